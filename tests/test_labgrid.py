"""A board farm for real: a labgrid coordinator and exporter started here on 127.0.0.1, exporting
the emulated lab's sshds as NetworkService resources; places become devices, a deploy holds its
place for the sweep and gives it back when the sweep ends, fails or is interrupted.

Places (all through the real labgrid-client): `farm-a` and `farm-b` (profile `local`: the lab
shares this host's x86_64 Python; host key fingerprints in tags), `farm-nokey` (board b without
a fingerprint tag), `farm-wrongkey` (board b, a wrong fingerprint), `farm-untagged` (no profile
tag) and `farm-gone` (a NetworkService where nothing listens).
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

from edgebench.cli import cli
from edgebench.devices import connect, lab
from edgebench.devices.inventory import InventoryError, get_device, read_inventory, scan_devices, write_inventory
from edgebench.devices.labgrid import Coordinator, PlaceHeld, place_status
from edgebench.devices.transport import TransportError
from edgebench.fleet.collect import collect_device
from edgebench.fleet.deploy import PreflightError, deploy_one
from edgebench.results.store import Store
from edgebench.runner.spec import RunSpec
from lab_fixtures import lab_in, wait_for_sweep

pytestmark = pytest.mark.lab
BIN = Path(sys.executable).parent
LABGRID_ENV = ("LG_COORDINATOR", "LG_USERNAME", "LG_HOSTNAME")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}: {log.read_text()}")


def _fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


class Farm:
    def __init__(self, root: Path, address: str, boards: dict[str, dict]):
        self.root, self.address, self.boards = root, address, boards

    def client(self, *args: str, user: str | None = None) -> str:
        """labgrid-client, as this host's user or as someone else (`user`)."""
        env = {**os.environ, "LG_COORDINATOR": self.address}
        if user:
            env["LG_USERNAME"] = user
        out = subprocess.run([str(BIN / "labgrid-client"), *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def place(self, name: str):
        with Coordinator(self.address) as coordinator:
            return coordinator.place(name)


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    root = tmp_path_factory.mktemp("farm")
    devices = [lab.LabDevice("raspberry-pi-4-4gb", name="lab-a"), lab.LabDevice("raspberry-pi-4-4gb", name="lab-b")]
    with pytest.MonkeyPatch.context() as env, lab_in(root, devices, state="lab"):
        for key in LABGRID_ENV:  # the farm's own coordinator, not one from the caller's shell
            env.delenv(key, raising=False)
        procs: list[subprocess.Popen] = []
        try:
            boards = lab.read_state()
            # The farm knows the boards; the inventory does not: only its `labgrid:` section stays.
            (root / "inventory.yaml").write_text(yaml.safe_dump({"labgrid": {
                "coordinator": "PLACEHOLDER", "key": str(root / "lab" / "client_key"),
                "known_hosts": str(root / "farm_known_hosts")}, "devices": {}}))
            port = _free_port()
            address = f"127.0.0.1:{port}"
            (root / "coordinator").mkdir()
            log = root / "coordinator.log"
            procs.append(subprocess.Popen([str(BIN / "labgrid-coordinator"), "-l", address], cwd=root / "coordinator",
                                          stdout=open(log, "wb"), stderr=subprocess.STDOUT))
            _wait_port(port, procs[-1], log)
            exported = {group: {"NetworkService": {"address": "127.0.0.1", "username": getpass.getuser(),
                                                   "port": boards[f"lab-{group}"]["port"]}} for group in ("a", "b")}
            exported["gone"] = {"NetworkService": {"address": "127.0.0.1", "username": "nobody", "port": _free_port()}}
            (root / "exporter.yaml").write_text(yaml.safe_dump(exported))
            log = root / "exporter.log"
            procs.append(
                subprocess.Popen(
                    [str(BIN / "labgrid-exporter"), "-c", address, "--name", "rack1", str(root / "exporter.yaml")],
                    stdout=open(log, "wb"),
                    stderr=subprocess.STDOUT,
                )
            )
            farm = Farm(root, address, boards)
            deadline = time.monotonic() + 30
            while "rack1/gone" not in farm.client("resources"):
                assert time.monotonic() < deadline and procs[-1].poll() is None, log.read_text()
                time.sleep(0.2)
            key = {g: _fingerprint(Path(boards[f"lab-{g}"]["home"]) / "ssh_host_ed25519_key.pub") for g in ("a", "b")}
            places = {
                "farm-a": ("a", {"edgebench-hostkey": key["a"]}),
                "farm-b": ("b", {"edgebench-hostkey": key["b"]}),
                "farm-nokey": ("b", {}),
                "farm-wrongkey": ("b", {"edgebench-hostkey": key["a"]}),
                "farm-gone": ("gone", {}),
                "farm-untagged": ("a", None),
            }
            farm.client("-p", "farm-a", "create")  # the CLI for one, labgrid's Python API for the rest (faster)
            with Coordinator(address) as coordinator:
                for name, (group, tags) in places.items():
                    if name != "farm-a":
                        assert coordinator._call("AddPlace", pb2.AddPlaceRequest(name=name)) is None
                    match = pb2.AddPlaceMatchRequest(placename=name, pattern=f"rack1/{group}/NetworkService")
                    assert coordinator._call("AddPlaceMatch", match) is None
                    if tags is not None:
                        tags = {"edgebench-profile": "local", "edgebench-workdir": str(root / "work" / name), **tags}
                        assert coordinator.set_tags(name, tags) is None
            assert "edgebench-hostkey=SHA256:" in farm.client("-p", "farm-a", "show")
            inventory = yaml.safe_load((root / "inventory.yaml").read_text())
            inventory["labgrid"]["coordinator"] = address
            (root / "inventory.yaml").write_text(yaml.safe_dump(inventory))
            yield farm
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(10)


def test_places_with_a_network_service_are_devices(farm, monkeypatch):
    out = CliRunner().invoke(cli, ["devices", "--json", "--no-check"])
    assert out.exit_code == 0, out.output
    rows = {r["name"]: r for r in json.loads(out.output)["devices"]}
    port_a = farm.boards["lab-a"]["port"]
    assert rows["farm-a"]["labgrid_place"] == "farm-a" and rows["farm-a"]["profile"] == "local"
    assert rows["farm-a"]["address"].endswith(f"@127.0.0.1:{port_a}") and rows["farm-a"]["transport"] == "ssh"
    assert "local" in rows and rows["local"]["labgrid_place"] is None  # the inventory's devices stay
    assert "no edgebench-profile tag" in rows["farm-untagged"]["reachable"]
    assert "labgrid-client -p farm-untagged set-tags edgebench-profile=" in rows["farm-untagged"]["reachable"]
    # $LG_COORDINATOR alone (labgrid-client's own setting) points edgebench at the farm too.
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(farm.root / "empty.yaml"))
    monkeypatch.setenv("LG_COORDINATOR", farm.address)
    assert {"farm-a", "farm-b", "farm-gone"} <= {d.name for d in scan_devices()[0]}
    monkeypatch.delenv("LG_COORDINATOR")
    assert [d.name for d in scan_devices()[0]] == ["local"]
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(farm.root / "inventory.yaml"))
    write_inventory(read_inventory())  # as `devices add` does: the labgrid section stays
    assert yaml.safe_load((farm.root / "inventory.yaml").read_text())["labgrid"]["coordinator"] == farm.address


