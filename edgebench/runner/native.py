"""Starting the native ExecuTorch worker (edgebench/native/worker.cpp) in place of the Python
worker: its command line, and why it cannot start here, said before it is tried.

A worker bundle is a folder: the `edgebench-worker` executable, `lib/` with the ExecuTorch
runtime libraries it was linked against, and `bundle.json` (its arch, executorch version and
each file's sha256). Its plan folder (edgebench/native/plan.py) holds plan.txt and
batches.bin. The supervisor runs it exactly as it runs the Python worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

WORKER = "edgebench-worker"
LAUNCHER = "run.sh"  # starts the worker with the bundle's libraries (and loader, where it has one)
BUNDLE_FACTS = "bundle.json"
PLAN = "plan.txt"
BATCHES = "batches.bin"
PLAN_FORMAT = "edgebench-native-plan 2"
RUNTIMES = ("native", "python")  # how the ExecuTorch backend runs: this worker, or the Python one


def backend_label(backend: str | None, runtime: str | None) -> str | None:
    """How tables and charts name a run's backend: `executorch-native` for the native worker, so
    its figures never fold into the Python ExecuTorch worker's."""
    return "executorch-native" if backend == "executorch" and runtime == "native" else backend


def machine_arch(machine: str | None = None) -> str:
    """The kernel's name for an arch, as bundles are named (amd64 -> x86_64, arm64 -> aarch64)."""
    machine = (machine or platform.machine()).lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def bundle_facts(bundle: str | Path) -> dict[str, Any]:
    """bundle.json of a worker bundle ({} when unreadable: `start_problem` says why)."""
    try:
        facts = json.loads((Path(bundle) / BUNDLE_FACTS).read_text())
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


def start_problem(spec: Any) -> str | None:
    """Why the native worker of `spec` cannot start on this device, with the fix; None if it can."""
    if not spec.native_worker or not spec.native_plan:
        return ("the spec asks for the native ExecuTorch worker but names no worker bundle or plan "
                "(native_worker, native_plan); run it through `edgebench bench` or `deploy`, which set them")
    bundle = Path(spec.native_worker)
    executable = bundle / WORKER
    if not executable.is_file():
        return f"{executable}: no native worker there; deploy again (it ships the worker) or use --runtime python"
    built_for = bundle_facts(bundle).get("arch")
    here = machine_arch()
    if built_for and built_for != here:
        return (f"{executable} was built for {built_for}, this device is {here}; deploy again so the host builds "
                f"the {here} worker (or use --runtime python)")
    if not os.access(executable, os.X_OK) or not (bundle / LAUNCHER).is_file():
        return f"{executable} is not executable or its {LAUNCHER} is missing; deploy again"
    plan = Path(spec.native_plan) / PLAN
    if not plan.is_file():
        return f"{plan}: no native plan there; deploy again"
    return None


def files_that_run(spec: Any) -> dict[str, str]:
    """The sha256 of every file a native run starts with, read as it starts (meta.json `ran`):
    `worker/<file>` of its bundle (bundle.json aside), `plan/<file>`, `program/<file>`. The host
    holds the worker's against what was deployed (edgebench.figures.run); runtime/sweep.sh records
    the same."""
    out: dict[str, str] = {}
    for prefix, folder in (("worker", spec.native_worker), ("plan", spec.native_plan), ("program", spec.program)):
        base = Path(folder) if folder else None
        if base is None or not base.is_dir():
            continue
        for path in sorted(p for p in base.rglob("*") if p.is_file() and p.name != BUNDLE_FACTS):
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            out[f"{prefix}/{path.relative_to(base).as_posix()}"] = digest.hexdigest()
    return out


def exec_prefix() -> dict[str, str]:
    """The environment that starts an aarch64 program on the arm64 lab's emulated device: its
    Python runs under qemu user-mode emulation without binfmt_misc, so the worker needs the same
    qemu in front (binfmt_misc's job on a host that has it). Empty everywhere else."""
    if not os.environ.get("EDGEBENCH_EMULATOR"):
        return {}
    qemu = Path(sys.executable).resolve().parent.parent / "tools" / "usr" / "bin" / "qemu-aarch64"
    return {"EDGEBENCH_EXEC_PREFIX": str(qemu)} if qemu.is_file() else {}


def command(spec: Any, out: str | Path) -> list[str]:
    """The worker's command line for `spec`, writing into run directory `out` (through the
    bundle's launcher, which replaces itself with the worker: the pid is the worker's)."""
    return ["sh", str(Path(spec.native_worker) / LAUNCHER), str(Path(spec.native_plan) / PLAN),
            "--program", str(spec.program), "--out", str(out)]
