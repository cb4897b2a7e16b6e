"""`edgebench collect`: each device's runs fetched (fleet/collect.py) and ingested into the store,
one device at a time, with a line per device (or JSON) of what came back."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from edgebench.fleet.commands.output import echo, echo_err
from edgebench.fleet.commands.targets import device_names
from edgebench.results import STORE_DEFAULT_HELP, runs_dir_for, store_for

if TYPE_CHECKING:
    from edgebench.fleet.collect import Collected

@click.command()
@click.option("--device", "devices", multiple=True, help="Inventory name (repeatable). Default: every device.")
@click.option("--run", "run_id", default=None, help="Only this run id.")
@click.option("--store", default=None, help=f"DuckDB results store to ingest into (default: RUNS_DIR/edgebench.duckdb "
                                            f"with --runs-dir, else {STORE_DEFAULT_HELP}).")
@click.option("--no-ingest", is_flag=True, help="Fetch only; do not touch the store.")
@click.option("--runs-dir", default=None, type=click.Path(file_okay=False),
              help="Local folder: runs land in RUNS_DIR/<device>/<run_id>/ (default: beside the store).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--all", "every", is_flag=True,
              help="Every sweep on the device, other hosts' too. Default: this host's sweeps, and an older "
                   "edgebench's (no host record).")
def collect(devices: tuple[str, ...], run_id: str | None, store: str | None, no_ingest: bool, runs_dir: str | None,
            as_json: bool, every: bool) -> None:
    """Fetch finished and partial runs from devices and ingest them into the store.

    Every file is checked against the size and sha256 the device lists; interrupted
    downloads resume; running it again fetches only what changed. Fresh clock probes are
    taken each time. A labgrid place held for a sweep that has ended is released. Other
    hosts' sweeps are left alone (each sweep records its host); --all fetches them too.
    """
    from edgebench.fleet.collect import collect_device

    names, problems = device_names(devices, with_local=False)
    report: dict[str, dict[str, Any]] = dict(problems)  # printed as JSON with --json
    errors, store_path = bool(report), store_for(store, runs_dir)
    for name in names:  # one at a time: the store takes one writer
        try:
            got = collect_device(name, run_id, runs_dir_for(runs_dir),
                                 None if no_ingest else store_path,
                                 log=(lambda _: None) if as_json else echo_err, every=every)
        except (RuntimeError, ValueError, OSError) as exc:
            errors = True
            report[name] = {"error": str(exc)}
            if not as_json:
                echo(f"{name}: FAILED: {exc}", fg="red", err=True)
            continue
        report[name] = {"runs": got.runs, "files_fetched": got.files_fetched, "bytes_fetched": got.bytes_fetched,
                        "ingested": got.ingested, "not_ingested": got.not_ingested, "refused": got.refused,
                        "other_hosts_runs": got.owners, "other_sweeps_left": got.others}
        errors = errors or bool(got.refused)
        if not as_json:
            _show_collected(name, got, "(no store)" if no_ingest else str(store_path))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    if errors:
        raise SystemExit(1)


def _show_collected(name: str, got: Collected, into: str) -> None:
    """A device's line of what was fetched and ingested, then what was left alone or refused."""
    click.echo(f"{name}: {len(got.runs)} runs, {got.files_fetched} files ({got.bytes_fetched / 1024:.0f} KiB) "
               f"fetched, {len(got.ingested)} ingested into {into}")
    if got.others:
        click.echo(f"  left alone: {got.others} sweep(s) of other hosts (--all fetches them)")
    for rid, owner in got.owners.items():
        click.echo(f"  {rid}: started by {owner}")
    for rid, why in got.not_ingested.items():
        echo(f"  not ingested {rid}: {why}")
    for rid, why in got.refused.items():
        echo(f"  refused {rid}: {why}", err=True, fg="red")
