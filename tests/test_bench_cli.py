"""`edgebench bench` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_json_end_to_end(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "edgebench.cli", "bench", "--device", "local", "--model", "tiny",
         "--steps", "3", "--json", "--runs-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True)
    results = json.loads(out.stdout)
    assert [r["method"] for r in results] == ["adamw", "sgd"]
    for r in results:
        assert r["status"] == "ok", r["detail"]
        assert r["steps_done"] == 3
        assert r["peak_rss_bytes_kernel"] > 50 * 2**20
        assert r["step_time_s"]["median"] > 0
        assert r["samples_per_s"] > 0
        run_dir = Path(r["run_dir"])
        assert (run_dir / "result.json").exists() and (run_dir / "samples.jsonl").exists()
    from edgebench.results.store import Store

    with Store(tmp_path / "edgebench.duckdb", read_only=True) as store:
        stored = {r["run_id"]: r["status"] for r in store.runs(device="local")}
    assert stored == {r["run_id"]: "ok" for r in results}


def test_bench_refuses_remote_devices_with_the_way_to_go():
    out = subprocess.run([sys.executable, "-m", "edgebench.cli", "bench", "--device", "jetson-orin"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "edgebench deploy --device jetson-orin" in out.stderr


def test_bench_onnxruntime_exports_runs_torch_free_and_records_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_EXPORT_CACHE", str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-m", "edgebench.cli", "bench", "--model", "tiny", "--backend", "onnxruntime",
         "--methods", "sgd,lora", "--steps", "2", "--json", "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300, check=True)
    sgd, lora = json.loads(out.stdout)
    assert sgd["status"] == "ok", sgd["detail"]
    assert sgd["backend"] == "onnxruntime" and sgd["steps_done"] == 2
    # No torch in the device process: far below the ~300 MB torch import alone.
    assert sgd["peak_rss_bytes_kernel"] < 200 * 2**20
    assert lora["status"] == "unsupported"
    assert "executorch" in lora["detail"]
