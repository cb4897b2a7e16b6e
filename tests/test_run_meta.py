"""meta.json (issue 71: everything from outside is checked once, at the boundary, against one
typed definition): `figures.run_meta.RunMeta` is the one definition; the Python supervisor and the
shell sweep write its keys, all of them and no other; readers parse it where meta.json is read,
and a bad field is one line naming the file and the field. Records written before (the previous
Python supervisor's and shell sweep's, the fixtures') still read."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from edgebench.figures.run import figures_of_run_dir
from edgebench.figures.run_meta import KEYS, MAX_OBJECT_CHARS, MAX_TEXT_CHARS, DeviceFacts, RunMeta
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import Supervisor
from edgebench.telemetry.clock import clock_pair
from edgebench.untrusted import BadRecord
from test_readings_parity import SHELLS
from test_run_end import run_shell, shell_functions
from test_untrusted import one_line_exit_2

DEVICE_KEYS = {f.name for f in dataclasses.fields(DeviceFacts)}
SPEC = RunSpec(model="tiny", method="sgd", backend="executorch", runtime="native", run_id="r1")
READINGS = {"recorded_by": "shell", "clock_ticks": 100, "temperatures": {"thermal_zone0_mc": "cpu-therm"}}


def python_meta(tmp_path: Path, clock_end: bool = True) -> dict:
    """meta.json as the Python supervisor writes it (at the end of a run, or at its start)."""
    supervisor = Supervisor(RunSpec(model="tiny", method="sgd", run_id="r1"), tmp_path / "py")
    supervisor.out.mkdir(parents=True)
    supervisor._readings = {**READINGS, "recorded_by": "python"}
    supervisor._write_meta(clock_pair(), clock_pair() if clock_end else None, {"peak_bytes": 5 << 20})
    return json.loads((supervisor.out / "meta.json").read_text())


def shell_meta(shell: str, tmp_path: Path, end: str, readings: str) -> dict:
    """meta.json as sweep.sh's write_meta writes it in `shell`, with the variables run_one sets."""
    sweep = tmp_path / shell / "sweep"
    (sweep / "specs").mkdir(parents=True)
    (sweep / "specs" / "000-r1.json").write_text(SPEC.to_json())
    (sweep / "runs" / "r1").mkdir(parents=True)
    worker = tmp_path / shell / "worker"
    worker.mkdir()
    (worker / "bundle.json").write_text(json.dumps({"arch": "aarch64", "files": {"edgebench-worker": "ab" * 32}}))
    clock = '{"mono_ns": 12000000005, "wall_ns": 1700000000000000007, "uncertainty_ns": null}'
    script = (shell_functions("json_text", "write_meta")
              + f"cd {sweep}; RUN=runs/r1; RUN_ID=r1; SPEC_JSON=000-r1.json; WORKER={worker}; MEM_TOTAL=4294967296; "
                f"CPU_COUNT=4; RAN='{{\"worker/edgebench-worker\": \"{'ab' * 32}\"}}'; CLOCK_START='{clock}'\n"
                f"write_meta '{end}' '{readings}'\n")
    run_shell(shell, tmp_path / shell, script)
    return json.loads((sweep / "runs" / "r1" / "meta.json").read_text())


# --- one key set for both writers -------------------------------------------------------------

