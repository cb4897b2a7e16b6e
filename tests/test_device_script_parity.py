"""Parity of the device scripts (issue 54): each `devices/device_scripts/NAME.sh` (after
`common.sh`, as `fleet.remote` sends it to a device with no Python) prints the JSON `NAME.py`
prints on the same fixture tree, and leaves the same files behind, under every shell such a
device may have (dash, busybox sh, Android's mksh) with toybox's tools as its whole PATH, so a
GNU-only tool or flag fails here. Every shell script of edgebench passes shellcheck.

scripts/setup.sh installs the shells, toybox and shellcheck: a missing one fails, never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from edgebench.devices import device_scripts
from edgebench.devices.device_scripts import digests, facts, listing, sweeps
from edgebench.fleet.remote import shell_twin

SCRIPTS = Path(device_scripts.__file__).parent
REPO = SCRIPTS.parents[2]
SHELLS = {"dash": "dash", "busybox sh": "busybox", "mksh": "mksh"}  # shell -> the binary `sh` links to
PYTHON_ONLY = ("python", "executable", "torch", "executorch", "onnxruntime_training", "psutil", "numpy")
# A name with everything json_text escapes: quotes, backslash, tab, newline, a control character, UTF-8.
ODD = 'odd "name" \\ \t\nline\x01 é'


def missing(tool: str) -> None:
    pytest.fail(f"{tool} is not installed; scripts/setup.sh installs it (apt-get install -y dash busybox mksh "
                "toybox shellcheck)")


@pytest.fixture(scope="session")
def toolbins(tmp_path_factory) -> dict[str, Path]:
    """Per shell, a folder of links to every toybox applet and `sh` to the shell: a device's whole PATH."""
    toybox = shutil.which("toybox")
    if toybox is None:
        missing("toybox")
    applets = subprocess.run([toybox, "--long"], capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for shell, binary in SHELLS.items():
        found = shutil.which(binary)
        if found is None:
            missing(shell)
        folder = tmp_path_factory.mktemp(binary)
        for applet in applets:
            name = applet.rsplit("/", 1)[-1]
            if name != "sh":
                (folder / name).symlink_to(toybox)
        (folder / "sh").symlink_to(found)  # busybox runs as its shell when called sh
        out[shell] = folder
    return out


def run_sh(toolbin: Path, program: ModuleType, *args: str, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> Any:
    proc = subprocess.run([str(toolbin / "sh"), "-c", shell_twin(program), "sh", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env={"PATH": str(toolbin), **(env or {})})
    assert proc.returncode == 0 and not proc.stderr, f"{program.__name__}.sh: exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def run_py(program: ModuleType, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Any:
    proc = subprocess.run([sys.executable, "-c", Path(program.__file__).read_text(), *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=env or {})
    assert proc.returncode == 0, f"{program.__name__}.py: exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def tree(root: Path) -> dict[str, Any]:
    """Every file under root: JSON files parsed, others as bytes; links by their target."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_file():
            data = path.read_bytes()
            try:
                out[rel] = json.loads(data) if path.suffix == ".json" else data
            except ValueError:
                out[rel] = data
    return out


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def shell_sweep_json(state: str, runs: dict[str, str], why: str | None = None, pid: int = 4242) -> str:
    """sweep.json as runner/sweep.sh writes it: one run a line."""
    lines = ",\n".join(f"{json.dumps(rid)}: {json.dumps(status)}" for rid, status in runs.items())
    return (f'{{"pid": {pid}, "state": "{state}", "supervisor": "shell", "why": {json.dumps(why)}, "runs": {{\n'
            f"{lines}\n}}}}\n")


def both(toolbin: Path, program: ModuleType, build: Callable[[Path], list[str]], base: Path,
         env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[Any, Any]:
    """(python's, the shell's) JSON and the files each leaves, on the same tree built afresh at the same path."""
    outputs = []
    for run in (lambda *a: run_py(program, *a, env=env, cwd=cwd), lambda *a: run_sh(toolbin, program, *a, env=env,
                                                                                      cwd=cwd)):
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        args = build(base)
        outputs.append((run(*args), tree(base)))
    return outputs[0], outputs[1]


@pytest.fixture(params=list(SHELLS))
def toolbin(request, toolbins) -> Path:
    return toolbins[request.param]


# --- digests --------------------------------------------------------------------------

def digest_tree(base: Path) -> list[str]:
    folder = base / "asset"
    write(folder / "config.json", '{"a": 1}\n')
    write(folder / "weights" / "model.safetensors", bytes(range(256)) * 64)
    write(folder / "empty", b"")
    write(folder / ".hidden", "kept: os.walk lists hidden files")
    write(folder / ".edgebench-verified", "skipped at the top")
    write(folder / "sub" / ".edgebench-verified", "kept below it")
    write(folder / "images" / "a b.png", b"\x89PNG\r\n")
    write(folder / "images" / ODD, "odd")
    write(folder / "..dots", "two dots")
    (folder / "empty-dir").mkdir()
    (folder / "link-to-file").symlink_to("config.json")  # followed, as os.walk lists it with the files
    (folder / "link-to-dir").symlink_to("images")  # not followed
    return [str(folder)]


def test_digests(toolbin, tmp_path):
    (py, py_tree), (sh, sh_tree) = both(toolbin, digests, digest_tree, tmp_path / "t")
    assert sh == py and sh_tree == py_tree
    assert "link-to-file" in py and "sub/.edgebench-verified" in py and f"images/{ODD}" in py
    assert ".edgebench-verified" not in py and not any(k.startswith("link-to-dir") for k in py)


def test_digests_of_a_missing_folder(toolbin, tmp_path):
    assert run_sh(toolbin, digests, str(tmp_path / "none")) == run_py(digests, str(tmp_path / "none")) == {}


# --- listing --------------------------------------------------------------------------

def listing_tree(base: Path) -> list[str]:
    work = base / "work"
    s1 = work / "sweeps" / "s1"
    write(s1 / "sweep.json", shell_sweep_json("finished", {"r1": "ok", ODD: "error"}))
    run = s1 / "runs" / "r1"
    write(run / "result.json", '{"status": "ok"}\n')
    write(run / "samples.jsonl", '{"t": 1}\n' * 50)
    write(run / ".result-reserve", b"\0" * 4096)  # hidden: left out
    write(run / "result.json.tmp", "{")  # half-written: left out
    write(run / "weights" / "model.safetensors", b"\1\2\3" * 1000)  # the trained weights of a --save run
    write(run / "weights" / "config.json", "{}")
    write(run / "weights" / ".hidden", "left out")
    write(run / "weights" / "half.tmp", "left out")
    write(run / "weights" / "nested" / "deeper", "not listed: weights/ is one level")
    (run / "link").symlink_to("result.json")
    write(s1 / "runs" / ODD / "a b.txt", "odd")
    (s1 / "runs" / "r2").mkdir()
    write(s1 / "runs" / "stray-file", "not a run")
    write(s1 / "runs" / ".hidden-run" / "x", "not a run")
    write(work / "sweeps" / "s2" / "runs" / "r3" / "weights", "a file named weights")
    write(work / "sweeps" / "s3" / "sweep.json", '{"pid": 1, "state": "runn')  # cut short: null
    write(work / "sweeps" / "s4" / "sweep.json", "")
    write(work / "sweeps" / "s5" / "sweep.json", json.dumps({"pid": 7, "state": "finished", "runs": {"a": "ok"}}))
    write(work / "sweeps" / "s6" / "sweep.json", "[1, 2]")  # not an object: null
    (work / "sweeps" / "s7" / "sweep.json").mkdir(parents=True)
    write(work / "sweeps" / "stray-file", "not a sweep")
    (work / "sweeps" / ".hidden").mkdir()
    host_records(work / "sweeps")
    return [str(work)]


HOST = {"id": "0123456789abcdef", "label": f"me@{ODD}"}


def host_records(root: Path) -> None:
    """host.json as deploy writes it (s1), cut short (s2), not an object (s3), a folder (s4); none elsewhere."""
    write(root / "s1" / "host.json", json.dumps(HOST) + "\n")
    write(root / "s2" / "host.json", '{"id": "0123')
    write(root / "s3" / "host.json", '["0123456789abcdef"]')
    (root / "s4" / "host.json").mkdir()


def test_listing(toolbin, tmp_path):
    (py, py_tree), (sh, sh_tree) = both(toolbin, listing, listing_tree, tmp_path / "t")
    assert sh == py and sh_tree == py_tree
    r1 = py["sweeps"]["s1"]["runs"]["r1"]
    assert {"weights/model.safetensors", "weights/config.json", "link", "result.json"} <= set(r1)
    assert not any(name.endswith(".tmp") or "hidden" in name or "reserve" in name for name in r1)
    assert py["sweeps"]["s1"]["state"]["runs"] == {"r1": "ok", ODD: "error"}
    assert [py["sweeps"][s]["state"] for s in ("s3", "s4", "s6", "s7")] == [None] * 4
    assert set(py["sweeps"]) == {"s1", "s2", "s3", "s4", "s5", "s6", "s7"}
    assert {s: entry["host"] for s, entry in py["sweeps"].items() if entry["host"]} == {"s1": HOST}


@pytest.mark.parametrize("workdir", ["missing", "relative", "home"])
def test_listing_root(toolbin, tmp_path, workdir):
    """root is abspath(expanduser(WORKDIR))/sweeps, the folder there or not."""
    (tmp_path / "work" / "sweeps").mkdir(parents=True)
    arg = {"missing": str(tmp_path / "gone"), "relative": "work", "home": "~/work"}[workdir]
    env = {"HOME": str(tmp_path)}
    py = run_py(listing, arg, env=env, cwd=tmp_path)
    assert run_sh(toolbin, listing, arg, env=env, cwd=tmp_path) == py
    assert py["root"] == str(tmp_path / ("gone" if workdir == "missing" else "work") / "sweeps")


# --- facts ----------------------------------------------------------------------------

MEMINFO = "MemTotal:       67108864 kB\nMemFree:         1000000 kB\nMemAvailable:   33554431 kB\nSwapTotal: 0 kB\n"


def cgroup_root(base: Path, kind: str) -> Path:
    root = base / "root"
    write(root / "proc" / "meminfo", MEMINFO)
    cg = root / "sys" / "fs" / "cgroup"
    if kind.startswith("v2"):
        write(root / "proc" / "self" / "cgroup", "0::/user.slice/lab\n")
        write(cg / "user.slice" / "lab" / "memory.max", {"v2": "2147483648\n", "v2-none": "max\n",
                                                         "v2-garbage": "banana\n", "v2-no-stat": "2147483648\n"}[kind])
        write(cg / "user.slice" / "lab" / "memory.current", "123456789\n")
        if kind != "v2-no-stat":
            write(cg / "user.slice" / "lab" / "memory.stat", "anon 1363148\nfile 406847488\nshmem 0\n")
    else:
        lines = "12:memory:/lab\n11:cpu,cpuacct:/other\n1:name=systemd:/lab\n0::/lab\n"
        write(root / "proc" / "self" / "cgroup", lines)
        limit = {"v1": "1073741824\n", "v1-none": "9223372036854771712\n", "v1-no-usage": "1073741824\n",
                 "v1-cache": "1073741824\n"}[kind]
        write(cg / "memory" / "lab" / "memory.limit_in_bytes", limit)
        if kind != "v1-no-usage":
            write(cg / "memory" / "lab" / "memory.usage_in_bytes", "524288000\n")
        # the hierarchical (total_) file pages: past 2^32 together, as mksh's 32-bit integers cannot add
        stat = ("cache 7\ninactive_file 5\nactive_file 2\ntotal_cache 5000000007\n" if kind == "v1-cache" else
                "cache 7\ninactive_file 5\nactive_file 2\ntotal_cache 5000000007\ntotal_inactive_file 2999999999\n"
                "total_active_file 2000000001\ntotal_unevictable 0\n")
        write(cg / "memory" / "lab" / "memory.stat", stat)
        # the cpu controller's folder under the memory hierarchy: not this process's memory cgroup
        write(cg / "memory" / "other" / "memory.limit_in_bytes", "999\n")
        write(cg / "memory" / "other" / "memory.usage_in_bytes", "9\n")
    return root


@pytest.mark.parametrize("kind", ["v2", "v2-none", "v2-garbage", "v2-no-stat", "v1", "v1-none", "v1-no-usage",
                                  "v1-cache"])
@pytest.mark.parametrize("emulator", [None, "qemu-aarch64 8.2.2"])
def test_facts(toolbin, tmp_path, kind, emulator):
    root = cgroup_root(tmp_path, kind)
    env = {"HOME": str(tmp_path), **({"EDGEBENCH_EMULATOR": emulator} if emulator else {})}
    args = ("~/work dir", str(root))
    py, sh = run_py(facts, *args, env=env), run_sh(toolbin, facts, *args, env=env)
    assert py["python"] and py["executable"] == sys.executable
    assert [sh.pop(key) for key in PYTHON_ONLY] == [None] * len(PYTHON_ONLY)  # facts.sh has no Python to ask
    for key in PYTHON_ONLY:
        py.pop(key)
    free = py.pop("disk_free_bytes"), sh.pop("disk_free_bytes")
    assert abs(free[0] - free[1]) < 256 * 2**20, free  # a live reading: others write to this disk meanwhile
    assert sh == py
    assert py["workdir"] == str(tmp_path / "work dir") and (tmp_path / "work dir").is_dir()
    assert py["mem_total_bytes"] == 67108864 * 1024 and py["emulated"] is bool(emulator)
    limits = {"v2": (2147483648, 123456789, 406847488), "v2-no-stat": (2147483648, 123456789, None),
              "v1": (1073741824, 524288000, 5000000000), "v1-cache": (1073741824, 524288000, 5000000007)}
    cgroup = (py["cgroup_limit_bytes"], py["cgroup_usage_bytes"], py["cgroup_cache_bytes"])
    assert cgroup == limits.get(kind, (None, None, None))


# --- sweeps ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def processes():
    """pids: a live sweep (runner/sweep.sh's command line), a live process that is not one, a dead one, a zombie."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "pkg/edgebench/runner/sweep.sh"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass", "edgebench.runner.sweep"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield {"live": live.pid, "other": os.getpid(), "dead": dead.pid, "zombie": zombie.pid}
    finally:
        live.kill()
        live.wait()
        zombie.wait()


def sweeps_tree(base: Path, pids: dict[str, int]) -> list[str]:
    work = base / "work"
    root = work / "sweeps"

    def sweep(name: str, state: str | None, runs: dict[str, str], pid: str | None = "dead", why: str | None = None,
              log: str | None = None) -> Path:
        sdir = root / name
        sdir.mkdir(parents=True)
        if state is not None:
            write(sdir / "sweep.json", shell_sweep_json(state, runs, why))
        if pid is not None:
            write(sdir / "sweep.pid", f"{pids[pid]}\n")
        if log is not None:
            write(sdir / "sweep.log", log)
        for i, rid in enumerate(runs):
            write(sdir / "specs" / f"{i:03d}-{rid}.json", "{}")
            write(sdir / "specs" / f"{i:03d}-{rid}.env", "RUN_ID=x\n")
        return sdir

    done = sweep("done", "finished", {"a": "ok", "b": "error", "c": "not started"})
    write(done / "specs" / ".hidden.json", "{}")
    (done / "specs" / "folder.json").mkdir()
    sweep("interrupted", "interrupted", {"a": "interrupted"}, why="stopped by SIGTERM")
    killed = sweep("killed", "running", {"a": "ok", "b": "running", "c": "running", "d": "not started"},
                   log="step 3\n" * 2000 + "sh: line 1: 4242 Killed  sh pkg/edgebench/runner/sweep.sh\n")
    write(killed / "runs" / "a" / "result.json", '{"status": "ok", "detail": null}\n')
    write(killed / "runs" / "b" / "meta.json", '{"run_id": "b", "supervisor": "shell", "oom_kills_at_start": null}\n')
    events = write(base / "memory.events", "low 0\nhigh 0\nmax 12\noom 3\noom_kill 3\n")
    oom = sweep("oom", "running", {"a": "running"}, log="Traceback (most recent call last):\nMemoryError\n")
    write(oom / "runs" / "a" / "meta.json",
          json.dumps({"run_id": "a", "oom_kills_at_start": {"file": str(events), "count": 1}}))
    rebooted = sweep("rebooted", "running", {"a": "running"}, log="oom_kill count dropped\n")
    write(rebooted / "runs" / "a" / "meta.json",
          json.dumps({"run_id": "a", "oom_kills_at_start": {"file": str(events), "count": 9}}))  # fewer: a reboot
    full = sweep("full", "running", {"a": "running"},
                 log="Traceback (most recent call last):\nOSError: [Errno 28] No space left on device\n")
    (full / "runs" / "a").mkdir(parents=True)
    write(full / "runs" / "a" / "result.json", "{not json")
    said = sweep("said-why", "running", {"a": "running"}, why='the device said "bye" \\ then')
    (said / "runs" / "a").mkdir(parents=True)
    sweep("no-record", None, {}, log="")
    garbled = sweep("garbled", None, {})
    write(garbled / "sweep.json", '{"pid": 3, "state": "running", "runs": {\n"a": "runn')
    sweep("not-started", None, {"a": "x"}, pid=None)
    sweep("live", "running", {"a": "ok", "b": "running"}, pid="live")
    sweep("reused-pid", "running", {"a": "running"}, pid="other")
    sweep("zombie", "running", {"a": "running"}, pid="zombie")
    sweep(ODD, "finished", {"a": "ok"})
    # a hand-edited record whose running run names a folder outside the sweep: nothing is written there
    write(root / "hostile" / "sweep.json", shell_sweep_json("running", {"../../../outside": "running"}, None))
    write(root / "hostile" / "sweep.pid", f"{pids['dead']}\n")
    (work / "outside").mkdir()
    write(root / "stray-file", "not a sweep")
    (root / ".hidden").mkdir()
    for name in ("s1", "s2", "s3", "s4"):
        sweep(name, "finished", {"a": "ok"})
    host_records(root)
    return [str(work)]


def test_sweeps(toolbin, tmp_path, processes):
    """The same states, and the same final records written (result.json of the cut-off runs, sweep.json)."""
    (py, py_tree), (sh, sh_tree) = both(toolbin, sweeps, lambda b: sweeps_tree(b, processes), tmp_path / "t")
    assert sh == py
    assert sh_tree == py_tree
    shown = {name: (s["state"], s["runs"]) for name, s in py.items()}
    assert shown["live"] == ("running", {"a": "ok", "b": "running"}) and py["live"]["alive"]
    assert shown["killed"] == ("stopped", {"a": "ok", "b": "killed", "c": "killed", "d": "not started"})
    assert py["killed"]["why"] == "the sweep process was killed"
    assert shown["oom"] == ("stopped", {"a": "oom"}) and shown["rebooted"] == ("stopped", {"a": "killed"})
    assert py["full"]["why"].startswith("the disk filled up") and shown["full"][1] == {"a": "killed"}
    assert py["said-why"]["why"] == 'the device said "bye" \\ then'
    assert shown["no-record"] == ("stopped", {}) and shown["not-started"] == ("not started", {})
    assert shown["zombie"][0] == shown["reused-pid"][0] == "stopped"
    assert py["done"]["specs"] == ["000-a", "001-b", "002-c"] and ".hidden" not in py
    assert set(py_tree["work/sweeps/killed/runs/b/result.json"]) == {"run_id", "status", "cut_off", "detail"}
    assert shown["hostile"] == ("stopped", {"../../../outside": "killed"})
    assert {name: s["host"] for name, s in py.items() if s["host"]} == {"s1": HOST}
    assert not [path for path in py_tree if path.startswith("work/outside/")]


def test_sweeps_reads_its_own_final_records_again(toolbin, tmp_path, processes):
    """A second read of a tree the shell twin made final gives what the first said (as sweeps.py's does)."""
    base = tmp_path / "t"
    base.mkdir()
    work = sweeps_tree(base, processes)[0]
    first = run_sh(toolbin, sweeps, work)
    before = tree(base)
    assert run_sh(toolbin, sweeps, work) == first and tree(base) == before


# --- every twin tested, every shell script clean ---------------------------------------

TESTED = {"digests": test_digests, "listing": test_listing, "facts": test_facts, "sweeps": test_sweeps}


def test_every_device_script_has_its_twin_and_a_parity_test():
    programs = {p.stem for p in SCRIPTS.glob("*.py") if p.stem != "__init__"}
    shells = {p.stem for p in SCRIPTS.glob("*.sh") if p.stem != "common"}
    assert programs == shells == set(TESTED)


SHELL_SCRIPTS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "edgebench").rglob("*.sh"))
@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shellcheck(script):
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        missing("shellcheck")
    proc = subprocess.run([shellcheck, "--shell=sh", "--format=gcc", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("count,size", [(18863343, 4096), (999999999999, 4096), (0, 4096), (7, 512),
                                        (2147483647, 65536)])
def test_the_shells_products_stay_exact_in_32_bits(toolbin, count, size):
    """common.sh's times_text (free disk = blocks x block size) on mksh's 32-bit integers: exact for
    a board's disk of any size (a 4 KiB block size and 18.9 M blocks overflowed once)."""
    common = Path(__file__).resolve().parents[1] / "edgebench" / "devices" / "device_scripts" / "common.sh"
    done = subprocess.run([str(toolbin / "sh"), "-c", f'. "{common}"; times_text {count} {size}'],
                          capture_output=True, text=True, env={"PATH": str(toolbin)}, timeout=30)
    assert done.returncode == 0 and done.stdout == str(count * size), (done.stdout, done.stderr)
