"""Live view: following files as they grow, the state, the rendering, and the real thing in tmux."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from edgebench.devices.transport import LocalTransport
from edgebench.live.follow import LocalRun, RemoteRun, find_local_run
from edgebench.live.state import LiveState
from edgebench.live.view import render, sparkline
from edgebench.telemetry.trace import TraceTail
from live_writer import write_run

TESTS = Path(__file__).parent


def _text(state: LiveState, width: int = 120) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(render(state, now=0.0))
    return console.export_text()


def test_trace_tail_returns_only_complete_lines(tmp_path):
    path = tmp_path / "samples.jsonl"
    tail = TraceTail(path)
    assert tail.read_lines() == []  # not there yet
    path.write_bytes(b'{"t_ns": 1}\n{"t_ns": 2, "rss')
    assert tail.read_lines() == [b'{"t_ns": 1}']
    with open(path, "ab") as fh:
        fh.write(b'_bytes": 5}\n')
    assert tail.read_lines() == [b'{"t_ns": 2, "rss_bytes": 5}']
    path.write_bytes(b'{"t_ns": 9}\n')  # replaced by a shorter file: start again
    assert tail.read_lines() == [b'{"t_ns": 9}']
    with open(path, "ab") as fh:
        fh.write(b'garbage\n{"t_ns": 10}\n')
    assert tail.read() == [{"t_ns": 10}] and tail.bad_lines == 1


def test_state_and_render_show_the_figures_of_a_finished_run(tmp_path):
    write_run(tmp_path / "r1", steps=4, step_s=0.02, sample_s=0.005)
    with open(tmp_path / "r1" / "samples.jsonl", "a") as fh:
        fh.write("garbage\n")
    source = LocalRun(tmp_path / "r1")
    state = LiveState(source=source.label)
    state.apply(source.poll())
    assert state.finished and state.steps_done == {"warmup": 1, "measure": 4} and state.bad_lines == 1
    assert state.peak_rss_bytes == (100 << 20) + 4 * (7 << 20)
    text = _text(state)
    for needle in ("method lora", "backend eager", "[ok]", "step 4/4", "/ 1,024 MiB", "W (measured)",
                   "finished: summary", "1 unreadable trace line"):
        assert needle in text, needle
    # the board's own accounting is the device's RAM (worker + 50 MiB); the worker's RSS is named as what it is
    assert "178.0 MiB / 1,024 MiB (17%): device RAM (MemTotal - MemAvailable)" in text
    assert "128.0 MiB kernel RSS of the worker process" in text
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"


def test_estimated_power_is_marked_in_the_view():
    state = LiveState()
    state.apply(SimpleNamespace(meta=None, result=None, error=None, bad_lines=0, events=[],
                                samples=[{"t_ns": 1, "rss_bytes": 1 << 20, "power_w_est": 4.2}]))
    assert "~4.20 W (ESTIMATED)" in _text(state)


def test_device_ram_is_the_cgroup_its_limit_applies_to_not_the_workers_rss():
    """A 512 MiB lab device: the worker's RSS (shared library pages) reads above the limit, the
    cgroup (what the limit applies to) below it; the RAM bar is the cgroup's."""
    state = LiveState()
    state.apply(
        SimpleNamespace(
            meta={"device": {"mem_total_bytes": 64 << 30}},
            result=None,
            error=None,
            bad_lines=0,
            events=[],
            samples=[
                {
                    "t_ns": 1,
                    "rss_bytes": 578 << 20,
                    "cgroup_usage_bytes": 500 << 20,
                    "cgroup_limit_bytes": 512 << 20,
                    "mem_available_bytes": 60 << 30,
                }
            ],
        )
    )
    text = _text(state, width=130)
    assert "500.0 MiB / 512 MiB (98%): device RAM (its cgroup, page cache included)" in text
    assert "578.0 MiB kernel RSS of the worker process" in text and "113%" not in text


