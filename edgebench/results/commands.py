"""`edgebench ingest` and `edgebench import-trace`: put run directories and external power
meter logs into the results store."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from edgebench.results import STORE_DEFAULT_HELP
from edgebench.untrusted import UnsafeName, path_name

F = TypeVar("F", bound=Callable[..., Any])


def device_option(**kw: Any) -> Callable[[F], F]:
    """--device: a device name, which names a folder (raw/<device>/): the one rule of edgebench.untrusted."""

    def check(ctx: click.Context, param: click.Parameter, value: str) -> str:
        try:
            return path_name(value, "device name")
        except UnsafeName as exc:
            raise click.BadParameter(str(exc)) from None

    return click.option("--device", callback=check, **kw)

store_option = click.option("--store", "store_path", type=click.Path(path_type=Path), default=None,
                            help=f"The results store (DuckDB file; created if missing). Default: {STORE_DEFAULT_HELP}.")


@click.command("ingest")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@device_option(default="local", show_default=True, help="Device the runs came from (its inventory name).")
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print what was ingested as JSON.")
def ingest_command(run_dirs: tuple[Path, ...], device: str, store_path: Path | None, as_json: bool) -> None:
    """Load run directories (meta.json, samples.jsonl, events.jsonl, result.json) into the
    store. Re-ingesting a run replaces it. `edgebench collect` does this for you; use this
    for runs copied by hand or made with `python -m edgebench.runner`.

    Given another store (a .duckdb file, e.g. the ./runs/edgebench.duckdb an earlier
    edgebench kept per folder), brings in every run it has that this store lacks, from the run
    files it names, with its clock probes and power traces (each run keeps its own device;
    --device is not used).

    \b
    Examples:
      edgebench ingest runs/adamw-eager-0
      edgebench ingest --device my-pi copied/sgd-eager-0
      edgebench ingest runs/edgebench.duckdb   # a per-folder store into yours
    """
    from edgebench.results.ingest import ingest_paths

    done = ingest_paths(store_path, run_dirs, device)
    if as_json:
        click.echo(json.dumps(done, indent=2))
        return
    for d in done:
        if "merged_from" in d:
            click.echo(f"{d['merged_from']}: {d['device']}/{d['run_id']}: {d['status']}")
            continue
        skipped = f", {d['samples_bad_lines']} bad line(s)" if d["samples_bad_lines"] else ""
        skipped += ", truncated last line" if d["samples_truncated"] else ""
        click.echo(f"{d['device']}/{d['run_id']}: {d['status']}, {d['samples_count']} samples{skipped}, "
                   f"clock from {d['align_source']}")


@click.command("import-trace")
@click.argument("csv_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@device_option(required=True, help="Device the meter was measuring.")
@store_option
@click.option("--id", "trace_id",
              help="Name of this trace in the store (default DEVICE:FILE-STEM); re-import replaces.")
@click.option("--time-col", default="time", show_default=True, help="Column holding the timestamp.")
@click.option("--time-format", default="s", show_default=True,
              help="s|ms|us|ns (epoch numbers, or since --time-origin), iso (ISO 8601), or a strptime "
                   "format like '%Y-%m-%d %H:%M:%S.%f'.")
@click.option("--time-origin", help="ISO time that numeric times count from (meters that log seconds since start).")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="Time zone of naive date-times (IANA name).")
@click.option("--offset-s", type=float, default=0.0, show_default=True,
              help="The meter's clock minus the host's clock, in seconds (subtracted from every time).")
@click.option("--power-col", help="Column holding power (or give --voltage-col and --current-col).")
@click.option("--power-unit", default="W", show_default=True, help="W, mW or uW.")
@click.option("--voltage-col", help="Column holding voltage.")
@click.option("--voltage-unit", default="V", show_default=True, help="V, mV or uV.")
@click.option("--current-col", help="Column holding current.")
@click.option("--current-unit", default="A", show_default=True, help="A, mA or uA.")
@click.option("--delimiter", default=",", show_default=True)
def import_trace_command(csv_path: Path, device: str, store_path: Path | None, trace_id: str | None,
                        **mapping: Any) -> None:
    """Import a host-side power meter's CSV log (USB meter, smart plug) for a device.

    Its times are put on the host clock; the device's runs, aligned by clock probes, then
    take their energy from this trace wherever it covers all their steps (reports show
    energy_source = external:ID).

    \b
    Examples:
      edgebench import-trace um34c.csv --device pi5 \\
          --time-col Timestamp --time-format iso \\
          --voltage-col 'Voltage(mV)' --voltage-unit mV \\
          --current-col 'Current(mA)' --current-unit mA
      edgebench import-trace plug.csv --device jetson \\
          --time-col ts --time-format ms --power-col watts
    """
    from edgebench.results.external import CsvMapping
    from edgebench.results.store import Store

    with Store(store_path) as store:
        try:
            tid = store.import_external_trace(csv_path, device, CsvMapping(**mapping), trace_id=trace_id)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        rows, first, last = store.con.execute(
            "SELECT rows, first_host_ns, last_host_ns FROM external_sources WHERE trace_id = ?", [tid]).fetchall()[0]
    click.echo(f"{tid}: {rows} readings over {(last - first) / 1e9:.1f} s")