@pytest.mark.parametrize("shell", SHELLS)
def test_the_shell_writer_writes_the_models_keys_as_the_python_writer_does(tmp_path, shell):
    """write_meta at a run's start (no readings, no end clock yet) and at its end: every key of
    RunMeta, the same keys as the supervisor's, the device's facts the same keys too; each value of
    its type, and the record reads back as written."""
    python = python_meta(tmp_path)
    end = '{"mono_ns": 13000000000, "wall_ns": 1700000001000000000, "uncertainty_ns": null}'
    for written in (shell_meta(shell, tmp_path / "start", "null", "null"),
                    shell_meta(shell, tmp_path / "end", end, json.dumps(READINGS))):
        assert set(written) == set(KEYS) == set(python)
        assert set(written["device"]) == set(python["device"]) == DEVICE_KEYS
        assert set(written["clock"]["start"]) == set(python["clock"]["start"])
        meta = RunMeta.from_json(written, "write_meta")
        assert meta.to_json() == written
        assert (meta.run_id, meta.supervisor, meta.runtime, meta.spec) == ("r1", "shell", "native", SPEC.to_dict())
        assert (meta.device.cpu_count, meta.device.mem_total_bytes, meta.device.python) == (4, 4 << 30, None)
        assert meta.ran == {"worker/edgebench-worker": "ab" * 32}
        assert (meta.native_worker or {})["files"] == {"edgebench-worker": "ab" * 32}
        assert meta.clock.start is not None and meta.clock.start.mono_ns == 12_000_000_005
    assert meta.readings == READINGS and meta.clock.end is not None and meta.clock.end.wall_ns == 1_700_000_001 * 10**9


def test_the_supervisors_record_is_the_model_and_reads_back(tmp_path):
    for clock_end in (True, False):
        written = python_meta(tmp_path / str(clock_end), clock_end)
        assert set(written) == set(KEYS)
        meta = RunMeta.from_json(written, "meta.json")
        assert meta.to_json() == written
        assert (meta.supervisor, meta.runtime, meta.native_worker, meta.ran) == ("python", None, None, None)
        assert meta.device.python and meta.device.mem_total_bytes and meta.versions
        assert (meta.clock.end is not None) is clock_end and meta.predicted == {"peak_bytes": 5 << 20}


# --- records written before -------------------------------------------------------------------

OLD_SHELL = {"run_id": "r1", "supervisor": "shell", "runtime": "native", "spec": SPEC.to_dict(),
             "device": {"arch": "aarch64", "hostname": "phone", "python": None, "mem_total_bytes": 4 << 30,
                        "emulator": None},
             "versions": {}, "native_worker": {"arch": "aarch64", "files": {"edgebench-worker": "ab" * 32}},
             "ran": {"worker/edgebench-worker": "ab" * 32}, "readings": READINGS,
             "clock": {"start": {"mono_ns": 5, "wall_ns": 10, "uncertainty_ns": None}, "end": None}, "predicted": None}
OLD_PYTHON = {"run_id": "r2", "spec": RunSpec(run_id="r2").to_dict(),
              "device": {"hostname": "pi", "arch": "aarch64", "platform": "Linux-6.1-aarch64", "python": "3.11.2",
                         "cpu_count": 4, "cpu_affinity": 4, "mem_total_bytes": 8 << 30, "emulator": None},
              "versions": {"torch": "2.5.1"}, "runtime": None,
              "clock": {"start": {"mono_ns": 5, "wall_ns": 10, "uncertainty_ns": 100}, "end": None},
              "predicted": None, "oom_kills_at_start": {"file": "/sys/fs/cgroup/memory.events", "count": 0},
              "readings": None}


@pytest.mark.parametrize("old", [OLD_SHELL, OLD_PYTHON], ids=["shell", "python"])
def test_a_record_the_previous_writers_wrote_reads(old):
    """The previous shell sweep wrote no oom_kills_at_start and fewer device facts; the previous
    supervisor no supervisor, and no native_worker or ran for a Python run: the keys left out take
    their defaults, and the record reads back the same."""
    meta = RunMeta.from_json(old, "old/meta.json")
    assert meta.run_id == old["run_id"] and meta.device.arch == "aarch64" and meta.recorded_raw
    assert meta.clock.start is not None and meta.clock.start.wall_ns == 10
    assert RunMeta.from_json(meta.to_json(), "again") == meta


