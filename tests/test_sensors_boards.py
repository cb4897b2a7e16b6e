"""Sensors as real boards report them (issue 20): fixture trees rebuilt from public listings
(each tree's NOTES.md names them), read through the same readers as on a device.

Reads that fail on the board (offline zones: EAGAIN; disconnected INA3221 channels: ENODATA)
are directories in the trees, so open() works and read() fails with an OSError, the path
the kernel's error takes (tests/fixtures/devices/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebench.devices.profiles import ProfileError, load_profile, parse_profile
from edgebench.telemetry import battery, power, rails, thermal
from edgebench.telemetry.battery import CalibrationError, calibrate_battery_sign
from edgebench.telemetry.sampler import Sampler
from edgebench.telemetry.sysfs import ProfileMismatch
from tests.host_figures import figures_of, figures_of_file, finite, measured, rail_watts, reads, temperatures

DEVICES = Path(__file__).parent / "fixtures" / "devices"
NANO, AGX, ORIN_NANO = DEVICES / "jetson-nano-jp4", DEVICES / "jetson-agx-orin-jp5", DEVICES / "jetson-orin-nano"
MI8, PIXEL, X86 = DEVICES / "android-xiaomi-mi8", DEVICES / "android-phone", DEVICES / "x86-rapl"


@pytest.fixture(autouse=True)
def no_stored_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_STATE_DIR", str(tmp_path / "state"))


def copy_device(device: Path, tmp_path: Path) -> Path:
    target = tmp_path / device.name
    shutil.copytree(device, target, symlinks=True)
    return target


def profile_sensors(profile_id: str) -> dict:
    return load_profile(profile_id).sensors.model_dump()


def sample(root: Path, sensors: dict, tmp_path: Path) -> dict:
    """A short sampler run on a fixture tree: its summary (what result.json carries), with the
    host's account of its power and its hottest reading."""
    sampler = Sampler(tmp_path / "samples.jsonl", 999999, rate_hz=50, root=root, sensors=sensors,
                      runner=lambda argv: (_ for _ in ()).throw(FileNotFoundError(argv[0]))).start()
    time.sleep(0.15)
    summary = sampler.stop()
    columns, account = figures_of_file(tmp_path / "samples.jsonl", sampler.readings(), {"sensors": sensors})
    return {**summary, **account, "temp_c_max": max(finite(columns["temp_c_max"]), default=None)}


def test_every_fixture_tree_names_its_sources():
    trees = [d for d in DEVICES.iterdir() if d.is_dir()]
    assert len(trees) >= 7
    for tree in trees:
        notes = (tree / "NOTES.md").read_text()
        assert "Sources" in notes or "Source:" in notes, tree.name
    links = [p for p in DEVICES.rglob("*") if p.is_symlink()]
    assert links and all(p.resolve().exists() for p in links)  # class/bus entries point into /sys/devices


# -- Jetson Nano on JetPack 4: the INA3221 through the ina3221x IIO driver ----------------------

def test_nano_jetpack4_power_through_iio_counts_the_input_once():
    source, reasons = power.measured_power_source(NANO, None, profile_sensors("jetson-nano-4gb"))
    assert source.name == "ina3221", reasons
    rec = source.read(1.0)
    assert rec["rail_pom_5v_in_mw"] == 2434 and rec["rail_pom_5v_gpu_mw"] == 40  # in_power<k>_input as read
    assert rail_watts(source) == {"rail_pom_5v_in_w": 2.434, "rail_pom_5v_gpu_w": 0.04, "rail_pom_5v_cpu_w": 0.485}
    watts, described = measured(source)
    assert watts == 2.434  # POM_5V_IN holds the GPU and CPU rails: not 2.959
    assert described["power_total"] == "POM_5V_IN" and "t/73608" in described["power_total_source"]
    # The same chip reached through /sys/bus/i2c/devices and drivers/ina3221x is read once.
    assert len(power.ina3221_channels(NANO)) == 3


def test_nano_thermal_zones_leave_out_pmic_die():
    zones = temperatures(thermal.ThermalZones(NANO, profile_sensors("jetson-nano-4gb")["thermal_zones"]))
    assert zones == {"temp_ao_therm_c": 39.5, "temp_cpu_therm_c": 35.5, "temp_gpu_therm_c": 33.5,
                     "temp_pll_therm_c": 33.0}
    assert temperatures(thermal.ThermalZones(NANO))["temp_pmic_die_c"] == 100.0  # why the profile leaves it out


# -- AGX Orin on JetPack 5: two chips, NC channels, a rail tree, JetPack 5 zone names -----------

