"""The live loop: poll the follower, re-render, repeat at a fixed rate until Ctrl-C."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live

from edgebench.live.state import LiveState
from edgebench.live.view import render


def run_live(source, state: LiveState, refresh_hz: float = 8.0, exit_when_finished: bool = False,
             console: Console | None = None) -> LiveState:
    """Shows the dashboard until Ctrl-C (or the run's end with `exit_when_finished`).

    Rendering is driven here, not by rich's refresh thread, so every frame shows fresh data.
    """
    period = 1.0 / refresh_hz
    try:
        with Live(render(state), console=console, auto_refresh=False, redirect_stdout=False,
                  redirect_stderr=False) as live:
            while True:
                started = time.monotonic()
                state.apply(source.poll())
                live.update(render(state), refresh=True)
                if exit_when_finished and state.finished:
                    break
                time.sleep(max(0.0, period - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    finally:
        source.close()
    return state
