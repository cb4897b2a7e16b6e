"""Sensor parsers against fixture trees shaped like real devices, the sampler's output
contract, and the trace reader's tolerance. The memory-fidelity check against the kernel
lives in test_telemetry_fidelity.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgebench.telemetry import clock, cpu, gpu, memory, power, thermal
from edgebench.telemetry.sampler import Sampler
from edgebench.telemetry.sysfs import ProfileMismatch, SourceUnavailable
from edgebench.telemetry.trace import TraceWriter, read_trace
from tests.host_figures import figures_of, figures_of_file, finite, rail_watts, reads

DEVICES = Path(__file__).parent / "fixtures" / "devices"
JETSON, PI5, ANDROID, X86 = (DEVICES / d for d in ("jetson-orin-nano", "raspberry-pi-5", "android-phone", "x86-rapl"))


def recorded_runner(device: Path):
    """Replays `<device>/<command>/<argument>.txt` as the command's output; anything not
    recorded fails as a missing command would."""
    def run(argv):
        path = device / argv[0] / f"{argv[1]}.txt"
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "not recorded for this device", " ".join(argv))
        return path.read_text()
    return run


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def wait_for_lines(path: Path, count: int, after_ns: int = 0) -> None:
    """Waits until the trace has `count` lines stamped after `after_ns`: a sampler that has
    stopped never gets there (30 s), a slow host only takes longer."""
    deadline = time.monotonic() + 30
    while sum(r["t_ns"] > after_ns for r in read_trace(path).records) < count:
        assert time.monotonic() < deadline, f"fewer than {count} samples after {after_ns} in 30 s"
        time.sleep(0.05)


def copy_device(device: Path, tmp_path: Path) -> Path:
    target = tmp_path / device.name
    shutil.copytree(device, target, symlinks=True)
    return target


# -- clock --------------------------------------------------------------------------------

def test_clock_pair_keeps_the_tightest_read_and_is_printed_as_json(monkeypatch):
    """Catches a pair taken from a looser read than the tightest, or a midpoint or uncertainty
    that is not the gap's: scripted clocks, then the real ones bracketed by the test's own reads."""
    mono = iter([100, 5_100, 200_000, 200_400, 300_000, 309_000])  # three tries: gaps of 5000, 400, 9000 ns
    wall = iter([1_000, 2_000, 3_000])
    with monkeypatch.context() as scripted:
        scripted.setattr(clock, "time", SimpleNamespace(monotonic_ns=lambda: next(mono), time_ns=lambda: next(wall)))
        assert clock.clock_pair(tries=3) == {"mono_ns": 200_200, "wall_ns": 2_000, "uncertainty_ns": 200}
    wall_before, before = time.time_ns(), time.monotonic_ns()
    pair = clock.clock_pair()
    after, wall_after = time.monotonic_ns(), time.time_ns()
    assert before <= pair["mono_ns"] <= after and wall_before <= pair["wall_ns"] <= wall_after
    assert 2 * pair["uncertainty_ns"] <= after - before
    out = subprocess.run([sys.executable, "-m", "edgebench.telemetry.clock"],
                         capture_output=True, text=True, check=True)
    assert set(json.loads(out.stdout)) >= {"mono_ns", "wall_ns"}


# -- Jetson: INA3221, thermal zones, GPU load, cgroup v2, process tree --------------------

def test_ina3221_rails_skip_nc_and_sum_channel_and_total_is_vdd_in():
    source = power.Ina3221Power(JETSON)
    records = reads(source, 10.0, 12.0)
    first = records[0]
    assert first["rail_vdd_in_mv"] == 5096 and first["rail_vdd_in_ma"] == 1248  # as hwmon gives them
    assert "power_w" not in first and "rail_vdd_in_w" not in first  # the device records rails; the host makes watts
    rails = sorted(k for k in first if k.startswith("rail_"))
    assert rails == ["rail_vdd_cpu_gpu_cv_ma", "rail_vdd_cpu_gpu_cv_mv", "rail_vdd_in_ma", "rail_vdd_in_mv",
                     "rail_vdd_soc_ma", "rail_vdd_soc_mv"]  # no NC, no sum channel
    watts = rail_watts(source)
    assert watts == {"rail_vdd_in_w": pytest.approx(5.096 * 1.248), "rail_vdd_soc_w": pytest.approx(5.096 * 0.704),
                     "rail_vdd_cpu_gpu_cv_w": pytest.approx(5.088 * 0.416)}
    columns, account = figures_of(records, {"rails": source.readings()})
    assert finite(columns["power_w"]) == [watts["rail_vdd_in_w"]] * 2
    assert account["power_total"] == "VDD_IN" and source.readings()["total_rails"] == ["rail_vdd_in_w"]


def test_ina3221_missing_rail_and_no_input_rail(tmp_path):
    root = copy_device(JETSON, tmp_path)
    chip = root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1"  # a symlink into /sys/devices, as on the board
    (chip / "curr2_input").unlink()  # a rail whose current file is missing
    source = power.Ina3221Power(root)
    assert "rail_vdd_cpu_gpu_cv_mv" not in source.read(0.0)
    assert finite(figures_of(reads(source, 0.0), {"rails": source.readings()})[0]["power_w"]) == \
        [rail_watts(source)["rail_vdd_in_w"]]
    (chip / "in1_label").write_text("VDD_GPU_SOC\n")  # rails no tree knows: every rail summed, labelled so
    source = power.Ina3221Power(root)
    rails = rail_watts(source)
    assert source.readings()["power_total"] == "sum of rails"
    assert "no rail tree is known" in source.readings()["power_total_source"]
    watts = finite(figures_of(reads(source, 0.0), {"rails": source.readings()})[0]["power_w"])
    assert watts == [pytest.approx(rails["rail_vdd_gpu_soc_w"] + rails["rail_vdd_soc_w"])]
    with pytest.raises(ProfileMismatch, match="total_rail 'VDD_IN' is not among .*'VDD_GPU_SOC'"):
        power.Ina3221Power(root, total_rail="VDD_IN")
    source, reasons = power.measured_power_source(X86, recorded_runner(X86), {"power": {"source": "ina3221"}})
    assert source is None and "no ina3221 rails" in reasons["ina3221"]
    assert "jtop" in reasons["ina3221"]  # the fallback was tried, and says why not


def test_thermal_zones_skip_offline_zone():
    zones = thermal.ThermalZones(JETSON)
    # cv0-2 are offline on an Orin Nano (no DLA): their reads fail (EAGAIN on the board) and are left out.
    columns, _ = figures_of(reads(zones, 0.0), {"temperatures": zones.names()})
    temps = {k: finite(v)[0] for k, v in columns.items() if k.startswith("temp_") and finite(v)}
    assert temps == {"temp_cpu_thermal_c": 47.5, "temp_gpu_thermal_c": 46.062, "temp_soc0_thermal_c": 45.531,
                     "temp_soc1_thermal_c": 46.281, "temp_soc2_thermal_c": 45.0, "temp_tj_thermal_c": 48.218,
                     "temp_c_max": 48.218}
    gpu_only = thermal.ThermalZones(JETSON, zones=["gpu-thermal"])
    assert gpu_only.names() == {"thermal_zone1_mc": "gpu-thermal"}
    assert gpu_only.read(0.0) == {"thermal_zone1_mc": 46062}


def test_jetson_gpu_load_and_unavailable_gpu_paths():
    assert gpu.JetsonGpuLoad(JETSON).read(0.0) == {"gpu_load_pct": 31.2}
    with pytest.raises(SourceUnavailable, match="no Jetson GPU load file"):
        gpu.JetsonGpuLoad(X86)
    try:
        import pynvml  # noqa: F401
    except ImportError:
        with pytest.raises(SourceUnavailable, match="pynvml is not installed"):
            gpu.NvmlGpu()
    assert gpu.cuda_memory_sample() == {} and gpu.cuda_status().startswith("unavailable")


def test_cgroup_v2_memory_and_cpu_throttle():
    cg = memory.CgroupMemory(4242, JETSON)
    assert cg.version == "v2" and cg.path == "edgebench/run1"
    assert cg.read() == {"cgroup_usage_bytes": 262144000}
    assert cg.counters() == {"cgroup_peak_bytes": 314572800, "cgroup_rss_bytes": 220200960, "cgroup_oom_kills": 1}
    assert "fresh cgroup per run" in cg.reset_peak()  # v2 peaks reset only per open file
    assert cpu.CgroupCpuThrottle(4242, JETSON).read(0.0) == {"cpu_throttled_us": 125000}


def test_process_tree_memory_from_fixture():
    tree = memory.ProcessTree(4242, JETSON)
    assert sorted(tree.pids(0.0)) == [4242, 4243]
    assert memory.ProcessRss(tree).read(0.0) == {"rss_bytes": (51200 + 2560) * memory.PAGE_SIZE}
    assert memory.ProcessUssPss(tree).read(0.0) == {"uss_bytes": (4800 + 170000 + 100 + 2000) * 1024,
                                                      "pss_bytes": (180224 + 4096) * 1024}
    assert memory.SystemMemory(JETSON).read(0.0) == {"mem_available_bytes": 5629952 * 1024}


def test_process_tree_without_children_files(tmp_path):
    root = copy_device(JETSON, tmp_path)
    for children in root.glob("proc/*/task/*/children"):
        children.unlink()  # kernels without CONFIG_PROC_CHILDREN: the tree comes from the ppids
    assert sorted(memory.ProcessTree(4242, root).pids(0.0)) == [4242, 4243]


def test_cpu_rates_and_frequencies(tmp_path):
    root = copy_device(JETSON, tmp_path)
    proc_cpu, sys_cpu = cpu.ProcessCpu(memory.ProcessTree(4242, root)), cpu.SystemCpu(root)
    records = [{"t_ns": 1_000_000_000, **proc_cpu.read(1.0), **sys_cpu.read(1.0)}]
    stat = root / "proc/4242/stat"
    stat.write_text(stat.read_text().replace(" 350 50 10 5 ", f" {350 + cpu.CLOCK_TICKS // 2} 50 10 5 "))
    (root / "proc/stat").write_text("cpu  10250 50 3150 80400 200 0 100 0 0 0\n")  # +400 busy, +400 idle
    records.append({"t_ns": 2_000_000_000, **proc_cpu.read(2.0), **sys_cpu.read(2.0)})
    assert records[1]["proc_stat_cpu"] == "10250 50 3150 80400 200 0 100 0 0 0"  # raw: the host makes shares
    assert records[1]["worker_cpu_ticks"] - records[0]["worker_cpu_ticks"] == cpu.CLOCK_TICKS // 2
    columns, _ = figures_of(records, {"clock_ticks": cpu.CLOCK_TICKS})
    assert finite(columns["cpu_proc_pct"]) == [50.0]  # a rate needs two reads
    assert finite(columns["cpu_sys_pct"]) == [50.0]
    assert cpu.CpuFreq(root).read(0.0) == {"cpu0_freq_mhz": 1510.4, "cpu1_freq_mhz": 729.6}


def test_sampler_on_jetson_fixture(tmp_path):
    out = tmp_path / "samples.jsonl"
    sampler = Sampler(out, 4242, rate_hz=50, root=JETSON, runner=recorded_runner(JETSON)).start()
    deadline = time.monotonic() + 30  # every source read at least once, however slowly the host runs it
    while not any("thermal_zone0_mc" in r for r in read_trace(out).records):
        assert time.monotonic() < deadline, "no thermal reading in 30 s"
        time.sleep(0.05)
    summary = sampler.stop()
    readings = sampler.readings()
    lines = read_trace(out).records
    assert lines and all(isinstance(r["t_ns"], int) for r in lines)
    assert all(b["t_ns"] > a["t_ns"] for a, b in zip(lines, lines[1:]))
    power_line = next(r for r in lines if "rail_vdd_in_mv" in r)
    assert (power_line["rail_vdd_in_mv"], power_line["rail_vdd_in_ma"]) == (5096, 1248)
    assert "rss_bytes" in lines[0] and "thermal_zone0_mc" not in lines[0]  # slow sources wait their interval
    columns, account = figures_of(lines, readings, {"power_model": {"idle_w": 4, "max_w": 15}})
    assert max(finite(columns["temp_c_max"])) == 48.218
    assert not finite(columns["power_w_est"])  # measured power wins over the model
    assert account["power_source"] == "ina3221" and account["power_total"] == "VDD_IN"
    assert summary["power_source"] == "ina3221"
    assert lines[-1]["cgroup_peak_bytes"] == 314572800 and lines[-1]["cgroup_oom_kills"] == 1
    assert readings["memory_cgroup"]["peak_scope"].startswith("cgroup lifetime")
    assert summary["oom_kills_start"] == summary["oom_kills_end"] == 1
    assert max(r.get("rss_bytes", 0) for r in lines) == (51200 + 2560) * memory.PAGE_SIZE
    assert {"process_rss", "cgroup_memory", "ina3221", "thermal_zones", "jetson_gpu_load", "cpu_freq"} <= \
        set(summary["sources_active"])
    assert "vcgencmd" in summary["sources_unavailable"]["pi_throttled"]


# -- Raspberry Pi 5: PMIC rails and throttling through the command runner -----------------

def test_pi5_pmic_power_pairs_rails():
    source = power.PiPmicPower(recorded_runner(PI5))  # current firmware: 12 paired rails
    rec = source.read(0.0)
    assert rec["rail_vdd_core_a"] == 1.54489 and rec["rail_vdd_core_v"] == 0.8872518  # as printed
    rails = rail_watts(source)
    assert len(rails) == 12 and "rail_ext5v_w" not in rails and "rail_batt_w" not in rails
    assert not any(k.startswith("rail_ext5v") for k in rec)  # a voltage with no current is no rail
    assert rails["rail_vdd_core_w"] == pytest.approx(1.54489 * 0.8872518)
    assert rails["rail_hdmi_w"] == pytest.approx(0.017094 * 4.9044)
    assert finite(figures_of(reads(source, 0.0), {"rails": source.readings()})[0]["power_w"]) == \
        [pytest.approx(sum(rails.values()))]
    assert source.readings()["power_total"] == "sum of rails"
    older = (PI5 / "older-firmware" / "pmic_read_adc.txt").read_text()  # 8 rails before the firmware update
    old_rails = rail_watts(power.PiPmicPower(lambda argv: older))
    assert len(old_rails) == 8
    assert old_rails["rail_vdd_core_w"] == pytest.approx(1.11625 * 0.7494)
    with pytest.raises(SourceUnavailable, match="pmic_read_adc"):
        power.PiPmicPower(recorded_runner(JETSON))


def test_pi_throttled_flags_decoded():
    assert thermal.PiThrottled(recorded_runner(PI5)).read(0.0) == {"throttle_flags": 0x50005}
    assert thermal.decode_throttled(0x50005) == {"now": ["under_voltage", "throttled"],
                                                 "since_boot": ["under_voltage", "throttled"]}
    assert thermal.decode_throttled(0x80008) == {"now": ["soft_temp_limit"], "since_boot": ["soft_temp_limit"]}
    assert thermal.decode_throttled(0) == {"now": [], "since_boot": []}
    zones = thermal.ThermalZones(PI5)
    assert zones.read(0.0) == {"thermal_zone0_mc": 52650} and zones.names() == {"thermal_zone0_mc": "cpu-thermal"}
    # hwmon's cpu_thermal mirrors the zone and is left out; the RP1 ADC's sensor is not.
    hwmon = thermal.HwmonTemps(PI5, zones.chip_names)
    assert list(hwmon.read(0.0).values()) == [41200] and list(hwmon.names().values()) == ["rp1_adc temp1"]
    columns, _ = figures_of(reads(hwmon, 0.0), {"temperatures": hwmon.names()})
    assert finite(columns["temp_rp1_adc_temp1_c"]) == [41.2]
    assert len(thermal.HwmonTemps(PI5).read(0.0)) == 2


def test_sampler_on_pi5_fixture(tmp_path):
    sampler = Sampler(tmp_path / "s.jsonl", os.getpid(), rate_hz=20, root=PI5,
                      sensors={"power": {"source": "pmic"}, "thermal_zones": ["cpu-thermal"], "throttle": "vcgencmd"},
                      runner=recorded_runner(PI5)).start()
    time.sleep(0.2)
    summary = sampler.stop()
    assert summary["power_source"] == "pmic"
    lines = read_trace(tmp_path / "s.jsonl").records
    assert {r["throttle_flags"] for r in lines if "throttle_flags" in r} == {0x50005}
    assert max(finite(figures_of(lines, sampler.readings())[0]["temp_c_max"])) == 52.65
    assert "not selected" not in json.dumps(summary["sources_unavailable"])


# -- Android: battery sign convention; an unreadable thermal zone --------------------------

def test_android_battery_sign_and_unreadable_zone(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_STATE_DIR", str(tmp_path))  # no stored calibration
    # Discharging at start, current_now < 0 (the kernel's convention): the sign is -1 whatever the profile says.
    source = power.BatteryPower(ANDROID, current_sign=1)
    record = source.read(0.0)
    assert record["battery_current_ua"] < 0 and record["battery_status"] == "Discharging"  # raw, as read
    columns, account = figures_of(reads(source, 0.0), {"battery": source.readings()},
                                  {"sensors": {"power": {"battery_current_sign": 1}}})
    assert finite(columns["power_w"]) == [pytest.approx(0.412 * 3.987, abs=1e-4)]
    assert account["battery_current_sign"] == -1 and "Discharging" in account["battery_sign_origin"]
    assert "differs from the profile" in account["battery_sign_origin"] and account["power_flags"] == []
    source, _ = power.measured_power_source(ANDROID, recorded_runner(ANDROID), {"battery_current_sign": -1})
    assert source.name == "battery"
    # The second zone's temp read fails (EINVAL on the phone): left out.
    assert thermal.ThermalZones(ANDROID).read(0.0) == {"thermal_zone0_mc": 31200}


# -- x86: RAPL wrap-around, cgroup v1 -----------------------------------------------------

def test_rapl_records_counters_and_the_host_makes_watts_across_the_wrap(tmp_path):
    root = copy_device(X86, tmp_path)
    package, core = root / "sys/class/powercap/intel-rapl:0", root / "sys/class/powercap/intel-rapl:0:0"
    source = power.RaplPower(root)
    readings = {"rails": source.readings()}
    max_range = 262143328850
    assert readings["rails"]["max_energy_range_uj"]["rapl_package_0_energy_uj"] == max_range  # once, in meta.json
    records = reads(source, 100.0)
    assert records[0]["rapl_package_0_energy_uj"] == 262143000000  # the counter as read: no watts on the device
    (package / "energy_uj").write_text(f"{1_000_000 - (max_range - 262143000000)}\n")  # wrapped, +1 J in all
    (core / "energy_uj").write_text(f"{100_000_000 + 500_000}\n")
    records += reads(source, 100.5)
    (package / "energy_uj").write_text(f"{1_000_000 - (max_range - 262143000000) + 3_000_000}\n")
    records += reads(source, 101.5)
    columns, account = figures_of(records, readings)
    assert [finite(columns[k][:1]) for k in ("rail_package_0_w", "rail_core_w", "power_w")] == [[], [], []]  # first
    assert finite(columns["rail_package_0_w"]) == [pytest.approx(2.0), pytest.approx(3.0)]
    assert finite(columns["rail_core_w"]) == [pytest.approx(1.0), 0.0]
    assert finite(columns["power_w"]) == [pytest.approx(2.0), pytest.approx(3.0)]  # the package zones, not core
    assert account["power_total"] == "sum of package zones" and "gaps" not in account


def test_rapl_counters_the_host_cannot_make_watts_of_are_named_gaps(tmp_path):
    root = copy_device(X86, tmp_path)
    package = root / "sys/class/powercap/intel-rapl:0"
    source = power.RaplPower(root)
    rails = source.readings()
    records = reads(source, 1.0)
    (package / "energy_uj").write_text("garbage\n")
    records += reads(source, 2.0)
    assert records[1]["rapl_package_0_energy_uj"] == "garbage"  # as read
    (package / "energy_uj").write_text("262143500000\n")
    records += reads(source, 3.0)
    columns, account = figures_of(records, {"rails": rails})
    assert finite(columns["power_w"]) == [pytest.approx(0.25)]  # 0.5 J over 2 s, across the garbage reading
    assert "gaps" not in account

    stat = ["1000 0 1000 8000 0 0 0 0 0 0", "1500 0 1500 9000 0 0 0 0 0 0", "2000 0 2000 10000 0 0 0 0 0 0"]
    garbled = [{**r, "rapl_package_0_energy_uj": "garbage", "proc_stat_cpu": cpu} for r, cpu in zip(records, stat)]
    columns, account = figures_of(garbled, {"rails": rails}, {"power_model": {"idle_w": 5, "max_w": 45}})
    assert not finite(columns["power_w"]) and "no reading is a number" in account["gaps"]["rapl_package_0_energy_uj"]
    assert account["power_source"] == "estimate"  # labelled as such, where the meter gave nothing
    assert finite(columns["power_w_est"]) == [25.0, 25.0]  # half the board's CPU busy
    no_core = [{k: v for k, v in r.items() if k != "rapl_core_energy_uj"} for r in records]  # a zone never recorded
    assert "rapl_core_energy_uj" in figures_of(no_core, {"rails": rails})[1]["gaps"]
    wrapped = [records[0], {**records[2], "rapl_package_0_energy_uj": 1_000_000}]
    columns, account = figures_of(wrapped, {"rails": {**rails, "max_energy_range_uj": {}}})  # where it wraps: unknown
    assert not finite(columns["power_w"])  # not a negative or a guessed number
    assert "no max_energy_range_uj" in account["gaps"]["rapl_package_0_energy_uj"]
    assert finite(figures_of(wrapped, {"rails": rails})[0]["power_w"]) == [pytest.approx(0.6644, abs=1e-4)]


def test_rails_recorded_as_watts_before_rails_were_raw_still_make_power():
    readings = {"rails": {"source": "ina3221", "total_rails": ["rail_vdd_in_w"], "power_total": "VDD_IN",
                          "power_total_source": "VDD_IN meters the module input (NVIDIA)"}}
    records = [{"t_ns": 1_000_000_000, "rail_vdd_in_w": 6.3598, "rail_vdd_soc_w": 3.5876}]
    columns, account = figures_of(records, readings)
    assert finite(columns["power_w"]) == finite(columns["rail_vdd_in_w"]) == [6.3598]
    assert account["power_total"] == "VDD_IN" and "gaps" not in account


def test_cgroup_v1_memory_and_cpu_throttle():
    cg = memory.CgroupMemory(777, X86)
    assert cg.version == "v1" and cg.read() == {"cgroup_usage_bytes": 524288000}
    assert cg.counters() == {"cgroup_peak_bytes": 629145600, "cgroup_rss_bytes": 419430400,
                             "cgroup_limit_bytes": 4294967296, "cgroup_oom_kills": 0}
    assert cpu.CgroupCpuThrottle(777, X86).read(0.0) == {"cpu_throttled_us": 42000}


def test_sampler_resets_the_v1_peak_so_it_covers_the_run(tmp_path):
    root = copy_device(X86, tmp_path)
    sampler = Sampler(tmp_path / "s.jsonl", 777, root=root, runner=recorded_runner(root)).start()
    summary = sampler.stop()
    last = read_trace(tmp_path / "s.jsonl").records[-1]
    assert sampler.readings()["memory_cgroup"]["peak_scope"] == "run"
    assert last["cgroup_peak_bytes"] == 0  # the fixture file took the reset (the kernel would hold usage)
    assert last["cpu_throttled_us"] == 42000 and summary["power_source"] == "rapl"


def test_root_cgroup_is_reported_not_read(tmp_path):
    (tmp_path / "proc/5").mkdir(parents=True)
    (tmp_path / "proc/5/cgroup").write_text("4:memory:/\n0::/\n")
    v1_root = tmp_path / "sys/fs/cgroup/memory"
    v1_root.mkdir(parents=True)
    for name, text in (("memory.usage_in_bytes", "1000"), ("cgroup.sane_behavior", "0")):
        (v1_root / name).write_text(text + "\n")
    with pytest.raises(SourceUnavailable, match="root memory cgroup"):
        memory.CgroupMemory(5, tmp_path)
    (v1_root / "cgroup.sane_behavior").unlink()  # a container's own cgroup, seen through its namespace
    assert memory.CgroupMemory(5, tmp_path).read() == {"cgroup_usage_bytes": 1000}
    (tmp_path / "proc/5/cgroup").write_text("0::/\n")  # v2 root: no memory.current there
    with pytest.raises(SourceUnavailable, match="0::/"):
        memory.CgroupMemory(5, tmp_path)


# -- power estimate, rate, traces ---------------------------------------------------------

def test_estimated_power_is_labelled_estimated(tmp_path, sleeper):
    out = tmp_path / "samples.jsonl"
    sampler = Sampler(out, sleeper.pid, rate_hz=50, sensors={"power": {"source": "none"}}).start()
    time.sleep(0.5)
    summary = sampler.stop()
    lines = read_trace(out).records
    assert not any(key.startswith(("power_w", "energy_j")) for r in lines for key in r)  # no figure on the device
    columns, account = figures_of(lines, sampler.readings(), {"power_model": {"idle_w": 2.0, "max_w": 6.0}})
    estimates = finite(columns["power_w_est"])
    assert estimates and all(2.0 <= w <= 6.0 for w in estimates) and not finite(columns["power_w"])
    assert summary["power_source"] is None and account["power_source"] == "estimate"
    assert account["power_est_basis"] == "the whole system's CPU use (/proc/stat)"
    _, unusable = figures_of(lines, sampler.readings(), {"power_model": {"idle_w": "two"}})
    assert unusable == {}  # a model that is not numbers gives no estimate, never a wrong one


def test_sampler_rate_and_real_process(tmp_path, sleeper):
    """Catches a sampler that bursts (samples faster than its rate) or stalls, against the time
    it ran as this test measured it, so a loaded host slows it without failing it."""
    out = tmp_path / "samples.jsonl"
    started = time.monotonic()
    sampler = Sampler(out, sleeper.pid, rate_hz=50).start()
    time.sleep(1.0)
    summary = sampler.stop()
    elapsed = time.monotonic() - started
    lines = read_trace(out).records
    # at most one line per 1/50 s, plus the first and the last (stop's); at least half the rate
    assert 50 / 2 * elapsed <= len(lines) <= 50 * elapsed + 2, (len(lines), elapsed)
    assert summary["samples"] == len(lines)
    assert "process_rss" in summary["sources_active"] and max(r.get("rss_bytes", 0) for r in lines) > 1_000_000
    assert any("uss_bytes" in r for r in lines) and any("worker_cpu_ticks" in r for r in lines)
    with pytest.raises(ValueError, match="out of range"):
        Sampler(out, sleeper.pid, rate_hz=500)


def test_sampler_keeps_going_after_the_process_exits(tmp_path):
    """Catches a sampler that stops when its process exits: samples stamped after the exit."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    sampler = Sampler(tmp_path / "s.jsonl", child.pid, rate_hz=50).start()
    child.wait()
    wait_for_lines(tmp_path / "s.jsonl", 5, after_ns=time.monotonic_ns())
    assert not sampler.stop()["sources_failed"]


