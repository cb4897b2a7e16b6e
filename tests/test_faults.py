"""Faults and bad input, done for real: nothing lost, nothing escapes.

Signals go to real process groups (each command starts in its own session with SIGINT at
its default, as a terminal's foreground job has it); a real tmpfs fills up; a lab device's
real sshd is killed mid-sweep; a device lists hostile names; two collects run at once.
Every run that started must end with a readable result.json; every user error is one line
and exit code 2; nothing is written outside the runs folder.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebench.devices.device_scripts import sweeps as sweeps_script
from edgebench.figures.run import figures_of_run_dir
from edgebench.runner import oom_score
from edgebench.runner.spec import RunSpec
from edgebench.runner.sweep import run_sweep
from edgebench.telemetry.trace import read_trace

PY = sys.executable


def tiny(**kw) -> RunSpec:
    base = dict(model="tiny", method="sgd", batch_size=1, text_length=16, warmup_steps=0, steps=2, sample_hz=20.0)
    return RunSpec(**{**base, **kw})


def _own_session() -> None:
    """A terminal's foreground job: its own process group, SIGINT at its default."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(argv: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})}, preexec_fn=_own_session,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def edgebench(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "edgebench.cli", *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def wait_for(predicate, timeout_s: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stepping(run_dir: Path) -> bool:
    return any(e.get("event") == "step_end" for e in read_trace(run_dir / "events.jsonl").records) \
        if (run_dir / "events.jsonl").exists() else False


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def supervisors_oom_score_adj() -> int:
    """What a supervisor's shield gives here: lowering oom_score_adj needs CAP_SYS_RESOURCE (bit 24),
    which some sandboxes withhold even from root; then it keeps what it inherited (this process's)."""
    caps = int(next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("CapEff:")), 16)
    return oom_score.SUPERVISOR if caps >> 24 & 1 else oom_score_adj(os.getpid())


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def inventory(tmp_path, monkeypatch):
    path = tmp_path / "inventory.yaml"
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(path))
    return path


def write_inventory(path: Path, devices: dict) -> None:
    import yaml

    path.write_text(yaml.safe_dump({"devices": devices}))


# --- signals ---------------------------------------------------------------------------

def test_ctrl_c_twice_during_bench_records_ingests_and_exits_130(tmp_path):
    proc = start([PY, "-m", "edgebench.cli", "bench", "--methods", "sgd,adamw", "--steps", "100000",
                  "--text-length", "16", "--runs-dir", "runs"], cwd=tmp_path)
    wait_for(lambda: any(stepping(d) for d in (tmp_path / "runs").glob("*") if d.is_dir()), what="a step")
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # the impatient second Ctrl-C
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    run_dirs = [d for d in (tmp_path / "runs").iterdir() if d.is_dir() and d.name != "raw"]
    assert len(run_dirs) == 1  # adamw never started
    result = json.loads((run_dirs[0] / "result.json").read_text())
    assert result["status"] == "interrupted" and "SIGINT" in result["detail"]
    assert read_trace(run_dirs[0] / "events.jsonl").bad_lines == 0
    import duckdb

    con = duckdb.connect(str(tmp_path / "runs" / "edgebench.duckdb"), read_only=True)
    assert con.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
    assert not children(proc.pid)


def test_ctrl_c_during_bench_is_named_alike_in_events_and_result(tmp_path):
    """The worker is passed the signal the user sent: its event and result.json name the same one."""
    proc = start([PY, "-m", "edgebench.cli", "bench", "--methods", "sgd", "--steps", "100000",
                  "--text-length", "16", "--runs-dir", "runs"], cwd=tmp_path)
    wait_for(lambda: any(stepping(d) for d in (tmp_path / "runs").glob("*") if d.is_dir()), what="a step")
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir() and d.name != "raw"]
    result = json.loads((run_dir / "result.json").read_text())
    (event,) = [e for e in read_trace(run_dir / "events.jsonl").records if e["event"] == "interrupted"]
    assert event["detail"] == result["detail"] == "stopped by Ctrl-C (SIGINT)", (event, result)


