"""A device's memory as a run meets it: the board probe (devices add | check) reads the memory
cgroup its own process is in (v1 and v2 fixture trees), and deploy's preflight counts the
cgroup's page cache as free (devices/device_scripts/facts.py's cgroup_cache_bytes, available_bytes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebench.devices import add, detect
from edgebench.devices.device_scripts import facts as facts_script
from edgebench.devices.inventory import make_device, read_inventory
from edgebench.devices.profiles import load_profile
from edgebench.devices.readiness import check
from edgebench.devices.transport import LocalTransport
from edgebench.fleet.deploy import MIN_FREE_RAM, preflight
from edgebench.methods.budget import available_bytes
from edgebench.runner.spec import RunSpec
from test_devices_add import _board

GIB = 2**30
HOST_KIB = 24_641_536  # 23.5 GiB: the host's MemTotal, which the sshd's cgroup does not give
SSHD = "/system.slice/ssh.service"


def cgroup_board(root: Path, layout: str, limit: str, mem_available: bool = True) -> Path:
    """A board whose probe runs in sshd's memory cgroup: v1 (its `memory` line, beside other
    controllers' and the unified one's) or v2 (the `0::` line), with `limit` as the kernel prints it."""
    _board(root, "x86_64", mem_kib=HOST_KIB)
    if mem_available:
        (root / "proc" / "meminfo").write_text(f"MemTotal:       {HOST_KIB} kB\nMemAvailable:   20971520 kB\n")
    (root / "proc" / "self").mkdir()
    if layout == "v1":
        lines, group = f"12:memory:{SSHD}\n4:cpu,cpuacct:/other\n0::{SSHD}\n", "sys/fs/cgroup/memory" + SSHD
        name = "memory.limit_in_bytes"
        other = root / "sys/fs/cgroup/memory/other"  # another controller's group: not ours
        other.mkdir(parents=True)
        (other / name).write_text("999\n")
    else:
        lines, group, name = f"0::{SSHD}\n", "sys/fs/cgroup" + SSHD, "memory.max"
    (root / "proc" / "self" / "cgroup").write_text(lines)
    (root / group).mkdir(parents=True)
    (root / group / name).write_text(f"{limit}\n")
    return root


def _probe(root: Path, tmp_path: Path) -> detect.BoardFacts:
    device = make_device("t", {"profile": "local", "kind": "local", "root": str(root), "workdir": str(tmp_path / "w")})
    return detect.probe(LocalTransport(device), device)


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_the_probe_takes_its_memory_cgroups_limit_below_memtotal(tmp_path, layout):
    facts = _probe(cgroup_board(tmp_path / "board", layout, str(4 * GIB)), tmp_path)
    assert (facts.ram_bytes, facts.cgroup_limit_bytes) == (HOST_KIB * 1024, 4 * GIB)
    assert facts.mem_available_bytes == 20 * GIB
    assert facts.ram() == (4 * GIB, "the memory cgroup's limit")
    assert detect.board_figures(facts, load_profile("linux-x86_64"))["ram_bytes"] == 4 * GIB
    note = detect.profile_mismatches(facts, "linux-x86_64")[0]  # then the cores'
    assert note.startswith("the board's runs have 4.0 GiB of RAM (the memory cgroup's limit; MemTotal 23.5 GiB)")


@pytest.mark.parametrize("layout,limit", [("v1", "9223372036854771712"), ("v2", "max"),
                                          ("v1", str(64 * GIB))])  # a limit above MemTotal binds nothing
def test_without_a_binding_limit_the_ram_is_memtotal(tmp_path, layout, limit):
    facts = _probe(cgroup_board(tmp_path / "board", layout, limit), tmp_path)
    assert facts.ram() == (HOST_KIB * 1024, "MemTotal")
    assert detect.board_figures(facts, load_profile("linux-x86_64"))["ram_bytes"] == HOST_KIB * 1024
    assert "23.5 GiB of RAM (MemTotal)" in detect.profile_mismatches(facts, "linux-x86_64")[0]


def test_add_records_the_cgroups_limit_and_names_a_missing_memavailable(tmp_path, monkeypatch):
    """devices add against a board whose sshd has 4 GiB of a 23.5 GiB host and an old kernel (no
    MemAvailable): its entry keeps 4 GiB, and the missing figure is a line naming the device."""
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    root = cgroup_board(tmp_path / "board", "v1", str(4 * GIB), mem_available=False)
    monkeypatch.setattr(add, "_check_host_key", lambda *args: None)
    monkeypatch.setattr(add, "_probe", lambda *args: _probe(root, tmp_path))
    said: list[str] = []
    added = add.add_board("old-kernel", host="board.local", serial=None, user=None, port=None, key=None,
                          profile="linux-x86_64", fingerprint=None, known_hosts=None, python=None, workdir=None,
                          root=None, yes=True, say=said.append, trust_key=lambda key: False,
                          choose=lambda candidates, default: default)
    assert read_inventory()["old-kernel"]["ram_bytes"] == 4 * GIB and added.facts.mem_available_bytes is None
    assert any("23.50 GiB RAM (4.00 GiB: the memory cgroup's limit)" in line for line in said), said
    assert any(line.startswith("note: old-kernel reports no MemAvailable in /proc/meminfo (a kernel before Linux "
                               "3.14)") for line in said), said


def test_check_names_the_same_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))

    def memory(root: Path, **entry: int) -> tuple[str, str, str | None]:
        device = make_device("sshd-box", {"profile": "linux-x86_64", "kind": "local", "root": str(root),
                                          "python": "/usr/bin/python3", "workdir": str(tmp_path / "w"), **entry})
        (found,) = [f for f in check(device).findings if f.item == "memory"]
        return found.status, found.detail, found.fix

    v2 = cgroup_board(tmp_path / "v2", "v2", str(4 * GIB))
    status, detail, fix = memory(v2, ram_bytes=4 * GIB)  # as devices add wrote it
    assert status == "ok" and detail == ("the board's runs have 4.0 GiB of RAM (the memory cgroup's limit; MemTotal "
                                         "23.5 GiB), 20.0 GiB available now (MemAvailable)")
    status, detail, fix = memory(v2, ram_bytes=HOST_KIB * 1024)  # an entry written before the cgroup counted
    assert status == "warn" and "predictions use sshd-box's 23.5 GiB" in detail
    assert fix is not None and fix.startswith(f"set ram_bytes: {4 * GIB} in sshd-box's entry of ")
    old = cgroup_board(tmp_path / "old", "v1", "9223372036854771712", mem_available=False)
    status, detail, _ = memory(old)
    assert status == "warn" and detail.startswith("sshd-box reports no MemAvailable in /proc/meminfo")


# --- deploy's preflight: what a new run could take now ------------------------------------------------

MIB = 2**20
# The device deploy refused with "only 63 MiB of RAM is free": its cgroup held 1.3 MiB of processes
# and 406 MB of page cache, which the kernel reclaims before it refuses a run.
PROCESSES, CACHE = 1_363_148, 406_847_488
LIMIT = PROCESSES + CACHE + 63 * MIB


def _facts(**changes: object) -> dict[str, object]:
    return {"arch": "aarch64", "mem_available_bytes": 3 * GIB, "mem_total_bytes": 4 * GIB,
            "cgroup_limit_bytes": LIMIT, "cgroup_usage_bytes": PROCESSES + CACHE, "cgroup_cache_bytes": CACHE,
            "disk_free_bytes": 10 * GIB, "workdir": "/home/pi/edgebench-work", **changes}


def test_available_bytes_counts_a_cgroups_page_cache_as_free():
    assert available_bytes(_facts()) == LIMIT - PROCESSES  # 451 MiB, not 63
    assert available_bytes(_facts(mem_available_bytes=100 * MIB)) == 100 * MIB  # the lower of the two
    assert available_bytes(_facts(cgroup_limit_bytes=None)) == 3 * GIB  # no cgroup: MemAvailable
    assert available_bytes(_facts(cgroup_cache_bytes=None)) == 63 * MIB  # cache unknown: counted as held
    assert available_bytes(_facts(cgroup_cache_bytes=PROCESSES + CACHE + MIB)) == LIMIT  # read a moment later
    assert available_bytes(_facts(mem_available_bytes=None)) == LIMIT - PROCESSES
    assert available_bytes(_facts(mem_available_bytes=None, cgroup_limit_bytes=None)) == 0


def test_preflight_runs_in_a_cache_heavy_cgroup_and_names_an_unknown_figure():
    pi = make_device("pi", {"profile": "raspberry-pi-4-4gb", "host": "10.0.0.9"})
    eager = [RunSpec(method="sgd", run_id="r1")]
    assert preflight(pi, _facts(), eager, 10**6) == []
    (full,) = preflight(pi, _facts(cgroup_cache_bytes=0), eager, 10**6)  # processes hold it all: refused
    assert full.startswith("only 63 MiB of RAM is free") and f"{MIN_FREE_RAM // MIB} MiB needed" in full
    (unknown,) = preflight(pi, _facts(mem_available_bytes=None, cgroup_limit_bytes=None), eager, 10**6)
    assert "no MemAvailable (Linux before 3.14)" in unknown


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_facts_on_a_cache_heavy_cgroup_leave_room_for_a_run(tmp_path, layout):
    """facts.py (what deploy reads on the device) on v1 and v2 trees: the page cache read, and
    available_bytes of its facts is the cgroup's room less only what its processes hold."""
    root = tmp_path / "root"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    if layout == "v1":
        (root / "proc" / "self" / "cgroup").write_text("9:memory:/box\n0::/box\n")
        group = root / "sys/fs/cgroup/memory/box"
        files = {"memory.limit_in_bytes": LIMIT, "memory.usage_in_bytes": PROCESSES + CACHE,
                 "memory.stat": f"cache {CACHE}\ntotal_cache {CACHE + 7}\ntotal_inactive_file {CACHE - 4096}\n"
                                "total_active_file 4096\n"}
    else:
        (root / "proc" / "self" / "cgroup").write_text("0::/box\n")
        group = root / "sys/fs/cgroup/box"
        files = {"memory.max": LIMIT, "memory.current": PROCESSES + CACHE,
                 "memory.stat": f"anon {PROCESSES}\nfile {CACHE}\n"}
    group.mkdir(parents=True)
    for name, value in files.items():
        (group / name).write_text(f"{value}\n")
    facts = facts_script.main(str(tmp_path / "w"), str(root))
    assert (facts["cgroup_limit_bytes"], facts["cgroup_cache_bytes"]) == (LIMIT, CACHE)
    assert available_bytes(facts) == LIMIT - PROCESSES



