"""Median step time and peak RSS of AdamW and SGD on this host, tiny and nanovlm-222m, batch 1.

Prints, next to each measured peak, the weights + gradients + optimizer-state bytes the
method implies (fp32: 4 bytes per parameter each; AdamW keeps two state tensors, SGD none).
Each run is its own process (edgebench's runner), so peaks do not mix.

    .venv/bin/python bench/step_time.py [--models tiny,nanovlm-222m] [--steps 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from edgebench.fleet.local import run_local
from edgebench.fleet.plan import new_run_id
from edgebench.model.config import get_config, parameter_count
from edgebench.runner.spec import RunSpec

STATE_TENSORS = {"adamw": 2, "sgd": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,nanovlm-222m")
    parser.add_argument("--methods", default="adamw,sgd")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            n = parameter_count(get_config(model))
            for method in args.methods.split(","):
                spec = RunSpec(model=model, method=method, steps=args.steps, warmup_steps=1)
                spec.run_id = new_run_id("local", spec)
                result = run_local(spec, Path(tmp) / spec.run_id)
                implied = 4 * n * (2 + STATE_TENSORS[method])
                median = (result.get("step_time_s") or {}).get("median")
                rows.append((model, method, result["status"], median, result.get("peak_rss_bytes_kernel"),
                             implied, n))
                print(f"{model:14s} {method:6s} {result['status']:6s} "
                      f"median {median if median is None else f'{median:.4f}'} s  "
                      f"peak RSS {result.get('peak_rss_bytes_kernel', 0) / 2**20:,.0f} MiB  "
                      f"weights+grads+state {implied / 2**20:,.0f} MiB ({n:,} params)", flush=True)
    print("\nmodel          method status median_s  peak_rss_MiB  implied_MiB  peak-implied_MiB")
    for model, method, status, median, peak, implied, _ in rows:
        med = "-" if median is None else f"{median:.4f}"
        print(f"{model:14s} {method:6s} {status:6s} {med:>8s}  {(peak or 0) / 2**20:12,.0f}  "
              f"{implied / 2**20:11,.0f}  {((peak or 0) - implied) / 2**20:16,.0f}")


if __name__ == "__main__":
    main()
