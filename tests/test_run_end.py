"""result.json's `end` record (issue 71: everything from outside is checked once, at the boundary,
against one typed definition): `figures.run_end.RunEnd` is the one definition; the Python
supervisor and the shell sweep write its keys, all of them and no other; readers parse it where
result.json is read, and a bad field is one line naming the file and the field. Records written
before the kernel's peak had one field (worker_maxrss_bytes, worker_hwm_bytes) still read."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from edgebench.figures.memory import WORKER_RSS
from edgebench.figures.run import SHELL_WORKER_RSS, figures_of_run_dir, status_of_run_dir
from edgebench.figures.run_end import MAX_TEXT_CHARS, RunEnd, result_end
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import Supervisor
from edgebench.telemetry.clock import clock_pair
from edgebench.untrusted import BadRecord
from test_readings_parity import SHELLS, SWEEP, android_tools
from test_untrusted import one_line_exit_2

FIELDS = {f.name for f in dataclasses.fields(RunEnd)}
MIB = 2**20


def python_end(tmp_path: Path, maxrss: int = 0) -> dict:
    """The `end` the Python supervisor writes for a worker that exited 0."""
    supervisor = Supervisor(RunSpec(model="tiny", method="sgd", run_id="x"), tmp_path / "py")
    supervisor.out.mkdir(parents=True)
    supervisor._cpu_start = {}
    return supervisor._finish(clock_pair(), 0, None, maxrss, False, {})["end"]


def shell_functions(*names: str) -> str:
    """The definitions of sweep.sh's functions `names`, as the script has them."""
    text = SWEEP.read_text()
    found = [re.search(rf"^{name}\(\) {{.*?^}}\n", text, re.S | re.M) for name in names]
    assert all(found), names
    return "".join(m[0] for m in found if m)


def run_shell(shell: str, tmp_path: Path, script: str) -> bytes:
    """`script` run in `shell` (mksh with toybox's tools as its whole PATH, as on Android): its stdout."""
    if shutil.which(SHELLS[shell][0]) is None:
        pytest.fail(f"{SHELLS[shell][0]} is not installed: scripts/setup.sh installs it (apt)")
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = android_tools(tmp_path / "android-bin") if shell == "mksh" else None
    done = subprocess.run([shutil.which(SHELLS[shell][0]) or "", *SHELLS[shell][1:], "-c", script],
                          capture_output=True, timeout=30, env={"PATH": path} if path else None)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


def shell_end(shell: str, tmp_path: Path, variables: str, events: bool = False,
              log: bytes = b'loading\n\tthe plan said "no" \\ here\nKilled\n') -> dict:
    """sweep.sh's end_json run in `shell` with the run's variables set as run_one sets them."""
    run = tmp_path / shell / "run"
    run.mkdir(parents=True)
    (run / "worker.log").write_bytes(log)
    if events:
        (run / "events.jsonl").write_text('{"t_ns": 1, "event": "load_begin"}\n')
    cgroup = tmp_path / shell / "cg"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 3\noom_kill 3\n")
    script = (shell_functions("json_text", "json_or_null", "bytes_of_kb", "oom_kills", "end_json")
              + f"RUN={run}; MEM_CG={cgroup}; {variables}\nend_json\n")
    return json.loads(run_shell(shell, tmp_path / shell, script).decode())  # strict UTF-8, as Python reads it


# --- one key set for both writers -------------------------------------------------------------

@pytest.mark.parametrize("shell", SHELLS)
def test_the_shell_writer_writes_the_models_keys_as_the_python_writer_does(tmp_path, shell):
    """end_json of a worker SIGKILLed past its timeout after a Ctrl-C, its cgroup counting OOM kills,
    and of one that exited 0 with events: every field of RunEnd, the same keys as the supervisor's,
    each value of its type."""
    killed = shell_end(shell, tmp_path, "RC=137; TIMED_OUT=1; STOPPED='Ctrl-C (SIGINT)'; OOM_BEFORE=1; "
                                        "HWM_KB=204800; LOW_KB=10240; USED_AT_LOW=300000000; LIMIT=536870912")
    assert set(killed) == FIELDS == set(python_end(tmp_path / "py"))
    end = RunEnd.from_json(killed, "end_json")
    assert (end.exit_code, end.exit_signal, end.timed_out, end.stopped_by) == (None, 9, True, "Ctrl-C (SIGINT)")
    assert (end.oom_kills_start, end.oom_kills_end) == (1, 3)
    assert (end.worker_peak_bytes, end.worker_peak_from) == (200 * MIB, "vm_hwm")
    assert (end.mem_available_low_bytes, end.cgroup_usage_at_low_bytes, end.cgroup_limit_bytes) == \
           (10 * MIB, 300_000_000, 512 * MIB)
    assert end.worker_log_tail is not None and 'the plan said "no" \\ here' in end.worker_log_tail
    assert end.to_json() == killed

    ok = shell_end(shell, tmp_path / "ok", "RC=0; TIMED_OUT=''; STOPPED=''; OOM_BEFORE=''; HWM_KB=''; LOW_KB=''; "
                                           "USED_AT_LOW=''; LIMIT=''", events=True)
    assert set(ok) == FIELDS
    assert RunEnd.from_json(ok, "end_json") == RunEnd(exit_code=0, oom_kills_end=3)


