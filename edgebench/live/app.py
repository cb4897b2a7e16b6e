"""The live loop: poll the follower, re-render, repeat at a fixed rate until Ctrl-C."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live

from edgebench.live.follow import Sweep
from edgebench.live.state import LiveState
from edgebench.live.view import render


def run_live(source, state: LiveState, refresh_hz: float = 8.0, exit_when_finished: bool = False,
             console: Console | None = None, sweep: Sweep | None = None) -> LiveState:
    """Shows the dashboard until Ctrl-C (or the run's end with `exit_when_finished`); with
    `sweep`, a finished run gives way to the next one the sweep starts.

    Rendering is driven here, not by rich's refresh thread, so every frame shows fresh data.
    """
    period = 1.0 / refresh_hz
    try:
        with Live(render(state), console=console, auto_refresh=False, redirect_stdout=False,
                  redirect_stderr=False) as live:
            while True:
                started = time.monotonic()
                state.apply(source.poll())
                newer = sweep.next_run(started, force=exit_when_finished) if sweep and state.finished else None
                if newer is not None:
                    source.close()
                    source, state = newer, LiveState(source=newer.label, device=state.device)
                    continue
                live.update(render(state), refresh=True)
                if exit_when_finished and state.finished:
                    break
                time.sleep(max(0.0, period - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    finally:
        source.close()
    return state
