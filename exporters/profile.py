"""`edgebench export --profile`: where an exported training step's time and memory go.

The program runs a few steps in a fresh process with ExecuTorch's own per-operator
profiler (ETDump, read by `executorch.devtools.Inspector`); the same steps run eagerly in
torch under `torch.profiler` in another fresh process. Each process's peak RSS (VmHWM) is
its own. Memory is split into what is known exactly (weights, gradients, optimizer state,
the program's static memory plan) and the remainder of the peak (runtime, imports,
eager's activations and allocator), labelled as a remainder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from edgebench.runner.spec import RunSpec

PROFILE = "profile.json"
# Runtime events in an ETDump that are phases, not operators.
_PHASES = {"Method::execute": "execute", "Program::load_method": "load", "Method::init": "load"}
_WRAPPERS = {"OPERATOR_CALL"}  # an instruction's wrapper event around its native_call_* one
# Optimizer state tensors per trainable element (float32), by the methods' optimizer knob.
_STATE_PER_ELEMENT = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
TOP = 12


def _vm(field: str) -> int:
    """VmRSS / VmHWM of this process in bytes (the kernel's accounting)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def _spec(manifest: dict[str, Any], directory: str, backend: str, steps: int, warmup: int,
          threads: int | None) -> RunSpec:
    from edgebench.runner.spec import RunSpec

    request = manifest["request"]
    return RunSpec(model=request["model"], method=request["method"], backend=backend,
                   batch_size=request["batch_size"], image_size=request["image_size"],
                   text_length=request["text_length"], seed=request["seed"], warmup_steps=warmup,
                   steps=steps, threads=threads, program=directory if backend != "eager" else None,
                   weight_decay=request.get("weight_decay"))  # the export's (baked into a fused update)


def _batches(manifest: dict[str, Any], spec: RunSpec) -> Iterator[dict[str, np.ndarray]]:
    from types import SimpleNamespace

    from edgebench.data.synthetic import synthetic_batches

    model = manifest["model"]
    cfg = SimpleNamespace(lm_vocab_size=model["lm_vocab_size"], vit_img_size=model["vit_img_size"])
    # a VLMConfig's two fields synthetic_batches reads (the manifest's model facts hold them)
    return synthetic_batches(cfg, spec.batch_size, spec.text_length, spec.seed)  # type: ignore[arg-type]


