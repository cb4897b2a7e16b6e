"""The arm64 lab: a lab device whose python is an arm64 Python with arm64 wheels (PyPI's torch,
ExecuTorch, peft), run under qemu user-mode emulation behind the host's sshd.

End to end: the emulation root is built (first time on a machine: downloads ~0.6 GB from
Debian and PyPI; then cached), a sweep of the tiny model (eager SGD, an ExecuTorch program
exported on this host run by the Python worker and by the native worker cross-compiled for
aarch64, and with EDGEBENCH_FULL=1 eager LoRA: each emulated run costs a minute
of `import torch` alone) runs there and is collected; its losses equal this host's
within LOSS_RTOL; `devices calibrate` measures its rates there; a second device whose memory
limit cannot hold torch's import ends `oom`.
Without apt or network the build's one-line error is checked instead; in CI (CI set) it must run.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from conftest import FULL
from edgebench.cli import cli
from edgebench.devices import arm64, connect, detect, lab
from edgebench.devices.device_scripts import facts as facts_script
from edgebench.devices.inventory import get_device, make_device, read_inventory
from edgebench.devices.readiness import TORCH_CPU_INDEX, _Checker
from edgebench.figures.run import figures_of_run_dir
from edgebench.fleet.collect import collect_device
from edgebench.fleet.deploy import deploy_one
from edgebench.fleet.plan import attach_native, attach_program
from edgebench.fleet.remote import run_program
from edgebench.report.tables import emulated_notes
from edgebench.results.store import Store
from edgebench.runner.native import machine_arch
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import run_spec
from lab_fixtures import lab_in, wait_for_sweep

# The same versions built for another ISA: the tiny model's losses agree to 3e-7 relative (measured);
# this leaves room for a reordered reduction without hiding a wrong program.
LOSS_RTOL = 1e-4
# a board whose OS at idle (157 MiB held inside it) leaves ~290 MiB, about what 256 MiB gave before
# the lab held its board's OS: emulated `import torch` alone needs ~280 MB of anonymous memory, so
# the worker must end oom (deploy's preflight still finds the 200 MiB it asks to be free)
SMALL_MEMORY = 448 * 2**20


def _libs(**over) -> dict:
    return {"python": [3, 11, 2], "executable": "/usr/bin/python3", "venv_module": True, "torch": "2.13.0",
            "torch_cuda": "13.0", "cuda_runtime": True, "numpy": "2.4.6", "psutil": "7.2.2", "executorch": "1.5.1",
            "onnxruntime_training": None, "machine": "aarch64", "emulator": None, **over}


def test_readiness_on_arm64_boards(tmp_path):
    """A CUDA torch without CUDA libraries cannot import on a Pi: a problem, fixed from the CPU index;
    the emulated lab's stubbed CUDA build is what it is meant to be; ONNX Runtime training: no wheel."""
    device = make_device("pi", {"profile": "raspberry-pi-4-4gb", "kind": "local", "workdir": str(tmp_path / "w")})
    facts = detect.BoardFacts(arch="aarch64", workdir="/home/pi/w")

    def torch_finding(libs: dict, backends=frozenset({"eager", "executorch"})) -> list:
        checker = _Checker(device, facts, set(backends))
        checker.libraries(libs)
        return checker.findings

    broken = next(f for f in torch_finding(_libs(cuda_runtime=False)) if f.item == "torch")
    assert broken.status == "missing" and "`import torch` fails" in broken.detail
    assert f"pip install --force-reinstall torch==2.13.0 --index-url {TORCH_CPU_INDEX}" in broken.fix
    assert TORCH_CPU_INDEX == "https://download.pytorch.org/whl/cpu"
    emulated = torch_finding(_libs(cuda_runtime=False, emulator="qemu-user 10.0.2"))
    assert next(f for f in emulated if f.item == "torch").status == "ok"
    ort = next(f for f in emulated if f.item == "onnxruntime")
    assert ort.status == "n/a" and "no aarch64 wheel" in ort.detail
    no_et = torch_finding(_libs(executorch=None))
    assert next(f for f in no_et if f.item == "executorch").fix.endswith("pip install executorch==1.5.1")


def test_cache_is_keyed_by_the_version_set_and_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_CACHE", str(tmp_path))
    assert arm64.cache_dir() == tmp_path / "arm64" / arm64.key()
    before = arm64.key()
    monkeypatch.setattr(arm64, "WHEELS", arm64.WHEELS[:-1] + ("typing-inspection==0.4.4",))
    assert arm64.key() != before  # another version set, another root
    state = arm64.status()
    assert state["state"] in ("buildable", "unavailable") and state["detail"]
    root = tmp_path / "root"
    (root / "downloads").mkdir(parents=True)
    wheel = root / "downloads" / "x.whl"
    wheel.write_bytes(b"wheel")
    manifest = {"sha256": {"downloads/x.whl": arm64._sha256(wheel)}}
    arm64.verify(root, manifest)
    wheel.write_bytes(b"wheel, changed")
    with pytest.raises(
        arm64.Arm64Error, match=r"x.whl is missing or changed .* remove .* run `edgebench lab up --arch arm64`"
    ):
        arm64.verify(root, manifest)


