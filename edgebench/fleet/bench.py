"""bench's sweep on this host: its specs run one at a time in the foreground, a disturbed run
again where the budget allows, a Ctrl-C stopping the sweep with what ran ingested. The
command (fleet/commands/bench.py) checks the options before and renders the result after; what
only the specs tell (room for --save's weights, the memory model's verdict) is refused here,
as click's errors, before any run starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import click

from edgebench.fleet.local import Interrupts, run_local, shielded
from edgebench.fleet.plan import (
    attach_native,
    attach_program,
    axes_of,
    disturbed_rerun,
    for_device,
    ingest_runs,
    make_specs,
    run_label,
    unsupported_result,
)
from edgebench.runner.native import machine_arch
from edgebench.runner.spec import RunSpec

if TYPE_CHECKING:
    from edgebench.devices.profiles import Profile
    from edgebench.methods.budget import Budget


class Bar(Protocol):
    """What the sweep tells the display about one run (fleet.progress.RunBar)."""

    def stage(self, text: str) -> None: ...

    def step(self, done: int) -> None: ...

    def ended(self, result: dict[str, Any]) -> None: ...


class Display(Protocol):
    """Where the sweep's runs show while they run (fleet.progress.RunBars): entered for the sweep."""

    def __enter__(self) -> Display: ...

    def __exit__(self, *exc: Any) -> None: ...

    def add(self, spec: RunSpec, label: str) -> Bar: ...


@dataclass
class BenchSweep:
    """What a sweep did: every result in run order (re-runs of disturbed runs at the end), how
    many re-runs it queued, and the signal that stopped it (None: it ran to its end)."""

    specs: list[RunSpec]
    results: list[dict[str, Any]]
    reruns: int
    interrupted: str | None


def bench_specs(methods: list[str], shape: dict[str, Any], profile: Profile, save: str | None) -> list[RunSpec]:
    """The sweep's specs for this host's profile; with --save each run keeps its weights in SAVE/<run_id>/."""
    specs = for_device("local", profile, make_specs(methods, **shape))
    if save:
        for spec in specs:
            spec.save_dir = str(Path(save).resolve() / str(spec.run_id))
    return specs


def bench_on_host(methods: list[str], shape: dict[str, Any], runs: Path, store_path: Path, *, save: str | None,
                  force: bool, rerun_disturbed: int, display: Display, log: Callable[[str], None]) -> BenchSweep:
    """bench's sweep on this host from its options: the specs for the local profile, refused
    before any run when --save's disk cannot hold their weights or a run is predicted not to fit
    (unless `force`), then run_bench."""
    from edgebench.devices.profiles import load_profile
    from edgebench.fleet import local
    from edgebench.results.store import check_location

    check_location(store_path)  # where the runs go, before they run
    profile = load_profile("local")
    specs = bench_specs(methods, shape, profile, save)
    if save:
        _check_save_room(save, specs)
    refused = _memory_preflight(specs, local.host_budget(profile, runs), profile, force, log)
    return run_bench(specs, profile, runs, store_path, force=force, rerun_disturbed=rerun_disturbed,
                     display=display, log=log, refused=refused)


def _check_save_room(save: str, specs: list[RunSpec]) -> None:
    """Before any run: room on --save's disk for every run's weights (fp32 safetensors, as
    methods.saving writes them), so no run trains for an hour and then finds the disk full."""
    import shutil

    from edgebench.fleet.plan import spec_config
    from edgebench.model.config import parameter_count

    needed = sum(4 * parameter_count(cfg) for cfg in map(spec_config, specs) if cfg is not None)
    free = shutil.disk_usage(save).free
    if needed > free:
        raise click.BadParameter(f"{save}: {needed / 2**20:,.0f} MiB of trained weights to write ({len(specs)} runs, "
                                 f"fp32) and {free / 2**20:,.0f} MiB free there; free some room or pass another "
                                 "folder", param_hint="--save")


def _memory_preflight(specs: list[RunSpec], held_to: Budget, profile: Profile, force: bool,
                      log: Callable[[str], None]) -> dict[str, str]:
    """Refuses (one line) the sweep where a run is predicted not to fit the budget, unless --force,
    which records it; in a sweep of several batch sizes, only the runs of a batch size that does not
    fit are refused (returned: run id -> why, each recorded `unsupported`) and the rest run."""
    from edgebench.fleet.plan import fit_by_shape

    alone, whole = fit_by_shape(specs, held_to, profile.device_speed, force, log)
    if whole:
        raise click.ClickException("; ".join(whole) + "; or --force to run anyway")
    return alone


