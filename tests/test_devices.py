"""Profiles, inventory, local and adb transports (no sshd needed; see test_lab.py for SSH)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import psutil
import pytest
import yaml

from edgebench.devices import connect
from edgebench.devices.inventory import InventoryError, get_device, list_devices, scan_devices
from edgebench.devices.profiles import ProfileError, list_profiles, load_profile, parse_profile
from edgebench.devices.transport import TransportError

REQUIRED = {"local", "raspberry-pi-5-8gb", "raspberry-pi-4-4gb", "raspberry-pi-zero-2w",
            "jetson-orin-nano-8gb", "jetson-agx-orin-64gb", "pixel-8"}


@pytest.fixture
def inventory(tmp_path, monkeypatch):
    """Writes an inventory file and points $EDGEBENCH_INVENTORY at it."""
    path = tmp_path / "inventory.yaml"
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(path))

    def write(devices):
        path.write_text(yaml.safe_dump({"devices": devices}))
        return path

    return write


def test_every_required_profile_loads_with_sane_figures():
    assert REQUIRED <= set(list_profiles())
    for name in REQUIRED:
        p = load_profile(name)
        assert p.id == name and p.cores >= 1 and p.ram_bytes >= 256 * 2**20
        assert p.emulation.memory_bytes > 0 and p.emulation.cpus > 0
        if p.arch != "x86_64":
            assert "onnxruntime" not in p.backends, name
        if p.power_model is not None:
            assert p.power_model.max_w > p.power_model.idle_w
    assert int(load_profile("raspberry-pi-zero-2w").ram_bytes) == 512 * 2**20
    assert int(load_profile("jetson-agx-orin-64gb").ram_bytes) == 64 * 2**30
    assert load_profile("pixel-8").sensors.power.source == "battery"
    assert load_profile("jetson-orin-nano-8gb").sensors.power.total_rail == "VDD_IN"


def test_local_profile_is_detected_from_this_machine():
    p = load_profile("local")
    assert p.cores == os.cpu_count()
    assert int(p.ram_bytes) == psutil.virtual_memory().total
    assert p.arch == "x86_64" and "onnxruntime" in p.backends  # this machine is x86_64
    assert os.path.exists(p.python)


def _pi4() -> dict:
    return yaml.safe_load(Path(load_profile("raspberry-pi-4-4gb").source).read_text())


def test_sizes_parse_and_bad_fields_name_file_field_and_fix():
    data = _pi4()
    data["ram_bytes"] = "1.5GiB"
    assert int(parse_profile(data, "x.yaml").ram_bytes) == 1536 * 2**20
    data.update(ram_bytes="4 gigs", colour="red")
    del data["cores"]
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "device_profiles/broken.yaml")
    text = str(err.value)
    assert "device_profiles/broken.yaml" in text
    assert "ram_bytes" in text and "8GiB" in text  # the fix: how to write a size
    assert "cores: required field is missing; add it" in text
    assert "colour: unknown field" in text


def test_onnxruntime_on_aarch64_is_refused_with_the_reason():
    data = _pi4()
    data["backends"] = ["eager", "onnxruntime"]
    with pytest.raises(ProfileError, match="no aarch64 wheel.*--enable_training_apis"):
        parse_profile(data, "pi.yaml")


def test_a_profile_asking_fp32_bf16_without_xnnpack_is_refused_with_the_fix():
    data = _pi4()
    data["export"] = {"xnnpack": False, "bf16": "fp32"}
    with pytest.raises(ProfileError, match="export.bf16: fp32 is a choice of the XNNPACK lowering; set export.xnnpack"):
        parse_profile(data, "pi.yaml")
    data["export"] = {"xnnpack": True, "bf16": "fp32"}
    assert parse_profile(data, "pi.yaml").export.bf16 == "fp32"


def test_profile_file_name_must_match_id(tmp_path, monkeypatch):
    data = _pi4()
    (tmp_path / "my-pi.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("EDGEBENCH_PROFILES", str(tmp_path))
    with pytest.raises(ProfileError, match="my-pi.yaml: id: 'raspberry-pi-4-4gb' differs from the file name"):
        load_profile("my-pi")
    with pytest.raises(ProfileError, match="unknown device profile 'nope'; known: .*pixel-8"):
        load_profile("nope")


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))  # 9**9 values


def test_a_profile_or_inventory_alias_bomb_or_binary_file_is_refused_quickly_naming_the_file(tmp_path, monkeypatch):
    """YAML aliases expand to a billion values in ten lines: refused before anything walks them
    (the validation error used to format the whole expansion and grow to GBs), in one line.
    Quickly is in this process's CPU seconds, which a loaded host does not stretch."""
    import time

    from click.testing import CliRunner

    from edgebench.cli import cli

    bomb = tmp_path / "prof.yaml"
    bomb.write_text(ALIAS_BOMB)
    started = time.process_time()
    result = CliRunner().invoke(cli, ["predict", "--method", "adamw", "--device", str(bomb)])
    assert result.exit_code == 2 and "Traceback" not in result.output and time.process_time() - started < 10
    assert f"{bomb}: its aliases expand to more than 100,000 values" in " ".join(result.output.split())
    assert len(result.output) < 300 + 2 * len(str(bomb))  # the error names the file: short, whatever its path
    (tmp_path / "cycle.yaml").write_text("id: &a [*a]\n")  # a recursive alias: unbounded too
    with pytest.raises(ProfileError, match="cycle.yaml: its aliases expand to more than"):
        load_profile(tmp_path / "cycle.yaml")
    (tmp_path / "binary.yaml").write_bytes(b"id: x\n\xff\xfe\x00")
    with pytest.raises(ProfileError, match=r"binary.yaml: not a text file \(byte 6 is not UTF-8\)"):
        load_profile(tmp_path / "binary.yaml")
    inventory = tmp_path / "inventory.yaml"
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(inventory))
    for text in (ALIAS_BOMB.encode(), b"\x89PNG\r\n\x1a\n\x00\xff"):
        inventory.write_bytes(text)
        with pytest.raises(InventoryError, match="inventory.yaml: (its aliases expand|not a text file)"):
            list_devices()


