"""A host-wide OOM is not the method's OOM (issue 68): a worker the kernel killed because the
whole host ran out, not its run's cgroup, reads `killed` with why, and the next run of a sweep
waits for the memory to come back. The kernel's log lines are shaped as a 6.x kernel writes
them to /dev/kmsg."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from edgebench.figures.run_end import RunEnd
from edgebench.figures.run_meta import KEYS as META_KEYS
from edgebench.figures.run_meta import RunMeta
from edgebench.figures.status import host_oom, run_status
from edgebench.runner import sweep
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import Supervisor, kernel_oom_record, memory_low_point
from edgebench.telemetry.clock import clock_pair

PID = 4242
SINCE_NS = 5_000 * 10**9  # the worker's start, monotonic
MIB = 2**20
GLOBAL = [  # another program took the host's memory: the killer chose the worker for the whole host
    "6,2301,5001000000,-;python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, "
    "oom_score_adj=0",
    " SUBSYSTEM=memory",
    "6,2350,5001200000,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
    f"task_memcg=/edgebench-lab/pi,task=python3,pid={PID},uid=0",
    f"3,2351,5001200100,-;Out of memory: Killed process {PID} (python3) total-vm:2154012kB, anon-rss:402112kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1200kB oom_score_adj:0",
]
MEMCG = [  # the run reached its own cgroup's limit
    "6,2401,5002000000,-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "6,2450,5002100000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    f"oom_memcg=/edgebench-lab/pi,task_memcg=/edgebench-lab/pi,task=python3,pid={PID},uid=0",
    f"3,2451,5002100100,-;Memory cgroup out of memory: Killed process {PID} (python3) total-vm:2154012kB, "
    "anon-rss:524000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1200kB oom_score_adj:0",
]
LAB = {"oom_kills_start": 0, "oom_kills_end": 1, "cgroup_limit_bytes": 512 * MIB}  # a lab device's cgroup


def kmsg(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "kmsg"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def killed(**end) -> tuple[str, str]:
    return run_status(RunEnd(**{"exit_signal": signal.SIGKILL, **end}), [])


def test_the_kernels_global_oom_kill_is_read_with_its_constraint(tmp_path):
    record = kernel_oom_record(PID, SINCE_NS, kmsg(tmp_path, GLOBAL))
    assert record == {"line": GLOBAL[3].partition(";")[2], "constraint": "CONSTRAINT_NONE"}
    record = kernel_oom_record(PID, SINCE_NS, kmsg(tmp_path, MEMCG))
    assert record is not None and record["constraint"] == "CONSTRAINT_MEMCG"
    assert record["line"].startswith(f"Memory cgroup out of memory: Killed process {PID} ")


def test_a_kill_of_another_pid_or_before_the_run_is_not_the_workers(tmp_path):
    path = kmsg(tmp_path, GLOBAL)
    assert kernel_oom_record(PID + 1, SINCE_NS, path) is None
    assert kernel_oom_record(PID, SINCE_NS + 10 * 10**9, path) is None
    assert kernel_oom_record(PID, SINCE_NS, str(tmp_path / "unreadable")) is None


def test_a_global_oom_kill_in_a_cgroup_with_a_limit_is_killed_not_oom(tmp_path):
    """The cgroup's counter rose (a global kill counts in the victim's cgroup too); the kernel says
    CONSTRAINT_NONE: the run did not reach its 512 MiB, so it is no evidence the method does not fit."""
    record = kernel_oom_record(PID, SINCE_NS, kmsg(tmp_path, GLOBAL))
    assert record is not None
    status, detail = killed(**LAB, kernel_oom=record["line"], kernel_oom_constraint=record["constraint"])
    assert status == "killed"
    assert "host-wide OOM" in detail and "CONSTRAINT_NONE" in detail and "did not exceed its budget" in detail


def test_a_cgroup_oom_kill_stays_the_methods_oom(tmp_path):
    record = kernel_oom_record(PID, SINCE_NS, kmsg(tmp_path, MEMCG))
    assert record is not None
    end = {**LAB, "kernel_oom": record["line"], "kernel_oom_constraint": record["constraint"],
           # the kernel's word wins over samples that look like a host's shortage
           "mem_available_low_bytes": 10 * MIB, "cgroup_usage_at_low_bytes": 100 * MIB}
    assert killed(**end) == ("oom", "worker killed by SIGKILL (cgroup oom_kill counter rose by 1)")
    assert killed(**{**end, "oom_kills_end": 0})[0] == "oom"  # the kernel's record alone


def test_without_a_limit_of_its_own_the_whole_ram_is_the_budget():
    """A board (no cgroup limit): a global OOM is the run's own."""
    end = {**LAB, "cgroup_limit_bytes": None, "kernel_oom_constraint": "CONSTRAINT_NONE"}
    assert killed(**end)[0] == "oom"
    assert host_oom(RunEnd(**end)) is None


