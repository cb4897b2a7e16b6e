"""The live loop: poll the follower, re-render, repeat at a fixed rate until what it follows has ended."""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.live import Live

from edgebench.live.follow import LocalRun, RemoteRun, RunSource, Sweep, find_local_run, find_remote_run
from edgebench.live.state import LiveState
from edgebench.live.view import ended_line, render
from edgebench.results import runs_dir_for


def run_live(source: RunSource, state: LiveState, refresh_hz: float = 8.0, console: Console | None = None,
             sweep: Sweep | None = None, follow: bool = False) -> LiveState:
    """Shows the dashboard until the run has ended, or with `sweep` (run after run) until the
    sweep has; the last frame ends with a line saying so. With `follow`, it then waits for the
    next sweep, saying so, until Ctrl-C. Ctrl-C leaves at any time.

    Rendering is driven here, not by rich's refresh thread, so every frame shows fresh data.
    """
    period = 1.0 / refresh_hz
    try:
        with Live(render(state), console=console, auto_refresh=False, redirect_stdout=False,
                  redirect_stderr=False) as live:
            while True:
                started = time.monotonic()
                state.apply(source.poll())
                if state.finished and sweep is None:
                    state.ended = ended_line(state, None)
                elif state.finished and sweep is not None and sweep.due(started):
                    newer = sweep.next_run()
                    if newer is not None:
                        source.close()
                        source, state = newer, LiveState(source=newer.label, device=state.device)
                        continue
                    swept = source.sweep_json()
                    if swept is None or swept.get("state") != "running":
                        state.ended = ended_line(state, swept, PurePosixPath(source.run_dir).parent.parent.name, follow)
                live.update(render(state), refresh=True)
                if state.ended and not follow:
                    break
                time.sleep(max(0.0, period - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    finally:
        source.close()
    return state


def watch(device: str | None, run_id: str | None, run_dir: str | None, root: Path | None, refresh_hz: float,
          follow: bool) -> None:
    """`edgebench live`: follows the run `run_dir` or `run_id` (on `device` when given, else
    here under `root`), or without either the newest run and the sweep after it, until it
    has ended. A missing run raises FileNotFoundError, an unreachable device TransportError."""
    if not device:
        where = runs_dir_for(root)
        if run_dir and not Path(run_dir).is_dir():
            raise FileNotFoundError(f"{run_dir}: no such run directory; `ls {where}` shows the runs here")
        source = LocalRun(Path(run_dir) if run_dir else find_local_run(where, run_id))
        sweep = None if run_dir or run_id else Sweep(lambda: find_local_run(where, None), LocalRun, source.run_dir)
        run_live(source, LiveState(source=source.label), refresh_hz=refresh_hz, sweep=sweep, follow=follow)
        return
    from edgebench.devices import connect

    transport = connect(device)
    try:
        remote_dir = run_dir or find_remote_run(transport, transport.device.workdir, run_id)
        remote = RemoteRun(transport, remote_dir)
        sweep = None if run_dir or run_id else Sweep(
            lambda: find_remote_run(transport, transport.device.workdir, None),
            lambda path: RemoteRun(transport, path), remote_dir)
        run_live(remote, LiveState(source=remote.label, device=device), refresh_hz=refresh_hz, sweep=sweep,
                 follow=follow)
    finally:
        transport.close()