def test_agx_orin_total_sums_the_roots_only():
    source = power.Ina3221Power(AGX, rail_tree="jetson-agx-orin")
    rails_w = rail_watts(source)
    assert set(rails_w) == {"rail_vdd_gpu_soc_w", "rail_vdd_cpu_cv_w", "rail_vin_sys_5v0_w", "rail_vddq_vdd2_1v8ao_w"}
    assert sum(rails_w.values()) == pytest.approx(13.2277, abs=1e-3)  # every rail: VDDQ counted twice
    watts, account = measured(source)
    assert watts == pytest.approx(13.2277 - 0.609, abs=1e-3)  # VDDQ_VDD2_1V8AO is inside VIN_SYS_5V0
    assert account["power_total"] == "VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0"
    assert power.Ina3221Power(AGX).readings() == source.readings()  # the tree is recognised from the rails
    narrow = power.Ina3221Power(AGX, rails=["VDD_GPU_SOC"], rail_tree="jetson-agx-orin")
    assert measured(narrow)[0] == watts and "rail_vddq_vdd2_1v8ao_mv" not in narrow.read(0.0)  # roots always read


def test_agx_orin_unreadable_root_rail_drops_the_total_not_part_of_it(tmp_path):
    root = copy_device(AGX, tmp_path)
    source = power.Ina3221Power(root, rail_tree="jetson-agx-orin")
    chip = root / "sys/class/hwmon/hwmon3"
    (chip / "in3_input").unlink()
    (chip / "in3_input").mkdir()  # VIN_SYS_5V0's read now fails, as an I2C error would
    (chip / "in3_input" / "EIO").write_text("stands in for a failing read\n")
    rec = source.read(0.0)
    assert "rail_vin_sys_5v0_mv" not in rec and "rail_vdd_gpu_soc_mv" in rec
    assert measured(source)[0] is None  # a total missing a root would under-read: none this time


def test_agx_orin_rail_tree_that_does_not_fit_is_a_profile_error():
    with pytest.raises(ProfileMismatch, match=r"rail_tree 'jetson-orin-nx-nano' .* this board reports \['VDDQ"):
        power.Ina3221Power(AGX, rail_tree="jetson-orin-nx-nano")


def test_agx_orin_jetpack5_zone_names_and_a_list_matching_none(tmp_path):
    old_list = ["cpu-thermal", "gpu-thermal", "soc0-thermal", "tj-thermal"]  # JetPack 6 names only
    with pytest.raises(ProfileMismatch) as err:
        thermal.ThermalZones(AGX, old_list)
    assert "match none of the thermal zones this board reports" in str(err.value)
    assert "'CPU-therm'" in str(err.value) and "'Tboard_tegra'" in str(err.value)
    zones = temperatures(thermal.ThermalZones(AGX, profile_sensors("jetson-agx-orin-64gb")["thermal_zones"]))
    assert zones == {"temp_cpu_therm_c": 45.5, "temp_gpu_therm_c": 43.625, "temp_soc0_therm_c": 42.718,
                     "temp_soc1_therm_c": 43.343, "temp_soc2_therm_c": 42.156, "temp_tj_therm_c": 45.5,
                     "temp_tboard_tegra_c": 36.0, "temp_tdiode_tegra_c": 37.25}  # CV0-2 offline: left out
    summary = sample(AGX, {"thermal_zones": old_list}, tmp_path)
    assert summary["sources_failed"]["thermal_zones"].startswith("ProfileMismatch: sensors.thermal_zones")


@pytest.mark.parametrize("profile_id,root,total", [
    ("jetson-nano-4gb", NANO, "POM_5V_IN"),
    ("jetson-orin-nano-8gb", ORIN_NANO, "VDD_IN"),
    ("jetson-agx-orin-64gb", AGX, "VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0"),
])
def test_jetson_profiles_fit_their_boards(tmp_path, profile_id, root, total):
    summary = sample(root, profile_sensors(profile_id), tmp_path)
    assert {"ina3221", "thermal_zones", "jetson_gpu_load"} <= set(summary["sources_active"])
    assert "thermal_zones" not in summary["sources_failed"] and "power" not in summary["sources_failed"]
    assert summary["power_total"] == total and summary["power_total_source"]
    assert summary["temp_c_max"] < 60  # no PMIC-Die, no -256 °C marker


# -- jtop: the same keys as sysfs, the total rail included ----------------------------------------

