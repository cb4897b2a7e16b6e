"""A stand-in runner for live-view tests: writes a run directory in real time, the way the
runner does (meta first, samples and step events flushed per line, result.json last)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from edgebench.telemetry.trace import TraceWriter, write_json_atomic


def write_run(run_dir: Path, steps: int, step_s: float, sample_s: float, status: str = "ok",
              mem_total_bytes: int = 1 << 30, cgroup_limit_bytes: int | None = None) -> None:
    """A board's samples, or with `cgroup_limit_bytes` a lab device's (its cgroup's usage and limit)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic_ns()
    meta = {"run_id": run_dir.name, "spec": {"model": "tiny", "method": "lora", "backend": "eager", "steps": steps,
                                             "warmup_steps": 1, "batch_size": 2},
            "device": {"hostname": "writer", "mem_total_bytes": mem_total_bytes},
            "clock": {"start": {"mono_ns": t0, "wall_ns": time.time_ns()}}}
    write_json_atomic(run_dir / "meta.json", meta)
    samples, events = TraceWriter(run_dir / "samples.jsonl"), TraceWriter(run_dir / "events.jsonl")
    events.write({"t_ns": t0, "event": "load_begin"})
    events.write({"t_ns": time.monotonic_ns(), "event": "load_end"})
    schedule = [("warmup", 0)] + [("measure", i) for i in range(steps)]
    next_sample = time.monotonic()
    for i, (phase, step) in enumerate(schedule):
        begin = time.monotonic_ns()
        events.write({"t_ns": begin, "event": "step_begin", "step": step, "phase": phase})
        end_at = time.monotonic() + step_s
        while time.monotonic() < end_at:
            if time.monotonic() >= next_sample:
                rss = (100 << 20) + i * (7 << 20)  # the board's other processes and page cache use 50 MiB more
                samples.write({"t_ns": time.monotonic_ns(), "rss_bytes": rss, "mem_available_bytes":
                               mem_total_bytes - rss - (50 << 20), "power_w": 2.0 + 0.1 * i, "temp_c_max": 40.0 + i,
                               "cpu_proc_pct": 150.0, **({"cgroup_usage_bytes": rss + (20 << 20),
                                                          "cgroup_limit_bytes": cgroup_limit_bytes}
                                                         if cgroup_limit_bytes else {})})
                next_sample += sample_s
            time.sleep(0.005)
        end = time.monotonic_ns()
        events.write({"t_ns": end, "event": "step_end", "step": step, "phase": phase, "loss": 5.0 - 0.3 * i,
                      "duration_s": (end - begin) / 1e9})
    samples.close()
    events.close()
    write_json_atomic(
        run_dir / "result.json",
        {
            "status": status,
            "detail": "",
            "run_id": run_dir.name,
            "steps_done": steps,
            "peak_rss_bytes_sampled": (100 << 20) + steps * (7 << 20),
            "peak_rss_bytes_kernel": (104 << 20) + steps * (7 << 20),
            "step_time_s": {"median": step_s, "p90": step_s},
            "samples_per_s": 2 / step_s,
            "loss_first": 5.0,
            "loss_last": 5.0 - 0.3 * steps,
        },
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--step-s", type=float, default=0.3)
    p.add_argument("--sample-s", type=float, default=0.05)
    p.add_argument("--mem-total-bytes", type=int, default=1 << 30)
    p.add_argument("--cgroup-limit-bytes", type=int)
    a = p.parse_args()
    write_run(a.run_dir, a.steps, a.step_s, a.sample_s, mem_total_bytes=a.mem_total_bytes,
              cgroup_limit_bytes=a.cgroup_limit_bytes)
