"""How the results store scales: ingest and metric time for 1M and 10M samples across 20 runs.

Writes 20 synthetic run directories shaped like the runner's (sparse sample lines with
the sampler's fields at 20 Hz, 2 s steps), ingests them into a fresh DuckDB store, and
computes every run's metrics. Also times re-ingesting one run (idempotent replace) and
one killed run whose last line is truncated. Wall times depend on what else runs; the
CPU times (all threads of this process, DuckDB's included) less so. DuckDB parses
samples.jsonl and events.jsonl itself (one DuckDB thread; the key check counts on
another core meanwhile). Target: 10M samples in under 10 s.

    .venv/bin/python bench/ingest.py                 # 1M and 10M samples (10M takes minutes)
    .venv/bin/python bench/ingest.py --samples 1000000 --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store
from edgebench.telemetry.trace import write_json_atomic

SAMPLE_HZ = 20
STEP_S = 2.0
FULL = ('{{"t_ns":{t},"rss_bytes":{rss},"uss_bytes":{uss},"pss_bytes":{pss},"mem_available_bytes":2000000000,'
        '"cgroup_usage_bytes":{cg},"cgroup_peak_bytes":{cg},"cpu_proc_pct":{cpu:.1f},"cpu_sys_pct":97.5,'
        '"power_w":{p:.3f},"rail_vdd_in_w":{p:.3f},"temp_c_max":{temp:.1f},"temp_cpu_c":{temp:.1f},"throttle_flags":0}}\n')
SPARSE = '{{"t_ns":{t},"rss_bytes":{rss},"cgroup_usage_bytes":{cg},"power_w":{p:.3f}}}\n'


def write_run(root: Path, index: int, n_samples: int) -> Path:
    """One run directory with n_samples sample lines (every other line sparse, as the sampler writes)."""
    run = root / f"run-{index:02d}"
    run.mkdir(parents=True)
    mono0, period = 10**12 + index * 10**9, 10**9 // SAMPLE_HZ
    per_step = int(SAMPLE_HZ * STEP_S)
    n_steps = max(1, n_samples // per_step - 1)
    write_json_atomic(run / "meta.json", {
        "run_id": run.name, "spec": {"model": "tiny", "method": f"m{index % 5}", "backend": "eager", "batch_size": 2,
                                     "text_length": 32, "steps": n_steps, "warmup_steps": 1},
        "device": {"mem_total_bytes": 8 << 30},
        "clock": {"start": {"mono_ns": mono0, "wall_ns": mono0 + 1_790_000_000 * 10**9}}})
    with open(run / "samples.jsonl", "w") as fh:
        chunk = []
        for i in range(n_samples):
            rss = 300_000_000 + (i % 4000) * 10_000 + index * 1_000_000
            fmt = FULL if i % 2 == 0 else SPARSE
            chunk.append(
                fmt.format(
                    t=mono0 + i * period,
                    rss=rss,
                    uss=rss - 50_000_000,
                    pss=rss - 20_000_000,
                    cg=rss + 80_000_000,
                    cpu=150 + i % 50,
                    p=4 + (i % 40) / 10,
                    temp=50 + (i % 600) / 60,
                )
            )
            if len(chunk) == 100_000:
                fh.write("".join(chunk))
                chunk.clear()
        fh.write("".join(chunk))
    with open(run / "events.jsonl", "w") as fh:
        t = mono0 + period
        fh.write(json.dumps({"t_ns": mono0, "event": "load_begin"}) + "\n")
        for s in range(n_steps + 1):
            phase, step = ("warmup", 0) if s == 0 else ("measure", s)
            end = t + int(STEP_S * 1e9) - 1000
            fh.write(f'{{"t_ns":{t},"event":"step_begin","step":{step},"phase":"{phase}"}}\n'
                     f'{{"t_ns":{end},"event":"step_end","step":{step},"phase":"{phase}","loss":{5 - s * 1e-4:.5f},'
                     f'"duration_s":{(end - t) / 1e9}}}\n')
            t = end + 1000
    write_json_atomic(run / "result.json", {"status": "ok", "run_id": run.name, "steps_done": n_steps})
    return run


def bench(total: int, runs: int, work: Path) -> dict:
    src = work / f"src-{total}"
    t = time.perf_counter()
    dirs = [write_run(src, i, total // runs) for i in range(runs)]
    gen_s = time.perf_counter() - t
    size = sum(p.stat().st_size for d in dirs for p in d.iterdir())
    store_path = work / f"store-{total}.duckdb"
    with Store(store_path) as store:
        t, cpu = time.perf_counter(), time.process_time()
        for d in dirs:
            store.ingest_run(d, device="bench", keep_raw=False)
        ingest_s, ingest_cpu_s = time.perf_counter() - t, time.process_time() - cpu
        t = time.perf_counter()
        store.ingest_run(dirs[0], device="bench", keep_raw=False)
        reingest_one_s = time.perf_counter() - t
        t, cpu = time.perf_counter(), time.process_time()
        rows = all_metrics(store)
        metrics_s, metrics_cpu_s = time.perf_counter() - t, time.process_time() - cpu
        count = store.con.execute("SELECT count(*) FROM samples").fetchall()[0][0]
    assert count == total // runs * runs and len(rows) == runs, (count, len(rows))
    with open(dirs[1] / "samples.jsonl", "a") as fh:  # a killed runner: truncated last line
        fh.write('{"t_ns": 1, "rss_by')
    with Store(store_path) as store:
        t = time.perf_counter()
        store.ingest_run(dirs[1], device="bench", keep_raw=False)
        truncated_one_s = time.perf_counter() - t
    out = {"samples": total, "runs": runs, "trace_mib": round(size / 2**20, 1),
           "generate_s": round(gen_s, 2), "ingest_s": round(ingest_s, 2),
           "ingest_samples_per_s": round(total / ingest_s), "ingest_cpu_s": round(ingest_cpu_s, 2),
           "metrics_s": round(metrics_s, 2), "metrics_cpu_s": round(metrics_cpu_s, 2),
           "reingest_one_run_s": round(reingest_one_s, 3), "ingest_truncated_run_s": round(truncated_one_s, 3),
           "store_mib": round(store_path.stat().st_size / 2**20, 1)}
    shutil.rmtree(src)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", default="1000000,10000000", help="comma-separated totals (default 1M,10M)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--dir", type=Path, help="work directory (default: a temporary one, removed after)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args()
    work = a.dir or Path(tempfile.mkdtemp(prefix="edgebench-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for total in (int(s) for s in a.samples.split(",")):
            results.append(bench(total, a.runs, work))
            if not a.json:
                r = results[-1]
                print(
                    f"{r['samples']:>10,} samples / {r['runs']} runs ({r['trace_mib']} MiB of JSONL): ingest "
                    f"{r['ingest_s']} s ({r['ingest_samples_per_s']:,} samples/s; CPU {r['ingest_cpu_s']} s), "
                    f"metrics {r['metrics_s']} s (CPU {r['metrics_cpu_s']} s), "
                    f"re-ingest one run {r['reingest_one_run_s']} s, "
                    f"one truncated run {r['ingest_truncated_run_s']} s, "
                    f"store {r['store_mib']} MiB",
                    flush=True,
                )
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
