"""`edgebench measure -- CMD`: any command run as a run's worker under the real supervisor and
sampler, recorded, ingested and reported; and edgebench.measure, the marks a measured script makes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebench import measure
from edgebench.figures.run_events import StepBegin, StepEnd, read_events
from edgebench.runner.spec import RunSpec

PY = sys.executable
MIB = 2**20
REPO = Path(__file__).resolve().parents[1]
# a measured script imports edgebench as the user's would: from the checkout under test
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}


def edgebench(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "edgebench.cli", *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def only_run(runs: Path) -> Path:
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return run_dir


def test_a_command_is_measured_recorded_ingested_and_reported(tmp_path):
    """The issue's check: a command holding a 300 MiB bytearray records a run whose kernel peak is
    at least 290 MiB, status ok, ingested; `report` lists it and says it has whole-run figures only."""
    done = edgebench("measure", "--runs-dir", "runs", "--",
                     PY, "-c", "import time; x = bytearray(300 * 2**20); time.sleep(1)", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = " ".join(done.stdout.split())  # one summary, wrapped to the output's width
    assert ": ok in " in line and "no steps marked" in line, line
    run_dir = only_run(tmp_path / "runs")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["method"] == "measure", result
    assert result["end"]["worker_peak_bytes"] >= 290 * MIB and result["end"]["exit_codes"] == "command"
    spec = RunSpec.load(run_dir / "spec.json")
    assert spec.command and spec.command[0] == PY and spec.model == Path(PY).name and spec.backend == "command"
    assert (run_dir / "samples.jsonl").stat().st_size > 0

    store = str(tmp_path / "runs" / "edgebench.duckdb")
    report = edgebench("report", "--store", store, "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    (row,) = json.loads(report.stdout)["runs"]
    assert row["run_id"] == run_dir.name and row["status"] == "ok" and row["method"] == "measure"
    assert row["peak_mem_bytes"] >= 290 * MIB and row["steps_measured"] == 0 and row["step_time_median_s"] is None
    assert row["text_length"] is None and row["steps"] is None  # not a spec's defaults: the command's own
    text = edgebench("report", "--store", store, cwd=tmp_path)
    assert "the command marked no steps (edgebench.measure): whole-run figures only" in " ".join(text.stdout.split())


def test_a_failing_command_is_an_error_with_its_exit_code(tmp_path):
    """Exit code 3 is edgebench's worker's `diverged`: a command's is its own, an error naming it."""
    done = edgebench("measure", "--runs-dir", "runs", "--json", "--",
                     PY, "-c", "import sys; print('it broke here'); sys.exit(3)", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    figures = json.loads(done.stdout)
    assert figures["status"] == "error", figures
    assert "the command exited with code 3: it broke here" in figures["detail"], figures["detail"]
    result = json.loads((only_run(tmp_path / "runs") / "result.json").read_text())
    assert result["end"]["exit_code"] == 3 and result["status"] == "error"


STEPS_SCRIPT = """
import sys, time
from edgebench import measure
assert measure.active()
with measure.step(warmup=True):
    time.sleep(0.01)
for i in range(int(sys.argv[1])):
    with measure.step():
        time.sleep(0.05)
        measure.record_loss(2.0 - 0.25 * i)
measure.begin_window("step")
time.sleep(0.05)
took = measure.end_window("step")
assert took >= 0.05, took
"""


def test_a_script_that_marks_steps_gets_step_figures(tmp_path):
    """N steps marked with measure.step() (and one window) are the run's measured steps: step time
    statistics and losses from the same figures as edgebench's runs; the warmup step left out."""
    script = tmp_path / "train.py"
    script.write_text(STEPS_SCRIPT)
    done = edgebench("measure", "--runs-dir", "runs", "--name", "my-train", "--json", "--", PY, str(script), "4",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["model"] == "my-train" and figures["status"] == "ok"
    assert figures["steps_measured"] == 5, figures  # 4 steps and the window
    assert 0.04 <= figures["step_time_median_s"] < 1.0, figures
    assert figures["loss_first"] == 2.0 and figures["loss_last"] == 1.25
    events = read_events(only_run(tmp_path / "runs") / "events.jsonl").events
    ends = [e for e in events if isinstance(e, StepEnd)]
    assert [e.phase for e in ends] == ["warmup"] + ["measure"] * 5
    assert [e.step for e in events if isinstance(e, StepBegin)] == [e.step for e in ends] == list(range(6))


def test_outside_measure_the_marks_write_nothing(tmp_path, monkeypatch):
    """Run on its own (no EDGEBENCH_MEASURE_EVENTS), the same script runs unchanged and writes nothing."""
    script = tmp_path / "train.py"
    script.write_text(STEPS_SCRIPT.replace("assert measure.active()", "assert not measure.active()"))
    env = {k: v for k, v in ENV.items() if k != measure.EVENTS_ENV}
    done = subprocess.run([PY, str(script), "3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]

    monkeypatch.delenv(measure.EVENTS_ENV, raising=False)
    with measure.step(loss=1.0):
        pass
    measure.begin_window("w")
    assert measure.end_window("w") >= 0


def test_misuse_is_refused_the_same_measured_or_not(tmp_path, monkeypatch):
    events = tmp_path / "events.jsonl"
    for measured in (False, True):
        if measured:
            monkeypatch.setenv(measure.EVENTS_ENV, str(events))
        with pytest.raises(ValueError, match="ends but nothing is open"):
            measure.end_window("never-begun")
        with pytest.raises(ValueError, match="record_loss outside a step"):
            measure.record_loss(1.0)
        measure.begin_window("a")
        with pytest.raises(ValueError, match="'step' begins while 'a' is open"):
            with measure.step():
                pass
        with pytest.raises(ValueError, match="a loss is a number"):
            measure.record_loss("low")
        measure.record_loss(float("nan"))  # kept out of `loss`: a trace holds a non-finite loss only where it diverged
        measure.end_window("a")
    written = read_events(events).events  # the trace reads back: the NaN did not make it unreadable
    assert [type(e) for e in written] == [StepBegin, StepEnd] and written[1].loss is None  # type: ignore[union-attr]


def test_a_command_that_cannot_start_is_refused_and_nothing_recorded(tmp_path):
    for command in (["--"], ["--", "no-such-program-edgebench"], ["--", str(tmp_path / "missing.sh")]):
        done = edgebench("measure", "--runs-dir", "runs", *command, cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), done.stderr
        assert not (tmp_path / "runs").exists()


def test_a_timeout_stops_the_commands_whole_process_tree(tmp_path):
    """Under the supervisor alone (no cgroup to end it), a command past its timeout is killed with
    the processes it started: they share its process group."""
    child = tmp_path / "child.pid"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
            f"open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    spec = RunSpec(model="tree", method="measure", backend="command", run_id="tree", timeout_s=1.0, steps=0,
                   warmup_steps=0, command=[PY, "-c", code])
    spec.save(tmp_path / "spec.json")
    done = subprocess.run([PY, "-m", "edgebench.runner", str(tmp_path / "spec.json"), "--out", str(tmp_path / "run")],
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout)["status"] == "timeout", done.stdout + done.stderr
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), f"the command's child {pid} outlived it"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_command_killed_for_memory_reads_oom(tmp_path, memory_cgroup):
    """A real cgroup limit (128 MiB): the command allocating past it is OOM-killed (it volunteers,
    as edgebench's worker does; the supervisor is shielded) and the run reads `oom`, not an error."""
    (memory_cgroup / "memory.limit_in_bytes").write_text(str(128 * MIB))
    spec = RunSpec(model="hog", method="measure", backend="command", run_id="hog", steps=0, warmup_steps=0,
                   command=[PY, "-c", "b = [bytearray(1 << 20) for _ in range(1024)]"])
    spec.save(tmp_path / "spec.json")
    procs = memory_cgroup / "cgroup.procs"
    done = subprocess.run([PY, "-m", "edgebench.runner", str(tmp_path / "spec.json"), "--out", str(tmp_path / "run")],
                          env=ENV, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: procs.write_text(str(os.getpid())))
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "oom", (result["detail"], done.stderr)
    assert result["end"]["exit_signal"] == signal.SIGKILL