@pytest.fixture(scope="module")
def emulation():
    """The built root (the first build takes minutes), or the one-line reason it cannot be built here."""
    try:
        return arm64.ensure()
    except arm64.Arm64Error as exc:
        return exc


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.arm64
@pytest.mark.timeout(2400)
def test_sweep_on_an_emulated_arm64_device(emulation, tmp_path, export_cache):
    if isinstance(emulation, arm64.Arm64Error):
        message = str(emulation)
        assert os.environ.get("CI") is None, f"CI must build the arm64 root: {message}"
        assert (
            message.startswith("arm64 lab: ") and "\n" not in message and ("again" in message or "install" in message)
        )
        return
    manifest = emulation.manifest
    assert manifest["torch"].startswith("2.13.0") and manifest["emulator"].startswith("qemu-user 10.")
    steps = 5 if FULL else 2  # two: the second loss checks the first update too

    def specs() -> list[RunSpec]:
        # one thread, as the emulated python runs (OMP_NUM_THREADS=1), so peaks compare
        return [RunSpec(method="sgd", steps=steps, warmup_steps=0, threads=1),
                RunSpec(method="sgd", backend="executorch", steps=steps, warmup_steps=0, threads=1),
                # the native worker, cross-compiled for aarch64 on this host, against the x86_64 one here
                RunSpec(method="sgd", backend="executorch", runtime="native", steps=steps, warmup_steps=0, threads=1),
                *([RunSpec(method="lora", steps=steps, warmup_steps=0, threads=1)] if FULL else [])]

    devices = [lab.LabDevice("raspberry-pi-4-4gb", name="lab-arm64", cpus=1, arch="arm64"),
               lab.LabDevice("raspberry-pi-4-4gb", name="lab-arm64-small", memory_bytes=SMALL_MEMORY, cpus=1,
                             arch="arm64")]
    with lab_in(tmp_path, devices) as running:
        assert {(d["python"], d["emulator"]) for d in running} == {(emulation.python, emulation.emulator)}
        device = get_device("lab-arm64")
        with connect(device) as transport:
            facts = run_program(transport, device, facts_script, device.workdir)
        assert facts["arch"] == "aarch64" and facts["emulated"] is True and facts["emulator"] == emulation.emulator
        assert facts["torch"].startswith("2.13.0") and facts["onnxruntime_training"] is None

        runs = tmp_path / "runs"
        big = deploy_one("lab-arm64", specs(), runs)
        small = deploy_one("lab-arm64-small", [RunSpec(method="sgd", steps=1, warmup_steps=0)], runs,
                           force=True)  # predicted not to fit: it is here to end oom
        assert big.facts["emulated"] and big.facts["arch"] == "aarch64" and len(big.run_ids) == len(specs())
        host = []  # the same specs on this host (x86_64 wheels), while the devices work
        for i, spec in enumerate(specs()):
            assert attach_program(spec, device.profile) is None  # the program deploy exported (cached)
            assert attach_native(spec, machine_arch()) is None
            run_spec(spec, tmp_path / "host" / str(i))
            host.append(figures_of_run_dir(tmp_path / "host" / str(i)))
        wait_for_sweep("lab-arm64-small", small.sweep_id, 900, poll_s=10)  # each poll starts an emulated python
        wait_for_sweep("lab-arm64", big.sweep_id, 1800, poll_s=10)
        store_path = tmp_path / "edgebench.duckdb"
        for name in ("lab-arm64", "lab-arm64-small"):
            collect_device(name, local_root=runs, store_path=store_path)
        # `devices calibrate` under emulation: the device's own arm64 Python and torch measure the
        # step-time model's rates, the inventory keeps them, predict ranks by them
        calibrated = CliRunner().invoke(cli, ["devices", "calibrate", "lab-arm64", "--json"])
        assert calibrated.exit_code == 0, calibrated.output
        stored = read_inventory()["lab-arm64"]["speed"]
        assert stored == json.loads(calibrated.output)["speed"] and stored["torch"].startswith("2.13.0")
        assert stored["matmul_gflops"] > 0 and stored["pass_ns"] > 0 and stored["normal_ns"] > 0
        ranked = CliRunner().invoke(cli, ["predict", "--device", "lab-arm64", "--model", "tiny", "--json"])
        assert json.loads(ranked.output)["speed"]["source"].startswith("this device's own, measured on"), ranked.output
    with Store(store_path, read_only=True) as store:
        rows = {r["run_id"]: r for r in store.runs()}
        notes = emulated_notes(store.runs(device="lab-arm64"))
    assert len(notes) == 1 and "step times not representative (emulated)" in notes[0], notes
    assert rows[small.run_ids[0]]["status"] == "oom", rows[small.run_ids[0]]["detail"]
    for run_id, on_host, spec in zip(big.run_ids, host, specs()):
        row = rows[run_id]
        assert row["status"] == "ok" and on_host["status"] == "ok", (spec.method, spec.backend, row["detail"])
        result, meta = json.loads(row["result_json"]), json.loads(row["meta_json"])
        assert meta["device"]["arch"] == "aarch64" and meta["device"]["emulator"] == emulation.emulator
        if spec.runtime == "native":
            assert meta["runtime"] == "native" and meta["native_worker"]["arch"] == "aarch64"
            assert on_host["runtime"] == "native"
        for key in ("loss_first", "loss_last"):
            assert result[key] == pytest.approx(on_host[key], rel=LOSS_RTOL), (spec.method, spec.backend, key)
        # the worker's ru_maxrss is qemu's: the emulator's own memory on top of the arm64 wheels' (measured
        # +65..+184 MiB over this host's on the tiny model, README: arm64 lab); far off means misread
        if spec.runtime != "native":  # the native worker's figure carries its supervisor's (see docs/figures.md)
            assert 0.8 < result["peak_rss_bytes_kernel"] / on_host["peak_rss_bytes_kernel"] < 2.5
