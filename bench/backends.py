"""Where each runtime stands: eager vs ExecuTorch (runtime kernels, XNNPACK; Python or native worker) vs ONNX Runtime.

For each model: export time, file sizes and planned memory (from the manifests), then
median step time and peak RSS (the kernel's VmHWM of a fresh process per run) from
one interleaved run: every round starts one process per variant in turn, so load from
other work hits all variants alike. Figures are printed as ratios to eager too.
Methods: SGD and AdamW (the updates every runtime has), batch 1, short text. Each row
names its lowering (from the export manifest): `executorch` runs everything on the
runtime's kernels (`linear` without weight transposes, the patch convolution as a matmul),
`executorch-xnnpack` (the device profiles' default) runs the matmuls and transposes in
XNNPACK with the weights as runtime inputs (the pip runtime's own matmul kernels are built
without AVX); `executorch-xnnpack-fp32` is that lowering with a bf16 method's values computed
in fp32, unrounded (export bf16 "fp32"; for fp32 methods the same program).
`executorch-native` runs the XNNPACK program in the native C++ worker (edgebench/native):
the same program and batches, no Python or torch in the process.

    .venv/bin/python bench/backends.py                       # tiny, SGD and AdamW
    .venv/bin/python bench/backends.py --models tiny,nanovlm-222m --variants eager,executorch-xnnpack,executorch-native
    .venv/bin/python bench/backends.py --models tiny,nanovlm-222m --methods sgd --rounds 3 --steps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

VARIANTS = {  # name -> (runtime backend, export backend, delegate, bf16 mode)
    "eager": ("eager", None, None, "rounded"),
    "executorch": ("executorch", "executorch", None, "rounded"),
    "executorch-xnnpack": ("executorch", "executorch", "xnnpack", "rounded"),
    "executorch-xnnpack-fp32": ("executorch", "executorch", "xnnpack", "fp32"),
    # the same program in the native worker (edgebench/native): no Python, no torch in the process
    "executorch-native": ("executorch", "executorch", "xnnpack", "rounded"),
    "onnxruntime": ("onnxruntime", "onnxruntime", None, "rounded"),
}

# One run in a fresh process: backend setup, warmup + measured steps, its own ru_maxrss.
# The ONNX Runtime child never imports torch (the config facts come from the manifest).
CHILD = r"""
import json, sys, time, types
from edgebench.backends import create
from edgebench.data.synthetic import synthetic_batches
from edgebench.runner.spec import RunSpec
spec = RunSpec.from_dict(json.loads(sys.argv[1]))
facts = json.loads(sys.argv[2])
cfg = types.SimpleNamespace(lm_vocab_size=facts["lm_vocab_size"], vit_img_size=facts["vit_img_size"])
batches = synthetic_batches(cfg, spec.batch_size, spec.text_length, spec.seed)
if spec.threads and spec.backend != "onnxruntime":
    import torch
    torch.set_num_threads(spec.threads)
backend = create(spec)
started = time.perf_counter()
backend.setup(spec, next(batches))
setup_s = time.perf_counter() - started
times, losses = [], []
for step in range(spec.warmup_steps + spec.steps):
    batch = next(batches)
    t = time.perf_counter()
    losses.append(backend.step(batch))
    if step >= spec.warmup_steps:
        times.append(time.perf_counter() - t)
# VmHWM, not ru_maxrss: ru_maxrss survives exec and starts at the (torch-laden) parent's RSS.
hwm_kib = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"setup_s": setup_s, "step_s": times, "losses": losses,
                  "peak_rss_bytes": hwm_kib * 1024,
                  "torch_imported": "torch" in sys.modules}))