@pytest.mark.parametrize("low,used,host", [(10 * MIB, 300 * MIB, True), (10 * MIB, 500 * MIB, False),
                                           (900 * MIB, 300 * MIB, False), (None, 300 * MIB, False)])
def test_where_the_kernel_says_nothing_the_samples_tell(low, used, host):
    """MemAvailable ran out while the cgroup stayed clearly below its limit: the host's OOM (the
    shell sweep's case: it reads no kmsg); at its limit, or with memory to spare, the run's."""
    end = {**LAB, "kernel_oom_constraint": None, "mem_available_low_bytes": low, "cgroup_usage_at_low_bytes": used}
    status, detail = killed(**end)
    assert (status, "host-wide OOM" in detail) == (("killed", True) if host else ("oom", False))


def test_a_crash_while_memory_ran_low_stays_a_crash():
    end = {**LAB, "kernel_oom_constraint": "CONSTRAINT_NONE", "oom_kills_end": 0}
    assert run_status(RunEnd(**{"exit_signal": signal.SIGSEGV, **end}), [])[0] == "error"


def test_the_low_point_is_read_from_the_samples(tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in [
        {"t_ns": 1, "cgroup_usage_bytes": 100, "mem_available_bytes": 9000, "cgroup_limit_bytes": 1000},
        {"t_ns": 2, "cgroup_usage_bytes": 300},
        {"t_ns": 3, "cgroup_usage_bytes": 400, "mem_available_bytes": 50},
        {"t_ns": 4, "cgroup_usage_bytes": 0, "mem_available_bytes": 8000},
    ]) + "\n{not json\n")
    assert memory_low_point(samples) == {"mem_available_low_bytes": 50, "cgroup_usage_at_low_bytes": 400,
                                         "cgroup_limit_bytes": 1000}
    assert memory_low_point(tmp_path / "none.jsonl") == dict.fromkeys(memory_low_point(samples))


# --- the sweep waits for the memory ----------------------------------------------------------

def meminfo(root: Path, available_kb: int) -> None:
    path = root / "proc" / "meminfo"
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name("meminfo.part")  # replaced whole, as the kernel's file reads: never half-written
    part.write_text(f"MemTotal:        8000000 kB\nMemFree:          100000 kB\nMemAvailable:   {available_kb} kB\n")
    os.replace(part, path)


def later(seconds: float, action) -> threading.Thread:
    thread = threading.Timer(seconds, action)
    thread.start()
    return thread


def test_the_wait_ends_when_the_memory_is_back_and_is_bounded(tmp_path):
    meminfo(tmp_path, 4_000_000)
    assert sweep.wait_for_memory(4_000_000 * 1024, str(tmp_path)).startswith("waited 0.0 s")
    meminfo(tmp_path, 10_000)
    started = time.monotonic()
    said = sweep.wait_for_memory(4_000_000 * 1024, str(tmp_path), limit_s=0.5, poll_s=0.1)
    assert 0.5 <= time.monotonic() - started < 2 and "not yet back" in said and "starts anyway" in said
    restore = later(0.3, lambda: meminfo(tmp_path, 4_100_000))
    said = sweep.wait_for_memory(4_000_000 * 1024, str(tmp_path), limit_s=10, poll_s=0.1)
    restore.join()
    assert said.startswith("waited 0.") and "back to 3906 MiB (4003 MiB)" in said
    assert "unreadable" in sweep.wait_for_memory(1, str(tmp_path / "nothing"))


def test_the_python_sweep_waits_after_a_host_wide_oom_only(tmp_path, monkeypatch, capsys):
    """Run a is cut short by a host-wide OOM (MemAvailable fell from 4 GB to 10 MB): b starts
    once MemAvailable is back; after b (an ordinary end) c starts at once."""
    root = tmp_path / "root"
    meminfo(root, 4_000_000)
    (tmp_path / "specs").mkdir()
    for n, rid in enumerate("abc"):
        RunSpec(model="tiny", method="sgd", run_id=rid).save(tmp_path / "specs" / f"{n:02d}-{rid}.json")
    starts: dict[str, float] = {}

    def fake_run(spec: RunSpec, out: Path, root: str) -> dict:
        starts[spec.run_id] = time.monotonic()
        end = {"exit_signal": signal.SIGKILL, **LAB, "kernel_oom_constraint": "CONSTRAINT_NONE"}
        if spec.run_id == "a":
            meminfo(Path(root), 10_000)
            later(1.0, lambda: meminfo(Path(root), 4_000_000))
        else:
            end = {"exit_signal": None, "exit_code": 0}
        status, detail = run_status(RunEnd(**end), [])
        Path(out).mkdir(parents=True)
        result = {"status": status, "detail": detail, "end": end}
        (Path(out) / "result.json").write_text(json.dumps(result))
        return result

    monkeypatch.setattr(sweep, "run_spec", fake_run)
    monkeypatch.setattr(sweep, "MEMORY_POLL_S", 0.1)
    state = sweep.run_sweep(tmp_path, root=str(root))
    assert state["runs"] == {"a": "killed", "b": "ok", "c": "ok"}
    assert 0.9 <= starts["b"] - starts["a"] < 5 and starts["c"] - starts["b"] < 0.5
    log = capsys.readouterr().err
    assert log.count("sweep: a ended in a host-wide OOM; waited") == 1 and "back to 3906 MiB" in log
    assert "killed" not in log.lower()  # sweep.log's tail naming a kill reads as the sweep's own (fleet sweeps.py)


