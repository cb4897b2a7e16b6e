"""`edgebench ingest` and `edgebench import-trace`: put run directories and external power
meter logs into the results store."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from edgebench.results import STORE_DEFAULT_HELP
from edgebench.untrusted import UnsafeName, path_name

if TYPE_CHECKING:
    from edgebench.results.store import Store

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


runs_store_option = click.option("--store", "store_path", type=click.Path(path_type=Path), default=None,
                                 help=f"The results store that holds the runs (DuckDB file). Default: "
                                      f"{STORE_DEFAULT_HELP}.")


@click.group("runs", short_help="List, remove and tag the runs in the store.")
def runs_group() -> None:
    """List, remove and tag the runs in the store: a bad or foreign run removed leaves every
    report; a tag picks runs out for one (`report --tag`).

    \b
    Examples:
      edgebench runs ls
      edgebench runs rm 20261207-1030-sgd-0
      edgebench runs tag pi5/20261207-1030-sgd-0 bad-power
      edgebench report --tag bad-power
    """


def _existing_store(store_path: Path | None) -> Store:
    """The store opened to write, refused (RunsError) where there is none: removing or tagging
    does not make one."""
    from edgebench.results import default_store
    from edgebench.results.runs import RunsError
    from edgebench.results.store import Store

    path = store_path or default_store()
    if not path.is_file():
        raise RunsError(f"{path}: no results store here; pass the store that holds the runs (--store)")
    return Store(path)


def _answered(question: str, yes: bool) -> bool:
    """--yes, or the user's answer; with no one to answer (no terminal) a RunsError saying to pass --yes."""
    import sys

    from edgebench.results.runs import RunsError

    if yes:
        return True
    try:
        return click.confirm(question, default=False, err=True)
    except click.Abort:
        if sys.stdin is not None and sys.stdin.isatty():
            raise
        raise RunsError("no one answered whether to remove the runs (no terminal); pass --yes; "
                        "nothing removed") from None


@runs_group.command("rm", short_help="Remove runs: their rows and their folders under the store's.")
@click.argument("names", metavar="RUN_ID...", nargs=-1, required=True)
@runs_store_option
@click.option("--yes", "-y", is_flag=True, help="Remove without asking (for scripts).")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def runs_rm(names: tuple[str, ...], store_path: Path | None, yes: bool, as_json: bool) -> None:
    """Remove runs from the store: their rows in every table (in one transaction) and their
    run directory and raw copy where these lie under the store's folder (a link is not
    followed; nothing outside that folder is deleted). Asks first, unless --yes. Name a run
    by its run id, or as DEVICE/RUN_ID where several devices have that id; an unknown id
    removes nothing.

    \b
    Examples:
      edgebench runs rm 20261207-1030-sgd-0
      edgebench runs rm --yes --store runs/edgebench.duckdb pi5/sgd-eager-0
    """
    from edgebench.results.runs import remove_runs, resolve

    with _existing_store(store_path) as store:
        keys = resolve(store, names)
        listed = ", ".join(f"{d}/{r}" for d, r in keys)
        if not _answered(f"Remove {len(keys)} run(s) ({listed}) from {store.path}, with their files "
                         f"under {store.path.parent}?", yes):
            click.echo("nothing removed", err=True)
            return
        done = remove_runs(store, keys)
    if as_json:
        click.echo(json.dumps(done, indent=2))
        return
    for d in done:
        deleted = f", deleted {len(d['deleted'])} folder(s)" if d["deleted"] else ""
        click.echo(f"removed {d['device']}/{d['run_id']}{deleted}")
        for path, why in d["kept"].items():
            click.echo(f"  kept {path}: {why}")


@runs_group.command("tag", short_help="Label runs with a tag, or take it off (--remove).")
@click.argument("names", metavar="RUN_ID... TAG", nargs=-1, required=True)
@runs_store_option
@click.option("--remove", is_flag=True, help="Take the tag off the runs instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs and what changed as JSON.")
def runs_tag(names: tuple[str, ...], store_path: Path | None, remove: bool, as_json: bool) -> None:
    """Label runs with a tag (1 to 40 printable characters, no spaces), or take it off
    (--remove). `edgebench report --tag TAG` then shows only the runs so labelled, its study
    (--study) too. Name a run by its run id, or as DEVICE/RUN_ID.

    \b
    Examples:
      edgebench runs tag 20261207-1030-sgd-0 20261207-1030-adamw-0 quiet-host
      edgebench runs tag --remove pi5/sgd-eager-0 quiet-host
      edgebench report --tag quiet-host --study
    """
    from edgebench.results.runs import RunsError, check_tag, resolve, tag_runs

    if len(names) < 2:
        raise RunsError("give one or more runs, then the tag: `edgebench runs tag RUN_ID... TAG`")
    tag = check_tag(names[-1])
    with _existing_store(store_path) as store:
        keys = resolve(store, names[:-1])
        changed = tag_runs(store, keys, tag, remove=remove)
    runs = [f"{d}/{r}" for d, r in keys]
    if as_json:
        click.echo(json.dumps({"tag": tag, "removed": remove, "runs": runs, "changed": changed}, indent=2))
        return
    done = "untagged" if remove else "tagged"
    click.echo(f"{done} {changed} of {len(runs)} run(s) {'from' if remove else 'with'} {tag!r}")


@runs_group.command("ls", short_help="List the runs with their method, status and tags.")
@runs_store_option
@click.option("--tag", help="Only runs with this tag.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
def runs_ls(store_path: Path | None, tag: str | None, as_json: bool) -> None:
    """List the runs in the store, oldest first: DEVICE/RUN_ID, method, status and tags.

    \b
    Examples:
      edgebench runs ls --tag quiet-host
      edgebench runs ls --json
    """
    from rich.text import Text

    from edgebench.results.store import Store
    from edgebench.terminal import Name, console
    from edgebench.untrusted import printable

    with Store(store_path, read_only=True) as store:
        tags = store.tags()
        runs = [{"device": r["device"], "run_id": r["run_id"], "method": r["method"], "status": r["status"],
                 "tags": tags.get((r["device"], r["run_id"]), [])} for r in store.runs(tag=tag)]
    if as_json:
        click.echo(json.dumps(runs, indent=2))
        return
    out = console()
    for r in runs:  # a line a run, wrapped at spaces and after a `+` to the output's width
        labels = f"  [{', '.join(r['tags'])}]" if r["tags"] else ""
        line = printable(f"{r['device']}/{r['run_id']}  {r['method']}  {r['status']}{labels}", newlines=False)
        out.print(Name(Text(line)))
