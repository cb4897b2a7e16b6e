"""`edgebench deploy`, `edgebench collect`, `edgebench status`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgebench.results import DEFAULT_STORE
from edgebench.runner.spec import RunSpec


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


def _device_names(given: tuple[str, ...], with_local: bool) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The devices named, or every good inventory device; bad entries come back as errors."""
    from edgebench.devices.inventory import InventoryError, scan_devices

    if given:
        return list(given), {}
    try:
        found, problems = scan_devices()
    except InventoryError as exc:
        raise click.ClickException(str(exc)) from None
    for name, why in problems.items():
        _echo_err(f"{name}: skipped: {why}")
    names = [d.name for d in found if with_local or d.name != "local"]
    return names, {name: {"error": why} for name, why in problems.items()}


@click.command()
@click.option("--device", "devices", multiple=True, required=True,
              help="Inventory name (repeatable; several devices run at once). See `edgebench devices`.")
@click.option("--model", default="tiny", show_default=True, help="Model config (see `edgebench models`).")
@click.option("--methods", default="sgd,adamw", show_default=True, help="Comma-separated presets or combinations.")
@click.option("--backend", default="eager", show_default=True, type=click.Choice(["eager", "executorch", "onnxruntime"]))
@click.option("--program", default=None, type=click.Path(exists=True, file_okay=False),
              help="Exported program directory (executorch/onnxruntime backends; see exporters/).")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Measured steps.")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0), help="Warmup steps.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--text-length", default=32, show_default=True, type=click.IntRange(min=2))
@click.option("--threads", default=None, type=int, help="torch threads (default: torch's own).")
@click.option("--sample-hz", default=20.0, show_default=True, type=click.FloatRange(1, 100))
@click.option("--timeout", "timeout_s", default=None, type=float, help="Wall-clock limit per run, seconds.")
@click.option("--spec", "spec_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="RunSpec JSON file to run as is (repeatable); replaces --methods and the shape options.")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Local folder for clock probes and deployment records.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def deploy(devices: tuple[str, ...], model: str, methods: str, backend: str, program: str | None, steps: int,
           warmup: int, batch_size: int, text_length: int, threads: int | None, sample_hz: float,
           timeout_s: float | None, spec_files: tuple[str, ...], runs_dir: str, as_json: bool) -> None:
    """Start a sweep of methods on one or more devices, detached; print the run ids.

    Preflight checks the device (Python, torch/executorch versions, free RAM and disk, arch
    vs backend); then edgebench's own source (no dependencies are installed on the device),
    the exported program if any, and one spec per method are shipped and the sweep starts
    with setsid/nohup, so it survives a dropped connection. Clock probes are recorded for
    alignment. Fetch results with `edgebench collect`; watch with `edgebench status`.
    """
    from edgebench.fleet.deploy import deploy_many

    if spec_files:
        specs = [RunSpec.load(path) for path in spec_files]
    else:
        specs = [RunSpec(model=model, method=m.strip(), backend=backend, program=program, steps=steps,
                         warmup_steps=warmup, batch_size=batch_size, text_length=text_length, threads=threads,
                         sample_hz=sample_hz, timeout_s=timeout_s) for m in methods.split(",") if m.strip()]
    results = deploy_many(list(devices), specs, Path(runs_dir), log=(lambda _: None) if as_json else _echo_err)
    failed = {name: str(r) for name, r in results.items() if isinstance(r, Exception)}
    if as_json:
        click.echo(json.dumps({name: {"error": str(r)} if isinstance(r, Exception) else
                               {"sweep_id": r.sweep_id, "sweep_dir": r.sweep_dir, "run_ids": r.run_ids}
                               for name, r in results.items()}, indent=2))
    else:
        for name, r in results.items():
            if isinstance(r, Exception):
                click.secho(f"{name}: FAILED: {r}", fg="red", err=True)
                continue
            click.echo(f"{name}: sweep {r.sweep_id}")
            for run_id in r.run_ids:
                click.echo(f"  {run_id}")
    if failed:
        raise SystemExit(1)


@click.command()
@click.option("--device", "devices", multiple=True, help="Inventory name (repeatable). Default: every device.")
@click.option("--run", "run_id", default=None, help="Only this run id.")
@click.option("--store", default=str(DEFAULT_STORE), show_default=True, help="DuckDB results store to ingest into.")
@click.option("--no-ingest", is_flag=True, help="Fetch only; do not touch the store.")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Local folder: runs land in RUNS_DIR/<device>/<run_id>/.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def collect(devices: tuple[str, ...], run_id: str | None, store: str, no_ingest: bool, runs_dir: str,
            as_json: bool) -> None:
    """Fetch finished and partial runs from devices and ingest them into the store.

    Every file is checked against the size and sha256 the device lists; interrupted
    downloads resume; running it again fetches only what changed. Fresh clock probes are
    taken each time.
    """
    from edgebench.fleet.collect import collect_device

    names, report = _device_names(devices, with_local=False)
    errors = bool(report)
    for name in names:  # one at a time: the store takes one writer
        try:
            got = collect_device(name, run_id, Path(runs_dir), None if no_ingest else Path(store),
                                 log=(lambda _: None) if as_json else _echo_err)
        except (RuntimeError, ValueError, OSError) as exc:
            errors = True
            report[name] = {"error": str(exc)}
            if not as_json:
                click.secho(f"{name}: FAILED: {exc}", fg="red", err=True)
            continue
        report[name] = {"runs": got.runs, "files_fetched": got.files_fetched, "bytes_fetched": got.bytes_fetched,
                        "ingested": got.ingested, "not_ingested": got.not_ingested}
        if not as_json:
            click.echo(f"{name}: {len(got.runs)} runs, {got.files_fetched} files ({got.bytes_fetched / 1024:.0f} KiB) "
                       f"fetched, {len(got.ingested)} ingested into {store if not no_ingest else '(no store)'}")
            for rid, why in got.not_ingested.items():
                click.echo(f"  not ingested {rid}: {why}")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    if errors:
        raise SystemExit(1)


@click.command()
@click.option("--device", "devices", multiple=True, help="Inventory name (repeatable). Default: every device.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(devices: tuple[str, ...], as_json: bool) -> None:
    """Show what is running where: each device's sweeps and their runs' statuses."""
    from edgebench.fleet.status import fleet_status

    names, problems = _device_names(devices, with_local=True)
    rows = fleet_status(names) + [{"device": name, **why} for name, why in problems.items()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        if "error" in row:
            click.secho(f"{row['device']}: {row['error']}", fg="red")
            continue
        if not row["sweeps"]:
            click.echo(f"{row['device']}: no sweeps")
        for sweep_id, sweep in row["sweeps"].items():
            done = sum(1 for s in sweep["runs"].values() if s not in ("running", "not started"))
            state = "running" if sweep["alive"] else (sweep["state"] or "not started")
            click.echo(f"{row['device']}: sweep {sweep_id}: {state}, {done}/{len(sweep['specs'])} runs done")
            for rid, run_status in sweep["runs"].items():
                click.echo(f"  {rid}: {run_status}")


COMMANDS = [deploy, collect, status]