def test_a_profile_error_quotes_a_short_prefix_of_the_bad_value(tmp_path):
    data = _pi4()
    data["ram_bytes"] = ["x" * 10_000] * 1000  # a huge wrong value: named, not printed
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "pi.yaml")
    assert "ram_bytes" in str(err.value) and len(str(err.value)) < 500


def test_inventory_merges_entry_over_profile_and_names_bad_entries(inventory):
    path = inventory({
        "orin": {"profile": "jetson-orin-nano-8gb", "host": "10.0.0.5", "key": "~/.ssh/id_ed25519"},
        "typo": {"profile": "raspberry-pi-4-4gb", "hots": "10.0.0.6"},
        "ghost": {"profile": "no-such-profile", "host": "x"},
        "nohost": {"profile": "raspberry-pi-5-8gb"},
    })
    orin = get_device("orin")
    assert (orin.transport.host, orin.transport.user, orin.transport.port) == ("10.0.0.5", "nvidia", 22)
    assert orin.profile.id == "jetson-orin-nano-8gb" and orin.address == "nvidia@10.0.0.5:22"
    with pytest.raises(InventoryError, match=rf"{path}: device 'typo': hots: unknown field"):
        get_device("typo")
    with pytest.raises(InventoryError, match="device 'ghost': profile: unknown device profile 'no-such-profile'"):
        get_device("ghost")
    with pytest.raises(InventoryError, match="device 'nohost': ssh needs `host:`"):
        get_device("nohost")
    with pytest.raises(InventoryError, match=f"unknown device 'jetson'; known: .*orin.*Add it to {path}"):
        get_device("jetson")
    with pytest.raises(InventoryError, match="device 'ghost'"):  # the first bad entry, by name
        list_devices()
    found, problems = scan_devices()
    assert [d.name for d in found] == ["local", "orin"]
    assert sorted(problems) == ["ghost", "nohost", "typo"] and "hots" in problems["typo"]


def test_local_transport_runs_streams_and_copies(tmp_path):
    t = connect("local")
    result = t.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    rc, out, err = result
    assert (rc, out, err, result.exit_signal) == (3, "out\n", "err\n", None)
    assert t.run(["sh", "-c", "kill -KILL $$"]).exit_signal == "KILL"
    src = tmp_path / "a.bin"
    src.write_bytes(b"0123456789")
    t.put(src, str(tmp_path / "b.bin"))  # absolute remote paths are used as they are
    dst = tmp_path / "c.bin"
    dst.write_bytes(b"01234xx")
    t.get(str(tmp_path / "b.bin"), dst, offset=5)  # resume: keep the first 5 bytes
    assert dst.read_bytes() == b"0123456789"
    assert list(t.stream(["printf", "a\\nb\\n"])) == ["a", "b"]
    with pytest.raises(TransportError, match="timed out after 0.2 s"):
        t.run(["sleep", "5"], timeout=0.2)