def _etdump_ops(path: str, executions: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(operators by total time, phase seconds) from an ETDump, per execution of the step."""
    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=path)
    total_ms: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    phases: dict[str, float] = defaultdict(float)
    for block in inspector.event_blocks:
        for event in block.events:
            if not event.perf_data:
                continue
            ms = float(sum(event.perf_data.raw))
            if event.name in _PHASES:
                phases[_PHASES[event.name]] += ms / 1e3
            elif event.name not in _WRAPPERS:
                name = event.name.removeprefix("native_call_")
                total_ms[name] += ms
                calls[name] += len(event.perf_data.raw)
    ops = [{"name": n, "s_per_step": round(total_ms[n] / 1e3 / executions, 4),
            "calls_per_step": round(calls[n] / executions, 1)}
           for n in sorted(total_ms, key=lambda n: total_ms[n], reverse=True)]
    return ops, {"load_s": round(phases["load"], 3), "execute_s_per_step": round(phases["execute"] / executions, 4)}


def _child_executorch(directory: str, steps: int, warmup: int, threads: int | None) -> dict[str, Any]:
    import torch

    from edgebench.backends.executorch import ExecutorchBackend, TrainingProgram, _as_inputs
    from edgebench.backends.program import BATCH_INPUTS

    manifest = json.loads((Path(directory) / "manifest.json").read_text())
    spec = _spec(manifest, directory, "executorch", steps, warmup, threads)
    if threads:
        torch.set_num_threads(threads)  # the update's torch ops; the runtime's pool is set in setup
    batches = _batches(manifest, spec)
    imports = _vm("VmRSS")
    backend = ExecutorchBackend(etdump=True)
    started = time.perf_counter()
    backend.setup(spec, next(batches))
    load_s = time.perf_counter() - started
    step_s, program_s, update_s = [], [], []
    for step in range(warmup + steps):
        inputs = _as_inputs(next(batches))
        t0 = time.perf_counter()
        if backend.update is None or backend.stepper is not None:  # MeZO (two program calls), a program
            # that updates itself, accumN's N calls, the fused per-parameter update: timed whole
            backend.step(dict(zip(BATCH_INPUTS, inputs)))
            t1 = time.perf_counter()
        else:  # an update between calls: the module is a TrainingProgram (setup's other kinds step whole)
            module = backend.module
            assert isinstance(module, TrainingProgram)
            module.forward_backward(inputs)
            t1 = time.perf_counter()
            backend.update.step(module.named_parameters(), module.grads)
        t2 = time.perf_counter()
        if step >= warmup:
            step_s.append(t2 - t0)
            program_s.append(t1 - t0)
            update_s.append(t2 - t1)
    peak = _vm("VmHWM")
    state = 0
    optimizer = getattr(backend.update, "torch_optimizer", None)
    if optimizer is not None:
        state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                    for t in s.values() if isinstance(t, torch.Tensor))
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "step.etdump")
        backend.runtime_module.write_etdump_result_to_file(path)
        executions = (warmup + steps) * (2 if backend.mezo is not None else 1)
        ops, phases = _etdump_ops(path, executions)
    return {"load_s": round(load_s, 3), "step_s": _median(step_s), "program_s": _median(program_s),
            "update_s": _median(update_s), "peak_rss_bytes": peak, "imports_rss_bytes": imports,
            "optimizer_state_bytes": state, "top_ops": ops[:TOP], "etdump": phases,
            "lowering": backend.lowering}


def _child_eager(directory: str, steps: int, warmup: int, threads: int | None) -> dict[str, Any]:
    import torch

    from edgebench.backends import create

    manifest = json.loads((Path(directory) / "manifest.json").read_text())
    spec = _spec(manifest, directory, "eager", steps, warmup, threads)
    if threads:
        torch.set_num_threads(threads)
    batches = _batches(manifest, spec)
    imports = _vm("VmRSS")
    backend = create(spec)
    started = time.perf_counter()
    backend.setup(spec, next(batches))
    load_s = time.perf_counter() - started
    for _ in range(warmup):
        backend.step(next(batches))
    step_s = []
    for _ in range(steps):  # timed without the profiler's overhead
        t0 = time.perf_counter()
        backend.step(next(batches))
        step_s.append(time.perf_counter() - t0)
    peak = _vm("VmHWM")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            backend.step(next(batches))
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    ops = [{"name": e.key, "s_per_step": round(e.self_cpu_time_total / 1e6 / steps, 4),
            "calls_per_step": round(e.count / steps, 1)} for e in rows[:TOP]]
    return {"load_s": round(load_s, 3), "step_s": _median(step_s), "peak_rss_bytes": peak,
            "imports_rss_bytes": imports, "top_ops": ops}


def _median(values: list[float]) -> float | None:
    return round(sorted(values)[len(values) // 2], 4) if values else None


def _memory(manifest: dict[str, Any], run: dict[str, Any], runtime: str) -> dict[str, Any]:
    """Bytes by kind. Exact: weights, gradients, optimizer state, planned arena; the rest of
    the peak is a remainder (not measured apart)."""
    facts = manifest["model"]
    weights = 4 * facts["parameters"]
    gradients = 4 * facts["trainable_elements"]
    knobs = manifest["method"]["knobs"]
    per = _STATE_PER_ELEMENT.get(knobs.get("optimizer"))
    state = run.get("optimizer_state_bytes") if runtime == "executorch" else (
        None if per is None else per * 4 * facts["trainable_elements"])
    if knobs.get("grad_mode") == "zeroth-order":
        gradients, state = 0, 0
    out = {"peak_rss": run["peak_rss_bytes"], "imports": run["imports_rss_bytes"], "weights": weights,
           "gradients": gradients, "optimizer_state": state}
    known = run["imports_rss_bytes"] + weights + (state or 0)
    if runtime == "executorch" and manifest.get("program") == "forward-backward":
        # The runtime keeps trainable weights in the plan (initialised from the .pte, whose
        # constant pages it then drops); frozen ones stay constants of the mapped .pte.
        planned = manifest.get("planned_memory_bytes") or 0
        trainable = 4 * facts["trainable_elements"]
        out["planned_arena"] = planned
        out["activations_in_arena_estimate"] = max(planned - trainable - gradients, 0)
        out["remainder"] = run["peak_rss_bytes"] - (known - trainable) - planned
        out["note"] = ("planned_arena holds the trainable weights, the gradients and every "
                       "activation/temporary; remainder = peak - imports - frozen weights - "
                       "optimizer state - arena")
    elif runtime == "executorch":
        planned = manifest.get("planned_memory_bytes") or 0
        out["planned_arena"] = planned
        out["activations_in_arena_estimate"] = planned
        out["remainder"] = run["peak_rss_bytes"] - known - planned
        out["note"] = "forward-only program: weights are inputs held by Python; the arena is activations"
    else:
        out["remainder"] = run["peak_rss_bytes"] - known - gradients
        out["note"] = "remainder = activations, allocator caches and runtime (peak - the rest)"
    return out


def _run_child(kind: str, directory: Path, steps: int, warmup: int, threads: int | None) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "exporters.profile", kind, str(directory), str(steps), str(warmup),
                           str(threads or 0)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])  # the child's result
    return result


def profile_export(directory: str | Path, steps: int = 3, warmup: int = 1, eager: bool = True,
                   threads: int | None = None,
                   on_stage: Callable[[str], None] = lambda stage: None) -> dict[str, Any]:
    """Profiles the exported program at `directory` (and eager for the same request);
    writes `profile.json` there and returns it. `threads`: for both runtimes (default:
    each one's own)."""
    directory = Path(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    if manifest["backend"] != "executorch":
        raise ValueError(f"{directory}: --profile reads ExecuTorch programs (ETDump); this is {manifest['backend']}")
    result: dict[str, Any] = {"steps": steps, "warmup": warmup, "threads": threads, "key": manifest["key"]}
    kinds = ["executorch"] + (["eager"] if eager else [])
    for kind in kinds:
        on_stage(f"profile {kind}")
        run = _run_child(kind, directory, steps, warmup, threads)
        if "error" not in run:
            run["memory"] = _memory(manifest, run, kind)
        result[kind] = run
    et, ref = result.get("executorch", {}), result.get("eager", {})
    if et.get("step_s") and ref.get("step_s"):
        result["step_vs_eager"] = round(et["step_s"] / ref["step_s"], 3)
        result["peak_rss_vs_eager"] = round(et["peak_rss_bytes"] / ref["peak_rss_bytes"], 3)
    (directory / PROFILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _main() -> None:
    kind, directory, steps, warmup, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    child = _child_executorch if kind == "executorch" else _child_eager
    print(json.dumps(child(directory, steps, warmup, threads or None)))


if __name__ == "__main__":
    _main()