def _supervised(tmp_path: Path, **spec) -> tuple[subprocess.Popen, Path]:
    tiny(steps=100_000, run_id="r", **spec).save(tmp_path / "spec.json")
    run_dir = tmp_path / "run"
    proc = start([PY, "-m", "edgebench.runner", "spec.json", "--out", "run"], cwd=tmp_path)
    wait_for(lambda: stepping(run_dir), what="a step")
    return proc, run_dir


def test_worker_killed_from_outside_is_killed_not_oom(tmp_path):
    proc, run_dir = _supervised(tmp_path)
    (worker,) = children(proc.pid)
    scores = [oom_score_adj(pid) for pid in (worker, proc.pid)]
    os.kill(worker, signal.SIGKILL)
    proc.communicate(timeout=60)
    result = figures_of_run_dir(run_dir)
    assert result["status"] == "killed", result
    assert result["exit_signal"] == "SIGKILL" and "no OOM record" in result["detail"]
    assert scores == [oom_score.WORKER, supervisors_oom_score_adj()]  # the OOM killer's first and last choice


def test_a_dying_supervisor_takes_its_worker_with_it(tmp_path):
    proc, run_dir = _supervised(tmp_path)
    (worker,) = children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # only the supervisor
    proc.communicate(timeout=30)
    wait_for(lambda: gone(worker), timeout_s=5, what="the worker to die with its supervisor")