def test_trace_with_truncated_last_line_and_garbage(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as writer:
        writer.write({"t_ns": 1})
        writer.write({"t_ns": 2})
    with open(path, "a") as fh:
        fh.write("not json at all\n[1, 2]\n")
        fh.write('{"t_ns": 3, "rss_by')
    trace = read_trace(path)
    assert [r["t_ns"] for r in trace.records] == [1, 2]
    assert trace.bad_lines == 2 and trace.truncated_last_line
    path.write_text("")
    empty = read_trace(path)
    assert empty.records == [] and not empty.truncated_last_line and empty.bad_lines == 0


def test_sensors_command_reports_sources_as_json():
    from click.testing import CliRunner

    from edgebench.cli.sensors import sensors_command

    result = CliRunner().invoke(sensors_command, ["--root", str(JETSON), "--seconds", "0.2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert "ina3221" in report["sources_active"] and report["latest"]["rail_vdd_in_mv"] == 5096
    assert report["figures"]["rail_vdd_in_w"] == report["figures"]["power_w"] == pytest.approx(5.096 * 1.248)
    assert report["power"]["power_total"] == "VDD_IN"
    assert "process_rss" in report["sources_unavailable"]  # this process is not in the fixture's /proc


def test_bad_settings_and_a_sensor_breaking_mid_run_do_not_stop_sampling(tmp_path, sleeper):
    calls = []

    def flaky_runner(argv):  # answers once, then the command starts failing
        calls.append(argv)
        if len(calls) > 1:
            raise subprocess.CalledProcessError(1, list(argv), stderr="VCHI initialization failed")
        return recorded_runner(PI5)(argv)

    sampler = Sampler(tmp_path / "s.jsonl", sleeper.pid, rate_hz=50, root=PI5,
                      sensors={"power": {"source": "bogus"}, "throttle": "vcgencmd"},
                      runner=flaky_runner).start()
    wait_for_lines(tmp_path / "s.jsonl", 5)
    summary = sampler.stop()
    assert "sensors.power.source is 'bogus'" in summary["sources_failed"]["power"]
    assert "CalledProcessError" in summary["sources_failed"]["pi_throttled"]
    assert "pi_throttled" not in summary["sources_active"]
    lines = read_trace(tmp_path / "s.jsonl").records
    assert max(finite(figures_of(lines, sampler.readings())[0]["temp_c_max"])) == 52.65


def _lab_device_tree(root: Path, cpu_max: str) -> Path:
    """A lab device's v2 cgroup (`0::/lab/pi4`) with a CPU quota, and a whole host that never moves."""
    (root / "proc/9").mkdir(parents=True)
    (root / "proc/9/cgroup").write_text("0::/lab/pi4\n")
    (root / "proc/stat").write_text("cpu  100 0 100 1000 0 0 0 0 0 0\n")
    group = root / "sys/fs/cgroup/lab/pi4"
    group.mkdir(parents=True)
    (group / "cpu.max").write_text(cpu_max + "\n")
    (group / "cpu.stat").write_text("usage_usec 1000000\nuser_usec 800000\nsystem_usec 200000\n")
    return group


def test_cgroup_cpu_is_the_lab_devices_own_share_of_its_quota(tmp_path):
    group = _lab_device_tree(tmp_path, "200000 100000")  # 2 cores
    source = cpu.CgroupCpu(9, tmp_path)
    first = reads(source, 10.0)
    assert first[0]["cgroup_cpu_usage_ns"] == 1_000_000_000 and source.cores == 2
    (group / "cpu.stat").write_text("usage_usec 1500000\n")  # 0.5 s of CPU in 0.5 s: one of its two cores
    readings = {"cgroup_cpu": source.readings()}
    assert finite(figures_of(first + reads(source, 10.5), readings)[0]["cpu_cgroup_pct"]) == [50.0]
    assert readings["cgroup_cpu"] == {"path": "lab/pi4", "cores": 2.0}
    (group / "cpu.max").write_text("max 100000\n")  # no quota: a session's cgroup on a board, not a device
    with pytest.raises(SourceUnavailable, match="no CPU quota"):
        cpu.CgroupCpu(9, tmp_path)


def test_estimated_power_of_a_lab_device_follows_its_cgroup_not_the_host(tmp_path):
    _lab_device_tree(tmp_path, "100000 100000")
    sampler = Sampler(tmp_path / "s.jsonl", 9, rate_hz=50, root=tmp_path, sensors={"power": {"source": "none"}}).start()
    time.sleep(0.2)
    sampler.stop()
    columns, account = figures_of_file(tmp_path / "s.jsonl", sampler.readings(),
                                       {"power_model": {"idle_w": 2.0, "max_w": 6.0}})
    estimates = finite(columns["power_w_est"])
    assert estimates and set(estimates) == {2.0}  # the device's cgroup was idle; the host's /proc/stat never counts
    assert account["power_est_basis"].startswith("the CPU use of its cgroup lab/pi4")


def test_a_real_lab_cgroups_cpu_use_is_its_own_not_the_busy_hosts():
    """A lab device's cgroups as the lab makes them (1 core): a busy loop outside leaves the
    device at ~0% while the host reads busy; the same loop inside reads as the device's, as much
    as the loop itself used in that second (catches a device figure that is the host's or none),
    however little of a loaded host the loop got."""
    import uuid

    from edgebench.devices.cgroups import Limits

    limits = Limits.create(f"edgebench-test-{uuid.uuid4().hex[:8]}/dev", 256 << 20, 1.0)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # other work on the host
    try:
        for procs in limits.procs_files():
            procs.write_text(str(idle.pid))
        device, host, loop = cpu.CgroupCpu(idle.pid), cpu.SystemCpu(), cpu.ProcessCpu(memory.ProcessTree(busy.pid))
        assert device.cores == 1
        readings = {"cgroup_cpu": device.readings(), "clock_ticks": cpu.CLOCK_TICKS}

        def read() -> dict:
            return {"t_ns": time.monotonic_ns(), **device.read(0.0), **host.read(0.0), **loop.read(0.0)}

        def shares() -> tuple[float, ...]:  # the device's, the host's and the loop's CPU use over one second
            first = read()
            time.sleep(1.0)
            columns, _ = figures_of([first, read()], readings)
            return tuple(finite(columns[key])[0] for key in ("cpu_cgroup_pct", "cpu_sys_pct", "cpu_proc_pct"))

        device_pct, host_pct, _ = shares()
        assert device_pct < 5 and host_pct > 20
        for procs in limits.procs_files():
            procs.write_text(str(busy.pid))
        device_pct, _, loop_pct = shares()
        assert loop_pct > 5 and device_pct == pytest.approx(loop_pct, abs=5), (device_pct, loop_pct)
    finally:
        for child in (idle, busy):
            child.kill()
            child.wait()
        limits.destroy()
