"""A device with no Python, over SSH: the native ExecuTorch worker under the shell sweep.

`lab up --no-python` starts a device whose sessions find only a phone's shell tools (no
python on PATH, `python: none` in the inventory). deploy ships the worker bundle, its plan
and the program (sha256-verified by the shell twin of digests.py), starts runner/sweep.sh;
status, collect and the store work as for any device. While it runs, no process in the
device's cgroup is a Python. Fresh from `lab up --no-python`, both such devices check ready.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EXPORTED_MODEL
from edgebench.cli import cli
from edgebench.devices import connect, lab, readiness
from edgebench.devices.cgroups import Limits
from edgebench.devices.inventory import get_device
from edgebench.fleet.collect import collect_device
from edgebench.fleet.deploy import PreflightError, deploy_one
from edgebench.fleet.status import device_status
from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store
from edgebench.runner.spec import RunSpec
from lab_fixtures import lab_in
from test_export import TEXT

pytestmark = pytest.mark.lab
DEVICE = "lab-pi4-nopy"
DEVICES = (DEVICE, "lab-pizero-nopy")  # what `lab up --no-python` starts


@pytest.fixture(scope="module")
def nopy_lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-nopy")
    with lab_in(root, [lab.LabDevice(profile, no_python=True, memory_bytes=512 * 2**20, cpus=1)
                       for profile in lab.DEFAULT_PROFILES]):
        yield root


def _pythons_in(device: str) -> set[str]:
    """Executables of the device's processes that are a Python (none may be)."""
    dev = lab.read_state()[device]
    found = set()
    for pid in Limits([Path(d) for d in dev["cgroups"]], dev["cgroup_version"]).pids():
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if "python" in Path(exe).name:
            found.add(exe)
    return found


def test_the_device_has_no_python(nopy_lab):
    with connect(DEVICE) as transport:
        assert (
            transport.run(["sh", "-c", "command -v python3 || command -v python || echo none"]).stdout.strip() == "none"
        )
    checked = readiness.check(get_device(DEVICE), backends={readiness.NATIVE})
    assert checked.ready, checked.messages()
    (python,) = [f for f in checked.findings if f.item == "python"]
    assert python.status == "n/a" and "native ExecuTorch worker" in python.detail
    assert not [f for f in checked.findings if f.item in ("torch", "numpy", "psutil", "executorch")]


def test_a_fresh_device_without_python_checks_ready(nopy_lab):
    """What runs there is the native worker, so its profile's Python backends ask nothing of it;
    asked for by name, one still is a problem."""
    listed = CliRunner().invoke(cli, ["devices", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r["readiness"] for r in json.loads(listed.stdout)["devices"]}
    assert all(rows[name].startswith("ready") for name in DEVICES), rows
    for name in DEVICES:
        out = CliRunner().invoke(cli, ["devices", "check", name, "--json"])
        assert out.exit_code == 0 and json.loads(out.stdout)["ready"], out.output
    eager = readiness.check(get_device(DEVICE), backends={"eager"})
    assert [f.item for f in eager.problems] == ["python"] and "eager needs Python" in eager.problems[0].detail


def test_native_sweep_without_python_end_to_end(nopy_lab, export_cache):
    runs_dir, store_path = nopy_lab / "runs", nopy_lab / "runs" / "edgebench.duckdb"
    spec = RunSpec(model=EXPORTED_MODEL, method="sgd", backend="executorch", runtime="native", text_length=TEXT,
                   warmup_steps=1, steps=40, sample_hz=20,  # ~0.6 s: a few CPU readings
                   eval_every=20, eval_samples=4)  # held out: the worker saves weights, the host evaluates them
    deployment = deploy_one(DEVICE, [spec], runs_dir)
    (run_id,) = deployment.run_ids
    assert deployment.probes and all(p["device_mono_ns"] > 0 for p in deployment.probes)
    seen_python: set[str] = set()
    deadline = time.monotonic() + 120
    while True:
        seen_python |= _pythons_in(DEVICE)
        sweep = device_status(DEVICE)["sweeps"][deployment.sweep_id]
        if not sweep["alive"] and sweep["state"] == "finished":
            break
        assert time.monotonic() < deadline, sweep
        time.sleep(0.2)
    assert not seen_python, seen_python
    assert sweep["runs"] == {run_id: "ended"}  # the device records how it ended; the host says what that is
    got = collect_device(DEVICE, None, runs_dir, store_path)
    assert got.runs == {run_id: "ok"} and got.ingested == [run_id]
    run_dir = runs_dir / DEVICE / run_id
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["runtime"] == "native" and meta["supervisor"] == "shell" and meta["device"]["python"] is None
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["t_ns"] > 0 for s in samples)
    assert max(s.get("rss_bytes", 0) for s in samples) > 10 * 2**20  # the worker really ran and was sampled
    with Store(store_path, read_only=True) as store:
        (row,) = store.runs(device=DEVICE, run_id=run_id)
        result = json.loads(row["result_json"])
    assert row["status"] == "ok" and row["runtime"] == "native" and row["steps_done"] == 40
    assert result["loss_last"] < result["loss_first"] and result["step_time_s"]["n"] == 40
    assert result["peak_rss_bytes_kernel"] < 64 * 2**20
    assert result["recorded_by"] == "shell" and meta["readings"]["recorded_by"] == "shell"
    # the files it started with, hashed by the shell as it started: the deployed worker's
    assert meta["ran"]["worker/edgebench-worker"] == meta["native_worker"]["files"]["edgebench-worker"]
    assert {"plan/plan.txt", "plan/batches.bin", "program/model.pte"} <= set(meta["ran"])
    # every figure a Python device's run gets: device RAM, the noise guard, the estimated energy
    with Store(store_path, read_only=True) as store:
        (figures,) = [m for m in all_metrics(store, device=DEVICE) if m["run_id"] == run_id]
    assert figures["device_ram_peak_what"].startswith("device RAM (its cgroup")
    assert 10 * 2**20 < figures["device_ram_peak_bytes"] <= figures["device_ram_limit_bytes"] == 512 * 2**20
    assert figures["disturbed"] is not None and figures["cpu_others_pct"] is not None
    assert figures["energy_per_step_j_est"] > 0 and "its cgroup" in figures["power_est_basis"]
    # held-out evaluation with no Python on the device: its saved weights came back with the run
    assert sorted(p.name for p in run_dir.glob("eval-weights-*")) == [
        f"eval-weights-{step:06d}.safetensors" for step in (20, 40, 41)]
    assert result["eval_count"] == 4 and result["eval_by"] == "the host, from the weights the run saved"
    assert result["eval_loss_last"] < result["eval_loss_first"]


def test_a_python_run_is_refused_on_a_device_without_python(nopy_lab):
    with pytest.raises(PreflightError, match="no Python.*--runtime native"):
        deploy_one(DEVICE, [RunSpec(model="tiny", method="sgd", backend="eager")], nopy_lab / "pf-runs")
