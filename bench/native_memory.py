"""The native worker's predicted peak (edgebench.native.memory, from each method's exported
program) against the peak the kernel measured (the worker's own VmHWM): issue 54 asks for
within 10 % on tiny and nanovlm-222m for sgd, adamw, lora and mezo.

Runs `edgebench bench --backend executorch --runtime native` (exports cached) for each model
and prints, per method, the prediction, the measured peak, their ratio and the prediction's
parts, then what fills each program's planned arena at its fullest instruction
(exporters.plan_parts). Memory does not depend on the host being quiet; the exports of
nanovlm-222m take a few minutes the first time.

    .venv/bin/python bench/native_memory.py                                 # tiny and nanovlm-222m
    .venv/bin/python bench/native_memory.py --models tiny --methods sgd,mezo --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from exporters.plan_parts import PARTS

MiB = 1 << 20
TARGET = 0.10


def measure(model: str, methods: str, steps: int) -> list[dict]:
    """One bench sweep of the native worker; its results (JSON) with the prediction's parts."""
    from edgebench.methods import parse_method
    from edgebench.native.memory import predict_for

    with tempfile.TemporaryDirectory(prefix="native-memory-") as runs:
        out = subprocess.run(
            [sys.executable, "-m", "edgebench.cli", "bench", "--device", "local", "--model", model,
             "--methods", methods, "--backend", "executorch", "--runtime", "native", "--steps", str(steps),
             "--warmup", "1",
             "--runs-dir", runs, "--force", "--json"], capture_output=True, text=True)
        if out.returncode not in (0, 1):
            sys.exit(f"bench failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
        rows = json.loads(out.stdout)
        for row in rows:
            program = json.loads((Path(row["run_dir"]) / "meta.json").read_text())["spec"]["program"]
            row["parts"] = predict_for(program, parse_method(row["method"]))
            row["arena_parts"] = json.loads((Path(program) / "manifest.json").read_text())["planned_memory_parts"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,nanovlm-222m")
    parser.add_argument("--methods", default="sgd,adamw,lora,mezo")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    table = []
    for model in args.models.split(","):
        for row in measure(model, args.methods, args.steps):
            predicted, measured = row.get("predicted_peak_bytes_est"), row.get("peak_rss_bytes_kernel")
            ratio = predicted / measured if predicted and measured else None
            table.append({"model": model, "method": row["method"], "status": row["status"],
                          "predicted_bytes_est": predicted, "measured_bytes": measured, "ratio": ratio,
                          "parts": {k: v for k, v in row["parts"].items() if k.endswith("_bytes")},
                          "arena_parts": row["arena_parts"]})
    print(f"{'model':14} {'method':8} {'status':8} {'predicted MiB':>14} {'measured MiB':>13} {'ratio':>7}  "
          "parts (MiB)")
    for r in table:
        parts = ", ".join(f"{k[:-6].replace('_', ' ')} {v / MiB:,.1f}" for k, v in r["parts"].items()
                          if v and k != "peak_bytes")
        pred = f"{r['predicted_bytes_est'] / MiB:,.1f}" if r["predicted_bytes_est"] else "-"
        meas = f"{r['measured_bytes'] / MiB:,.1f}" if r["measured_bytes"] else "-"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        print(f"{r['model']:14} {r['method']:8} {r['status']:8} {pred:>14} {meas:>13} {ratio:>7}  {parts}")
    print("\nthe planned arena at its fullest instruction (exporters.plan_parts), MiB:")
    for r in table:
        arena = r["arena_parts"]
        parts = ", ".join(f"{k.replace('_', ' ')} {arena[f'{k}_bytes'] / MiB:,.1f}" for k in PARTS
                          if arena[f"{k}_bytes"])
        print(f"{r['model']:14} {r['method']:8} arena {arena['arena_bytes'] / MiB:,.1f} = {parts}, "
              f"packing {arena['packing_bytes'] / MiB:,.1f} (instruction {arena['peak_instruction']} of "
              f"{arena['instructions']}, loss at {arena['loss_instruction']})")
    worst = max((abs(r["ratio"] - 1) for r in table if r["ratio"]), default=None)
    print(f"largest error: {worst:.1%} (target {TARGET:.0%})" if worst is not None else "no run measured")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