def test_without_labgrid_the_inventory_works_and_a_farm_says_what_to_install(farm, tmp_path):
    program = ("import sys, json; sys.modules['labgrid'] = None\n"  # as if labgrid were not installed
               "from edgebench.devices.inventory import get_device, scan_devices\n"
               "import os; coordinator = os.environ.pop('LG_COORDINATOR')\n"
               "assert get_device('local').name == 'local' and scan_devices()[1] == {}\n"
               "os.environ['LG_COORDINATOR'] = coordinator\n"
               "print(json.dumps(scan_devices()[1]))")
    env = {**os.environ, "EDGEBENCH_INVENTORY": str(tmp_path / "none.yaml"), "LG_COORDINATOR": farm.address}
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (problem,) = json.loads(out.stdout).values()
    assert "labgrid is not installed: pip install 'edgebench[farm]'" in problem


def test_host_keys_come_from_known_hosts_or_the_place_tag(farm):
    known_hosts = farm.root / "farm_known_hosts"
    with pytest.raises(TransportError, match=r"farm-nokey .*host key not in .*farm_known_hosts"):
        connect("farm-nokey")  # no fingerprint tag and not in known_hosts: refused, never trusted silently
    with pytest.raises(InventoryError, match=r"farm-wrongkey .*offers host key SHA256:.*edgebench-hostkey tag says"):
        get_device("farm-wrongkey")
    assert not known_hosts.exists() or f":{farm.boards['lab-b']['port']}]" not in known_hosts.read_text()
    with connect("farm-b") as transport:  # the tag's fingerprint matched: the key went to known_hosts
        assert transport.check(["echo", "hi"]).strip() == "hi"
    assert f"[127.0.0.1]:{farm.boards['lab-b']['port']} ssh-ed25519 " in known_hosts.read_text()
    with connect("farm-nokey") as transport:  # the same board, now listed in known_hosts
        transport.check(["true"])
    out = CliRunner().invoke(cli, ["devices", "--json"])  # readiness through the farm
    rows = {r["name"]: r for r in json.loads(out.output)["devices"]}
    assert rows["farm-a"]["reachable"] == "ok" and rows["farm-b"]["reachable"] == "ok", rows["farm-a"]
    assert rows["farm-nokey"]["reachable"] == "ok"  # known_hosts lists board b now, and it wins over tags
    assert "unreachable" in rows["farm-gone"]["reachable"]