def test_sigint_to_the_runner_group_is_interrupted(tmp_path):
    proc, run_dir = _supervised(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    result = figures_of_run_dir(run_dir)
    assert result["status"] == "interrupted" and result["last_step"] is not None
    assert any(e["event"] == "interrupted" for e in read_trace(run_dir / "events.jsonl").records)


# --- sweeps: state, resume, full disk --------------------------------------------------

def _sweep_dir(tmp_path: Path, specs: list[RunSpec]) -> Path:
    sweep = tmp_path / "sweep"
    (sweep / "specs").mkdir(parents=True)
    for i, spec in enumerate(specs):
        spec.save(sweep / "specs" / f"{i:02d}-{spec.run_id}.json")
    return sweep


def test_killed_sweep_reads_stopped_and_resumes_into_a_fresh_attempt(tmp_path):
    sweep = _sweep_dir(tmp_path, [tiny(run_id="a", steps=100_000)])
    proc = start([PY, "-m", "edgebench.runner.sweep", str(sweep)], cwd=tmp_path)
    wait_for(lambda: stepping(sweep / "runs" / "a"), what="a step")
    (worker,) = children(proc.pid)
    scores = [oom_score_adj(pid) for pid in (worker, proc.pid)]
    os.killpg(proc.pid, signal.SIGKILL)  # the device rebooted, as far as the sweep can tell
    proc.communicate(timeout=30)
    assert scores == [oom_score.WORKER, supervisors_oom_score_adj()]  # the OOM killer's first and last choice
    state = sweeps_script.sweep_state(str(sweep))
    assert state["state"] == "stopped" and state["why"] and state["runs"]["a"] == "killed"
    closed = json.loads((sweep / "runs" / "a" / "result.json").read_text())  # final: collect and the store read it
    assert closed["status"] == "killed" and closed["cut_off"] and state["why"] in closed["detail"]
    assert json.loads((sweep / "sweep.json").read_text())["state"] == "stopped"
    assert sweeps_script.sweep_state(str(sweep)) == state  # read again: the same
    steps_before = sum(1 for e in read_trace(sweep / "runs" / "a" / "events.jsonl").records if e["event"] == "step_end")
    spec = RunSpec.load(sweep / "specs" / "00-a.json")
    spec.steps = 3
    spec.save(sweep / "specs" / "00-a.json")
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    again = run_sweep(sweep)
    assert (
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
    ) == handlers  # an in-process sweep leaves none behind
    assert again["state"] == "finished"
    assert again["runs"] == {"a.attempt-1": "interrupted", "a": "ok"}
    fresh = figures_of_run_dir(sweep / "runs" / "a")
    assert fresh["steps_done"] == 3  # nothing appended to the old attempt's trace
    kept = sweep / "runs" / "a.attempt-1"
    assert json.loads((kept / "result.json").read_text())["status"] == "interrupted"
    assert sum(1 for e in read_trace(kept / "events.jsonl").records if e["event"] == "step_end") == steps_before


def test_a_sweep_killed_after_its_worker_was_killed_for_memory_reads_oom(tmp_path, memory_cgroup):
    """The kernel can kill the sweep process too while the OOM-killed worker's memory is still being
    freed. Here for certain: the sweep is frozen, the worker OOM-killed (a real cgroup limit, a
    real allocation beside it), then the sweep killed. The run still reads `oom`, from the kill count."""
    sweep = _sweep_dir(tmp_path, [tiny(run_id="a", steps=100_000)])

    def enter_cgroup() -> None:
        _own_session()
        (memory_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen([PY, "-m", "edgebench.runner.sweep", str(sweep)], cwd=tmp_path, preexec_fn=enter_cgroup,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: stepping(sweep / "runs" / "a"), what="a step")
    (worker,) = children(proc.pid)
    os.kill(proc.pid, signal.SIGSTOP)  # it cannot record what follows
    usage = int((memory_cgroup / "memory.usage_in_bytes").read_text())
    (memory_cgroup / "memory.limit_in_bytes").write_text(str(usage + 64 * 2**20))
    subprocess.run([PY, "-c", "b = b'x' * (256 << 20)"], preexec_fn=enter_cgroup, timeout=60)
    wait_for(lambda: gone(worker), timeout_s=30, what="the OOM killer to take the worker (oom_score_adj 1000)")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    state = sweeps_script.sweep_state(str(sweep))
    assert state["state"] == "stopped" and state["runs"] == {"a": "oom"}, state
    result = json.loads((sweep / "runs" / "a" / "result.json").read_text())
    assert result["oom_kills_during_run"] >= 1 and not result.get("cut_off"), result
    assert str(memory_cgroup / "memory.oom_control") in result["detail"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs (real ENOSPC), unmounted afterwards."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the fault tests need root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_ends_the_run_as_error_and_the_sweep_as_stopped(small_tmpfs):
    sweep = _sweep_dir(small_tmpfs, [tiny(run_id="a", steps=1_000_000, sample_hz=100.0), tiny(run_id="b")])
    free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
    (small_tmpfs / "filler").write_bytes(
        b"x" * (free - 400 * 1024)
    )  # the reserves (320 KiB), room to start (64 KiB) and a little
    done = subprocess.run([PY, "-m", "edgebench.runner.sweep", str(sweep)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    result = json.loads((sweep / "runs" / "a" / "result.json").read_text())
    assert result["status"] == "error" and "no space left" in result["detail"], result
    state = json.loads((sweep / "sweep.json").read_text())
    assert state["state"] == "stopped" and "no space left" in state["why"]
    assert state["runs"]["b"] == "not started"
    assert read_trace(sweep / "runs" / "a" / "events.jsonl").bad_lines == 0


def test_preflight_says_how_much_room_a_sweep_needs():
    from edgebench.runner.sweep import disk_needed_est

    short, long = [tiny(steps=5)], [tiny(duration_s=3600.0)]
    assert 0 < disk_needed_est(short) < disk_needed_est(long)
    assert disk_needed_est(long) >= 3600 * 20 * 300  # an hour of samples at 20 Hz, ~300 B a line


# --- names from outside ------------------------------------------------------------------

def _hostile_device(tmp_path: Path, inventory: Path, listing: dict) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(listing)}\nEOF\n")
    fake.chmod(0o755)
    write_inventory(inventory, {"evil": {"profile": "local", "kind": "local", "python": str(fake),
                                         "workdir": str(tmp_path / "dev")}})


@pytest.mark.parametrize("run_id,file_name", [("../../../escape", "f"), ("ok", "../../escape"),
                                              ("ok", "/tmp/escape-abs"), (".hidden", "f"),
                                              ("ok", "weights/../../../escape"), ("ok", "weights/x/../../../escape")])
def test_hostile_listing_is_refused_and_named(tmp_path, inventory, edgebench_here, run_id, file_name):
    sha = "0" * 64
    _hostile_device(tmp_path, inventory, {"root": str(tmp_path / "dev"), "sweeps": {
        "s1": {"state": None, "runs": {run_id: {file_name: {"size": 1, "sha256": sha}}}}}})
    work = tmp_path / "host"
    work.mkdir()
    done = edgebench_here("collect", "--device", "evil", "--runs-dir", "runs", cwd=work)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "evil" in done.stderr and "refused" in done.stderr
    assert not (tmp_path / "escape").exists() and not Path("/tmp/escape-abs").exists()
    written = [p for p in work.rglob("*") if p.is_file() and p.name != ".collect.lock"]
    assert written == []


def test_device_name_that_is_a_path_is_refused(tmp_path, inventory, edgebench_here):
    write_inventory(inventory, {"../../escape": {"profile": "local", "kind": "local"}})
    done = edgebench_here("deploy", "--device", "../../escape", "--methods", "sgd", cwd=tmp_path)
    assert done.returncode == 2 and "not a safe file name" in done.stderr
    assert not (tmp_path.parent / "escape").exists()


@pytest.fixture(scope="module")
def device_with_runs(tmp_path_factory):
    """A local-transport device whose work dir holds a finished sweep of one tiny run."""
    root = tmp_path_factory.mktemp("dev")
    sweep = root / "work" / "sweeps" / "s1"
    (sweep / "specs").mkdir(parents=True)
    tiny(run_id="r0").save(sweep / "specs" / "00-r0.json")
    assert run_sweep(sweep)["state"] == "finished"
    return root


def test_two_collects_at_once_both_finish_and_agree(tmp_path, inventory, device_with_runs):
    write_inventory(
        inventory, {"box": {"profile": "local", "kind": "local", "workdir": str(device_with_runs / "work")}}
    )
    procs = [start([PY, "-m", "edgebench.cli", "collect", "--device", "box", "--runs-dir", "runs", "--store",
                    "runs/edgebench.duckdb"], cwd=tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    import duckdb

    con = duckdb.connect(str(tmp_path / "runs" / "edgebench.duckdb"), read_only=True)
    assert con.execute("SELECT run_id, status FROM runs").fetchall() == [("r0", "ok")]
    original = device_with_runs / "work" / "sweeps" / "s1" / "runs" / "r0" / "events.jsonl"
    assert (tmp_path / "runs" / "box" / "r0" / "events.jsonl").read_bytes() == original.read_bytes()
    assert not list((tmp_path / "runs").rglob("*.part"))


def test_a_hostile_run_name_is_refused_and_the_device_s_other_runs_are_collected(tmp_path, inventory,
                                                                                  edgebench_here, device_with_runs):
    import shutil

    work = tmp_path / "work"
    shutil.copytree(device_with_runs / "work", work)
    (work / "sweeps" / "s1" / "runs" / "bad name$(x)").mkdir()
    (work / "sweeps" / "s1" / "runs" / "bad name$(x)" / "meta.json").write_text("{}")
    write_inventory(inventory, {"box": {"profile": "local", "kind": "local", "workdir": str(work)}})
    done = edgebench_here("collect", "--device", "box", "--runs-dir", "runs", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # something was refused: said, and the exit code says so
    got = json.loads(done.stdout)["box"]
    assert got["runs"] == {"r0": "ok"} and got["ingested"] == ["r0"], got
    assert list(got["refused"]) == ["bad name$(x)"] and "not a plain file name" in got["refused"]["bad name$(x)"]
    assert sorted(p.name for p in (tmp_path / "runs" / "box").iterdir() if p.is_dir()) == ["r0"]


# --- user errors: one line, exit 2, before any work -----------------------------------

USER_ERRORS = [
    (["bench", "--methods", "adamww"], "adamww"),
    (["bench", "--methods", "sgd+sgd"], "twice"),
    (["bench", "--methods", "sgd+adamw"], "sgd"),
    (["bench", "--model", "tinyy"], "tinyy"),
    (["bench", "--duration", "-5s"], "--duration"),
    (["bench", "--duration", "0"], "--duration"),
    (["bench", "--duration", "1e999"], "--duration"),
    (["bench", "--device", "nosuch"], "nosuch"),
    (["predict", "--method", "adamw", "--device", "nosuch"], "nosuch"),
    (["live", "--device", "nosuch"], "nosuch"),
    (["status", "--device", "nosuch"], "nosuch"),
    (["collect", "--device", "nosuch"], "nosuch"),
    (["report", "--store", "/etc/hostname"], "damaged"),
]


@pytest.mark.parametrize("args,names", USER_ERRORS, ids=[" ".join(a) for a, _ in USER_ERRORS])
def test_user_error_is_one_line_exit_2_and_starts_nothing(tmp_path, inventory, edgebench_here, args, names):
    done = edgebench_here(*args, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_debug_shows_the_traceback(tmp_path, inventory, edgebench_here):
    done = edgebench_here("--debug", "live", "--device", "nosuch", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" in done.stderr


def test_damaged_checkpoint_and_foreign_store_are_named(tmp_path, inventory, edgebench_here):
    from edgebench.model.config import get_config

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(get_config("tiny").to_nanovlm_dict()))
    (ckpt / "model.safetensors").write_bytes(b"\x00garbage")
    done = edgebench_here("models", "--load", str(ckpt), cwd=tmp_path)
    assert done.returncode == 2 and "damaged" in done.stderr and "model.safetensors" in done.stderr
    (ckpt / "config.json").write_text("{}")
    done = edgebench_here("models", "--load", str(ckpt), cwd=tmp_path)
    assert done.returncode == 2 and "config.json: missing field(s) vit_hidden_dim" in done.stderr
    import duckdb

    duckdb.connect(str(tmp_path / "other.duckdb")).execute("CREATE TABLE x (a INT)").close()
    done = edgebench_here("report", "--store", "other.duckdb", cwd=tmp_path)
    assert done.returncode == 2 and "not an edgebench results store" in done.stderr


def test_status_exits_non_zero_when_a_device_cannot_be_asked(tmp_path, inventory, edgebench_here):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    write_inventory(inventory, {"away": {"profile": "raspberry-pi-4-4gb", "host": "127.0.0.1", "port": port,
                                         "user": "pi", "connect_timeout_s": 2}})
    done = edgebench_here("status", "--device", "away", cwd=tmp_path)
    assert done.returncode == 1 and "away" in done.stdout + done.stderr


# --- the lab: sshd dies mid-sweep ----------------------------------------------------------

@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.large  # ~55 s on the lab's one worker, the suite's longest path: CI's `-m 'arm64 or large'`
def test_lab_up_after_sshd_died_keeps_the_running_sweep(tmp_path, monkeypatch):
    from edgebench.devices import lab
    from edgebench.fleet.deploy import deploy_one

    monkeypatch.setenv("EDGEBENCH_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    device = lab.LabDevice("raspberry-pi-4-4gb", name="lab-faults")
    lab.up([device])
    try:
        deployed = deploy_one("lab-faults", [tiny(steps=100_000, timeout_s=120.0)], tmp_path / "runs")
        run_dir = Path(deployed.sweep_dir) / "runs" / deployed.run_ids[0]
        wait_for(lambda: stepping(run_dir), what="a step on the lab device")
        sweep_pid = int((Path(deployed.sweep_dir) / "sweep.pid").read_text())
        os.kill(lab.read_state()["lab-faults"]["pid"], signal.SIGKILL)  # its sshd dies
        wait_for(lambda: not [r for r in lab.status() if r["running"]], timeout_s=10, what="sshd to be gone")
        assert lab.status()[0]["processes"] >= 2  # the sweep and its worker are still there
        lab.up([device])
        assert not gone(sweep_pid) and stepping(run_dir)
        assert lab.status()[0]["running"] and lab.status()[0]["processes"] >= 3
        os.kill(sweep_pid, signal.SIGTERM)
        wait_for(lambda: (run_dir / "result.json").exists(), what="result.json after SIGTERM")
        assert json.loads((run_dir / "result.json").read_text())["status"] == "interrupted"
        wait_for(lambda: gone(sweep_pid), timeout_s=30, what="the sweep to end")
        state = json.loads((Path(deployed.sweep_dir) / "sweep.json").read_text())
        assert state["state"] == "interrupted" and "SIGTERM" in state["why"]
        _ctrl_c_during_deploy(tmp_path)
    finally:
        lab.down(purge=True)


def _ctrl_c_during_deploy(tmp_path: Path) -> None:
    """Ctrl-C while deploy still waits on a second device (an SSH port that never answers):
    the sweep already started on the lab device is stopped, collected and ingested; exit 130."""
    import socket

    import yaml

    from edgebench.devices.inventory import inventory_path

    with socket.socket() as silent:  # accepts connections (kernel backlog) but never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        entries = yaml.safe_load(inventory_path().read_text())["devices"]
        port = silent.getsockname()[1]
        known = Path(entries["lab-faults"]["known_hosts"]).read_text().split()
        (tmp_path / "mute_known_hosts").write_text(f"[127.0.0.1]:{port} {known[1]} {known[2]}\n")
        entries["mute"] = {"profile": "raspberry-pi-4-4gb", "host": "127.0.0.1", "port": port, "user": "pi",
                           "connect_timeout_s": 40, "known_hosts": str(tmp_path / "mute_known_hosts")}
        write_inventory(inventory_path(), entries)
        work = Path(entries["lab-faults"]["workdir"])
        before = set(work.glob("sweeps/*"))
        proc = start([PY, "-m", "edgebench.cli", "deploy", "--device", "lab-faults", "--device", "mute", "--methods",
                      "sgd", "--steps", "100000", "--text-length", "16", "--runs-dir", "runs"], cwd=tmp_path)
        wait_for(lambda: any((d / "sweep.json").exists() for d in set(work.glob("sweeps/*")) - before),
                 what="the new sweep to start")
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "lab-faults: interrupted" in err
    (sweep,) = set(work.glob("sweeps/*")) - before
    (run_dir,) = (sweep / "runs").iterdir()
    assert json.loads((run_dir / "result.json").read_text())["status"] == "interrupted"
    import duckdb

    con = duckdb.connect(str(tmp_path / "runs" / "edgebench.duckdb"), read_only=True)
    assert ("interrupted",) in con.execute("SELECT status FROM runs WHERE run_id = ?", [run_dir.name]).fetchall()


# --- oom only with evidence ------------------------------------------------------------

def test_kernel_oom_record_is_the_evidence_for_a_kill(memory_cgroup):
    """A real OOM kill in a 64 MiB cgroup: the kernel's record names the pid and the cgroup's
    limit as what it killed for, so a SIGKILL without a cgroup counter still reads `oom` (even in a
    cgroup with a limit: not the host's OOM); with no record it reads `killed`."""
    from edgebench.figures.run_end import RunEnd
    from edgebench.figures.status import run_status
    from edgebench.runner.supervisor import kernel_oom_record

    (memory_cgroup / "memory.limit_in_bytes").write_text(str(64 * 2**20))
    procs = memory_cgroup / "cgroup.procs"
    started = time.monotonic_ns()
    hog = subprocess.Popen([PY, "-c", "b = [bytearray(1 << 20) for _ in range(1024)]"],
                           preexec_fn=lambda: procs.write_text(str(os.getpid())))
    assert hog.wait(timeout=60) == -signal.SIGKILL
    record = kernel_oom_record(hog.pid, started)
    assert record is not None and f"Killed process {hog.pid} " in str(record["line"])
    assert record["constraint"] == "CONSTRAINT_MEMCG"
    end = RunEnd(exit_signal=signal.SIGKILL, kernel_oom=record["line"], kernel_oom_constraint=record["constraint"],
                 cgroup_limit_bytes=64 * 2**20)
    assert run_status(end, [])[0] == "oom"
    assert kernel_oom_record(os.getpid(), started) is None
    assert run_status(RunEnd(exit_signal=signal.SIGKILL, kernel_oom=None), [])[0] == "killed"


def test_save_to_a_disk_without_room_for_the_weights_is_refused_before_any_run(small_tmpfs, tmp_path,
                                                                               edgebench_here):
    """tiny's fp32 weights (8 MiB) do not fit a 2 MiB disk: refused in one line naming both sizes,
    before anything trains, not found out after the last step."""
    done = edgebench_here("bench", "--methods", "sgd", "--save", str(small_tmpfs / "w"), cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "MiB of trained weights to write (1 runs, fp32) and 2 MiB free there" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


def test_one_sweep_per_device_even_when_two_deploys_start_together(tmp_path):
    """Two sweeps in one device's sweeps folder: the second starts nothing and says which sweep
    holds the device; once the first is gone (killed, its host away), the lock is free again."""
    device = tmp_path / "work" / "sweeps"
    first, second = device / "first", device / "second"
    for sweep, spec in ((first, tiny(run_id="a", steps=100_000)), (second, tiny(run_id="b", steps=1))):
        (sweep / "specs").mkdir(parents=True)
        spec.save(sweep / "specs" / f"00-{spec.run_id}.json")
    proc = start([PY, "-m", "edgebench.runner.sweep", str(first)], cwd=tmp_path)
    try:
        wait_for(lambda: stepping(first / "runs" / "a"), what="a step")
        refused = subprocess.run([PY, "-m", "edgebench.runner.sweep", str(second)], capture_output=True, text=True,
                                 timeout=60)
        state = json.loads((second / "sweep.json").read_text())
        assert refused.returncode == 2 and state["state"] == "refused" and state["runs"] == {"b": "not started"}
        assert "sweep first is running on this device" in state["why"] and not (second / "runs").exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the first sweep dies without a word: its lock goes with it
        proc.communicate(timeout=30)
    assert run_sweep(second)["runs"] == {"b": "ok"}


def test_one_sweep_per_device_in_the_shell_sweep(tmp_path):
    """The shell sweep keeps the same rule: a live sweep.sh holding the device's lock folder makes
    a second one record `refused` and start nothing; a holder that is gone leaves it free."""
    sweep_sh = Path(__file__).resolve().parents[1] / "edgebench" / "runner" / "sweep.sh"
    device = tmp_path / "work" / "sweeps"
    second = device / "second"
    (second / "specs").mkdir(parents=True)
    (second / "specs" / "00-b.env").write_text("RUN_ID=b\n")
    holder = subprocess.Popen(["sh", "-c", "sleep 60", "sweep.sh"])  # its command line names sweep.sh
    try:
        lock = device / ".one-sweep-at-a-time.d"
        lock.mkdir()
        (lock / "pid").write_text(f"{holder.pid}\n")
        (lock / "sweep").write_text("first\n")
        refused = subprocess.run(["sh", str(sweep_sh), str(second)], capture_output=True, text=True, timeout=60)
        state = json.loads((second / "sweep.json").read_text())
        assert refused.returncode == 2 and state["state"] == "refused" and state["runs"] == {"b": "not started"}
        assert "sweep first is running on this device" in state["why"]
    finally:
        holder.kill()
        holder.wait()
    (second / "specs" / "00-b.env").unlink()  # nothing to run: the sweep takes the lock and ends
    done = subprocess.run(["sh", str(sweep_sh), str(second)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads((second / "sweep.json").read_text())["state"] == "finished"
    assert not lock.exists()  # given back as it ended


def test_saved_weights_on_a_disk_that_fills_up_leave_nothing_that_looks_saved(small_tmpfs):
    """A real ENOSPC half-way through the weights (8 MiB into a 2 MiB tmpfs): the write fails
    with the kernel's error and leaves neither model.safetensors nor its partial file behind."""
    import torch

    from edgebench.model.checkpoint import write_safetensors

    layout = {f"w{i}": torch.empty(256, 1024, device="meta") for i in range(8)}  # 1 MiB each
    with pytest.raises(OSError) as err:
        write_safetensors(small_tmpfs / "model.safetensors", layout, lambda name: torch.ones(256, 1024))
    assert err.value.errno == errno.ENOSPC
    assert list(small_tmpfs.iterdir()) == []