"""


def export_variants(model: str, method: str, text_length: int, variants: list[str],
                    batch_size: int = 1) -> dict[str, dict]:
    """Each variant's export (in a process of its own, exporters.own_process: the bench's process
    stays small between its runs)."""
    from exporters.manifest import ExportRequest
    from exporters.pipeline import export

    out = {}
    for name in variants:
        _, backend, delegate, bf16 = VARIANTS[name]
        if backend is None:
            continue
        request = ExportRequest(model=model, method=method, backend=backend, delegate=delegate, bf16=bf16,
                                text_length=text_length, batch_size=batch_size)
        label = f"{model} {method} {name}"
        result = export(request, on_stage=lambda stage, label=label: print(f"  [{label}] {stage}", file=sys.stderr,
                                                                            flush=True))
        out[name] = {"directory": str(result.directory), "manifest": result.manifest, "cached": result.cached}
    return out


def run_native(spec: dict) -> dict:
    """One run of the native worker on the same batches (its plan skips the first batch, as the
    Python child's setup takes it): step times and losses from its events, its own VmHWM."""
    import tempfile

    from edgebench.native.build import bundle
    from edgebench.native.plan import write_plan
    from edgebench.runner.spec import RunSpec
    from exporters.manifest import cache_root

    run = RunSpec.from_dict({**spec, "runtime": "native"})
    plan = write_plan(run, cache_root())
    worker = bundle() / "edgebench-worker"
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([str(worker), str(plan / "plan.txt"), "--program", run.program, "--out", out],
                              capture_output=True, text=True)
        events = [json.loads(line) for line in Path(out, "events.jsonl").read_text().splitlines()]
    if proc.returncode != 0:
        return {"error": next((e["detail"] for e in events if "detail" in e), f"exit {proc.returncode}")}
    ends = [e for e in events if e["event"] == "step_end"]
    return {"setup_s": None, "step_s": [e["duration_s"] for e in ends if e["phase"] == "measure"],
            "losses": [e["loss"] for e in ends], "torch_imported": False,
            "peak_rss_bytes": next(e["vm_hwm_bytes"] for e in events if e["event"] == "memory")}


def run_child(spec: dict, facts: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec), json.dumps(facts)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_model(model: str, method: str, variants: list[str], rounds: int, steps: int, warmup: int,
                text_length: int, threads: int | None = None, batch_size: int = 1) -> dict:
    from edgebench.model.config import get_config

    cfg = get_config(model)
    facts = {"lm_vocab_size": cfg.lm_vocab_size, "vit_img_size": cfg.vit_img_size}
    exports = export_variants(model, method, text_length, variants, batch_size)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for round_index in range(rounds):
        for name in variants:  # interleaved: one process per variant per round
            runtime = VARIANTS[name][0]
            spec = {"model": model, "method": method, "backend": runtime, "text_length": text_length,
                    "batch_size": batch_size,
                    "warmup_steps": warmup, "steps": steps, "threads": threads,
                    "program": exports.get(name, {}).get("directory")}
            print(f"  [{model} {method}] round {round_index + 1}/{rounds}: {name}", file=sys.stderr)
            runs[name].append(run_native(spec) if name == "executorch-native" else run_child(spec, facts))
    rows = {}
    for name in variants:
        ok = [r for r in runs[name] if "error" not in r]
        manifest = exports.get(name, {}).get("manifest", {})
        rows[name] = {
            "error": next((r["error"] for r in runs[name] if "error" in r), None),
            "median_step_s": statistics.median(t for r in ok for t in r["step_s"]) if ok else None,
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ok) if ok else None,
            "first_losses": ok[0]["losses"][:3] if ok else None,
            "torch_imported": ok[0]["torch_imported"] if ok else None,
            "export_time_s": manifest.get("export_time_s"),
            "export_cached": exports.get(name, {}).get("cached"),
            "file_bytes": sum(f["bytes"] for f in manifest.get("files", {}).values()) or None,
            "planned_memory_bytes": manifest.get("planned_memory_bytes"),
            "lowering": manifest.get("lowering"),
            "losses": [r["losses"] for r in ok],
        }
    eager = rows.get("eager", {})
    for row in rows.values():
        for key in ("median_step_s", "peak_rss_bytes"):
            base, value = eager.get(key), row[key]
            row[f"{key}_vs_eager"] = round(value / base, 3) if base and value else None
        # Same spec, same batches: every step's loss against eager's (relative).
        base, mine = (eager.get("losses") or [None])[0], (row["losses"] or [None])[0]
        row["max_loss_rel_diff"] = (max(abs(x - y) / abs(y) for x, y in zip(mine, base))
                                    if base and mine else None)
    return rows


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    for title, rows in results.items():
        table = Table(title=f"{title}, batch 1 (ratios to eager from one interleaved run)")
        for col in ("variant", "step s", "x eager", "peak RSS MiB", "x eager", "export s", "files MiB",
                    "planned MiB", "loss[0]", "loss vs eager"):
            table.add_column(col, justify="left" if col == "variant" else "right")

        def fmt(value, scale=1.0, digits=3):
            return "-" if value is None else f"{value / scale:.{digits}f}"

        for name, r in rows.items():
            table.add_row(name, fmt(r["median_step_s"]), fmt(r["median_step_s_vs_eager"], digits=2),
                          fmt(r["peak_rss_bytes"], 2**20, 0), fmt(r["peak_rss_bytes_vs_eager"], digits=2),
                          fmt(r["export_time_s"], digits=1), fmt(r["file_bytes"], 2**20, 1),
                          fmt(r["planned_memory_bytes"], 2**20, 1),
                          r["error"] or ("-" if not r["first_losses"] else f"{r['first_losses'][0]:.4f}"),
                          "-" if r["max_loss_rel_diff"] is None else f"{r['max_loss_rel_diff']:.1e}")
        Console(width=None if sys.stdout.isatty() else 160).print(table)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options every interleaved-runs benchmark takes (this one and bench/exported.py)."""
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--text-length", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None,
                        help="Threads for every runtime (default: each one's own); 1 is fairer on a busy host.")
    parser.add_argument("--json", dest="json_out", default=None, help="Also write the figures to this file.")


def chosen(parser: argparse.ArgumentParser, text: str, known: Sequence[str], what: str) -> list[str]:
    """The comma-separated names in `text`, each one of `known` (else the usage error naming them)."""
    names = [n for n in text.split(",") if n]
    unknown = set(names) - set(known)
    if unknown:
        parser.error(f"unknown {what} {sorted(unknown)}; choose from {', '.join(known)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny")
    parser.add_argument("--methods", default="sgd,adamw", help="Comma-separated: sgd, adamw.")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3)
    add_run_options(parser)
    args = parser.parse_args()
    variants = chosen(parser, args.variants, VARIANTS, "variant(s)")
    results = {f"{m} {method}": bench_model(m, method, variants, args.rounds, args.steps, args.warmup,
                                            args.text_length, args.threads)
               for m in args.models.split(",") for method in args.methods.split(",")}
    render(results)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