def test_sweep_holds_its_place_until_collect_sees_it_ended(farm):
    spec = farm.root / "spec.json"
    RunSpec(method="sgd", steps=1, warmup_steps=0).save(spec)
    runs_dir, store = farm.root / "runs", farm.root / "runs" / "edgebench.duckdb"
    runner = CliRunner()
    out = runner.invoke(cli, ["deploy", "--device", "farm-a", "--device", "farm-b", "--spec", str(spec),
                              "--runs-dir", str(runs_dir), "--json"])  # two boards at once: one thread each
    assert out.exit_code == 0, out.output
    sweep_id, sweep_b = (json.loads(out.output)[name]["sweep_id"] for name in ("farm-a", "farm-b"))
    held = place_status(get_device("farm-a"))["place"]
    assert held["mine"] and held["sweep"] == sweep_id and held["since"].endswith("UTC")
    assert place_status(get_device("farm-b"))["place"]["sweep"] == sweep_b
    again = runner.invoke(cli, ["deploy", "--device", "farm-a", "--spec", str(spec), "--runs-dir", str(runs_dir)])
    assert again.exit_code == 1
    assert f"labgrid place farm-a is held by you ({held['held_by']}) since {held['since']} for edgebench sweep " \
           f"{sweep_id}: not deployed; `edgebench collect` releases it" in again.output
    status = runner.invoke(cli, ["status", "--device", "farm-a"])
    assert f"farm-a: labgrid place farm-a: held by {held['held_by']} since" in status.output, status.output
    wait_for_sweep("farm-a", sweep_id)
    wait_for_sweep("farm-b", sweep_b)
    assert farm.place("farm-a").acquired == held["held_by"]  # ended, but collect has not seen it yet
    out = runner.invoke(cli, ["collect", "--device", "farm-a", "--device", "farm-b", "--store", str(store),
                              "--runs-dir", str(runs_dir), "--json"])
    assert out.exit_code == 0, out.output
    for name in ("farm-a", "farm-b"):
        assert list(json.loads(out.output)[name]["runs"].values()) == ["ok"]
        place = farm.place(name)
        assert place.acquired is None and "edgebench-sweep" not in place.tags
        with Store(store, read_only=True) as db:
            assert [r["status"] for r in db.runs(device=name)] == ["ok"]
    status = json.loads(runner.invoke(cli, ["status", "--device", "farm-a", "--json"]).output)
    assert status[0]["place"]["held_by"] is None and status[0]["sweeps"][sweep_id]["runs"]


def test_place_outlives_the_host_connection_and_goes_back_after_an_interrupted_sweep(farm):
    runs_dir = farm.root / "runs-cut"
    deployment = deploy_one("farm-a", [RunSpec(method="sgd", steps=100000, warmup_steps=0, duration_s=120)], runs_dir)
    sweep = Path(deployment.sweep_dir)
    deadline = time.monotonic() + 60
    while not list((sweep / "runs").glob("*/events.jsonl")):  # the run has started
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.5)
    lab.drop_connections("lab-a")  # the host's link to the board drops; the sweep carries on
    collected = collect_device("farm-a", local_root=runs_dir)
    assert collected.released is None and farm.place("farm-a").tags["edgebench-sweep"] == deployment.sweep_id
    os.killpg(int((sweep / "sweep.pid").read_text()), signal.SIGTERM)  # someone stops the sweep on the board
    assert wait_for_sweep("farm-a", deployment.sweep_id)["state"] == "interrupted"
    assert farm.place("farm-a").acquired is not None  # held until collect sees the sweep ended
    logged: list[str] = []
    collected = collect_device("farm-a", local_root=runs_dir, log=logged.append)
    assert collected.released == deployment.sweep_id and farm.place("farm-a").acquired is None
    assert f"farm-a: sweep {deployment.sweep_id} has ended (interrupted): released labgrid place farm-a" in logged