class RecordedJtop:
    """What a started `jtop.jtop()` client gives the reader: `.power` and `.close()`; the dict is
    recorded per jetson-stats' PowerService (the input rail moved from 'rail' into 'tot')."""

    def __init__(self, power_dict: dict):
        self.power = power_dict
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_jtop_fallback_gives_the_sysfs_rails_and_total():
    recorded = json.loads((ORIN_NANO / "jtop" / "power.json").read_text())
    assert "VDD_IN" not in recorded["rail"]  # jtop moved it into 'tot'
    client = RecordedJtop(recorded)
    jtop, sysfs = power.JtopPower(client=client), power.Ina3221Power(ORIN_NANO)
    assert jtop.read(5.0)["rail_vdd_in_mw"] == 6359  # jtop's power as given
    via_jtop, via_sysfs = rail_watts(jtop), rail_watts(sysfs)
    assert set(via_jtop) == set(via_sysfs)  # rail_vdd_in_w included
    for key in via_sysfs:
        assert via_jtop[key] == pytest.approx(via_sysfs[key], abs=2e-3)  # jtop truncates to whole mW
    assert jtop.readings()["total_rails"] == sysfs.readings()["total_rails"] == ["rail_vdd_in_w"]
    assert measured(jtop)[0] == pytest.approx(measured(sysfs)[0], abs=2e-3)
    agx = {"rail": {"VDD_GPU_SOC": {"power": 4000, "online": True}, "VDD_CPU_CV": {"power": 1587, "online": True},
                    "VIN_SYS_5V0": {"power": 7031, "online": True}, "VDDQ_VDD2_1V8AO": {"power": 609, "online": True}},
           "tot": {"power": 13227, "avg": 13227}}  # no input rail: jtop's 'tot' is its own sum of every rail
    source = power.JtopPower(client=RecordedJtop(agx))
    watts, account = measured(source)
    assert watts == pytest.approx(12.618) and source.read(0.0)["rail_vdd_gpu_soc_mw"] == 4000
    assert account["power_total"] == "VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0"
    source.close()
    assert not client.closed


# -- x86 RAPL: the control directory and symlinked zones ------------------------------------------

def test_rapl_skips_the_control_directory_and_follows_zone_links(tmp_path):
    assert (X86 / "sys/class/powercap/intel-rapl").is_symlink()  # the control type, no energy_uj
    root = copy_device(X86, tmp_path)
    source = power.RaplPower(root)
    assert list(source.readings()["raw"]) == ["rail_package_0_w", "rail_core_w", "rail_uncore_w"]
    records = reads(source, 10.0)
    zone = root / "sys/class/powercap/intel-rapl:0:1"  # a link: the write lands in /sys/devices
    (zone / "energy_uj").write_text("7000000\n")
    records += reads(source, 11.0)
    columns, _ = figures_of(records, {"rails": source.readings()})
    assert finite(columns["rail_uncore_w"]) == [2.0]  # sub-zones are inside the package: not in the total
    assert finite(columns["power_w"]) == [0.0]


# -- Android: the battery sign is determined; external power is flagged --------------------------

def test_xiaomi_charging_run_is_flagged_and_its_sign_unverified(tmp_path):
    summary = sample(MI8, {"power": {"source": "battery"}}, tmp_path)
    assert summary["power_source"] == "battery"
    assert summary["battery_status_seen"] == ["Charging"]
    assert summary["power_flags"] == ["battery_sign_unverified", "charging"]
    assert "usb online" in summary["power_warning"] and "sensors --calibrate" in summary["power_warning"]


def test_calibration_on_a_discharging_xiaomi_fixes_the_inverted_sign(tmp_path):
    root = copy_device(MI8, tmp_path)
    bat = root / "sys/class/power_supply/battery"
    with pytest.raises(CalibrationError, match="'Charging', not 'Discharging': unplug USB"):
        calibrate_battery_sign(root)
    (bat / "status").write_text("Discharging\n")
    (bat / "current_now").write_text("412000\n")  # discharging reads positive on this phone
    (root / "sys/class/power_supply/usb/online").write_text("0\n")
    # A discharging phone shows positive consumption whatever sign the profile assumed.
    profile = {"sensors": {"power": {"battery_current_sign": -1}}}
    watts, account = measured(power.BatteryPower(root, current_sign=-1), profile)
    assert watts == pytest.approx(0.412 * 3.888173, abs=1e-4)
    assert "differs from the profile (-1)" in account["battery_sign_origin"] and account["power_flags"] == []
    record = calibrate_battery_sign(root)
    assert record["battery_current_sign"] == 1 and Path(record["stored_in"]).is_file()
    # Plugged in again: the stored sign holds, so charging reads as energy going in, and is flagged.
    (bat / "status").write_text("Charging\n")
    (bat / "current_now").write_text("-326171\n")
    (root / "sys/class/power_supply/usb/online").write_text("1\n")
    watts, account = measured(power.BatteryPower(root))
    assert account["battery_current_sign"] == 1
    assert account["battery_sign_origin"].startswith("calibrated on this device")
    assert watts < 0 and account["power_flags"] == ["charging"]