def test_the_supervisors_record_is_the_model_and_reads_back(tmp_path):
    written = python_end(tmp_path, maxrss=300 * MIB)
    assert set(written) == FIELDS
    end = RunEnd.from_json(written, "result.json")
    assert (end.worker_peak_bytes, end.worker_peak_from) == (300 * MIB, "ru_maxrss")
    assert end.to_json() == written
    assert json.loads((tmp_path / "py" / "result.json").read_text())["end"] == written


# --- any bytes in worker.log: valid JSON ---------------------------------------------------------

# An ANSI colour and a title sequence, C0 controls, DEL, a quote, a backslash, printf's '%', UTF-8
# of 2, 3 and 4 bytes, and bytes that are not UTF-8: a stray continuation, 0xff, an overlong NUL,
# a surrogate, a sequence cut short at the end
HOSTILE_LOG = (b'step 1 \x1b[31mred\x1b[0m \x1b]0;title\x07 \x01\x02\x1f \x7f "quoted" back\\slash %d %s %%\n'
               b'\ttab\rcr \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 bad \x80 \xff \xc0\x80 \xed\xa0\x80 cut \xe2\x82')


@pytest.mark.parametrize("shell", SHELLS)
def test_json_text_writes_valid_json_of_any_bytes(tmp_path, shell):
    """sweep.sh's json_text escapes every byte below 0x20 (and DEL), quotes and backslashes, keeps
    UTF-8 and replaces what is not UTF-8 as Python's "replace" does: json.loads reads back the text."""
    (tmp_path / "log").write_bytes(HOSTILE_LOG)
    out = run_shell(shell, tmp_path, shell_functions("json_text") + f'json_text "$(cat {tmp_path / "log"})"\n')
    assert all(b >= 0x20 and b != 0x7f for b in out), out  # every control character escaped
    assert json.loads(out.decode()) == HOSTILE_LOG.decode("utf-8", "replace")
    assert json.loads(run_shell(shell, tmp_path / "empty", shell_functions("json_text") + "json_text ''\n")) == ""


@pytest.mark.parametrize("shell", SHELLS)
def test_a_worker_log_of_any_bytes_leaves_result_json_valid(tmp_path, shell):
    """A worker that wrote escape sequences and bytes that are not UTF-8 before it wrote any event:
    end_json's record is valid JSON and RunEnd reads its log tail back, the bad bytes replaced."""
    end = shell_end(shell, tmp_path, "RC=1; TIMED_OUT=''; STOPPED=''; OOM_BEFORE=''; HWM_KB=''; LOW_KB=''; "
                                     "USED_AT_LOW=''; LIMIT=''", log=HOSTILE_LOG)
    assert RunEnd.from_json(end, "end_json").worker_log_tail == HOSTILE_LOG.decode("utf-8", "replace")


# --- records written before: the old key names ------------------------------------------------

@pytest.mark.parametrize("key,source,what", [("worker_maxrss_bytes", "ru_maxrss", WORKER_RSS),
                                             ("worker_hwm_bytes", "vm_hwm", SHELL_WORKER_RSS)])
def test_a_record_written_before_reads_its_peak_from_the_old_key(tmp_path, key, source, what):
    """A run directory the previous edgebench wrote (the Python supervisor's worker_maxrss_bytes, the
    shell's worker_hwm_bytes, and none of the keys added since) reads: the same peak, read the same way."""
    from results_fixtures import FakeRun

    run = FakeRun(run_id="old", status="ok").write(tmp_path)
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "readings": {}}))
    old = {"exit_code": 0, "exit_signal": None, "timed_out": False, "stopped_by": None, "oom_kills_start": 0,
           "oom_kills_end": 0, "kernel_oom": None, "start_problem": None, "write_failure": None,
           "disk_full": False, key: 123 * MIB, "worker_log_tail": None}
    (run / "result.json").write_text(json.dumps({"run_id": "old", "recorded_by": "python", "end": old}))
    end = RunEnd.from_json(old, "old/result.json")
    assert (end.worker_peak_bytes, end.worker_peak_from, end.mem_available_low_bytes) == (123 * MIB, source, None)
    figures = figures_of_run_dir(run)
    assert figures is not None
    assert (figures["status"], figures["peak_rss_bytes_kernel"], figures["peak_rss_kernel_what"]) == \
           ("ok", 123 * MIB, what)
    assert status_of_run_dir(run) == "ok"


