"""`edgebench live`: a rich dashboard following a run as it happens."""

from __future__ import annotations

from pathlib import Path

import click

from edgebench.cli_types import FiniteRange


@click.command("live")
@click.option("--device", help="Follow a run on this device (inventory name) over its transport (SSH, adb).")
@click.option("--run", "run_id", help="The run id (default: the most recently started run).")
@click.option("--dir", "run_dir", help="The run directory itself (on the device when --device is given).")
@click.option("--root", type=click.Path(path_type=Path), default=None,
              help="Where to look for local runs by id (ROOT/ID, ROOT/DEVICE/ID, ROOT/sweeps/*/runs/ID); "
                   "default: beside your store (`edgebench bench`'s and `collect`'s runs).")
@click.option("--hz", type=FiniteRange(1, 30), default=8.0, show_default=True, help="Refreshes per second.")
@click.option("--follow", is_flag=True, help="Once the sweep has ended, wait for the next one (until Ctrl-C).")
@click.option("--exit-when-done", is_flag=True, hidden=True, help="What live does anyway; kept for scripts.")
def live_command(device: str | None, run_id: str | None, run_dir: str | None, root: Path | None, hz: float,
                 follow: bool, exit_when_done: bool) -> None:
    """Watch a run live: the device's RAM against its limit (a lab device's cgroup, else the
    board's own accounting) beside the worker's kernel RSS, power, temperature, step progress
    and rate, a loss sparkline, the method and backend; a finished run shows its summary.
    Without --run or --dir it follows the device's sweep: when a run ends, the next one.
    It leaves when the run (or the sweep) has ended, with a line saying so and the runs'
    statuses; --follow waits for the next sweep instead.

    Works on this machine, on a device over SSH (tails its run directory with `tail -F`),
    and inside an SSH terminal on the device itself (run it there without --device).
    Ctrl-C leaves the view; the run itself carries on.

    \b
    Examples:
      edgebench live                            # your newest run on this host
      edgebench live --dir ~/.local/share/edgebench/adamw-eager-0
      edgebench live --device lab-pi4           # its sweep, run after run
      edgebench live --device lab-pi4 --follow  # and every sweep after it
      edgebench live --device lab-pi4 --run lora-eager-0
    """
    from edgebench.devices.transport import TransportError
    from edgebench.live.app import watch

    if follow and (run_id or run_dir):
        raise click.UsageError("--follow follows the device's sweeps; leave out --run and --dir")
    try:
        watch(device, run_id, run_dir, root, refresh_hz=hz, follow=follow)
    except (FileNotFoundError, TransportError) as exc:
        raise click.ClickException(str(exc)) from exc
