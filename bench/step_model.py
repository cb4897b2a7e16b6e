"""The step-time model (edgebench.methods.steptime, an estimate) against measured step times.

Runs every preset eagerly on this host (each in its own process, edgebench's runner; one
warm-up step, then `--steps` measured), and prints for each its measured median step time, the
measured ratio to SGD's and the model's predicted ratio, and the model's error
(predicted / measured - 1). The target: every preset within +-30 % on nanovlm-222m. SGD runs
first and again last; the ratio uses the mean of its two medians, and both are printed, so a
host that changed speed mid-run shows. A preset with N micro-batches (accumN) runs at batch N,
against an SGD run at batch N. Take it on a quiet host.

It measures this host's rates first (methods.device_speed), which the model weighs its terms by.
`--updates` times each per-step optimizer's update over the model's weights instead and prints
it in elementwise passes (the optimizer descriptors' `update_passes`).

    .venv/bin/python bench/step_model.py [--model nanovlm-222m] [--methods ...] [--steps 4] [--json]
    .venv/bin/python bench/step_model.py --updates
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from edgebench.fleet.local import run_local
from edgebench.fleet.plan import new_run_id
from edgebench.methods import PRESETS, parse_method
from edgebench.methods.device_speed import host_speed
from edgebench.methods.steptime import relative_step_time
from edgebench.model.config import get_config
from edgebench.runner.spec import RunSpec

TARGET = 0.30
NEEDS_CUDA = {"adalomo"}  # lomo-optim's AdaLomo allocates its state with .cuda()


def measure(model: str, method: str, steps: int, batch_size: int, text_length: int, tmp: Path) -> dict[str, Any]:
    spec = RunSpec(model=model, method=method, steps=steps, warmup_steps=1, batch_size=batch_size,
                   text_length=text_length)
    spec.run_id = new_run_id("local", spec)
    started = time.monotonic()
    result = run_local(spec, tmp / spec.run_id)
    median = (result.get("step_time_s") or {}).get("median")
    return {"method": method, "batch_size": batch_size, "status": result["status"], "median_s": median,
            "wall_s": round(time.monotonic() - started, 1), "detail": result.get("detail")}


def print_update_passes(model: str, speed) -> int:
    """Each per-step optimizer's update over `model`'s weights (random gradients; the fastest of
    three after the one that makes its state), in elementwise passes at this host's rate."""
    from edgebench.methods import make_trainer
    from edgebench.methods.optimizers import OPTIMIZERS
    from edgebench.model import build_model

    for name, opt in OPTIMIZERS.items():
        if opt.trainer != "step":
            continue  # its trainer owns the update (lomo, cg): fitted from whole steps
        net = build_model(model)
        trainer = make_trainer(name, net, total_steps=10)  # each such optimizer is a preset too
        params = [p for p in net.parameters() if p.requires_grad]
        best = float("inf")
        for _ in range(4):
            for p in params:
                p.grad = torch.randn_like(p) * 1e-3
            started = time.perf_counter()
            trainer.optimizer.step()
            best = min(best, time.perf_counter() - started)
        weights = sum(p.numel() for p in params)
        print(f"{name:<14} {best:7.3f} s over {weights / 1e6:.1f} M weights: "
              f"{best / weights * 1e9 / speed.pass_ns:5.1f} passes")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="nanovlm-222m")
    parser.add_argument("--methods", help="comma-separated presets (default: every preset this host runs)")
    parser.add_argument("--steps", type=int, default=4)  # fewer: one slow step sways the median
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--text-length", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--updates", action="store_true",
                        help="instead: time each optimizer's update over the model's weights, in passes "
                             "(the descriptors' update_passes)")
    args = parser.parse_args()
    methods = args.methods.split(",") if args.methods else [
        m for m in PRESETS if m != "sgd" and (m not in NEEDS_CUDA or torch.cuda.is_available())]
    cfg = get_config(args.model)
    speed = host_speed()
    print(f"  this host's rates (methods.device_speed): {speed}", file=sys.stderr)
    if args.updates:
        return print_update_passes(args.model, speed)
    batch_of = {m: max(args.batch_size, parse_method(m).accumulation) for m in methods}
    references = {}  # SGD's median at a batch other than --batch-size (accumN's)
    with tempfile.TemporaryDirectory() as tmp:

        def run(method: str, batch_size: int) -> dict[str, Any]:
            row = measure(args.model, method, args.steps, batch_size, args.text_length, Path(tmp))
            print(f"  {method} at batch {batch_size}: {row['status']} median {row['median_s']} s "
                  f"({row['wall_s']} s in all)", file=sys.stderr, flush=True)
            return row

        first = run("sgd", args.batch_size)
        table = [run(m, batch_of[m]) for m in methods]
        for batch_size in sorted(set(batch_of.values()) - {args.batch_size}):
            references[batch_size] = run("sgd", batch_size)["median_s"]
        last = run("sgd", args.batch_size)
    sgd_first, sgd_last = first["median_s"], last["median_s"]
    references[args.batch_size] = (sgd_first + sgd_last) / 2 if sgd_first and sgd_last else None
    for row in table:
        batch_size = row["batch_size"]
        predicted = relative_step_time(cfg, parse_method(row["method"]), batch_size, args.text_length, speed)
        row["predicted_ratio_est"] = None if predicted is None else round(predicted, 3)
        sgd = references[batch_size]
        if sgd and row["median_s"] and predicted is not None:
            row["measured_ratio"] = round(row["median_s"] / sgd, 3)
            row["model_error"] = round(predicted / row["measured_ratio"] - 1, 3)
    within = [r for r in table if r.get("model_error") is not None and abs(r["model_error"]) <= TARGET]
    summary = {"model": args.model, "batch_size": args.batch_size, "text_length": args.text_length,
               "speed": asdict(speed),
               "sgd_median_s": [sgd_first, sgd_last], "sgd_median_s_by_batch": references, "target": TARGET,
               "within_target": len(within),
               "measured": sum(r.get("model_error") is not None for r in table), "rows": table}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"\n{args.model}, batch {args.batch_size}, text {args.text_length}: SGD median {sgd_first} s "
          f"(first) / {sgd_last} s (last)")
    width = max(15, *(len(r["method"]) for r in table))
    print(f"{'method':<{width}} {'batch':>5} {'status':<8} {'median_s':>9} {'measured':>9} {'predicted (est)':>16} "
          f"{'error':>7}")
    for r in table:
        median = f"{r['median_s']:.3f}" if r["median_s"] else "-"
        print(f"{r['method']:<{width}} {r['batch_size']:>5} {r['status']:<8} {median:>9} "
              f"{r.get('measured_ratio', '-'):>9} {r['predicted_ratio_est'] or '-':>16} {r.get('model_error', '-'):>7}")
    print(f"within +-{TARGET:.0%}: {len(within)} of {summary['measured']} measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