def test_a_result_without_an_end_record_keeps_its_status(tmp_path):
    assert result_end({"status": "interrupted", "cut_off": True}, "r.json") is None
    assert result_end({"status": "ok", "end": None}, "r.json") is None


# --- a bad value: one line naming the file and the field --------------------------------------

BAD = [("worker_peak_bytes", math.nan, "end.worker_peak_bytes is nan, not a whole number"),
       ("cgroup_limit_bytes", -1, "end.cgroup_limit_bytes is -1, not a whole number 0 or more"),
       ("exit_code", "0", "end.exit_code is '0', not a whole number from 0 to 255"),
       ("exit_signal", True, "end.exit_signal is True, not a whole number"),
       ("oom_kills_end", 2.5, "end.oom_kills_end is 2.5"),
       ("timed_out", "no", "end.timed_out is 'no', not true or false"),
       ("worker_log_tail", "x" * 10_000_000, f"end.worker_log_tail holds 10,000,000 characters, more than the "
                                             f"{MAX_TEXT_CHARS:,}"),
       ("worker_log_tail", ["a"], "end.worker_log_tail is ['a'], not text"),
       ("worker_peak_from", "guess", "end.worker_peak_from is 'guess', not one of ru_maxrss, vm_hwm"),
       ("worker_maxrss_bytes", -5, "end.worker_maxrss_bytes is -5")]


@pytest.mark.parametrize("field,value,words", BAD, ids=[f"{f}-{str(v)[:8]}" for f, v, _ in BAD])
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(field, value, words):
    record = {"exit_code": 0, "worker_peak_bytes": 5, "worker_peak_from": "vm_hwm", field: value}
    if field == "worker_maxrss_bytes":
        del record["worker_peak_bytes"], record["worker_peak_from"]
    with pytest.raises(BadRecord) as refused:
        RunEnd.from_json(record, "/runs/r1/result.json")
    message = str(refused.value)
    assert message.startswith("/runs/r1/result.json: ") and words in message, message
    assert "\n" not in message and len(message) < 400


def test_a_record_that_is_not_an_object_or_has_half_its_peak_is_refused():
    with pytest.raises(BadRecord, match=r"^r\.json: end is \[1, 2\], not a JSON object"):
        result_end({"end": [1, 2]}, "r.json")
    with pytest.raises(BadRecord, match="worker_peak_bytes and worker_peak_from go together"):
        RunEnd.from_json({"worker_peak_bytes": 5}, "r.json")


def _hostile_run(tmp_path: Path, value: object) -> Path:
    from results_fixtures import FakeRun

    run = FakeRun(run_id="r1", status="ok").write(tmp_path / "src")
    (run / "result.json").write_text(json.dumps({"run_id": "r1", "recorded_by": "shell",
                                                 "end": {"exit_code": 0, "worker_log_tail": value}}))
    return run


def test_ingest_of_a_run_with_a_bad_end_record_says_which_field_without_a_traceback(tmp_path, edgebench_here):
    """A 10 MB log tail (within result.json's 64 MiB cap, so the record itself is what refuses it) and
    a number where text belongs: `edgebench ingest` exits 2 with one line naming result.json and the
    field; nothing is stored."""
    for value, words in (("x" * 10_000_000, "characters, more than the"), (7, "is 7, not text")):
        run = _hostile_run(tmp_path, value)
        done = edgebench_here("ingest", str(run), "--store", "s/store.duckdb", cwd=tmp_path)
        one_line_exit_2(done, f"{run / 'result.json'}: end.worker_log_tail", words)
        assert "x" * 100 not in done.stderr
        assert not (tmp_path / "s" / "raw").exists()


def test_the_live_view_names_a_bad_end_record_and_makes_no_figures_of_it(tmp_path):
    from edgebench.live.follow import LocalRun
    from edgebench.live.state import LiveState

    run = _hostile_run(tmp_path, {"nested": "object"})
    source = LocalRun(run)
    state = LiveState(source=source.label)
    state.apply(source.poll())
    assert state.figures is None and state.end is None
    assert state.follow_error is not None and f"{run}/result.json: end.worker_log_tail" in state.follow_error
    with pytest.raises(BadRecord):
        status_of_run_dir(run)


def test_the_status_of_a_signal_comes_from_the_model():
    from edgebench.figures.status import run_status

    assert run_status(RunEnd(exit_signal=signal.SIGKILL, oom_kills_start=0, oom_kills_end=1), [])[0] == "oom"
    assert run_status(RunEnd(), [])[0] == "error"  # no record of how the worker ended