def test_usb_with_charging_disabled_is_flagged_mid_run(tmp_path):
    root = copy_device(PIXEL, tmp_path)
    source = power.BatteryPower(root)
    records = reads(source, 0.0)
    assert figures_of(records, {"battery": source.readings()})[1]["power_flags"] == []
    (root / "sys/class/power_supply/battery/status").write_text("Not charging\n")
    (root / "sys/class/power_supply/usb/online").write_text("1\n")
    _, described = figures_of(records + reads(source, 1.0), {"battery": power.BatteryPower(root).readings()})
    assert described["battery_status_seen"] == ["Discharging", "Not charging"]
    assert described["power_flags"] == ["charging_disabled"] and "usb with charging disabled" in \
        described["power_warning"]


def test_calibration_needs_a_current_it_can_read_the_sign_of(tmp_path):
    root = copy_device(PIXEL, tmp_path)
    (root / "sys/class/power_supply/battery/current_now").write_text("-900\n")
    with pytest.raises(CalibrationError, match="too small to tell the sign"):
        calibrate_battery_sign(root, tmp_path / "sign.json")
    assert battery.stored_calibration(tmp_path / "sign.json") is None


# -- profiles: rail trees and signs validated where the file is read ------------------------------

def test_profile_rail_tree_errors_name_the_file_field_and_fix():
    base = load_profile("jetson-agx-orin-64gb").model_dump(mode="json")
    bad = {**base, "sensors": {**base["sensors"], "power": {**base["sensors"]["power"], "rail_tree": "agx"}}}
    with pytest.raises(ProfileError) as err:
        parse_profile(bad, "my-agx.yaml")
    assert "my-agx.yaml" in str(err.value) and "sensors.power.rail_tree" in str(err.value)
    assert "use one of jetson-nano" in str(err.value)
    both = {**base, "sensors": {**base["sensors"], "power": {**base["sensors"]["power"], "total_rail": "VIN_SYS_5V0"}}}
    with pytest.raises(ProfileError, match="not the only root of rail_tree 'jetson-agx-orin'.*remove total_rail"):
        parse_profile(both, "my-agx.yaml")
    assert set(rails.RAIL_TREES) >= {"jetson-nano", "jetson-orin-nx-nano", "jetson-agx-orin"}
    assert all(tree.source and tree.roots for tree in rails.RAIL_TREES.values())


def test_battery_module_entry_point_runs_on_the_device(tmp_path):
    """What the host runs over SSH/adb: one JSON line, or one error line and exit code 2."""
    env = {**os.environ, "EDGEBENCH_STATE_DIR": str(tmp_path)}
    run = [sys.executable, "-m", "edgebench.telemetry.battery", "--root", str(MI8)]
    now = subprocess.run(run, capture_output=True, text=True, env=env, check=True)
    report = json.loads(now.stdout)
    assert report["external_power"] == "charging" and report["verified"] is False
    refused = subprocess.run([*run, "--calibrate"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "unplug USB" in refused.stderr and "Traceback" not in refused.stderr


def test_a_run_on_a_charging_phone_is_flagged_in_its_figures(tmp_path):
    """The flag reaches the run's figures: the device recorded the raw battery readings and where
    they came from, the host's figures of the run directory say what the power covers."""
    from edgebench.figures.run import figures_of_run_dir
    from edgebench.runner.spec import RunSpec
    from edgebench.runner.supervisor import run_spec

    spec = RunSpec(model="tiny", method="no-such-method", steps=1, run_id="flagged",
                   sensors={"power": {"source": "battery", "battery_current_sign": "auto"}})
    run_spec(spec, tmp_path / "run", root=str(MI8))  # the worker fails at once; the sampler ran meanwhile
    assert json.loads((tmp_path / "run" / "result.json").read_text())["sampler"]["power_source"] == "battery"
    stored = figures_of_run_dir(tmp_path / "run")["power"]
    assert stored["power_source"] == "battery" and stored["power_flags"] == ["battery_sign_unverified", "charging"]
    assert stored["battery_status_seen"] == ["Charging"] and "unplug USB" in stored["power_warning"]


def test_sensors_calibrate_command(tmp_path):
    from click.testing import CliRunner

    from edgebench.cli.sensors import sensors_command

    refused = CliRunner().invoke(sensors_command, ["--root", str(MI8), "--calibrate"])  # plugged in
    assert refused.exit_code == 2 and "unplug USB" in refused.output and "Traceback" not in refused.output
    root = copy_device(MI8, tmp_path)
    (root / "sys/class/power_supply/battery/status").write_text("Discharging\n")
    (root / "sys/class/power_supply/battery/current_now").write_text("412000\n")
    done = CliRunner().invoke(sensors_command, ["--root", str(root), "--calibrate", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["battery_current_sign"] == 1
    assert battery.stored_calibration()["battery_current_sign"] == 1  # where the sampler looks
    table = CliRunner().invoke(sensors_command, ["--root", str(MI8), "--seconds", "0.1"])
    assert table.exit_code == 0 and "power_warning" in table.output and "battery_sign_origin" in table.output
