"""`devices add | check | remove` against real lab sshds, with board files from fixture trees.

A lab device is a real sshd on 127.0.0.1 with its own host key. `devices add --root FIXTURE`
points the board probe at tests/fixtures/devices/<board>/ (device-tree model, meminfo,
cpuinfo, os-release, sysfs sensors): the same shell probe a real board runs, over SSH.
/usr/bin/python3 (no torch, numpy or psutil) plays a freshly flashed board's Python.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgebench.cli import cli
from edgebench.devices import connect, detect, lab
from edgebench.devices.inventory import get_device, make_device, read_inventory
from edgebench.devices.profiles import ProfileError, Transport, load_profile, resolve_profile
from edgebench.devices.readiness import ADB_LIMITS, TORCH_CPU_INDEX, _Checker, check
from edgebench.devices.transport import LocalTransport
from lab_fixtures import lab_in

FIXTURES = Path(__file__).parent / "fixtures" / "devices"
PI5, JETSON, ANDROID, X86 = (FIXTURES / d for d in ("raspberry-pi-5", "jetson-orin-nano", "android-phone", "x86-rapl"))


def _fixture_device(root: Path, profile: str, tmp_path: Path):
    return make_device("t", {"profile": profile, "kind": "local", "root": str(root), "workdir": str(tmp_path / "w")})


def _board(root: Path, arch: str, model: str = "", mem_kib: int = 16_000_000, cores: int = 8) -> Path:
    """A bare board's files: arch, RAM, cores, OS and a device-tree model if given; no sensor."""
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "arch").write_text(f"{arch}\n")
    (root / "proc" / "meminfo").write_text(f"MemTotal:       {mem_kib} kB\n")
    (root / "proc" / "cpuinfo").write_text("".join(f"processor\t: {i}\n\n" for i in range(cores)))
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    if model:
        (root / "proc" / "device-tree").mkdir()
        (root / "proc" / "device-tree" / "model").write_bytes(model.encode() + b"\0")
    return root


# --- without sshd: the probe on fixture trees, proposals, aliases, the torch build rule ------------


@pytest.mark.parametrize("root,board,arch,cores,ram_gib,profile", [
    (PI5, "Raspberry Pi 5 Model B Rev 1.0", "aarch64", 4, 7.86, "raspberry-pi-5-8gb"),
    (JETSON, "NVIDIA Jetson Orin Nano Developer Kit", "aarch64", 6, 7.44, "jetson-orin-nano-8gb"),
    (ANDROID, "Pixel 8 (Android 14)", "aarch64", 9, 7.48, "pixel-8"),
])
def test_probe_reads_the_board_and_proposes_its_profile(tmp_path, root, board, arch, cores, ram_gib, profile):
    device = _fixture_device(root, "local", tmp_path)
    facts = detect.probe(LocalTransport(device), device)
    assert (facts.board, facts.arch, facts.cores) == (board, arch, cores)
    assert round(facts.ram_bytes / 2**30, 2) == ram_gib
    assert facts.workdir == str(tmp_path / "w") and facts.disk_free_bytes > 0
    assert detect.propose_profiles(facts)[0] == profile
    assert abs(facts.clock_offset_s) < 5  # same machine's clock


def test_probe_facts_mismatching_a_profile_are_named(tmp_path):
    device = _fixture_device(PI5, "local", tmp_path)
    facts = detect.probe(LocalTransport(device), device)
    assert facts.os == "Debian GNU/Linux 12 (bookworm)" and ("cpu-thermal", "52650") in facts.thermal
    (note,) = detect.profile_mismatches(facts, "raspberry-pi-4-4gb")
    assert "has 7.9 GiB of RAM (MemTotal), profile raspberry-pi-4-4gb says 4.0 GiB: its entry keeps the board's" in note
    assert detect.board_figures(facts, load_profile("raspberry-pi-4-4gb")) == {"ram_bytes": facts.ram_bytes}
    assert detect.profile_mismatches(facts, "raspberry-pi-5-8gb") == []
    assert detect.board_figures(facts, load_profile("raspberry-pi-5-8gb")) == {}  # 7.86 GiB of 8: the kernel's share
    x86 = detect.probe(LocalTransport(device), _fixture_device(X86, "local", tmp_path))
    assert x86.model == "" and detect.propose_profiles(x86) == [f"linux-{x86.arch}"]  # no model: the generic one


