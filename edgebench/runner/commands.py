"""`edgebench bench`: benchmark methods on this host, each in a fresh process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edgebench.runner.local import new_run_id, run_local
from edgebench.runner.spec import RunSpec


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _loss(result: dict[str, Any]) -> str:
    first, last = result.get("loss_first"), result.get("loss_last")
    return "-" if first is None else f"{first:.2f}->{last:.2f}"


def render_table(results: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption="memory in MiB. peak: kernel ru_maxrss; smpl: sampled tree RSS; "
                                       "est.: the method's memory model (an estimate); step: median "
                                       "seconds; smp/s: samples per second; loss: first->last step")
    for name in ("method", "status", "peak", "smpl", "est.", "step", "smp/s", "loss"):
        table.add_column(name, justify="left" if name in ("method", "status") else "right",
                         no_wrap=name != "method", overflow="fold")
    for r in results:
        median = (r.get("step_time_s") or {}).get("median")
        status = r["status"] if r["status"] == "ok" else f"[red]{r['status']}[/red]"
        table.add_row(r.get("method", "?"), status,
                      _mib(r.get("peak_rss_bytes_kernel")), _mib(r.get("peak_rss_bytes_sampled")),
                      _mib(r.get("predicted_peak_bytes_est")),
                      "-" if median is None else f"{median:.3g}",
                      "-" if r.get("samples_per_s") is None else f"{r['samples_per_s']:.2f}",
                      _loss(r))
    console = Console()
    console.print(table)
    for r in results:
        if r["status"] != "ok":
            console.print(f"[red]{r.get('method')}[/red]: {r['status']}: {str(r.get('detail', ''))[:500]}")


def _profile_fields(profile: Any) -> dict[str, Any]:
    """Power model and sensor settings the runner needs from the device profile."""
    fields: dict[str, Any] = {}
    if profile.power_model is not None:
        fields["power_model"] = profile.power_model.model_dump()
    if profile.sensors is not None:
        fields["sensors"] = profile.sensors.model_dump()
    return fields


def _export_program(spec: RunSpec, profile: Any, progress: Any, task: Any) -> dict[str, Any] | None:
    """Sets spec.program for exported backends; returns a result when the export is refused."""
    if spec.backend == "eager":
        return None
    from exporters.pipeline import ExportRefused, export_for_spec

    try:
        spec.program = export_for_spec(
            spec, profile, on_stage=lambda stage: progress.update(task, description=f"{spec.method}: {stage}"))
    except ExportRefused as exc:
        return {"run_id": spec.run_id, "model": spec.model, "method": spec.method, "backend": spec.backend,
                "status": "unsupported", "detail": str(exc)}
    return None


@click.command()
@click.option("--device", default="local", show_default=True,
              help="Where to run. `local` is this host; remote devices go through `edgebench deploy`.")
@click.option("--model", default="tiny", show_default=True, help="Model config (see `edgebench models`).")
@click.option("--methods", default="adamw,sgd", show_default=True,
              help="Comma-separated presets or combinations (see `edgebench methods`).")
@click.option("--backend", default="eager", show_default=True,
              type=click.Choice(["eager", "executorch", "onnxruntime"]))
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Measured steps.")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0), help="Warmup steps.")
@click.option("--duration", default=None, help="Run for a time instead of --steps, e.g. 90s or 10m.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--text-length", default=32, show_default=True, type=click.IntRange(min=2))
@click.option("--threads", default=None, type=int, help="torch threads (default: torch's own).")
@click.option("--accelerator", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--sample-hz", default=20.0, show_default=True, type=click.FloatRange(1, 100),
              help="Telemetry sampling rate.")
@click.option("--timeout", "timeout_s", default=None, type=float, help="Wall-clock limit per run, seconds.")
@click.option("--seed", default=0, show_default=True)
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Where run directories go.")
@click.option("--store", default=None, type=click.Path(dir_okay=False),
              help="Results store to ingest into (default: RUNS_DIR/edgebench.duckdb); see `edgebench report`.")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON instead of a table.")
def bench(device: str, model: str, methods: str, backend: str, steps: int, warmup: int,
          duration: str | None, batch_size: int, text_length: int, threads: int | None,
          accelerator: str, sample_hz: float, timeout_s: float | None, seed: int, runs_dir: str,
          store: str | None, as_json: bool) -> None:
    """Benchmark fine-tuning methods on this host.

    Each method runs in a fresh process so its memory is its own, sampled while it runs;
    a run that OOMs, diverges or fails is recorded with its status and the sweep goes on.
    Each run leaves a run directory under --runs-dir.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if device != "local":
        raise click.UsageError(
            f"bench runs on this host only (--device local); for device {device!r} use "
            f"`edgebench deploy --device {device}` and then `edgebench collect`")
    from edgebench.devices.profiles import load_profile

    profile = load_profile(device)
    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    duration_s = parse_duration(duration) if duration else None
    base = dict(model=model, backend=backend, batch_size=batch_size, text_length=text_length,
                warmup_steps=warmup, steps=steps, duration_s=duration_s, timeout_s=timeout_s,
                seed=seed, sample_hz=sample_hz, threads=threads, accelerator=accelerator,
                **_profile_fields(profile))
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), disable=as_json, transient=False) as progress:
        for method in method_list:
            spec = RunSpec(method=method, **base)
            spec.run_id = new_run_id(device, spec)
            total = None if duration_s else warmup + steps
            task = progress.add_task(f"{method} ({backend})", total=total)
            refused = _export_program(spec, profile, progress, task)
            if refused is not None:
                progress.update(task, description=f"{method} ({backend}): unsupported")
                results.append(refused)
                continue
            result = run_local(spec, Path(runs_dir) / spec.run_id,
                               on_progress=lambda n, t=task: progress.update(t, completed=n))
            result["run_dir"] = str(Path(runs_dir) / spec.run_id)
            progress.update(task, completed=total or result.get("steps_done") or 0,
                            description=f"{method} ({backend}): {result['status']}")
            results.append(result)
    store_path = Path(store) if store else Path(runs_dir) / "edgebench.duckdb"
    _ingest(store_path, [Path(r["run_dir"]) for r in results if "run_dir" in r], device)
    if as_json:
        click.echo(json.dumps(results, indent=2, default=str))
    else:
        render_table(results, f"{model} on {device}, batch {batch_size}, {backend}")
        click.echo(f"run directories under {runs_dir}/; store {store_path} (edgebench report --store {store_path})")


def _ingest(store_path: Path, run_dirs: list[Path], device: str) -> None:
    from edgebench.results.store import Store

    with Store(store_path) as results_store:
        for run_dir in run_dirs:
            results_store.ingest_run(run_dir, device=device)


def parse_duration(text: str) -> float:
    """'90s', '10m', '1h' or plain seconds -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip().lower()
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise click.BadParameter(f"{text!r}: use e.g. 90s, 10m or 1h") from None


COMMANDS = [bench]
