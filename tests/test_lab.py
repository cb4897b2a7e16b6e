"""The emulated lab end to end: real sshd per device, real cgroup limits, real runs, real store.

Two devices: `lab-small` (600 MiB) and `lab-pi4` (the 4 GiB profile). One sweep of three
specs goes to both at once: sgd and adamw at batch 1 (~270 MB charged to the cgroup, ~350 MB
RSS: torch's import plus the tiny model) and sgd-momentum at batch 96 (~0.6 GB more activations).
The big batch cannot fit in 600 MiB, so there it must end `oom` while the rest completes.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgebench.cli import cli
from edgebench.devices import connect, lab
from edgebench.devices.inventory import get_device, read_inventory, write_inventory
from edgebench.devices.transport import TransportError
from edgebench.figures.run import figures_of_run_dir
from edgebench.fleet.collect import collect_device
from edgebench.fleet.deploy import PreflightError, deploy_one, remote_run_dir
from edgebench.fleet.status import device_status
from edgebench.results.store import Store
from edgebench.runner.spec import RunSpec
from lab_fixtures import lab_in, wait_for_sweep

pytestmark = pytest.mark.lab
SMALL_MEMORY = 600 * 2**20


@pytest.fixture(scope="module")
def lab_env(tmp_path_factory):
    """A lab of two devices in temporary state/inventory paths; torn down afterwards."""
    root = tmp_path_factory.mktemp("lab")
    with lab_in(root, [lab.LabDevice("raspberry-pi-zero-2w", name="lab-small", memory_bytes=SMALL_MEMORY, cpus=1),
                       lab.LabDevice("raspberry-pi-4-4gb")]):
        yield root


def test_sweep_on_two_devices_at_once_oom_on_the_small_one(lab_env):
    specs = [RunSpec(method="sgd", steps=1, warmup_steps=0),
             RunSpec(method="sgd-momentum", batch_size=96, steps=1, warmup_steps=0)]
    spec_files = []
    for i, spec in enumerate(specs):
        spec_files += ["--spec", str(lab_env / f"spec{i}.json")]
        spec.save(lab_env / f"spec{i}.json")
    runs_dir, store_path = lab_env / "runs", lab_env / "runs" / "edgebench.duckdb"
    runner = CliRunner()
    out = runner.invoke(cli, ["deploy", "--device", "lab-small", "--device", "lab-pi4", *spec_files,
                              "--runs-dir", str(runs_dir), "--json", "--force"])  # batch 96 is predicted not to fit
    assert out.exit_code == 0, out.output
    deployed = json.loads(out.output)
    assert set(deployed) == {"lab-small", "lab-pi4"} and all(len(d["run_ids"]) == 2 for d in deployed.values())
    for name, d in deployed.items():
        wait_for_sweep(name, d["sweep_id"])
    out = runner.invoke(cli, ["collect", "--store", str(store_path), "--runs-dir", str(runs_dir), "--json"])
    assert out.exit_code == 0, out.output
    collected = json.loads(out.output)
    with Store(store_path, read_only=True) as store:
        for name, d in deployed.items():
            rows = {r["run_id"]: r for r in store.runs(device=name)}
            assert set(rows) == set(d["run_ids"]), name
            statuses = [rows[rid]["status"] for rid in d["run_ids"]]  # in sweep order
            expected = ["ok", "oom"] if name == "lab-small" else ["ok", "ok"]
            assert statuses == expected, (name, {rid: (rows[rid]["status"], rows[rid]["detail"]) for rid in rows})
            assert collected[name]["runs"] == dict(zip(d["run_ids"], statuses))
            for rid in d["run_ids"]:  # the raw files stay on the host, next to the store
                assert (runs_dir / name / rid / "result.json").exists()
        probes = store.probes("lab-small")
        assert len(probes) >= 20  # deploy-time and collect-time probes
        # over SSH, a probe is a network round trip, not a Python start-up (0.5-1.6 s on a busy device)
        assert min(p["host_recv_ns"] - p["host_send_ns"] for p in probes) < 100e6
    small_ok = figures_of_run_dir(runs_dir / "lab-small" / deployed["lab-small"]["run_ids"][0])
    assert small_ok["power"]["power_source"] == "estimate"  # no sensor: from the device's own CPU, not the host's
    assert small_ok["power"]["power_est_basis"].startswith("the CPU use of its cgroup "), small_ok["power"]
    assert small_ok["device_ram_limit_bytes"] == SMALL_MEMORY  # its cgroup's limit: the device's RAM
    small_oom = figures_of_run_dir(runs_dir / "lab-small" / deployed["lab-small"]["run_ids"][1])
    # its supervisor saw the kill; or the kernel took the sweep process too while the worker's memory
    # was still being freed (seen on a 2-core host), and the status helper read the cgroup's kill count
    assert small_oom.get("exit_signal") in ("SIGKILL", "KILL") or small_oom.get("oom_kills_during_run", 0) >= 1
    assert lab.status()[[r["name"] for r in lab.status()].index("lab-small")]["oom_kills"] >= 1
    again = runner.invoke(cli, ["collect", "--store", str(store_path), "--runs-dir", str(runs_dir), "--json"])
    assert again.exit_code == 0 and all(v["files_fetched"] == 0 for v in json.loads(again.output).values())


def test_cut_connection_sweep_carries_on_and_collect_gets_everything(lab_env):
    runs_dir, store_path = lab_env / "cut-runs", lab_env / "cut-runs" / "edgebench.duckdb"
    program = lab_env / "program"  # an exported program directory travels with its spec
    program.mkdir()
    (program / "model.pte").write_bytes(b"\x00pte" * 1000)
    spec = RunSpec(method="sgd", warmup_steps=1, steps=1000, duration_s=5, program=str(program))
    deployment = deploy_one("lab-pi4", [spec], runs_dir)
    run_id = deployment.run_ids[0]
    run_remote = remote_run_dir("lab-pi4", run_id, runs_dir)
    assert run_remote == f"{deployment.sweep_dir}/runs/{run_id}"
    watcher = connect("lab-pi4")
    (spec_name,) = watcher.check(["ls", f"{deployment.sweep_dir}/specs"]).split()
    shipped = json.loads(watcher.check(["cat", f"{deployment.sweep_dir}/specs/{spec_name}"]))["program"]
    assert shipped.startswith(f"{deployment.sweep_dir.rsplit('/sweeps/', 1)[0]}/cache/")  # cached, checked by content
    assert watcher.check(["cat", f"{shipped}/model.pte"]) == "\x00pte" * 1000
    deadline = time.monotonic() + 60
    while watcher.run(["test", "-s", f"{run_remote}/events.jsonl"]).rc != 0:  # wait for the first step
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.5)
    partial = collect_device("lab-pi4", run_id, runs_dir, store_path)
    assert partial.runs[run_id].startswith("partial")
    fetched_first = sum(p.stat().st_size for p in (runs_dir / "lab-pi4" / run_id).iterdir())
    lines = watcher.stream(["tail", "-F", f"{run_remote}/samples.jsonl"])
    assert json.loads(next(lines))["t_ns"] > 0  # the live view's way of watching
    assert lab.drop_connections("lab-pi4") >= 1
    with pytest.raises(TransportError, match="lab-pi4"):
        watcher.run(["true"])
    watcher.close()
    sweep = wait_for_sweep("lab-pi4", deployment.sweep_id)
    assert sweep["runs"] == {run_id: "ok"}
    final = collect_device("lab-pi4", run_id, runs_dir, store_path)
    assert final.runs == {run_id: "ok"} and final.ingested == [run_id]
    assert 0 < final.bytes_fetched  # resumed: only what was new since the partial collect
    total = sum(p.stat().st_size for p in (runs_dir / "lab-pi4" / run_id).iterdir())
    assert final.bytes_fetched < total and total > fetched_first
    with Store(store_path, read_only=True) as store:
        (row,) = store.runs(device="lab-pi4", run_id=run_id)
        assert row["status"] == "ok" and row["steps_done"] >= 1


def test_changed_or_unknown_host_key_is_refused(lab_env):
    device = get_device("lab-small")
    known_hosts = Path(device.transport.known_hosts)
    original = known_hosts.read_text()
    other = lab_env / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    try:
        host = original.split()[0]
        known_hosts.write_text(f"{host} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
        with pytest.raises(TransportError) as err:
            connect("lab-small")
        assert "lab-small" in str(err.value) and "HOST KEY CHANGED" in str(err.value)
        assert f"ssh-keygen -R '{host}'" in str(err.value)
        known_hosts.write_text("")
        with pytest.raises(TransportError, match=r"lab-small .*host key not in .*ssh-keyscan -p"):
            connect("lab-small")
    finally:
        known_hosts.write_text(original)
    connect("lab-small").close()  # the right key is accepted again


def test_unreachable_device_and_bad_entry_are_named(lab_env):
    inventory = read_inventory()
    saved = dict(inventory)
    port = int(inventory["lab-small"]["port"])
    try:
        inventory["lab-gone"] = {**inventory["lab-small"], "port": 1 if port != 1 else 2, "lab": None}
        inventory["lab-typo"] = {"profile": "raspberry-pi-4-4gb", "host": "127.0.0.1", "prot": 22}
        write_inventory(inventory)
        with pytest.raises(TransportError, match=r"lab-gone \(root@127.0.0.1:\d+\): unreachable .*check that it is on"):
            connect("lab-gone")
        out = CliRunner().invoke(cli, ["devices", "--json"])
        listed = json.loads(out.output)["devices"]
        rows = {r["name"]: r["reachable"] for r in listed}
        assert rows["lab-small"] == "ok" and rows["lab-pi4"] == "ok"
        # a Pi 4's profile is aarch64, but the lab device runs this host's python
        assert {r["name"]: r["arch"] for r in listed}["lab-pi4"] == platform.machine()
        assert "lab-gone" in rows["lab-gone"] and "unreachable" in rows["lab-gone"]
        assert "device 'lab-typo': prot: unknown field" in rows["lab-typo"]
        out = CliRunner().invoke(cli, ["deploy", "--device", "lab-gone", "--methods", "sgd"])
        assert out.exit_code == 1 and "lab-gone: FAILED" in out.output
    finally:
        write_inventory(saved)


def test_preflight_refuses_a_device_without_torch(lab_env):
    inventory = read_inventory()
    saved = dict(inventory)
    try:
        inventory["lab-small"] = {**inventory["lab-small"], "python": "/usr/bin/python3"}  # no torch there
        write_inventory(inventory)
        with pytest.raises(PreflightError, match=r"(?s)lab-small .*torch: not installed; fix: `\S+/venv/bin/python "
                                                 r"-m pip install torch==2.13.0 --index-url https://download.pytorch"):
            deploy_one("lab-small", [RunSpec(method="sgd")], lab_env / "pf-runs")
    finally:
        write_inventory(saved)


def test_down_leaves_no_process_cgroup_key_or_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_LAB_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    (dev,) = lab.up([lab.LabDevice("raspberry-pi-4-4gb", name="lab-tmp", memory_bytes=2**30, cpus=1)])
    with connect("lab-tmp") as t:  # something detached still running on the device
        t.check(["sh", "-c", "setsid nohup sleep 300 > /dev/null 2>&1 < /dev/null &"])
    cgroups = [Path(d) for d in dev["cgroups"]]
    pids = {int(p) for p in (cgroups[0] / "cgroup.procs").read_text().split()}
    assert dev["pid"] in pids and len(pids) >= 2
    assert lab.down() == ["lab-tmp"]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert not any(d.exists() for d in cgroups) and not any(d.parent.exists() for d in cgroups)
    leftovers = [p.name for p in (tmp_path / "state").rglob("*") if "key" in p.name or p.name == "known_hosts"]
    assert leftovers == [] and read_inventory() == {} and lab.status() == []


def test_down_mid_sweep_ends_every_run_and_purge_after_down_removes_its_work(tmp_path, monkeypatch):
    """`lab down` during a sweep stops it as SIGTERM does (the running run ends `interrupted`); status,
    collect and the store agree on that once the device is back; a later `down --purge` removes it."""
    monkeypatch.setenv("EDGEBENCH_LAB_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    device = lab.LabDevice("raspberry-pi-4-4gb", name="lab-mid", memory_bytes=2**30, cpus=1)
    lab.up([device])
    runs = tmp_path / "runs"
    try:
        deployed = deploy_one("lab-mid", [RunSpec(method="sgd", steps=100_000, text_length=16),
                                          RunSpec(method="adamw", text_length=16)], runs)
        first = Path(deployed.sweep_dir) / "runs" / deployed.run_ids[0]
        deadline = time.monotonic() + 180
        while '"step_end"' not in ((first / "events.jsonl").read_text() if (first / "events.jsonl").exists() else ""):
            assert time.monotonic() < deadline, "no step within 180 s"
            time.sleep(0.5)
    finally:
        lab.down()
    ended = figures_of_run_dir(first)
    sweep = json.loads((Path(deployed.sweep_dir) / "sweep.json").read_text())
    assert ended["status"] == "interrupted" and sweep["state"] == "interrupted", (ended, sweep)
    assert sweep["runs"] == {deployed.run_ids[0]: "interrupted", deployed.run_ids[1]: "not started"}
    lab.up([device])  # the same work directory: its runs can be collected now
    try:
        shown = device_status("lab-mid")["sweeps"][deployed.sweep_id]
        got = collect_device("lab-mid", local_root=runs, store_path=runs / "s.duckdb")
    finally:
        lab.down()
    with Store(runs / "s.duckdb", read_only=True) as store:
        stored = {r["run_id"]: r["status"] for r in store.runs(device="lab-mid")}
    assert shown["runs"][deployed.run_ids[0]] == got.runs[deployed.run_ids[0]] == stored[deployed.run_ids[0]] \
        == "interrupted"
    home = tmp_path / "state" / "lab-mid"
    assert (home / "work").is_dir()  # a plain down keeps the uncollected work
    assert lab.down(purge=True) == [] and not home.exists()  # the lab is down: purge still removes it


def test_missing_python_on_the_device_is_named(lab_env):
    inventory = read_inventory()
    saved = dict(inventory)
    try:
        inventory["lab-small"] = {**inventory["lab-small"], "python": "/opt/no/python3"}
        write_inventory(inventory)
        with pytest.raises(TransportError, match=r"lab-small: python '/opt/no/python3' cannot be run on the device"):
            deploy_one("lab-small", [RunSpec(method="sgd")], lab_env / "pf-runs")
    finally:
        write_inventory(saved)


def test_deploy_runs_the_export_step_and_refuses_what_the_runtime_cannot_run(lab_env):
    """deploy takes bench's path: an exported backend without --program goes through the export
    step for the device's profile; a method the runtime cannot express is refused up front, named."""
    out = CliRunner().invoke(cli, ["deploy", "--device", "lab-pi4", "--backend", "executorch",
                                   "--methods", "cg", "--runs-dir", str(lab_env / "runs")])
    assert out.exit_code == 1
    assert "lab-pi4: no method can run there" in out.output and "cg" in out.output
    out = CliRunner().invoke(cli, ["deploy", "--device", "lab-pi4", "--duration", "-5s"])
    assert out.exit_code == 2 and "--duration" in out.output