@pytest.mark.parametrize("model,ram_gib,first", [
    ("Raspberry Pi 500 Rev 1.0", 8, "raspberry-pi-5-8gb"),
    ("Raspberry Pi Compute Module 4 Rev 1.0", 4, "raspberry-pi-4-4gb"),
    ("Raspberry Pi Zero 2 W Rev 1.0", 0.5, "raspberry-pi-zero-2w"),
    ("NVIDIA Jetson AGX Orin Developer Kit", 64, "jetson-agx-orin-64gb"),
    ("NVIDIA Jetson Orin NX Developer Kit", 16, "jetson-orin-nano-8gb"),  # no NX profile: the closest RAM
])
def test_board_models_map_to_profiles(model, ram_gib, first):
    proposed = detect.propose_profiles(detect.BoardFacts(model=model, arch="aarch64", ram_bytes=int(ram_gib * 2**30)))
    assert proposed[0] == first
    # wrong arch: the arch's generic profile; an arch without one: none
    assert detect.propose_profiles(detect.BoardFacts(model=model, arch="x86_64")) == ["linux-x86_64"]
    assert detect.propose_profiles(detect.BoardFacts(model=model, arch="armv7l")) == []


@pytest.mark.parametrize("arch,model,profile", [("x86_64", "", "linux-x86_64"),
                                                ("aarch64", "Radxa ROCK 5B", "linux-aarch64"),
                                                ("armv7l", "", None)])
def test_a_board_of_no_known_family_gets_its_archs_generic_profile_and_keeps_its_own_figures(tmp_path, arch, model,
                                                                                               profile):
    device = _fixture_device(_board(tmp_path / "board", arch, model), "local", tmp_path)
    facts = detect.probe(LocalTransport(device), device)
    assert detect.propose_profiles(facts) == ([profile] if profile else [])
    if profile is None:
        return
    own = detect.board_figures(facts, load_profile(profile))
    assert own == {"ram_bytes": 16_000_000 * 1024, "cores": 8}
    assert any("its entry keeps the board's (detected)" in n for n in detect.profile_mismatches(facts, profile))
    board = make_device("b", {"profile": profile, "host": "board.local", **own})
    assert (int(board.profile.ram_bytes), board.profile.cores) == (16_000_000 * 1024, 8)
    assert board.profile.sensors.power.source == "auto" and board.profile.sensors.thermal_zones == ["*"]


def test_the_default_work_dir_is_in_the_login_users_home(tmp_path, monkeypatch):
    """The profile's work dir is relative: the board resolves it in the home of whoever logs in."""
    home = tmp_path / "home" / "someone"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    device = detect.first_contact_device("b", Transport(kind="local"), load_profile("linux-x86_64").workdir, str(PI5))
    assert detect.probe(LocalTransport(device), device).workdir == str(home / "edgebench-work")


def test_check_suggests_only_fixes_that_apply(tmp_path):
    """A fix is named only where it can work: chmod where RAPL zones exist but are unreadable,
    nothing where the board has no powercap at all or (a generic profile) no sensor."""
    def check_on(root, profile):
        device = make_device("t", {"profile": profile, "kind": "local", "root": str(root),
                                   "python": "/usr/bin/python3", "workdir": str(tmp_path / "w")})
        return {f.item: f for f in check(device).findings}

    bare = _board(tmp_path / "bare", "aarch64", "Radxa ROCK 5B")
    generic = check_on(bare, "linux-aarch64")
    assert generic["power"].status == "n/a" and "not measured" in generic["power"].detail
    assert generic["thermal"].status == "n/a" and not generic["power"].fix and not generic["thermal"].fix
    no_powercap = check_on(bare, "local")  # names RAPL; the board has no /sys/class/powercap
    assert no_powercap["power"].status == "warn" and "no RAPL zones" in no_powercap["power"].detail
    assert no_powercap["power"].fix is None
    zone = bare / "sys" / "class" / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").mkdir()  # a read that fails, as for a user who may not read it (fixtures README)
    locked = check_on(bare, "local")
    assert locked["power"].status == "warn" and locked["power"].fix.startswith("sudo chmod a+r /sys/class/powercap/")
    x86 = check_on(X86, "linux-x86_64")  # auto: the RAPL zones it has
    assert x86["power"].status == "ok" and x86["power"].detail.startswith("RAPL ")


