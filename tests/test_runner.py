"""The runner: every way a run can end becomes a recorded result, with its traces intact."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebench.figures.run import figures_of_run_dir
from edgebench.runner import supervisor
from edgebench.runner.spec import RunSpec
from edgebench.runner.sweep import run_sweep
from edgebench.telemetry.trace import read_trace


def tiny(**overrides) -> RunSpec:
    fields = dict(model="tiny", method="sgd", steps=3, warmup_steps=1, batch_size=2, text_length=16,
                  sample_hz=50, run_id="test-run", threads=1)
    fields.update(overrides)
    return RunSpec(**fields)


def run_spec(spec: RunSpec, out: Path) -> dict:
    """Runs the spec under the supervisor; the run's figures, as the host makes them of its records."""
    supervisor.run_spec(spec, out)
    return figures_of_run_dir(out)


def events_of(run_dir: Path) -> list[dict]:
    return read_trace(run_dir / "events.jsonl").records


def test_ok_run_writes_the_whole_run_directory(tmp_path):
    result = run_spec(tiny(), tmp_path)
    assert result["status"] == "ok", result["detail"]
    for name in ("meta.json", "samples.jsonl", "events.jsonl", "result.json"):
        assert (tmp_path / name).exists(), name
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["spec"]["method"] == "sgd"
    assert meta["clock"]["start"]["mono_ns"] < meta["clock"]["end"]["mono_ns"]
    assert "torch" in meta["versions"]
    ends = [e for e in events_of(tmp_path) if e["event"] == "step_end"]
    assert [e["phase"] for e in ends] == ["warmup", "measure", "measure", "measure"]
    assert result["steps_done"] == 3 and result["last_step"] == 3
    assert result["loss_first"] == ends[0]["loss"] and result["loss_last"] == ends[-1]["loss"]
    assert result["step_time_s"]["min"] <= result["step_time_s"]["median"] <= result["step_time_s"]["max"]
    samples = read_trace(tmp_path / "samples.jsonl").records
    assert samples and all("t_ns" in s for s in samples)
    # Every sample taken while the worker lived (between its first and last event, same clock) has its RSS.
    events = events_of(tmp_path)
    alive = [s for s in samples if events[0]["t_ns"] < s["t_ns"] < events[-1]["t_ns"]]
    assert alive and all("rss_bytes" in s for s in alive)
    # The kernel's peak for the worker is at least what was sampled of it.
    assert result["peak_rss_bytes_kernel"] >= 0.98 * result["peak_rss_bytes_sampled"]
    if result["device_ram_peak_what"].startswith("device RAM (MemTotal"):  # this host is the device
        assert (
            0 < result["device_ram_peak_bytes"] <= result["device_ram_limit_bytes"] == meta["device"]["mem_total_bytes"]
        )


def test_duration_bounds_the_run(tmp_path):
    result = run_spec(tiny(steps=10_000, duration_s=2.0), tmp_path)
    assert result["status"] == "ok"
    assert 1 <= result["steps_done"] < 10_000


def test_non_finite_loss_is_diverged(tmp_path):
    result = run_spec(tiny(lr=1e30, steps=8), tmp_path)
    assert result["status"] == "diverged", result
    assert "non-finite loss" in result["detail"]
    assert any(e["event"] == "diverged" for e in events_of(tmp_path))


def test_a_loss_rising_past_the_factor_is_diverged(tmp_path):
    """lomo at lr 3 takes tiny's loss from 6.5 to 662 in four steps, all finite (later it falls
    back to ln(vocab), its weights broken, and the run read `ok`): it ends at the step that passed."""
    result = run_spec(tiny(method="lomo", lr=3.0, steps=8), tmp_path)
    assert result["status"] == "diverged", result
    events = events_of(tmp_path)
    (diverged,) = [e for e in events if e["event"] == "diverged"]
    last = [e for e in events if e["event"] == "step_end"][-1]
    assert diverged["step"] == last["step"] and diverged["loss"] == last["loss"] and math.isfinite(last["loss"])
    assert f"at step {last['step']}: the mean of the last" in result["detail"], result["detail"]


def test_wall_clock_limit_is_timeout(tmp_path):
    result = run_spec(tiny(steps=100_000, timeout_s=6.0), tmp_path)
    assert result["status"] == "timeout"
    assert result["exit_signal"] == "SIGKILL"
    assert read_trace(tmp_path / "samples.jsonl").records


