"""The study's first table: every method fine-tuning nanovlm-222m at batch 1 on this host.

For each preset (and a few combinations) one fresh runner process (`python -m edgebench.runner`)
measures the kernel peak RSS (ru_maxrss), the median step time and the loss; the memory model's
prediction (an estimate) stands beside it. Methods that store frozen weights in bf16/int8 build
the model in bf16 (the eager backend does), so loading never holds fp32 weights.

    .venv/bin/python bench/methods.py [--model nanovlm-222m] [--steps 3] [--methods a,b,...]

Heavy: full AdamW on 222M takes 2-5 s a step and ~4 GB; run it when the host is quiet.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgebench.methods import PRESETS, memory, parse_method
from edgebench.fleet.local import run_local
from edgebench.runner.spec import RunSpec

EXTRA = ["mezo-lora+frozen-int8", "lora+ckpt+frozen-int8"]
GiB = 1 << 30


def run_one(model: str, name: str, steps: int, out: Path) -> dict:
    method = parse_method(name)
    batch = method.accumulation  # accumN splits the batch: its smallest batch is N
    spec = RunSpec(model=model, method=name, batch_size=batch, text_length=32,
                   warmup_steps=1, steps=steps, threads=2, timeout_s=600, run_id=name.replace("+", "_"))
    result = run_local(spec, out / "runs" / spec.run_id)
    predicted = memory.predict(model, method, batch, 32)
    return {"method": name, "batch_size": batch, "status": result.get("status"),
            "peak_rss_bytes_kernel": result.get("peak_rss_bytes_kernel"),
            "predicted_peak_bytes_est": predicted["peak_bytes"],
            "step_time_s_median": (result.get("step_time_s") or {}).get("median"),
            "loss_first": result.get("loss_first"), "loss_last": result.get("loss_last"),
            "detail": result.get("detail", "")}


def render(rows: list[dict], model: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model}, batch 1, this host (predicted = estimate)")
    for col in ("method", "status", "peak RSS MiB", "predicted MiB (est.)", "pred. error",
                "median step s", "loss first -> last"):
        table.add_column(col)
    for r in rows:
        peak, pred = r["peak_rss_bytes_kernel"], r["predicted_peak_bytes_est"]
        error = f"{(pred - peak) / peak:+.0%}" if peak else "-"
        loss = "-" if r["loss_first"] is None else f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"
        step = "-" if r["step_time_s_median"] is None else f"{r['step_time_s_median']:.2f}"
        name = r["method"] + (f" (batch {r['batch_size']})" if r["batch_size"] != 1 else "")
        table.add_row(name, r["status"], "-" if not peak else f"{peak / 2**20:,.0f}",
                      f"{pred / 2**20:,.0f}", error, step, loss)
    Console().print(table)
    fits = [r["method"] for r in rows if r["peak_rss_bytes_kernel"] and r["peak_rss_bytes_kernel"] <= GiB
            and r["loss_last"] is not None and r["loss_last"] < r["loss_first"]]
    print(f"fine-tune within 1 GiB peak RSS while the loss falls: {', '.join(fits) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nanovlm-222m")
    parser.add_argument("--steps", type=int, default=3, help="measured steps after one warmup step")
    parser.add_argument("--methods", default=",".join(list(PRESETS) + EXTRA))
    parser.add_argument("--out", default="runs/bench-methods")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.methods.split(","):
        rows.append(run_one(args.model, name, args.steps, out))
        (out / "methods.json").write_text(json.dumps(rows, indent=2))
        print(json.dumps(rows[-1]), flush=True)
    render(rows, args.model)


if __name__ == "__main__":
    main()