def test_live_follows_a_sweep_from_run_to_run(tmp_path):
    """Over a transport (what `live --device D` uses): when the followed run ends, the sweep's next one."""
    from edgebench.live.app import run_live
    from edgebench.live.follow import Sweep, find_remote_run

    runs = tmp_path / "sweeps" / "s1" / "runs"
    write_run(runs / "first", steps=2, step_s=0.01, sample_s=0.005)
    write_run(runs / "second", steps=3, step_s=0.01, sample_s=0.005)  # the sweep's next run
    for name, mtime in (("first", 1_000), ("second", 2_000)):  # which is newer is set, not slept for
        os.utime(runs / name, (mtime, mtime))
    transport = LocalTransport(SimpleNamespace(name="here"))
    source = RemoteRun(transport, str(runs / "first"), json_interval_s=0.05)
    sweep = Sweep(lambda: find_remote_run(transport, str(tmp_path), None),
                  lambda path: RemoteRun(transport, path, json_interval_s=0.05), runs / "first", interval_s=0.05)
    console = Console(file=open(os.devnull, "w"), width=100)
    state = run_live(source, LiveState(source=source.label), refresh_hz=30, console=console,
                     sweep=sweep)
    assert state.run_id == "second" and state.finished and state.steps_done["measure"] == 3


def test_find_local_run_by_id_and_newest(tmp_path):
    """Catches a newest run picked by anything but its meta.json's time (the order of creation or
    of the patterns): the times are set, not slept for, and the newest is neither first nor last."""
    for path, mtime in (("a", 1_000), ("pi/b", 3_000), ("sweeps/s1/runs/c", 2_000)):
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "meta.json").write_text("{}")
        os.utime(tmp_path / path / "meta.json", (mtime, mtime))
    assert find_local_run(tmp_path, "c") == tmp_path / "sweeps" / "s1" / "runs" / "c"
    assert find_local_run(tmp_path, None) == tmp_path / "pi" / "b"
    with pytest.raises(FileNotFoundError, match="no run 'zz'"):
        find_local_run(tmp_path, "zz")


def test_remote_follower_tails_through_a_transport(tmp_path):
    """RemoteRun over the devices room's LocalTransport: a real `tail -F` subprocess."""
    transport = LocalTransport(SimpleNamespace(name="here"))
    writer = subprocess.Popen([sys.executable, str(TESTS / "live_writer.py"), str(tmp_path / "r"), "--steps", "5",
                               "--step-s", "0.1", "--sample-s", "0.02"])
    (tmp_path / "r").mkdir(exist_ok=True)
    source = RemoteRun(transport, str(tmp_path / "r"), json_interval_s=0.1)
    state = LiveState(source=source.label)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (state.finished and state.steps_done["measure"] == 5):
            state.apply(source.poll())
            time.sleep(0.05)
    finally:
        source.close()
        writer.wait(timeout=20)
    assert state.finished and state.status == "ok"
    assert state.steps_done == {"warmup": 1, "measure": 5} and state.samples_seen > 10 and state.bad_lines == 0


CLOCK = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d)")  # the header's clock: the time of the frame, in tenths