def test_sigterm_is_interrupted_with_steps_kept(tmp_path):
    spec_path = tmp_path / "spec.json"
    tiny(steps=100_000).save(spec_path)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "edgebench.runner", str(spec_path), "--out", str(run_dir)])
    deadline = time.monotonic() + 60
    while not any(e["event"] == "step_end" for e in events_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    result = figures_of_run_dir(run_dir)
    assert result["status"] == "interrupted"
    assert result["last_step"] is not None
    assert any(e["event"] == "interrupted" for e in events_of(run_dir))


def test_unknown_method_is_an_error_naming_it(tmp_path):
    result = run_spec(tiny(method="no-such-method"), tmp_path)
    assert result["status"] == "error"
    assert "no-such-method" in result["detail"]


def test_cuda_without_a_gpu_is_unsupported(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.fail("this test expects a CPU-only host")
    result = run_spec(tiny(accelerator="cuda"), tmp_path)
    assert result["status"] == "unsupported"
    assert "cuda" in result["detail"].lower()


def test_oom_kill_under_a_cgroup_limit_is_recorded(tmp_path, memory_cgroup):
    """A real cgroup v1 limit: the kernel kills the worker; the supervisor records `oom`."""
    limit = 700 * 2**20
    (memory_cgroup / "memory.limit_in_bytes").write_text(str(limit))
    spec_path = tmp_path / "spec.json"
    # Big enough batch that the first backward cannot fit in the limit, small model so load fits.
    tiny(batch_size=4096, steps=2, warmup_steps=0).save(spec_path)
    run_dir = tmp_path / "run"

    def enter_cgroup() -> None:
        (memory_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.run([sys.executable, "-m", "edgebench.runner", str(spec_path), "--out", str(run_dir)],
                          preexec_fn=enter_cgroup, timeout=300)
    assert proc.returncode == 1
    result = figures_of_run_dir(run_dir)
    assert result["status"] == "oom", result
    assert result["exit_signal"] == "SIGKILL"
    assert result["last_step"] == 0
    samples = read_trace(run_dir / "samples.jsonl")
    assert samples.bad_lines == 0 and len(samples.records) >= 3
    assert result["peak_rss_bytes_sampled"] > 200 * 2**20
    # The kernel's own peak for the group is at the limit (shared library pages charged to
    # other groups make the summed RSS of the tree read higher than the group's usage).
    assert 0.8 * limit <= result["cgroup_peak_bytes"] <= limit
    # the device's RAM is the cgroup's, which the limit applies to; the worker's RSS is named apart
    assert (result["device_ram_peak_bytes"], result["device_ram_limit_bytes"]) == (result["cgroup_peak_bytes"], limit)
    assert result["device_ram_peak_what"].startswith("device RAM (its cgroup")
    assert result["peak_rss_kernel_what"] == "kernel RSS of the worker process"


def test_sweep_runs_every_spec_and_resumes(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    tiny(run_id="a", steps=1).save(specs / "01-a.json")
    tiny(run_id="b", method="adamw", steps=1).save(specs / "02-b.json")
    state = run_sweep(tmp_path)
    assert state["state"] == "finished"
    assert state["runs"] == {"a": "ok", "b": "ok"}
    before = (tmp_path / "runs" / "a" / "result.json").stat().st_mtime_ns
    again = run_sweep(tmp_path)
    assert again["runs"] == {"a": "ok", "b": "ok"}
    assert (tmp_path / "runs" / "a" / "result.json").stat().st_mtime_ns == before


def test_a_sweep_runs_a_disturbed_run_again_within_its_budget(tmp_path):
    """deploy --rerun-disturbed: a process spins on a core (half of this 2-core host's CPU, more
    than the noise guard's 10% on any host up to 10 cores), so every run is disturbed. The
    device's sweep adds the first run's spec again (naming it) as its budget of one allows, not
    the re-run's; a resumed sweep runs neither again."""
    specs = tmp_path / "specs"
    specs.mkdir()
    tiny(run_id="a", steps=2, warmup_steps=0).save(specs / "000-a.json")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    try:
        state = run_sweep(tmp_path, rerun_disturbed=1)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert state["state"] == "finished" and state["runs"] == {"a": "ok", "a-again": "ok"}
    assert RunSpec.load(specs / "001-a-again.json").extra["rerun_of"] == "a"
    for run_id in ("a", "a-again"):
        assert figures_of_run_dir(tmp_path / "runs" / run_id)["cpu"]["disturbed"]
    assert run_sweep(tmp_path, rerun_disturbed=5)["runs"] == {"a": "ok", "a-again": "ok"}
    assert len(list(specs.glob("*.json"))) == 2