def test_a_record_from_before_raw_readings_keeps_its_devices_figures(tmp_path):
    """The fixtures' meta.json (no readings, no supervisor, no versions) reads, marked as recorded
    before raw readings; written again it has no readings either, so it reads back the same."""
    from results_fixtures import FakeRun

    run = FakeRun(run_id="old", status="ok").write(tmp_path)
    meta = RunMeta.from_json(json.loads((run / "meta.json").read_text()), "meta.json")
    assert not meta.recorded_raw and "readings" not in meta.to_json()
    assert RunMeta.from_json(meta.to_json(), "again") == meta
    assert meta.device.mem_total_bytes == FakeRun.mem_total_bytes and meta.predicted == {"peak": FakeRun.rss_base}
    figures = figures_of_run_dir(run)
    assert figures is not None and figures["peak_rss_bytes_sampled"] == FakeRun().result()["peak_rss_bytes_sampled"]
    assert RunMeta.from_json({"run_id": "b", "supervisor": "shell", "oom_kills_at_start": None}, "m").run_id == "b"


# --- a bad value: one line naming meta.json and the field -------------------------------------

BIG = "x" * 10_000_000
BAD = [({"device": {"mem_total_bytes": math.nan}}, "device.mem_total_bytes is nan, not a whole number 0 or more"),
       ({"spec": {"batch_size": math.nan}}, "spec.batch_size is nan, not a whole number 0 or more"),
       ({"spec": {"sample_hz": math.nan}}, "spec.sample_hz is nan, not a number 0 or more"),
       ({"spec": {"sample_hz": 10**400}}, "spec.sample_hz is 1000000000"),  # JSON digits past a float's range
       ({"spec": {"extra": {"budget": {"budget_bytes": math.inf}}}}, "spec.extra.budget.budget_bytes is inf"),
       ({"readings": {"cgroup_cpu": {"cores": -math.inf}}}, "readings.cgroup_cpu.cores is -inf"),
       ({"device": {"mem_total_bytes": -1}}, "device.mem_total_bytes is -1, not a whole number 0 or more"),
       ({"clock": {"start": {"mono_ns": -5, "wall_ns": 1}}}, "clock.start.mono_ns is -5, not a whole number"),
       ({"spec": {"steps": -3}}, "spec.steps is -3, not a whole number 0 or more"),
       ({"spec": {"batch_size": "2"}}, "spec.batch_size is '2', not a whole number"),
       ({"readings": {"clock_ticks": "100"}}, "readings.clock_ticks is '100', not a whole number from 1 to"),
       ({"clock": {"start": {"mono_ns": 1, "wall_ns": "now"}}}, "clock.start.wall_ns is 'now', not a whole number"),
       ({"device": {"cpu_count": True}}, "device.cpu_count is True, not a whole number"),
       ({"spec": {"packing": "yes"}}, "spec.packing is 'yes', not true or false"),
       ({"run_id": BIG}, "run_id holds 10,000,000 characters, more than the 1,000"),
       ({"device": {"hostname": BIG}}, f"device.hostname holds 10,000,000 characters, more than the "
                                        f"{MAX_TEXT_CHARS:,}"),
       ({"spec": {"data_dir": BIG}}, f"spec.data_dir holds 10,000,000 characters, more than the {MAX_TEXT_CHARS:,}"),
       ({"spec": {"sensors": {"x": BIG}}}, "spec.sensors holds 10,000,0"),
       ({"predicted": {"note": BIG}}, f"more than the {MAX_OBJECT_CHARS:,} it may"),
       ({"device": []}, "device is [], not a JSON object"),
       ({"spec": ["tiny"]}, "spec is ['tiny'], not a JSON object"),
       ({"readings": [1]}, "readings is [1], not a JSON object"),
       ({"clock": {"start": [1, 2]}}, "clock.start is [1, 2], not a JSON object"),
       ({"versions": {"torch": 2}}, "versions.torch is 2, not text"),
       ({"ran": {"worker/x": None}}, "ran.worker/x is None, not text"),
       ({"supervisor": "perl"}, "supervisor is 'perl', not one of python, shell"),
       ({"clock": {"start": {"wall_ns": 1}}}, "clock.start.mono_ns is missing")]