def run_bench(specs: list[RunSpec], profile: Profile, runs: Path, store_path: Path, *, force: bool,
              rerun_disturbed: int, display: Display, log: Callable[[str], None],
              refused: dict[str, str] | None = None) -> BenchSweep:
    """Runs the specs in turn, each in its own supervisor; a method the backend cannot run, or a
    run the memory preflight `refused` (run id -> why), is recorded `unsupported` and the sweep
    goes on. Ctrl-C: the running run ends `interrupted` (result.json written), no further run
    starts; either way what ran is ingested into the store."""
    results: list[dict[str, Any]] = []
    interrupts = Interrupts()
    queue = list(specs)  # and the re-runs of disturbed runs (--rerun-disturbed)
    try:
        with interrupts, display:
            for k, spec in enumerate(queue, 1):  # a disturbed run's re-run joins the queue's end
                bar = display.add(spec, f"run {k} of {len(queue)}: {run_label(spec, specs)}" if len(queue) > 1 else
                                  spec.method)
                too_big = (refused or {}).get(str(spec.run_id))
                result = _run_one(spec, profile, runs, bar, interrupts, force, log, too_big)
                results.append(result)
                if interrupts.signal:
                    break
                again = disturbed_rerun(spec, result, "local") if len(queue) - len(specs) < rerun_disturbed else None
                if again is not None:
                    queue.append(again)
    except KeyboardInterrupt:  # between runs (e.g. during an export): nothing running to record
        interrupts.signal = interrupts.signal or "Ctrl-C (SIGINT)"
    from edgebench.results.store import StoreError

    made = [d for d in (runs / str(s.run_id) for s in queue) if (d / "result.json").exists()]
    with shielded(bool(interrupts.signal)):
        try:
            ingest_runs(store_path, made, "local")
        except StoreError as exc:  # busy past its wait, or gone bad since the start: the runs stay
            raise StoreError(f"{exc}. The {len(made)} runs are kept in {runs}: `edgebench ingest "
                             f"{' '.join(str(d) for d in made[:3])}{' ...' if len(made) > 3 else ''} --store "
                             f"{store_path}` brings them in later") from None
    return BenchSweep(specs, results, len(queue) - len(specs), interrupts.signal)


def _run_one(spec: RunSpec, profile: Profile, runs: Path, bar: Bar, interrupts: Interrupts, force: bool,
             log: Callable[[str], None], too_big: str | None) -> dict[str, Any]:
    """One spec: its program exported and its worker settled first (refused, or `too_big` for the
    memory preflight: `unsupported`), then run."""
    refused = too_big or (attach_program(spec, profile, on_stage=bar.stage)
                          or attach_native(spec, machine_arch(), bar.stage)
                          or _native_memory_refusal(spec, profile, runs, force, log))
    if refused is not None:
        bar.stage("unsupported")
        return unsupported_result(spec, refused)
    run_dir = runs / str(spec.run_id)  # for_device gave every spec one
    result = {**run_local(spec, run_dir, on_progress=bar.step, interrupts=interrupts), **axes_of(spec)}
    result["run_dir"] = str(run_dir)
    if spec.save_dir and result["status"] == "ok" and (Path(spec.save_dir) / "model.safetensors").is_file():
        result["saved_to"] = spec.save_dir
    bar.ended(result)
    return result


def _native_memory_refusal(spec: RunSpec, profile: Profile, runs: Path, force: bool,
                           log: Callable[[str], None]) -> str | None:
    """The memory preflight of a native worker's run, once its program is exported (the
    prediction reads it): why it is refused (recorded `unsupported`, the sweep goes on), or None."""
    from edgebench.fleet import local
    from edgebench.fleet.plan import force_memory, memory_refusals

    if spec.runtime != "native":
        return None
    refused, why = memory_refusals([spec], local.host_budget(profile, runs), profile.device_speed)
    if refused and not force:
        return f"{why}; or --force to run anyway"
    if refused:
        force_memory([spec], refused, why)
        log(f"forced (--force): {why}")
    return None
