"""`edgebench measure`'s work: any command run on this host as a run's worker, under the same
supervisor, sampler and cgroup as bench's runs (fleet/local.py), recorded as a run directory
and ingested like every other run.

The spec says what the run is: `command` (the argv the supervisor runs in the worker's place:
runner/supervisor.py), method `measure`, backend `command`, the model the name given (else the
command's basename); its steps are the ones the command marks (edgebench/measure.py), none
otherwise. The command's exit code is its own (figures.run_end.RunEnd.exit_codes): 0 ok, any
other an error that names it; a signal, an OOM kill, a timeout or a Ctrl-C as for any run.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from edgebench.fleet.local import Interrupts, run_local, shielded
from edgebench.fleet.plan import for_device, ingest_runs
from edgebench.measure import BACKEND, METHOD
from edgebench.runner.spec import RunSpec


@dataclass
class Measured:
    """What `measure` did: the run's figures as the store makes them, where it lies, and the
    signal that stopped it (None: the command ended by itself)."""

    figures: dict[str, Any]
    run_dir: Path
    store: Path
    duration_s: float | None
    interrupted: str | None


def check_command(command: tuple[str, ...]) -> list[str]:
    """The command as given, once it can be started here: refused (one line, nothing recorded)
    when there is none or its program is not found or not executable."""
    if not command:
        raise click.UsageError("give the command to measure after `--`, e.g. "
                               "`edgebench measure -- python3 train.py`")
    program = command[0]
    found = program if "/" in program else shutil.which(program)
    if not found or not os.path.isfile(found):
        raise click.BadParameter(f"{program!r}: no such program" + ("" if "/" in program else " on PATH")
                                 + "; give the command's path or a program PATH finds", param_hint="COMMAND")
    if not os.access(found, os.X_OK):
        raise click.BadParameter(f"{program!r}: not executable by this user; `chmod +x` it or run it through its "
                                 "interpreter (python3 SCRIPT)", param_hint="COMMAND")
    return list(command)


def measure_spec(command: list[str], name: str | None, batch_size: int, timeout_s: float | None,
                 sample_hz: float) -> RunSpec:
    """The run's spec for this host: the command, its name, and the local profile's sensors and
    power model with a fresh run id (as bench's runs get: fleet.plan.for_device)."""
    from edgebench.devices.profiles import load_profile

    spec = RunSpec(model=name or Path(command[0]).name, method=METHOD, backend=BACKEND, command=command,
                   batch_size=batch_size, timeout_s=timeout_s, sample_hz=sample_hz, steps=0, warmup_steps=0)
    return for_device("local", load_profile("local"), [spec])[0]


def measure_on_host(spec: RunSpec, runs: Path, store_path: Path) -> Measured:
    """Runs the spec's command under a supervisor (its own cgroup where this user can make one),
    then ingests the run; a Ctrl-C stops the command (the run ends `interrupted`) and what was
    recorded is still ingested."""
    from edgebench.figures.run import read_json
    from edgebench.figures.run_meta import run_meta_of
    from edgebench.results.metrics import run_metrics
    from edgebench.results.store import Store, check_location

    check_location(store_path)  # where the run goes, before it runs
    run_dir = runs / str(spec.run_id)
    interrupts = Interrupts()
    with interrupts:
        run_local(spec, run_dir, interrupts=interrupts)
    with shielded(bool(interrupts.signal)):
        ingest_runs(store_path, [run_dir], "local")
    with Store(store_path) as store:
        figures = run_metrics(store, store.runs(device="local", run_id=str(spec.run_id))[0])
    clock = run_meta_of(read_json(run_dir / "meta.json"), str(run_dir / "meta.json")).clock
    duration = (clock.end.mono_ns - clock.start.mono_ns) / 1e9 if clock.start and clock.end else None
    return Measured(figures, run_dir, store_path, duration, interrupts.signal)


def _mib(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value / 2**20:,.0f} MiB"


def summary(measured: Measured) -> str:
    """One line: status, duration, peak, and the step figures where the command marked steps."""
    f = measured.figures
    took = "" if measured.duration_s is None else f" in {measured.duration_s:.1f} s"
    line = f"{f['model']}: {f['status']}{took}, peak RSS {_mib(f.get('peak_mem_bytes'))}"
    if f.get("steps_measured"):
        line += f", {f['steps_measured']} steps, step time median {f['step_time_median_s']:.3g} s"
        if f.get("energy_per_step_j") is not None:
            line += f", {f['energy_per_step_j']:.3g} J/step"
    else:
        line += ", no steps marked (edgebench.measure): whole-run figures only"
    if f["status"] != "ok" and f.get("detail"):
        line += f" ({' '.join(str(f['detail']).split())[:300]})"
    return line + f"; run {f['run_id']} in {measured.store}"