def test_what_a_board_reports_out_of_any_range_is_not_taken():
    from edgebench.devices.detect import parse_probe

    facts = parse_probe("mem_kib=100000000000000000000000\nmem_available_kib=-5\ncores=99999999\n"
                        "model=" + "x" * 10_000_000 + "\n")
    assert facts.ram_bytes is None and facts.mem_available_bytes is None and facts.cores is None
    assert len(facts.model) <= 200


@pytest.mark.parametrize("rates", [{"matmul_gflops": float("nan")}, {"matmul_gflops": float("inf")},
                                   {"pass_ns": 0}, {"normal_ns": -1.0}, {"matmul_gflops": 1e300},
                                   {"bf16_matmul_cost": "fast"}])
def test_calibrated_rates_out_of_any_range_are_refused(rates):
    from pydantic import ValidationError

    from edgebench.devices.inventory import MeasuredSpeed

    good = {"matmul_gflops": 50.0, "bf16_matmul_cost": 0.5, "pass_ns": 1e6, "normal_ns": 5.0,
            "measured_at": "2026-12-07T12:00:00Z", "cpu": "x", "threads": 2}
    MeasuredSpeed.model_validate(good)
    with pytest.raises(ValidationError):
        MeasuredSpeed.model_validate({**good, **rates})


def test_devices_calibrate_stores_nothing_a_device_reports_out_of_range():
    from edgebench.devices.inventory import MeasuredSpeed, get_device
    from edgebench.fleet.calibrate import CalibrationError, _checked

    with pytest.raises(CalibrationError, match=r"local: the rates it reported are not a measurement \(matmul_gflops"):
        _checked(get_device("local"), lambda: MeasuredSpeed(matmul_gflops=float("inf"), pass_ns=1.0, normal_ns=1.0,
                                                            measured_at="now", cpu="x", threads=1))