def test_profile_aliases_resolve_or_ask():
    assert resolve_profile("jetson-orin") == ["jetson-agx-orin-64gb", "jetson-orin-nano-8gb"]
    assert resolve_profile("pi5") == ["raspberry-pi-5-8gb"]  # the profile's alias
    assert resolve_profile("android") == ["pixel-8"]
    assert len(resolve_profile("raspberry-pi")) == 3 and resolve_profile("nothing-like-it") == []
    assert load_profile("orin-nano").id == "jetson-orin-nano-8gb"
    with pytest.raises(ProfileError, match="'jetson-orin' could mean jetson-agx-orin-64gb, jetson-orin-nano-8gb"):
        load_profile("jetson-orin")


def test_torch_build_rule_per_board(tmp_path):
    """PyPI's torch is a CUDA build: on a Pi that is a warning whose fix is the CPU index."""
    libs = {"python": [3, 11, 2], "executable": "/usr/bin/python3", "venv_module": True, "torch": "2.13.0",
            "torch_cuda": "13.0", "numpy": "2.1.0", "psutil": "7.0.0", "executorch": "1.5.1",
            "onnxruntime_training": None}
    facts = detect.BoardFacts(arch="aarch64", workdir="/home/pi/edgebench-work")
    pi = _Checker(_fixture_device(PI5, "raspberry-pi-5-8gb", tmp_path), facts, {"eager"})
    pi.libraries(libs)
    torch = next(f for f in pi.findings if f.item == "torch")
    assert torch.status == "warn" and "CUDA 13.0 build" in torch.detail
    assert torch.fix == (f"/home/pi/edgebench-work/venv/bin/python -m pip install --force-reinstall torch==2.13.0 "
                         f"--index-url {TORCH_CPU_INDEX}")
    assert next(f for f in pi.findings if f.item == "onnxruntime").status == "n/a"  # no aarch64 wheel
    jetson = _Checker(_fixture_device(JETSON, "jetson-orin-nano-8gb", tmp_path), facts, {"eager"})
    jetson.libraries(libs)
    assert next(f for f in jetson.findings if f.item == "torch").status == "ok"  # a CUDA build is right there
    jetson.libraries({**libs, "torch_cuda": None})
    cpu_torch = [f for f in jetson.findings if f.item == "torch"][-1]
    assert cpu_torch.status == "warn" and cpu_torch.pip is None and "install-pytorch-jetson" in cpu_torch.fix


def test_check_names_each_boards_own_fixes(tmp_path):
    """Same check, other boards: a phone in Termux gets pkg commands, its battery is read."""
    def check_on(root, profile):
        device = make_device("t", {"profile": profile, "kind": "local", "root": str(root),
                                   "python": "/usr/bin/python3", "workdir": str(tmp_path / profile)})
        return {f.item: f for f in check(device).findings}

    phone = check_on(ANDROID, "pixel-8")
    assert phone["torch"].status == "missing" and phone["torch"].fix == "pkg install python-torch"
    assert phone["torch"].pip is None and phone["numpy"].fix == "pkg install python-numpy"
    assert phone["power"].status == "ok" and "battery" in phone["power"].detail
    assert phone["executorch"].fix.startswith("no ExecuTorch wheel for Android")
    assert phone["python"].status == "ok" and phone["disk"].status in ("ok", "warn")
    jetson = check_on(JETSON, "jetson-orin-nano-8gb")
    assert jetson["power"].status == "ok" and "VDD_IN" in jetson["power"].detail
    assert jetson["thermal"].status == "ok" and "cpu-thermal" in jetson["thermal"].detail
    assert jetson["jtop"].status == "warn" and "jetson-stats" in jetson["jtop"].fix


def test_check_points_at_a_python_that_runs(tmp_path):
    device = make_device("t", {"profile": "raspberry-pi-5-8gb", "kind": "local", "root": str(PI5),
                               "python": str(tmp_path / "no-python"), "workdir": str(tmp_path / "w")})
    result = check(device)
    (python,) = [f for f in result.findings if f.item == "python"]
    assert python.status == "missing" and "no-python does not run on the device" in python.detail
    assert python.fix.startswith("set python: /") and not result.ready
    assert not any(f.item == "torch" for f in result.findings)  # nothing to ask a python that does not run


# --- adb: no phone here, so the status says so and what adb could and could not check -----------


