"""Shared fixtures: tiny specs, run helpers, and a real cgroup v1 memory group."""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

FULL = os.environ.get("EDGEBENCH_FULL") == "1"
# The model the tests of exported programs lower: tiny at half its depth, so each
# ExecuTorch export takes half tiny's time (edgebench.model.config `micro`).
EXPORTED_MODEL = "micro"


def checkpoint_lr(method: str) -> float:
    """The default lr of `method` when a run fine-tunes a checkpoint. The parity tests of exported
    programs against eager run there: their tolerances were measured at these lrs, and a fresh
    model's default ones (up to 30x larger: lomo 0.3 took micro's loss to 43) let float32's
    summing order show above them within ten steps."""
    from edgebench.methods import optim, parse_method

    return optim.default_lr(parse_method(method), 1, fresh_weights=False)
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")

# Under pytest-xdist two workers share the cores; torch's default of one OpenMP thread per
# core then oversubscribes them and its threads spin at every barrier (a tiny SGD run on a
# loaded 2-core host: 10 CPU-s and 6-8 s a step with two threads, 5 CPU-s and 0.08 s a
# step with one). One thread per process, for the tests and every process they start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# A command run without --store or --runs-dir writes to the user's store (edgebench.results): the
# tests' go to a folder of their own, never the person's ~/.local/share/edgebench.
os.environ.pop("EDGEBENCH_STORE", None)
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="edgebench-test-data-")


@pytest.fixture
def memory_cgroup():
    """A fresh cgroup v1 memory group (yielded as its path); removed afterwards with its processes."""
    if not (CGROUP_V1_MEMORY / "cgroup.procs").exists() or not os.access(CGROUP_V1_MEMORY, os.W_OK):
        pytest.fail("cgroup v1 memory controller not writable here: run the tests as root "
                    "on a host with /sys/fs/cgroup/memory (CI does)")
    path = CGROUP_V1_MEMORY / f"edgebench-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)


# Module-scoped fixtures that take a minute or more: xdist would build one on each worker that
# runs one of its tests, so their tests share a worker (tiny_runs: eight fresh runner processes).
SHARED_FIXTURES = ("tiny_runs",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`), tests of the emulated lab (real sshds on
    loopback ports, cgroups, the lab state) run one after another on one worker, as do the
    tests of each SHARED_FIXTURES fixture; the rest spread over both. First among the hooks:
    xdist's own reads the group into each test's id."""
    for item in items:
        if item.get_closest_marker("lab") or item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("lab"))
        elif shared := next((f for f in SHARED_FIXTURES if f in getattr(item, "fixturenames", ())), None):
            item.add_marker(pytest.mark.xdist_group(shared))


def session_shared_root(tmp_path_factory) -> Path:
    """A folder every xdist worker of this test session sees (the session's temporary root)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture
def small_rates(monkeypatch, export_cache):
    """methods.device_speed's sizes shrunk so the native worker's rates (edgebench/native/rates.py
    reads them when called) take well under a second: one small matmul shape, one repeat."""
    from edgebench.methods import device_speed

    for name, value in (("SHAPES", ((16, 32, 64),)), ("REPEATS", 1), ("PASS_ELEMENTS", 1 << 18),
                        ("NORMAL_ELEMENTS", 1 << 16)):
        monkeypatch.setattr(device_speed, name, value)


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory):
    """One export cache for the test session: the same request is exported once, also across
    xdist workers (they share the session's temporary root; the exporter locks each entry while
    it builds, so the second asker waits and reuses it: ExecuTorch exports of the tiny model take
    20-60 s each)."""
    cache = session_shared_root(tmp_path_factory) / "export-cache"
    cache.mkdir(exist_ok=True)
    patch = pytest.MonkeyPatch()
    patch.setenv("EDGEBENCH_EXPORT_CACHE", str(cache))
    yield cache
    patch.undo()


@pytest.fixture
def edgebench_here(capsys, monkeypatch):
    """`edgebench ARGS` run in this process (edgebench.cli.main, which `python -m edgebench.cli` calls) in
    `cwd` with `env` added, as a CompletedProcess (returncode, stdout, stderr): for what a command checks
    before any run, where a process of its own would add only torch's import (2-4 s). A test of a run, a
    terminal, a signal or a process's own warnings starts `python -m edgebench.cli` instead. What the
    command changes in os.environ (--debug) or the working directory is undone after the test."""
    from edgebench.cli import main

    debug = os.environ.pop("EDGEBENCH_DEBUG", None)  # `--debug` sets it; monkeypatch keeps no record of an unset one

    def run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        with pytest.raises(SystemExit) as ended:
            main(list(args))
        said = capsys.readouterr()
        return subprocess.CompletedProcess(["edgebench", *args], ended.value.code, said.out, said.err)

    yield run
    os.environ.pop("EDGEBENCH_DEBUG", None)
    if debug is not None:
        os.environ["EDGEBENCH_DEBUG"] = debug