@pytest.fixture
def adb_server_port():
    """A private adb server port, so the test neither uses nor leaves a user's server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(port)}
    yield port
    subprocess.run(["adb", "kill-server"], env=env, capture_output=True, timeout=30)


def test_adb_without_phone_names_serial_and_fix(inventory, adb_server_port, monkeypatch):
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(adb_server_port))
    inventory({"phone": {"profile": "pixel-8", "kind": "adb", "serial": "EB0NOPHONE"}})
    device = get_device("phone")
    assert device.address == "adb:EB0NOPHONE"
    with pytest.raises(TransportError) as err:
        connect(device)
    text = str(err.value)
    assert "phone" in text and "'EB0NOPHONE'" in text
    assert "USB debugging" in text and "adb connect HOST:PORT" in text and "adb devices -l" in text


def test_cgroup_v2_limits_are_written_and_read_back(tmp_path):
    """cgroup v2 (memory.max, cpu.max) on a fixture tree shaped like /sys/fs/cgroup."""
    from edgebench.devices.cgroups import Limits, cgroup_version

    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    assert cgroup_version(tmp_path) == 2
    limits = Limits.create("edgebench-lab-x/lab-pi4", 512 * 2**20, 1.5, root=tmp_path)
    group = tmp_path / "edgebench-lab-x" / "lab-pi4"
    assert limits.dirs == [group] and limits.version == 2
    assert (group / "memory.max").read_text() == str(512 * 2**20)
    assert (group / "cpu.max").read_text() == "150000 100000"
    assert "+memory" in (tmp_path / "edgebench-lab-x" / "cgroup.subtree_control").read_text()
    (group / "memory.current").write_text("1000\n")
    (group / "memory.peak").write_text("2000\n")
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert limits.memory_stats() == {"usage_bytes": 1000, "limit_bytes": 512 * 2**20, "peak_bytes": 2000,
                                     "oom_kills": 1}


def test_devices_methods_sensors_and_devices_check_read_at_80_columns(inventory):
    """Each name whole and beside its figures in a tmux pane: an unreachable board's long
    error, the methods' descriptions and `devices check`'s fixes wrap inside their own card."""
    from edgebench.cli import cli
    from layout_checks import in_terminal, names_beside_figures

    inventory({"far-away-board": {"profile": "raspberry-pi-4-4gb", "host": "127.0.0.1", "port": _free_port(),
                                  "user": "pi"}})
    for args, names in ((["devices"], ["far-away-board", "local"]), (["methods"], ["adafactor", "fused-adamw"]),
                        (["devices", "check", "local"], ["python", "torch", "disk"]),
                        (["sensors"], ["process_rss", "system_cpu", "cpu_freq"])):
        output = in_terminal(cli, args)
        lines = output.splitlines()
        assert max(len(line) for line in lines) <= 80, output
        assert "optimizer=adafacto\n" not in output  # no word cut at the column's edge
        names_beside_figures(lines, names)
    board = in_terminal(cli, ["devices"]).split("far-away-board")[1]
    assert "\n    readiness: " in board  # why it is not ready, in its own card however long


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_profiles_speed_reaches_the_step_time_estimate():
    """`speed` figures are the device's rates (bf16 optional); unset, the reference host's stand in
    and say so; a bad figure names its field."""
    from edgebench.methods.device_speed import REFERENCE

    data = _pi4()
    assert parse_profile(data, "pi.yaml").device_speed() == REFERENCE
    data["speed"] = {"matmul_gflops": 20, "pass_ns": 2.5, "normal_ns": 30}
    speed = parse_profile(data, "pi.yaml").device_speed()
    assert (speed.matmul_gflops, speed.bf16_matmul_cost, speed.pass_ns) == (20, None, 2.5)
    assert speed.source == "profile raspberry-pi-4-4gb"
    data["speed"]["pass_ns"] = -1
    with pytest.raises(ProfileError, match="speed.*pass_ns"):
        parse_profile(data, "pi.yaml")


def _add(path: str, index: int) -> None:
    from edgebench.devices.inventory import add_entry

    add_entry(f"box{index}", {"profile": "local", "kind": "local"}, Path(path))


def test_several_writers_at_once_lose_no_inventory_entry(tmp_path):
    import multiprocessing

    from edgebench.devices.inventory import read_inventory

    path = tmp_path / "inventory.yaml"
    context = multiprocessing.get_context("spawn")
    with context.Pool(8) as pool:
        pool.starmap(_add, [(str(path), i) for i in range(16)])
    assert sorted(read_inventory(path)) == sorted(f"box{i}" for i in range(16))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".inventory.yaml.") and "lock" not in p.name] == []


def test_empty_groups_a_killed_bench_left_are_removed_and_busy_ones_kept():
    from edgebench.devices.cgroups import Limits, remove_empty_groups

    left = Limits.create("edgebench-test-leftovers/run-a", 2**30, 1.0)
    busy = Limits.create("edgebench-test-leftovers/run-b", 2**30, 1.0)
    sleeper = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: [p.write_text(str(os.getpid()))
                                                                    for p in busy.procs_files()])
    try:
        assert remove_empty_groups("edgebench-test-leftovers", older_than_s=3600) == []  # too young to judge
        removed = remove_empty_groups("edgebench-test-leftovers", older_than_s=0)
        assert sorted(removed) == sorted(left.dirs) and not any(d.exists() for d in left.dirs)
        assert all(d.exists() for d in busy.dirs)
    finally:
        busy.destroy()
        sleeper.wait()