def _capture(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def _pane_when(session: str, shows) -> str:
    """The pane's text once `shows(text)` holds: a slow host only takes longer, a view that
    never gets there fails after 60 s."""
    deadline = time.monotonic() + 60
    while not shows(text := _capture(session)):
        assert time.monotonic() < deadline, text
        time.sleep(0.1)
    return text


def _figures(text: str) -> tuple[int, float] | None:
    """The step and the device RAM (MiB) the view shows, or None before it shows both."""
    step, ram = re.search(r"step (\d+)/16", text), re.search(r"([\d,.]+) MiB / 1,024 MiB", text)
    return (int(step.group(1)), float(ram.group(1).replace(",", ""))) if step and ram else None


def test_live_view_in_tmux_follows_a_run_being_written(tmp_path):
    """The real view in a terminal follows a run as it is written (catches a view stuck on its
    first figures), refreshes at least 4 times a second by its own header clock over every frame
    it drew (catches a view refreshing once a second), and leaves by itself once the run has ended.
    It waits for what the pane shows, never for set times."""
    assert shutil.which("tmux"), "tmux is needed for this test: apt-get install -y tmux"
    run_dir, frames = tmp_path / "live-run", tmp_path / "frames"
    run_dir.mkdir()
    session = f"ebtest{int(time.time() * 1000) % 10**8}"
    command = f"{sys.executable} -m edgebench.live --dir {run_dir}; echo LIVE-EXIT=$?; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "130", "-y", "45", command], check=True)
    writer = None
    try:
        subprocess.run(["tmux", "pipe-pane", "-t", session, f"cat > {shlex.quote(str(frames))}"], check=True)
        _pane_when(session, CLOCK.search)  # the view is up before the run begins: it sees all of it
        writer = subprocess.Popen([sys.executable, str(TESTS / "live_writer.py"), str(run_dir), "--steps", "16",
                                   "--step-s", "0.3", "--sample-s", "0.05"])
        step1, ram1 = _figures(_pane_when(session, _figures))
        _pane_when(session, lambda text: (now := _figures(text)) is not None and now[0] > step1 and now[1] > ram1)
        writer.wait(timeout=60)
        done = _pane_when(session, lambda text: "LIVE-EXIT=" in text)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        if writer is not None and writer.poll() is None:
            writer.kill()
    assert "finished: summary" in done and "[ok]" in done and "step 16/16" in done
    assert "run live-run ended: ok" in done and "LIVE-EXIT=0" in done and "Traceback" not in done
    drawn = list(dict.fromkeys((3600 * int(h) + 60 * int(m) + int(s)) * 10 + int(t)  # tenths of the day, in order
                               for h, m, s, t in CLOCK.findall(frames.read_text(errors="replace"))))
    span_s = (drawn[-1] - drawn[0]) % 864_000 / 10  # from its first frame to its last, across midnight too
    assert span_s >= 5 and len(drawn) >= 4 * span_s, (len(drawn), span_s)


@pytest.mark.lab
def test_live_follows_a_run_on_a_lab_device_over_ssh(tmp_path, monkeypatch):
    """`edgebench live --device` against an emulated device: real sshd, real `tail -F` over SSH."""
    from click.testing import CliRunner

    from edgebench.devices import lab
    from edgebench.devices.inventory import get_device
    from edgebench.live.commands import live_command

    monkeypatch.setenv("EDGEBENCH_LAB_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    lab.up([lab.LabDevice("raspberry-pi-4-4gb", name="lab-live", cpus=1)])
    writer = None
    try:
        device = get_device("lab-live")
        budget_mib = int(device.profile.ram_bytes) / (1 << 20)  # the lab device's cgroup limit, not the host's 64 GiB
        run_dir = Path(device.workdir) / "sweeps" / "s1" / "runs" / "ssh-run"
        writer = subprocess.Popen([sys.executable, str(TESTS / "live_writer.py"), str(run_dir), "--steps", "6",
                                   "--step-s", "0.2", "--sample-s", "0.05", "--mem-total-bytes", str(64 << 30),
                                   "--cgroup-limit-bytes", str(int(device.profile.ram_bytes))])
        deadline = time.monotonic() + 10
        while not (run_dir / "meta.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        result = CliRunner().invoke(live_command, ["--device", "lab-live", "--run", "ssh-run", "--exit-when-done"],
                                    catch_exceptions=False, env={"COLUMNS": "130"})
    finally:
        if writer is not None:
            writer.wait(timeout=30)
        lab.down(purge=True)
    assert result.exit_code == 0, result.output
    assert "lab-live · ssh-run" in result.output and "finished: summary" in result.output
    assert "step 6/6" in result.output and f"/ {budget_mib:,.0f} MiB" in result.output
    # the device figure is the cgroup's (its label may wrap inside the view's box)
    assert "device RAM (its cgroup" in re.sub(r"[\s│]+", " ", result.output)


def _sweep_run(root: Path, sweep: str, run: str, state: str, runs: dict) -> Path:
    import json

    write_run(root / "sweeps" / sweep / "runs" / run, steps=2, step_s=0.01, sample_s=0.005)
    (root / "sweeps" / sweep / "sweep.json").write_text(json.dumps({"state": state, "runs": runs}))
    return root / "sweeps" / sweep / "runs" / run


def test_live_leaves_a_finished_sweep_with_a_line_saying_so(tmp_path):
    from click.testing import CliRunner

    from edgebench.live.commands import live_command

    _sweep_run(tmp_path, "s1", "a", "finished", {"a": "ok", "b": "oom"})
    result = CliRunner().invoke(live_command, ["--root", str(tmp_path), "--hz", "30"], env={"COLUMNS": "130"})
    assert result.exit_code == 0, result.output
    assert "sweep s1 ended (finished): 1 ok, 1 oom" in result.output and "waiting" not in result.output


def test_live_follow_waits_for_the_next_sweep_and_says_so(tmp_path):
    """--follow: the ended sweep's line says it waits; the next sweep's run is followed (looks, not clocks)."""
    import io

    from edgebench.live.app import run_live
    from edgebench.live.follow import Sweep

    first = _sweep_run(tmp_path, "s1", "a", "finished", {"a": "ok"})
    looks: list[Path] = []

    def find() -> Path:
        looks.append(find_local_run(tmp_path, None))
        if len(looks) == 2:  # s1 has been seen ended: the next sweep starts
            return _sweep_run(tmp_path, "s2", "b", "finished", {"b": "ok"})
        if len(looks) == 3:  # s2 seen through to its end: leave as Ctrl-C does
            raise KeyboardInterrupt
        return looks[-1]

    console = Console(record=True, file=io.StringIO(), force_terminal=True, width=130)
    state = run_live(LocalRun(first), LiveState(source=str(first)), refresh_hz=30, console=console,
                     sweep=Sweep(find, LocalRun, first, interval_s=0), follow=True)
    assert "sweep s1 ended (finished): 1 ok; waiting for the next sweep on this machine" in console.export_text()
    assert state.run_id == "b" and state.finished


def test_live_step_time_is_the_summarys_and_the_stores(tmp_path):
    """Every measured step counts (not a window, not warmup), as in the summary and the store."""
    import json

    from edgebench.fleet.plan import ingest_runs
    from edgebench.results.metrics import run_metrics
    from edgebench.results.store import Store

    run_dir = tmp_path / "r1"
    write_run(run_dir, steps=30, step_s=0.001, sample_s=0.005)
    meta = json.loads((run_dir / "meta.json").read_text())
    (run_dir / "meta.json").write_text(json.dumps({**meta, "readings": {}}))  # as a runner writes it: raw readings
    (run_dir / "result.json").write_text(json.dumps({"run_id": "r1", "end": {"exit_code": 0}}))
    source = LocalRun(run_dir)
    state = LiveState(source=source.label)
    state.apply(source.poll())
    ingest_runs(tmp_path / "s.duckdb", [run_dir], "local")
    with Store(tmp_path / "s.duckdb", read_only=True) as store:
        stored = run_metrics(store, store.runs(run_id="r1")[0])["step_time_median_s"]
    assert state.step_time_s == pytest.approx(stored, rel=1e-9) and state.figures is not None
    assert state.figures["step_time_s"]["median"] == state.step_time_s
    text = _text(state, width=130)
    assert f"{stored:.3f} s/step (median of 30 steps)" in text and f"{stored:.3f} / " in text
