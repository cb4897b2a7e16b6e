"""`devices calibrate`: the step-time model's rates measured on a device, stored in its inventory
entry, and what predict (and deploy's preflight, through Device.device_speed) rank methods by."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata

import pytest
import yaml
from click.testing import CliRunner

from conftest import EXPORTED_MODEL
from edgebench.cli import cli
from edgebench.devices import lab
from edgebench.devices.inventory import InventoryError, edited_inventory, get_device, read_inventory
from lab_fixtures import lab_in

MEASURED = {"matmul_gflops": 20.0, "bf16_matmul_cost": 3.5, "pass_ns": 2.5, "normal_ns": 30.0,
            "measured_at": "2026-01-02T03:04:05+00:00", "cpu": "Cortex-A72", "torch": "2.13.0", "threads": 4}


def _predict(device: str, *args: str, model: str = "tiny") -> dict:
    out = CliRunner().invoke(cli, ["predict", "--device", device, "--model", model, "--json", *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_stored_rates_rank_an_inventory_devices_methods(tmp_path, monkeypatch):
    """A calibrated entry's rates replace the reference host's, bf16 methods get an estimate and
    the source says whose rates, when and what measured them (a rate the native worker could
    not take, why); a bad stored figure names its field."""
    path = tmp_path / "inventory.yaml"
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(path))
    path.write_text(yaml.safe_dump({"devices": {"pi": {"profile": "raspberry-pi-4-4gb", "host": "10.0.0.9"}}}))
    before = _predict("pi")
    assert before["speed"]["source"].startswith("a reference x86 host's rates")
    assert next(r for r in before["methods"] if r["method"] == "adamw-bf16")["step_time_vs_sgd_est"] is None
    path.write_text(yaml.safe_dump({"devices": {"pi": {"profile": "raspberry-pi-4-4gb", "host": "10.0.0.9",
                                                       "speed": MEASURED}}}))
    after = _predict("pi")
    assert after["speed"]["matmul_gflops"] == 20.0 and after["speed"]["bf16_matmul_cost"] == 3.5
    assert after["speed"]["source"] == "this device's own, measured on 2026-01-02 (Cortex-A72, torch 2.13.0, 4 threads)"
    assert next(r for r in after["methods"] if r["method"] == "adamw-bf16")["step_time_vs_sgd_est"] > 1
    assert get_device("pi").device_speed() == get_device("pi").speed.rates()  # deploy's preflight ranks by these
    native = {**MEASURED, "torch": None, "executorch": "1.5.1", "bf16_matmul_cost": None,
              "unmeasured": {"bf16_matmul_cost": "no bf16 kernel"}}
    path.write_text(yaml.safe_dump({"devices": {"pi": {"profile": "raspberry-pi-4-4gb", "host": "10.0.0.9",
                                                       "speed": native}}}))
    # the worker measured them, so by default predict ranks its runs (test_predict_runtime); a torch
    # process's ranking shows the same rates, without an export per method
    assert _predict("pi", "--runtime", "python")["speed"]["source"] == (
        "this device's own, measured on 2026-01-02 (Cortex-A72, the native worker, executorch 1.5.1, 4 threads; "
        "bf16_matmul_cost unknown: no bf16 kernel)")
    path.write_text(yaml.safe_dump({"devices": {"pi": {"profile": "raspberry-pi-4-4gb", "host": "10.0.0.9",
                                                       "speed": {**MEASURED, "pass_ns": -1}}}}))
    with pytest.raises(InventoryError, match="speed.pass_ns"):
        get_device("pi")


def test_calibrate_refuses_what_it_cannot_store(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    for name, says in (("local", "`speed: measure`"), ("nosuch", "nowhere to be stored")):
        out = CliRunner().invoke(cli, ["devices", "calibrate", name])
        assert out.exit_code == 2 and says in out.output and len(out.output.strip().splitlines()) == 1, out.output


@pytest.mark.lab
def test_calibrate_a_lab_device_and_predict_ranks_by_its_rates(tmp_path):
    """Measured over SSH by the device's own python, under its cgroup's CPU quota."""
    devices = [lab.LabDevice("raspberry-pi-4-4gb", name="lab-cal", memory_bytes=2 * 2**30, cpus=1)]
    with lab_in(tmp_path, devices):
        out = CliRunner().invoke(cli, ["devices", "calibrate", "lab-cal", "--json"])
        assert out.exit_code == 0, out.output
        shown = json.loads(out.output)["speed"]
        stored = read_inventory()["lab-cal"]["speed"]
        assert stored == shown and stored["matmul_gflops"] > 0 and stored["bf16_matmul_cost"] > 0
        assert stored["threads"] >= 1 and stored["torch"] and stored["cpu"]
        today = datetime.now(timezone.utc).date().isoformat()
        predicted = _predict("lab-cal")
        assert predicted["speed"]["source"].startswith(f"this device's own, measured on {today}")
        assert predicted["speed"]["matmul_gflops"] == stored["matmul_gflops"]
        assert all(r["step_time_vs_sgd_est"] is not None for r in predicted["methods"])  # bf16 ones too
        table = CliRunner().invoke(cli, ["predict", "--device", "lab-cal", "--model", "tiny"], env={"COLUMNS": "300"})
        assert table.exit_code == 0 and f"Rates: this device's own, measured on {today}" in table.output



@pytest.mark.lab
def test_calibrate_a_device_without_python_with_the_native_worker(tmp_path, small_rates):
    """The host builds the worker for the arch the device reports, ships it and the rates programs
    as deploy ships its assets, and the worker measures there: the entry stores its rates and
    says what measured them (no torch: the native worker and its executorch)."""
    from importlib import metadata

    with lab_in(tmp_path, [lab.LabDevice("raspberry-pi-4-4gb", no_python=True, memory_bytes=512 * 2**20, cpus=1)]):
        out = CliRunner().invoke(cli, ["devices", "calibrate", "lab-pi4-nopy", "--json"])
        assert out.exit_code == 0, out.output
        stored = read_inventory()["lab-pi4-nopy"]["speed"]
        assert stored == json.loads(out.stdout)["speed"] and "shipping native worker" in out.stderr
        for name in ("matmul_gflops", "bf16_matmul_cost", "pass_ns", "normal_ns"):
            assert stored[name] > 0, (name, stored)
        assert stored["torch"] is None and stored["executorch"] == metadata.version("executorch")
        assert stored["unmeasured"] == {} and stored["threads"] >= 1 and stored["cpu"]
        today = datetime.now(timezone.utc).date().isoformat()
        source = _predict("lab-pi4-nopy", "--method", "sgd", model=EXPORTED_MODEL)["speed"]["source"]
        assert source.startswith(f"this device's own, measured on {today} ({stored['cpu']}, the native worker, "
                                 f"executorch {stored['executorch']}"), source
        again = CliRunner().invoke(cli, ["devices", "calibrate", "lab-pi4-nopy"])  # the cached copies are used
        assert again.exit_code == 0 and "already on the device" in again.stderr, again.output
        assert "the native worker, executorch" in again.stdout


@pytest.mark.lab
def test_calibrate_a_device_whose_python_has_no_torch_with_the_native_worker(tmp_path, small_rates):
    """A board with Python but no torch is measured as it is, by the native worker, not told to
    install torch; predict then ranks the native worker's runs there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")  # this host's Python without its libraries
    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0
    with lab_in(tmp_path, [lab.LabDevice("raspberry-pi-4-4gb", name="lab-notorch", memory_bytes=512 * 2**20,
                                         cpus=1)]):
        with edited_inventory() as entries:
            entries["lab-notorch"] = {**entries["lab-notorch"], "python": python}
        out = CliRunner().invoke(cli, ["devices", "calibrate", "lab-notorch", "--json"])
        assert out.exit_code == 0, out.output
        assert f"{python} has no torch: measuring with the native worker" in out.stderr
        stored = read_inventory()["lab-notorch"]["speed"]
        assert stored == json.loads(out.stdout)["speed"] and stored["matmul_gflops"] > 0
        assert stored["torch"] is None and stored["executorch"] == metadata.version("executorch")
        shown = _predict("lab-notorch", "--method", "sgd", model=EXPORTED_MODEL)  # the worker's run, at its rates
        assert shown["runtime"] == "native" and "Python has no torch" in shown["runtime_why"]
        assert shown["speed"]["matmul_gflops"] == stored["matmul_gflops"] and shown["planned_arena_bytes"] > 0
