"""`edgebench bench`: a sweep on this host in the foreground (fleet/bench.py), its table, and
an exit code that says whether any run ended ok."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgebench.fleet.checks import check_save
from edgebench.fleet.commands.output import echo_err
from edgebench.fleet.options import RERUN_OPTION, SAVE_OPTION, run_options
from edgebench.fleet.plan import axis_values, rerun_summary
from edgebench.results import STORE_DEFAULT_HELP, default_store, runs_dir_for, store_for
from edgebench.terminal import console, wrapped

if TYPE_CHECKING:
    from edgebench.fleet.bench import BenchSweep


@click.command()
@click.option("--device", default="local", show_default=True,
              help="Where to run. `local` is this host; remote devices go through `edgebench deploy`.")
@run_options
@click.option("--store", default=None, type=click.Path(dir_okay=False),
              help=f"Results store to ingest into (default: RUNS_DIR/edgebench.duckdb with --runs-dir, else "
                   f"{STORE_DEFAULT_HELP}); see `edgebench report`.")
@RERUN_OPTION
@SAVE_OPTION
def bench(device: str, shape: dict[str, Any], methods: list[str], runs_dir: str | None, as_json: bool,
          store: str | None, rerun_disturbed: int, save: str | None, force: bool) -> None:
    """Benchmark fine-tuning methods on this host: `deploy` to the local device, in the foreground.

    Each method runs in a fresh process so its memory is its own, sampled while it runs;
    a run that OOMs, diverges or fails is recorded with its status and the sweep goes on;
    a method the backend cannot run is recorded `unsupported`. Exit 1 when no run ended `ok`.
    A run the memory model predicts does not fit what a run may take on this host (its RAM less
    what it holds now, the supervisor and a margin) is refused before anything starts, with
    methods that fit; --force runs it anyway.
    Each run leaves a run directory under --runs-dir and is ingested into the store.
    With --repeats N the table gives each figure as the median of the N runs with
    [min-max] and n; a run that other processes disturbed (they took >10% of the CPU)
    is flagged "!" (--rerun-disturbed N runs it again, N extra runs at most). Fine-tune
    your own model on your own data with --model CHECKPOINT_DIR --data DATASET_DIR --lr 1e-4
    --save DIR (README: "Your model, your data"). Piped, it prints one line per stage and step.
    docs/figures.md defines every figure.
    """
    from edgebench.fleet.bench import bench_on_host
    from edgebench.fleet.progress import RunBars

    if device != "local":
        raise click.UsageError(
            f"bench runs on this host only (--device local); for device {device!r} use "
            f"`edgebench deploy --device {device}` and then `edgebench collect`")
    check_save(save, shape["backend"])
    store_path, runs = store_for(store, runs_dir), runs_dir_for(runs_dir)
    sweep = bench_on_host(methods, shape, runs, store_path, save=save, force=force, rerun_disturbed=rerun_disturbed,
                          display=RunBars(quiet=as_json), log=echo_err)
    if sweep.interrupted:
        click.echo(f"interrupted by {sweep.interrupted}: {len(sweep.results)} of {len(sweep.specs)} runs recorded and "
                   f"ingested into {store_path}; the rest did not start", err=True)
        raise SystemExit(130)
    if as_json:
        click.echo(json.dumps(sweep.results, indent=2, default=str))
    else:
        batch = ",".join(map(str, axis_values(shape["batch_size"])))
        _show_bench(sweep, f"{shape['model']} on {device}, batch {batch}, {shape['backend']}",
                    rerun_disturbed, runs, store_path)
    _bench_exit(sweep.results, device, shape["backend"])


def _show_bench(sweep: BenchSweep, title: str, rerun_disturbed: int, runs: Path, store_path: Path) -> None:
    """bench's table, what --rerun-disturbed and --save did, and where the runs and the store are."""
    from edgebench.report.tables import render_bench_results

    render_bench_results(sweep.results, title)
    if rerun_disturbed:
        click.echo(wrapped(rerun_summary(sweep.results, sweep.reruns, rerun_disturbed), console().width))
    for r in sweep.results:
        if r.get("saved_to"):
            click.echo(f"{r['method']}: trained weights saved to {r['saved_to']}")
    see = "edgebench report" if store_path == default_store() else f"edgebench report --store {store_path}"
    # wrapped at spaces: the command and its path stay whole (a terminal breaks a line anywhere)
    click.echo(wrapped(f"run directories under {runs}/; store {store_path} ({see})", console().width))


def _bench_exit(results: list[dict[str, Any]], device: str, backend: str) -> None:
    """Exit 1 when no run ended ok (as deploy: a sweep where nothing could run failed); runs
    that did not end ok are counted on stderr either way."""
    refused = {r["method"]: " ".join(str(r["detail"]).split()) for r in results if r["status"] == "unsupported"}
    if results and len(refused) == len(results):
        click.secho(f"{device}: no method can run there ({backend}): "
                    + "; ".join(f"{m}: {why}" for m, why in refused.items()), fg="red", err=True)
        raise SystemExit(1)
    ended = Counter(str(r["status"]) for r in results)
    if ended["ok"] < len(results):
        click.secho(f"{device}: {ended['ok']} of {len(results)} runs ended ok ("
                    + ", ".join(f"{n} {status}" for status, n in ended.items() if status != "ok")
                    + "); the table and `edgebench report` give each run's detail",
                    fg="red" if not ended["ok"] else "yellow", err=True)
    if results and not ended["ok"]:
        raise SystemExit(1)