@pytest.mark.parametrize("record,words", BAD, ids=[f"{next(iter(r))}-{w.split()[0]}" for r, w in BAD])
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(record, words):
    with pytest.raises(BadRecord) as refused:
        RunMeta.from_json(record, "/runs/r1/meta.json")
    message = str(refused.value)
    assert message.startswith("/runs/r1/meta.json: ") and words in message, message
    assert "\n" not in message and len(message) < 400 and "x" * 100 not in message


def test_a_record_that_is_not_an_object_or_nested_too_deep_is_refused():
    with pytest.raises(BadRecord, match=r"^m\.json: the record is \[1, 2\], not a JSON object"):
        RunMeta.from_json([1, 2], "m.json")
    with pytest.raises(BadRecord, match=r"^m\.json: spec\.extra\.a\[0\]\[0\].* is nested more than 32 deep"):
        RunMeta.from_json({"spec": {"extra": {"a": json.loads("[" * 40 + "]" * 40)}}}, "m.json")


def _hostile_run(tmp_path: Path, **meta: object) -> Path:
    from results_fixtures import FakeRun

    run = FakeRun(run_id="r1", status="ok").write(tmp_path / "src")
    (run / "meta.json").write_text(json.dumps({**json.loads((run / "meta.json").read_text()), **meta}))
    return run


@pytest.mark.parametrize("meta,field,words", [
    ({"device": {"mem_total_bytes": math.nan}}, "device.mem_total_bytes", "is nan, not a whole number"),
    ({"spec": {"model": "tiny", "batch_size": -2}}, "spec.batch_size", "is -2, not a whole number 0 or more"),
    ({"readings": {"temperatures": BIG}}, "readings.temperatures", "not a JSON object"),
    ({"device": ["pi"]}, "device", "is ['pi'], not a JSON object")], ids=["nan", "negative", "10MB", "list"])
def test_ingest_of_a_run_with_a_bad_meta_json_says_which_field_without_a_traceback(tmp_path, edgebench_here, meta,
                                                                                   field, words):
    """`edgebench ingest` exits 2 with one line naming meta.json and the field; nothing is stored."""
    from edgebench.results.store import Store

    run = _hostile_run(tmp_path, **meta)
    done = edgebench_here("ingest", str(run), "--store", "s/store.duckdb", cwd=tmp_path)
    one_line_exit_2(done, f"{run / 'meta.json'}: {field}", words)
    assert "x" * 100 not in done.stderr
    assert not (tmp_path / "s" / "raw").exists()
    if (tmp_path / "s" / "store.duckdb").exists():
        with Store(tmp_path / "s" / "store.duckdb") as store:
            assert store.con.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]


def test_ingest_stores_the_checked_record(tmp_path):
    """The store's meta_json is the record as checked (RunMeta.to_json): what report and metrics read."""
    from edgebench.results.store import Store

    run = _hostile_run(tmp_path, readings=READINGS, supervisor="python", unknown_key="left out")
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run, device="pi")
        ((stored,),) = store.con.execute("SELECT meta_json FROM runs").fetchall()
    meta = RunMeta.from_json(json.loads((run / "meta.json").read_text()), "meta.json")
    assert json.loads(stored) == meta.to_json() and "unknown_key" not in stored


def test_the_run_directorys_figures_and_the_live_view_name_a_bad_meta_json(tmp_path):
    from edgebench.live.follow import LocalRun
    from edgebench.live.state import LiveState

    run = _hostile_run(tmp_path, clock={"start": {"mono_ns": "soon", "wall_ns": 1}})
    with pytest.raises(BadRecord, match=r"meta\.json: clock\.start\.mono_ns is 'soon'"):
        figures_of_run_dir(run)
    source = LocalRun(run)
    state = LiveState(source=source.label)
    state.apply(source.poll())
    assert state.meta is None and state.follow_error is not None
    assert f"{run}/meta.json: clock.start.mono_ns" in state.follow_error
    assert state.figures is not None  # the run's own result still shows, made without the bad facts
