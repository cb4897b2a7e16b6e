"""What each preset costs to learn: the tiny model on the synthetic task, each preset at its
default learning rate and at a small grid around it, run until a held-out target (or a cap
of steps), fresh runner process each. Prints, per preset, the learning rate that reached the
target in the fewest seconds (where none did: the lowest held-out loss at the cap), with its
steps, seconds, joules (the host's power model: an estimate) and peak RSS, and the default's
figures beside it, so no method is judged on a bad default (methods.optimizers' fresh_lr are
this benchmark's picks). Runs are interleaved (every preset at one lr, then the next lr) so
all see the same host load. Take it on a quiet host.

    .venv/bin/python bench/learning.py [--target loss=1.0] [--cap 200] [--methods a,b,...]
        [--grid 0.1,1,10] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

from edgebench.devices.profiles import load_profile
from edgebench.fleet.local import run_local
from edgebench.fleet.plan import for_device, ingest_runs
from edgebench.methods import PRESETS, MethodUnavailable, make_trainer, parse_method
from edgebench.methods.trainer import build_model_for
from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store
from edgebench.runner.spec import RunSpec

MODEL, BATCH, TEXT = "tiny", 8, 32
# one preset of each way of computing gradients and keeping optimizer state (`--methods` for all)
METHODS = ("sgd,sgd-momentum,adamw,adafactor,adamw-8bit,galore,lomo,lora,bitfit,freeze-vision,mezo,mezo-lora,"
           "forward-grad,cg")
MiB = 1 << 20


def default_lr(method: str) -> float:
    """The lr a run of `method` on tiny's fresh weights gets when none is given (the trainer's own
    choice; methods.optimizers' fresh_lr, which this benchmark's grid measures)."""
    parsed = parse_method(method)
    return make_trainer(parsed, build_model_for(parsed, MODEL), lr=None, total_steps=1, fresh_weights=True).lr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="loss=1.0", help="held-out target (edgebench bench --target)")
    parser.add_argument("--cap", type=int, default=200, help="steps at most")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-samples", type=int, default=32)
    parser.add_argument("--methods", default=METHODS, help=f"presets (all: {','.join(PRESETS)})")
    parser.add_argument("--grid", default="0.1,1,10", help="multiples of each preset's default lr")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    grid = [float(g) for g in args.grid.split(",")]
    defaults, unavailable = {}, {}
    for m in methods:
        try:
            defaults[m] = default_lr(m)
        except MethodUnavailable as exc:  # adalomo without CUDA: said, not run
            unavailable[m] = str(exc)
    methods = [m for m in methods if m in defaults]
    work = Path(tempfile.mkdtemp(prefix="edgebench-learning-"))
    asked = [RunSpec(model=MODEL, method=m, batch_size=BATCH * parse_method(m).accumulation, text_length=TEXT,
                     warmup_steps=0, steps=args.cap, lr=defaults[m] * g, eval_every=args.eval_every,
                     eval_samples=args.eval_samples, target=args.target, threads=2) for g in grid for m in methods]
    specs = for_device("local", load_profile("local"), asked)  # the host's sensors and power model, as bench's
    for spec in specs:
        spec.run_id = f"{spec.method}-x{spec.lr / defaults[spec.method]:.2g}"
    for i, spec in enumerate(specs, 1):
        result = run_local(spec, work / spec.run_id)
        got = f"reached after {result.get('steps_to_target')} steps" if result.get("target_reached") else "not reached"
        print(f"[{i}/{len(specs)}] {spec.method} lr {spec.lr:.3g}: {result['status']}, target {got}", flush=True)
    ingest_runs(work / "store.duckdb", [work / s.run_id for s in specs], "local")
    with Store(work / "store.duckdb", read_only=True) as store:
        rows = {r["run_id"]: r for r in all_metrics(store)}
    table = []
    for m in methods:
        runs = [(g, rows[f"{m}-x{g:.2g}"]) for g in grid]
        reached = [(g, r) for g, r in runs if r.get("target_reached")]
        # none reached the target within the cap: the lr that got nearest (lowest held-out loss)
        finite = [(g, r) for g, r in runs if r.get("eval_loss_last") is not None
                  and math.isfinite(r["eval_loss_last"])]
        best = (min(reached, key=lambda gr: gr[1]["time_to_target_s"]) if reached
                else min(finite, key=lambda gr: gr[1]["eval_loss_last"]) if finite else None)
        default = rows[f"{m}-x1"] if 1.0 in grid else None
        table.append({"method": m, "default_lr": defaults[m],
                      "best_lr": defaults[m] * best[0] if best else None,
                      "best_by": "time to target" if reached else "lowest held-out loss at the cap",
                      **{k: (best[1].get(k) if best else None) for k in
                         ("steps_to_target", "time_to_target_s", "energy_to_target_j_est", "peak_mem_bytes",
                          "eval_loss_last")},
                      "default_steps_to_target": default.get("steps_to_target") if default else None,
                      "eval_loss_last_at_default": default.get("eval_loss_last") if default else None,
                      "status_at_default": default.get("status") if default else None})
    if args.json:
        print(json.dumps({"target": args.target, "cap": args.cap, "grid": grid, "rows": table,
                          "unavailable": unavailable}, indent=2))
        return
    print(f"\ntiny, synthetic task, batch {BATCH}, target {args.target} held-out, cap {args.cap} steps, "
          f"lr grid x{args.grid} of each default; J est: the profile's power model (an estimate; - without one)")
    print(f"{'method':<14} {'default lr':>10} {'best lr':>9} {'steps':>6} {'s':>7} {'J est':>7} {'peak MiB':>8} "
          f"{'steps@default':>13} {'held-out loss':>13}  (* none reached: best = lowest held-out loss at the cap)")
    for r in table:
        def fmt(v, spec):
            return "-" if v is None else format(v, spec)
        print(f"{r['method']:<14} {r['default_lr']:>10.3g} {fmt(r['best_lr'], '>9.3g')} "
              f"{fmt(r['steps_to_target'], '>6d')} {fmt(r['time_to_target_s'], '>7.2f')} "
              f"{fmt(r['energy_to_target_j_est'], '>7.1f')} "
              f"{fmt(r['peak_mem_bytes'] and r['peak_mem_bytes'] / MiB, '>8.0f')} "
              f"{fmt(r['default_steps_to_target'], '>13d')} {fmt(r['eval_loss_last'], '>13.3f')}"
              f"{'' if r['best_by'] == 'time to target' else '  *'}")
    for m, why in unavailable.items():
        print(f"{m:<14} not run here: {why}")


if __name__ == "__main__":
    main()