@pytest.fixture
def adb_server_port(monkeypatch):
    """A private adb server port, so the test neither uses nor leaves a user's server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    yield port
    subprocess.run(["adb", "kill-server"], capture_output=True, timeout=30)


def test_adb_phone_without_a_phone(tmp_path, monkeypatch, adb_server_port):
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    runner = CliRunner()
    out = runner.invoke(cli, ["devices", "add", "phone", "--serial", "EB0NOPHONE", "--profile", "android"])
    assert out.exit_code == 2, out.output
    assert "adb device 'EB0NOPHONE' is not available" in out.output and "cannot run Termux's python" in out.output
    assert read_inventory() == {}  # nothing written for a phone that did not answer
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(
        {"devices": {"phone": {"profile": "pixel-8", "kind": "adb", "serial": "EB0NOPHONE"}}}))
    out = runner.invoke(cli, ["devices", "check", "phone", "--json"])
    assert out.exit_code == 1
    report = json.loads(out.output)
    assert report["summary"] == "unreachable" and not report["ready"]
    found = {f["item"]: f for f in report["findings"]}
    assert "USB debugging" in found["reachable"]["detail"]
    assert found["adb"]["status"] == "n/a" and found["adb"]["detail"] == ADB_LIMITS


# --- real sshd: add, check --fix, list, remove -----------------------------------------------------


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """One lab sshd (its host key, the lab's client key) and fresh inventory/known_hosts paths."""
    root = tmp_path_factory.mktemp("add")
    with lab_in(root, [lab.LabDevice("raspberry-pi-5-8gb", name="lab-board", memory_bytes=2**30, cpus=1)]) as (dev,):
        host_pub = Path(dev["home"]) / "ssh_host_ed25519_key.pub"
        fingerprint = subprocess.run(["ssh-keygen", "-lf", str(host_pub)], capture_output=True, text=True,
                                     check=True).stdout.split()[1]
        yield {"root": root, "port": dev["port"], "key": str(Path(os.environ["EDGEBENCH_LAB_DIR"]) / "client_key"),
               "fingerprint": fingerprint, "host_pub": host_pub.read_text().split()[:2]}


def _add(board, name, root, *extra, known_hosts="kh", input=None, workdir=None):
    return CliRunner().invoke(cli, [
        "devices", "add", name, "--host", "127.0.0.1", "--port", str(board["port"]), "--user", "root",
        "--key", board["key"], "--known-hosts", str(board["root"] / known_hosts), "--root", str(root),
        "--python", "/usr/bin/python3",
        "--workdir", workdir or str(board["root"] / f"work-{name}"), *extra], input=input)


@pytest.mark.lab
def test_add_shows_the_host_key_and_never_trusts_silently(board):
    kh = board["root"] / "kh"
    out = _add(board, "pi", PI5, "--no-check", input="n\n")
    assert out.exit_code == 2 and f"ssh-ed25519 key {board['fingerprint']}?" in out.stderr
    assert "host key not trusted: nothing written" in out.output
    assert not kh.exists() and "pi" not in read_inventory()
    out = _add(board, "pi", PI5, "--no-check", "--trust-host-key", "SHA256:" + "A" * 43)
    assert out.exit_code == 2 and f"offers {board['fingerprint']}, not SHA256:AAA" in out.output
    assert not kh.exists()
    out = _add(board, "pi", PI5, "--no-check", input="y\n\n")  # trust, then take the proposed profile
    assert out.exit_code == 0, out.output
    assert kh.read_text().split() == [f"[127.0.0.1]:{board['port']}", *board["host_pub"]]
    assert ("found: Raspberry Pi 5 Model B Rev 1.0, aarch64, 7.86 GiB RAM, 4 cores, Debian GNU/Linux 12 (bookworm), "
            "python 3.11.2 (/usr/bin/python3)") in out.output
    entry = read_inventory()["pi"]
    assert entry["profile"] == "raspberry-pi-5-8gb" and entry["root"] == str(PI5)
    assert get_device("pi").address == f"root@127.0.0.1:{board['port']}"
    again = _add(board, "pi", PI5, "--no-check")
    assert again.exit_code == 2 and "already has a device 'pi'" in again.output


@pytest.mark.lab
def test_add_jetson_alias_asks_which_then_checks(board):
    out = _add(board, "orin", JETSON, "--profile", "jetson-orin", "--trust-host-key", board["fingerprint"],
               "--json", known_hosts="kh-orin", input="\n")  # Enter: the detected Orin Nano
    assert out.exit_code == 0, out.output
    assert "which profile (jetson-agx-orin-64gb, jetson-orin-nano-8gb) [jetson-orin-nano-8gb]" in out.stderr
    report = json.loads(out.stdout)  # the question went to stderr
    assert report["entry"]["profile"] == "jetson-orin-nano-8gb"
    assert report["facts"]["l4t"].startswith("R36 (release), REVISION: 3.0")
    found = {f["item"]: f for f in report["readiness"]["findings"]}
    assert found["torch"]["status"] == "missing" and "install-pytorch-jetson" in found["torch"]["fix"]
    assert found["torch"]["pip"] is None  # NVIDIA's wheel is the user's call, not --fix's
    assert found["power"]["status"] == "ok" and "VDD_IN" in found["power"]["detail"]
    assert found["jtop"]["status"] == "warn" and found["jtop"]["fix"].startswith("sudo pip3 install -U jetson-stats")
    assert found["onnxruntime"]["status"] == "n/a" and "no Linux aarch64 wheel" in found["onnxruntime"]["detail"]
    assert found["clock"]["status"] == "ok"


@pytest.mark.lab
def test_add_refuses_changed_host_key_and_unknown_board(board, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    (board["root"] / "kh-changed").write_text(
        f"[127.0.0.1]:{board['port']} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
    out = _add(board, "evil", PI5, "--no-check", known_hosts="kh-changed")
    assert out.exit_code == 2 and "HOST KEY CHANGED" in out.output and "ssh-keygen -R" in out.output
    armv7 = _board(tmp_path / "armv7", "armv7l")  # a 32-bit board: no profile of its arch
    out = _add(board, "box", armv7, "--no-check", "--trust-host-key", board["fingerprint"], known_hosts="kh-box")
    assert out.exit_code == 2 and "no profile matches 'unknown armv7l'" in out.output and "--profile" in out.output
    assert not {"evil", "box"} & set(read_inventory())


@pytest.mark.lab
def test_add_a_generic_x86_64_board_with_its_own_figures_and_work_dir_in_the_login_home(board, tmp_path):
    """An x86_64 board of no known family (a lab machine's sshd) gets linux-x86_64 with the RAM and
    cores detected; a relative work dir lands in the home of the user who logged in."""
    x86 = _board(tmp_path / "x86", "x86_64", mem_kib=32_000_000, cores=16)
    shutil.copytree(X86 / "sys", x86 / "sys", symlinks=True)  # its RAPL zones
    relative = f"edgebench-test-{os.getpid()}"
    out = _add(board, "x86", x86, "--yes", "--json", "--trust-host-key", board["fingerprint"], known_hosts="kh-x86",
               workdir=relative)
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    entry = report["entry"]
    assert (entry["profile"], entry["ram_bytes"], entry["cores"]) == ("linux-x86_64", 32_000_000 * 1024, 16)
    with connect(get_device("x86")) as transport:
        home = transport.check(["sh", "-c", 'echo "$HOME"']).strip()
    try:
        assert report["facts"]["workdir"] == f"{home}/{relative}"
    finally:
        shutil.rmtree(f"{home}/{relative}")
    found = {f["item"]: f for f in report["readiness"]["findings"]}
    assert found["power"]["status"] == "ok" and found["power"]["detail"].startswith("RAPL ")
    listed = json.loads(CliRunner().invoke(cli, ["devices", "--no-check", "--json"]).output)["devices"]
    rows = {r["name"]: r for r in listed}
    assert (rows["x86"]["ram_bytes"], rows["x86"]["cores"], rows["x86"]["arch"]) == (32_000_000 * 1024, 16, "x86_64")


@pytest.mark.lab
def test_check_fix_installs_into_a_venv_then_listing_and_remove(board):
    if "pi" not in read_inventory():
        assert _add(board, "pi", PI5, "--no-check", "--yes", "--trust-host-key", board["fingerprint"],
                    known_hosts="kh-fix").exit_code == 0
    runner = CliRunner()
    out = runner.invoke(cli, ["devices", "check", "pi", "--json"])
    assert out.exit_code == 1  # torch, numpy, psutil, executorch are missing
    found = {f["item"]: f for f in json.loads(out.output)["findings"]}
    venv_python = str(board["root"] / "work-pi" / "venv" / "bin" / "python")
    assert found["torch"]["fix"] == f"{venv_python} -m pip install torch==2.13.0 --index-url {TORCH_CPU_INDEX}"
    assert found["numpy"]["status"] == "missing" and found["numpy"]["pip"] == ["numpy"]
    assert found["power"]["status"] == "warn" and "raspi-utils" in found["power"]["fix"]  # no vcgencmd here
    assert found["thermal"]["status"] == "ok"  # cpu-thermal is in the fixture tree
    # torch, executorch and numpy are large; psutil shows the path: a venv in the work dir, pip into it
    out = runner.invoke(cli, ["devices", "check", "pi", "--fix", "--only", "psutil", "--json"])
    assert out.exit_code == 1, out.output
    report = json.loads(out.output)
    assert [(r["item"], r["ok"]) for r in report["fixed"]] == [("venv", True), ("psutil", True)]
    found = {f["item"]: f for f in report["findings"]}
    assert found["psutil"]["status"] == "ok" and found["numpy"]["status"] == "missing"
    assert found["torch"]["status"] == "missing" and found["python"]["detail"].endswith(venv_python)
    assert read_inventory()["pi"]["python"] == venv_python
    subprocess.run([venv_python, "-c", "import psutil"], check=True)
    out = runner.invoke(cli, ["devices", "--json"])
    rows = {r["name"]: r for r in json.loads(out.output)["devices"]}
    assert rows["pi"]["arch"] == "aarch64" and rows["pi"]["ram_bytes"] == 8 * 2**30
    assert rows["pi"]["readiness"] == "3 problems" and rows["pi"]["reachable"] == "ok"
    assert any(p.startswith("torch: not installed; fix: ") for p in rows["pi"]["problems"])
    assert rows["lab-board"]["readiness"].startswith("ready")  # the lab runs this host's venv
    out = runner.invoke(cli, ["devices", "remove", "pi"])
    assert out.exit_code == 0 and "pi" not in read_inventory()
    out = runner.invoke(cli, ["devices", "remove", "pi"])
    assert out.exit_code == 2 and "no device 'pi'" in out.output


@pytest.mark.lab
def test_add_without_a_terminal_points_at_trust_host_key(board):
    out = _add(board, "quiet", PI5, "--no-check", known_hosts="kh-quiet")  # stdin ends: nobody to ask
    assert out.exit_code == 2 and "interrupted" not in out.output, out.output
    assert "no one answered whether to trust it (no terminal)" in out.output and "--trust-host-key" in out.output
    assert not (board["root"] / "kh-quiet").exists() and "quiet" not in read_inventory()


@pytest.mark.lab
def test_add_shows_the_boards_strings_without_escape_sequences(board, tmp_path):
    evil = tmp_path / "evil-board"
    shutil.copytree(PI5, evil, symlinks=True)
    (evil / "proc" / "device-tree" / "model").write_bytes(b"Raspberry Pi 5\x1b]0;pwned\x07\x1b[2J Model B "
                                                          + b"\x07x" * 10_000_000 + b"\x00")  # 20 MB
    os_release = (evil / "etc" / "os-release").read_text()
    (evil / "etc" / "os-release").write_text(os_release.replace("Debian GNU/Linux 12", "Debian\x1b[2J 12"))
    out = _add(board, "evil", evil, "--no-check", "--trust-host-key", board["fingerprint"], "--yes",
               known_hosts="kh-evil")
    assert out.exit_code == 0, out.output
    assert "found: Raspberry Pi 5 Model B" in out.output and "Debian 12" in out.output  # the title and clear: gone
    assert "\x1b" not in out.output and "\x07" not in out.output and "pwned" not in out.output
    assert max(len(line) for line in out.output.splitlines()) < 1000  # the model cut short


def test_a_boards_long_strings_are_cut_short(tmp_path):
    board = tmp_path / "board"
    shutil.copytree(PI5, board, symlinks=True)
    (board / "proc" / "device-tree" / "model").write_bytes(b"Raspberry Pi 5 Model B " + b"x" * 20_000_000)
    device = _fixture_device(board, "local", tmp_path)
    facts = detect.probe(LocalTransport(device), device)
    assert facts.board == ("Raspberry Pi 5 Model B " + "x" * 200)[:detect.TEXT_CHARS]
    assert detect.propose_profiles(facts)[0] == "raspberry-pi-5-8gb" and facts.workdir == str(tmp_path / "w")