def test_a_place_someone_else_holds_is_refused_and_left_to_them(farm):
    sweeps = farm.root / "work" / "farm-b" / "sweeps"
    before = sorted(sweeps.glob("*"))
    farm.client("-p", "farm-b", "acquire", user="alice")
    try:
        logged: list[str] = []
        with pytest.raises(PlaceHeld, match=r"farm-b: labgrid place farm-b is held by [^ ]+/alice since "
                                            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: not deployed; try again"):
            deploy_one("farm-b", [RunSpec(method="sgd", steps=1, warmup_steps=0)], farm.root / "runs-b", logged.append)
        assert farm.place("farm-b").acquired.endswith("/alice")
        assert sorted(sweeps.glob("*")) == before  # nothing shipped, nothing started
    finally:
        farm.client("-p", "farm-b", "release", user="alice")


def test_place_released_after_an_error(farm):
    logged: list[str] = []
    with pytest.raises(PreflightError, match="program directory /nonexistent/program does not exist"):
        deploy_one(
            "farm-b", [RunSpec(method="sgd", program="/nonexistent/program")], farm.root / "runs-b", logged.append
        )
    assert "farm-b: acquired labgrid place farm-b" in logged and logged[-1] == "farm-b: released labgrid place farm-b"
    assert farm.place("farm-b").acquired is None
    with pytest.raises(TransportError, match="farm-gone .*unreachable"):  # the board cannot be reached
        deploy_one("farm-gone", [RunSpec(method="sgd")], farm.root / "runs-gone", logged.append)
    assert logged[-1] == "farm-gone: released labgrid place farm-gone" and farm.place("farm-gone").acquired is None

    def cut_when_shipping(line: str) -> None:  # the host loses its connection mid-deploy
        logged.append(line)
        if "shipping program" in line:
            assert lab.drop_connections("lab-b") >= 1

    program = farm.root / "small-program"
    program.mkdir(exist_ok=True)
    (program / "model.pte").write_bytes(b"\x00" * 4096)
    with pytest.raises(TransportError, match="farm-b: connection lost during"):
        deploy_one("farm-b", [RunSpec(method="sgd", program=str(program))], farm.root / "runs-b", cut_when_shipping)
    assert logged[-1] == "farm-b: released labgrid place farm-b" and farm.place("farm-b").acquired is None


def test_place_released_after_ctrl_c(farm, tmp_path):
    program = tmp_path / "program"  # big enough that shipping it takes a while
    program.mkdir()
    (program / "model.pte").write_bytes(os.urandom(64 * 2**20))
    spec = tmp_path / "spec.json"
    RunSpec(method="sgd", steps=1, warmup_steps=0, program=str(program)).save(spec)

    def terminal() -> None:  # a terminal's foreground job: its own process group, Ctrl-C not ignored
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    sweeps_dir = farm.root / "work" / "farm-b" / "sweeps"
    before = set(sweeps_dir.glob("*"))  # other tests' sweeps on this farm
    proc = subprocess.Popen([sys.executable, "-m", "edgebench.cli", "deploy", "--device", "farm-b", "--spec", str(spec),
                             "--runs-dir", str(tmp_path / "runs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=terminal)
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if "shipping program" in line:
            assert farm.place("farm-b").acquired is not None
            os.killpg(proc.pid, signal.SIGINT)
            break
    else:
        raise AssertionError(f"the deploy never shipped its program: {''.join(seen)} {proc.stdout.read()}")
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode != 0
    assert "farm-b: released labgrid place farm-b" in rest, rest
    assert farm.place("farm-b").acquired is None
    ours = set(sweeps_dir.glob("*")) - before
    assert not any((s / "sweep.pid").exists() for s in ours)  # shipped (or not), never started
