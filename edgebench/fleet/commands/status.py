"""`edgebench status`: what is running where (fleet/status.py), a line per sweep and run, exit 1
when a device could not be asked."""

from __future__ import annotations

import json
from typing import Any

import click

from edgebench.fleet.commands.output import echo
from edgebench.fleet.commands.targets import device_names
from edgebench.terminal import VALUE_CHARS
from edgebench.untrusted import printable


@click.command()
@click.option("--device", "devices", multiple=True, help="Inventory name (repeatable). Default: every device.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--all", "every", is_flag=True,
              help="Every sweep on the device, other hosts' marked with whose they are. Default: this host's "
                   "sweeps, and an older edgebench's (no host record).")
def status(devices: tuple[str, ...], as_json: bool, every: bool) -> None:
    """Show what is running where: each device's sweeps this host deployed (--all: other hosts'
    too) and their runs' statuses, and for a board farm's device who holds its labgrid place (since
    when, for which sweep)."""
    from edgebench.fleet.status import fleet_status

    names, problems = device_names(devices, with_local=True)
    rows = fleet_status(names, every) + [{"device": name, **why} for name, why in problems.items()]
    unasked = [row["device"] for row in rows if "error" in row]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    for row in [] if as_json else rows:
        _show_device(row)
    if unasked:  # a script must not read "nothing running" into a device that could not be asked
        raise SystemExit(1)


def _show_device(row: dict[str, Any]) -> None:
    """A device's labgrid place (a board farm's: who holds it), then its error, or each sweep
    with how many of its runs are done, and each run's status."""
    place = row.get("place")
    if place:
        sweep = f" for sweep {place['sweep']}" if place["sweep"] else ""
        held = f"held by {place['held_by']} since {place['since']}{sweep}" if place["held_by"] else "free"
        echo(f"{row['device']}: labgrid place {place['name']}: {held}")
    if "error" in row:
        echo(f"{row['device']}: {row['error']}", fg="red")
        return
    if not row["sweeps"]:
        click.echo(f"{row['device']}: no sweeps" + (" of this host's" if row["others"] else ""))
    if row["others"]:
        click.echo(f"{row['device']}: {row['others']} sweep(s) of other hosts not shown (--all shows them)")
    for sweep_id, sweep in row["sweeps"].items():
        done = sum(1 for rid, s in sweep["runs"].items()  # a kept partial attempt is not a spec of its own
                   if s not in ("running", "not started", "stopped") and ".attempt-" not in rid)
        why = f" ({_said(sweep['why'])})" if sweep.get("why") else ""
        owner = f" [started by {sweep['owner']}]" if sweep.get("owner") else ""
        echo(f"{row['device']}: sweep {_said(sweep_id)}: {_said(sweep['state'])}{why}, {done}/"
             f"{len(sweep['specs'])} runs done{owner}")
        for rid, run_status in sweep["runs"].items():
            echo(f"  {_said(rid)}: {_said(run_status)}")


def _said(value: Any) -> str:
    """What a device reported (a sweep id, a run's status), as a line shows it: printable, cut short."""
    return printable(value, newlines=False, limit=VALUE_CHARS)