# --- the shell sweep: the same end facts, the same wait ---------------------------------------

def python_end_keys(tmp_path: Path) -> set[str]:
    supervisor = Supervisor(RunSpec(model="tiny", method="sgd", run_id="x"), tmp_path / "py")
    supervisor.out.mkdir(parents=True)
    supervisor._cpu_start = {}
    return set(supervisor._finish(clock_pair(), 0, None, 0, False, {})["end"])


def worker(folder: Path, body: str) -> Path:
    """A native worker bundle whose run.sh answers --clock and otherwise runs `body`."""
    folder.mkdir(parents=True)
    (folder / "bundle.json").write_text("{}")
    (folder / "run.sh").write_text('if [ "$1" = --clock ]; then s=$(date +%s); echo "$s 0 $s 0"; exit 0; fi\n'
                                   + body)
    return folder


def test_the_shell_sweep_writes_the_same_end_facts_and_waits_for_the_memory(tmp_path):
    """The worker of a takes the fixture host's memory and is SIGKILLed: result.json's `end` has
    the supervisor's keys, RunEnd's (the kernel's record null: a shell reads no kmsg) with the low point; b
    starts once MemAvailable is back, and sweep.log says so."""
    if shutil.which("sha256sum") is None:
        pytest.fail("sha256sum is not installed (coreutils)")
    root = tmp_path / "root"
    meminfo(root, 4_000_000)
    hog = worker(tmp_path / "hog", f'printf "MemAvailable: 10240 kB\\n" > "{root}/proc/meminfo"\n'
                                   "sleep 0.5\nkill -9 $$\n")
    ok = worker(tmp_path / "ok", "date +%s.%N > \"$(dirname \"$0\")/started\"\nexit 0\n")
    done_a = tmp_path / "hog" / "ended"
    sweep_dir = tmp_path / "sweeps" / "s"
    (sweep_dir / "specs").mkdir(parents=True)
    for n, (rid, bundle) in enumerate((("a", hog), ("b", ok))):
        (sweep_dir / "specs" / f"{n:02d}-{rid}.json").write_text("{}")
        (sweep_dir / "specs" / f"{n:02d}-{rid}.env").write_text(
            f"RUN_ID={rid}\nSPEC_JSON={n:02d}-{rid}.json\nPROGRAM={tmp_path}/none\nWORKER={bundle}\n"
            f"PLAN={tmp_path}/none\nTICK_S=0.05\nMID_EVERY=1\nSLOW_EVERY=1\nTIMEOUT_S=0\nPOWER=none\n")

    def restore_when_a_ended() -> None:
        while not (sweep_dir / "runs" / "a" / "result.json").exists():
            time.sleep(0.05)
        done_a.write_text(str(time.time()))
        time.sleep(2)
        meminfo(root, 4_000_000)

    restore = threading.Thread(target=restore_when_a_ended)
    restore.start()
    proc = subprocess.run(["sh", str(Path(sweep.__file__).with_name("sweep.sh")), str(sweep_dir)],
                          env={**os.environ, "EDGEBENCH_ROOT": str(root)}, capture_output=True, text=True,
                          timeout=120)
    restore.join()
    assert proc.returncode == 0, proc.stderr
    result = sweep_dir / "runs" / "a" / "result.json"
    written = json.loads(result.read_text())["end"]
    assert set(written) == python_end_keys(tmp_path) == {f.name for f in dataclasses.fields(RunEnd)}
    end = RunEnd.from_json(written, str(result))
    assert end.exit_signal == signal.SIGKILL and end.kernel_oom is end.kernel_oom_constraint is None
    meta_path = sweep_dir / "runs" / "a" / "meta.json"  # meta.json too: RunMeta's keys, every one of them
    meta = json.loads(meta_path.read_text())
    assert set(meta) == set(META_KEYS) and RunMeta.from_json(meta, str(meta_path)).to_json() == meta
    assert end.mem_available_low_bytes == 10240 * 1024
    waited = float((ok / "started").read_text()) - float(done_a.read_text())
    assert 1.5 <= waited < 10, waited
    assert "sweep: a ended while the device's memory ran out" in proc.stderr
    assert "back to 3906 MiB (3906 MiB)" in proc.stderr and "killed" not in proc.stderr.lower()
