"""`edgebench sensors`: what this machine (or a fixture tree) can measure, and why not."""

from __future__ import annotations

import json
from typing import Any

import click

from edgebench.cli_types import FiniteRange
from edgebench.runner.probe import probe


@click.command("sensors")
@click.option("--root", default="/", show_default=True, type=click.Path(exists=True, file_okay=False),
              help="Filesystem root holding /proc and /sys (point it at a fixture tree to test).")
@click.option("--sensors", "sensors_json", default="{}", show_default=True,
              help='The profile\'s sensors block as JSON, e.g. \'{"power": {"source": "rapl"}}\'; '
                   "empty: detect every source.")
@click.option("--seconds", default=1.0, show_default=True, type=FiniteRange(min=0, min_open=True, max=3600),
              help="How long to sample before reporting.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.option("--calibrate", is_flag=True,
              help="Phones: store which sign of the battery's current_now means discharging (run once on the "
                   "phone, unplugged; runs then use it). Over SSH/adb: python -m edgebench.telemetry.battery "
                   "--calibrate.")
def sensors_command(root: str, sensors_json: str, seconds: float, as_json: bool, calibrate: bool) -> None:
    """List each telemetry source (memory, cgroup, CPU, power, thermal, GPU): active with its
    latest values, or unavailable with the reason and what would fix it.

    \b
    Examples:
      edgebench sensors
      edgebench sensors --root tests/fixtures/devices/jetson-orin-nano --json
      edgebench sensors --calibrate      # on a phone, unplugged
    """
    if calibrate:
        _calibrate(root, as_json)
        return
    try:
        sensors = json.loads(sensors_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--sensors") from None
    report = probe(root, sensors, seconds=seconds)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    _print_sources(report, root)


def _calibrate(root: str, as_json: bool) -> None:
    """--calibrate: the battery's discharge sign measured and stored; a phone that cannot tell is exit 2."""
    from edgebench.telemetry.battery import CalibrationError, calibrate_battery_sign

    try:
        record = calibrate_battery_sign(root)
    except CalibrationError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(json.dumps(record) if as_json else f"battery sign {record['battery_current_sign']:+d} stored in "
               f"{record['stored_in']} (current_now {record['current_now_ua']} uA while discharging)")


def _print_sources(report: dict[str, Any], root: str) -> None:
    """Each source's status as a table fitted to the terminal, then the latest values."""
    from rich.table import Table

    from edgebench.terminal import Field, fitted
    from edgebench.terminal import console as terminal

    rows = [{"source": name, "status": "active"} for name in report["sources_active"]]
    rows += [{"source": name, "status": why} for name, why in {**report["sources_unavailable"],
                                                              **report["sources_failed"]}.items()]
    rows += [{"source": key, "status": str(report["power"][key])}  # what power_w covers; why it may not
             for key in ("power_total", "battery_sign_origin", "power_warning", "power_est_basis")
             if report["power"].get(key)]
    console = terminal()
    for part in fitted(f"telemetry sources under {root}", [Field("source", "source", lambda r: r["source"], True),
                                                           Field("status", "status", lambda r: r["status"], True)],
                       [], rows, console.width):
        console.print(part)
    values = Table(title="latest values")
    values.add_column("key", overflow="fold")
    values.add_column("value", justify="right", overflow="fold")
    for key, value in {**report["latest"], **report["figures"]}.items():
        values.add_row(key, str(value))
    console.print(values)


