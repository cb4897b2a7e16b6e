"""What the sampler costs a training step: median step time with the sampler off and at
20, 50 and 100 Hz, as ratios to "off", from one interleaved run per model.

Set up as the runner is: this process plays the supervisor (it owns the Sampler) and a
worker process trains (plain SGD on edgebench.model, batches from edgebench.data.synthetic).
Blocks of steps alternate between the settings, in a rotating order, so drift and the
other load on the machine fall on every setting alike. Target: < 1 % slowdown at 50 Hz.

    .venv/bin/python bench/sampler_overhead.py [--models tiny,nanovlm-222m] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from edgebench.telemetry.sampler import Sampler

SETTINGS = (None, 20.0, 50.0, 100.0)  # None: sampler off
DEFAULT_STEPS = {"tiny": 20, "nanovlm-222m": 2}  # steps per block


def worker(model_name: str) -> None:
    """Builds the model and answers each `N` on stdin with N step times (JSON) on stdout."""
    import time

    import torch

    from edgebench.data.synthetic import synthetic_batches, to_torch
    from edgebench.model import build_model

    torch.manual_seed(0)
    model = build_model(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = synthetic_batches(model.cfg, batch_size=1, text_length=32, seed=0)

    def step() -> float:
        batch = to_torch(next(batches))
        started = time.perf_counter()
        loss = model(batch["input_ids"], batch["images"], batch["labels"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    step(), step()  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps([step() for _ in range(int(line))]), flush=True)


def measure(model_name: str, rounds: int, steps: int) -> dict[float | None, dict]:
    child = subprocess.Popen([sys.executable, __file__, "--worker", model_name],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready", "worker failed to start"
    times: dict[float | None, list[float]] = {s: [] for s in SETTINGS}
    costs: dict[float | None, list[float]] = {s: [] for s in SETTINGS}
    worst: dict[float | None, float] = {s: 0.0 for s in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = SETTINGS[r % len(SETTINGS):] + SETTINGS[:r % len(SETTINGS)]
            for rate in order:
                sampler = Sampler(Path(tmp) / f"{rate}-{r}.jsonl", child.pid, rate_hz=rate).start() if rate else None
                child.stdin.write(f"{steps}\n")
                child.stdin.flush()
                times[rate] += json.loads(child.stdout.readline())
                if sampler:
                    summary = sampler.stop()
                    # Share of one core the sampler thread used: CPU per sample x samples per second.
                    costs[rate].append(summary["sample_cpu_us_mean"] * summary["achieved_hz"] / 1e4)
                    worst[rate] = max(worst[rate], summary["sample_cpu_us_max"])  # a sample with smaps_rollup
    child.stdin.close()
    child.wait()
    off = statistics.median(times[None])
    return {rate: {"median_s": statistics.median(t), "ratio": statistics.median(t) / off, "steps": len(t),
                   "sampler_core_pct": statistics.mean(costs[rate]) if costs[rate] else 0.0,
                   "worst_sample_ms": worst[rate] / 1e3}
            for rate, t in times.items()}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,nanovlm-222m")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None, help="steps per block (default: 20 tiny, 2 for 222m)")
    args = parser.parse_args()
    print(f"{'model':14s} {'sampler':>8s} {'steps':>5s} {'median_s':>9s} {'vs_off':>7s} {'sampler_core_%':>14s} "
          f"{'worst_sample_ms':>15s}")
    for model_name in args.models.split(","):
        steps = args.steps or DEFAULT_STEPS.get(model_name, 2)
        for rate, r in measure(model_name, args.rounds, steps).items():
            label = "off" if rate is None else f"{rate:.0f} Hz"
            print(f"{model_name:14s} {label:>8s} {r['steps']:5d} {r['median_s']:9.4f} {r['ratio']:7.3f} "
                  f"{r['sampler_core_pct']:14.2f} {r['worst_sample_ms']:15.1f}", flush=True)


if __name__ == "__main__":
    main()
