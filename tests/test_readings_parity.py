"""The shell sweep (runner/sweep.sh, devices with no Python) and the Python sampler record the
same raw readings from the same device, under dash, busybox sh and mksh with toybox's tools
(Android's shell and tools), and the host makes the same figures of them.

Each fixture tree is shaped like a real device's /proc and /sys: a Pixel-style battery
(current_now < 0 discharging), a Xiaomi-style one (> 0 discharging) on its charger with a
stored calibration, a Raspberry Pi in a cgroup v1 lab device with a mirrored hwmon chip, and
a Jetson's thermal zones with a duplicated name and an offline zone under cgroup v2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgebench.figures.readings import READINGS_FIELDS, is_sample_key
from edgebench.figures.run_samples import read_samples, sample_of
from edgebench.figures.samples import columns_of, raw_columns, sample_figures
from edgebench.telemetry.sampler import Sampler
from edgebench.untrusted import BadRecord

SWEEP = Path(__file__).resolve().parents[1] / "edgebench" / "runner" / "sweep.sh"
SHELLS = {"dash": ["dash"], "busybox": ["busybox", "sh"], "mksh": ["mksh"]}
PID = 4242
# what sweep.sh runs besides its shell's builtins; under mksh they come from toybox, as on Android
# (Debian's toybox 0.8.9 lacks tr, which Android's has: busybox's stands in)
TOOLS = ("cat", "date", "sleep", "sed", "grep", "tr", "mv", "rm", "mkdir", "kill", "uname", "tail", "sort", "getconf",
         "cp", "rmdir", "printf", "od", "sh")


def android_tools(folder: Path) -> str:
    """A PATH of toybox's applets (busybox's where toybox has none), like a phone's."""
    folder.mkdir(exist_ok=True)
    applets = set(subprocess.run(["toybox"], capture_output=True, text=True).stdout.split())
    for tool in TOOLS:
        target = shutil.which("mksh") if tool == "sh" else shutil.which("toybox") if tool in applets else \
            shutil.which("busybox")
        (folder / tool).symlink_to(target)
    return str(folder)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _process(root: Path, cgroup: str, rss_kb: int = 102400) -> None:
    """The worker's /proc entries, the machine's /proc/stat and meminfo."""
    _write(root, {
        f"proc/{PID}/status": f"Name:\tedgebench-worker\nVmHWM:\t{rss_kb + 4096} kB\nVmRSS:\t{rss_kb} kB\n",
        f"proc/{PID}/statm": f"90000 {rss_kb // 4} 1000 10 0 20000 0\n",
        f"proc/{PID}/stat": f"{PID} (edgebench worker) S 1 {PID} {PID} 0 -1 4194304 100 0 0 0 "
                            "1234 567 8 9 20 0 4 0 1000 368640000 25600 18446744073709551615\n",
        f"proc/{PID}/task/{PID}/children": "",
        f"proc/{PID}/cgroup": cgroup,
        "proc/stat": "cpu  4705 150 1120 16250 520 0 30 7 0 0\ncpu0 2352 75 560 8125 260 0 15 3 0 0\n"
                     "cpu1 2353 75 560 8125 260 0 15 4 0 0\nintr 1\n",
        "proc/meminfo": "MemTotal:        3884096 kB\nMemFree:          204800 kB\nMemAvailable:    1843200 kB\n",
        "proc/loadavg": "0.52 0.58 0.59 2/160 4242\n",
    })


def pixel(root: Path) -> dict:
    _process(root, "0::/lab/pixel\n")
    cg = "sys/fs/cgroup/lab/pixel"
    _write(root, {
        f"{cg}/memory.current": "734003200\n", f"{cg}/memory.peak": "801112064\n", f"{cg}/memory.max": "max\n",
        f"{cg}/memory.stat": "anon 600000000\nfile 100000000\n", f"{cg}/memory.events": "low 0\noom_kill 2\n",
        f"{cg}/cpu.max": "200000 100000\n", f"{cg}/cpu.stat": "usage_usec 9876543210\nthrottled_usec 1234\n",
        "sys/class/power_supply/battery/type": "Battery\n", "sys/class/power_supply/battery/status": "Discharging\n",
        "sys/class/power_supply/battery/current_now": "-352000\n",
        "sys/class/power_supply/battery/voltage_now": "3912000\n",
        "sys/class/power_supply/usb/type": "USB\n", "sys/class/power_supply/usb/online": "0\n",
        "sys/class/thermal/thermal_zone0/type": "battery\n", "sys/class/thermal/thermal_zone0/temp": "31200\n",
        "sys/class/thermal/thermal_zone1/type": "skin-therm\n", "sys/class/thermal/thermal_zone1/temp": "35400\n",
    })
    return {"power": {"source": "battery"}}


def xiaomi_charging(root: Path) -> dict:
    _process(root, "0::/phone\n", rss_kb=51200)
    cg = "sys/fs/cgroup/phone"
    _write(root, {
        f"{cg}/memory.current": "52428800\n", f"{cg}/memory.max": "1073741824\n",
        f"{cg}/memory.events.local": "oom_kill 0\n",
        "sys/class/power_supply/bms/type": "Battery\n", "sys/class/power_supply/bms/status": "Charging\n",
        "sys/class/power_supply/bms/current_now": "512000\n", "sys/class/power_supply/bms/voltage_now": "4310000\n",
        "sys/class/power_supply/usb/type": "USB_PD\n", "sys/class/power_supply/usb/online": "1\n",
        "state/battery_sign.json": json.dumps({"battery_current_sign": 1, "calibrated_at": "2026-12-01T10:00:00+0000",
                                               "status": "Discharging", "current_now_ua": 420000}, indent=2) + "\n",
        "sys/class/thermal/thermal_zone3/type": "cpu-0-0\n", "sys/class/thermal/thermal_zone3/temp": "48000\n",
        "sys/class/thermal/thermal_zone10/type": "quiet_therm\n", "sys/class/thermal/thermal_zone10/temp": "33000\n",
    })
    return {"power": {"source": "battery"}}


def pi_lab(root: Path) -> dict:
    _process(root, "12:memory:/edgebench-lab/pi\n11:cpu,cpuacct:/edgebench-lab/pi\n0::/\n")
    mem, cpu = "sys/fs/cgroup/memory/edgebench-lab/pi", "sys/fs/cgroup/cpu,cpuacct/edgebench-lab/pi"
    _write(root, {
        f"{mem}/memory.usage_in_bytes": "402653184\n", f"{mem}/memory.max_usage_in_bytes": "455081984\n",
        f"{mem}/memory.limit_in_bytes": "536870912\n", f"{mem}/memory.stat": "cache 1000\ntotal_rss 350000000\n",
        f"{mem}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        f"{cpu}/cpu.cfs_quota_us": "50000\n", f"{cpu}/cpu.cfs_period_us": "100000\n",
        f"{cpu}/cpuacct.usage": "123456789012\n", f"{cpu}/cpu.stat": "nr_periods 10\nthrottled_time 4567890\n",
        "sys/fs/cgroup/memory/cgroup.sane_behavior": "0\n",
        "sys/class/thermal/thermal_zone0/type": "cpu-thermal\n", "sys/class/thermal/thermal_zone0/temp": "52612\n",
        "sys/class/hwmon/hwmon0/name": "cpu_thermal\n", "sys/class/hwmon/hwmon0/temp1_input": "52612\n",
        "sys/class/hwmon/hwmon1/name": "rp1_adc\n", "sys/class/hwmon/hwmon1/temp1_input": "47000\n",
        "sys/class/hwmon/hwmon1/temp1_label": "RP1 die\n",
    })
    return {"power": {"source": "none"}}


def jetson_zones(root: Path) -> dict:
    _process(root, "0::/jetson\n")
    cg = "sys/fs/cgroup/jetson"
    _write(root, {
        f"{cg}/memory.current": "1073741824\n", f"{cg}/memory.peak": "1207959552\n",
        f"{cg}/memory.max": "max\n", f"{cg}/memory.events": "oom_kill 0\n",
        **{f"sys/devices/virtual/thermal/thermal_zone{i}/{name}": value for i, (t, c) in enumerate(
            [("cpu-thermal", "47500"), ("gpu-thermal", "45000"), ("cpu-thermal", "47000"), ("tj-thermal", "-256000")])
           for name, value in (("type", t + "\n"), ("temp", c + "\n"))},
    })
    return {"power": {"source": "none"}}


DEVICES = {"pixel": pixel, "xiaomi_charging": xiaomi_charging, "pi_lab": pi_lab, "jetson_zones": jetson_zones}


def _python(root: Path, sensors: dict, tmp: Path) -> tuple[dict, dict]:
    """The Python sampler's readings and one sample with every source, on the fixture tree."""
    out = tmp / "samples.jsonl"
    out.unlink(missing_ok=True)
    sampler = Sampler(out, PID, root=root, sensors=sensors, runner=_no_command).start()  # resets a v1 peak
    sampler.stop()  # its last line reads every source
    return sampler.readings(), dict(read_samples(out).records[-1])  # every line checked (figures.run_samples)


def _no_command(argv: object) -> str:
    raise FileNotFoundError("no vcgencmd on this fixture")


def _shell(shell: list[str], root: Path, power: str) -> tuple[dict, dict]:
    path = android_tools(root.parent / "android-bin") if shell == ["mksh"] else os.environ["PATH"]
    env = {"PATH": path, "EDGEBENCH_ROOT": str(root), "POWER": power, "EDGEBENCH_STATE_DIR": str(root / "state")}
    done = subprocess.run([shutil.which(shell[0]) or shell[0], *shell[1:], str(SWEEP), "--sample", str(PID)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    readings, sample = done.stdout.splitlines()
    return json.loads(readings), dict(sample_of(json.loads(sample), "sweep.sh --sample"))  # as the host reads it


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shell", SHELLS)
def test_the_shell_sweep_records_what_the_python_sampler_records(tmp_path, device, shell):
    if shutil.which(SHELLS[shell][0]) is None:
        pytest.fail(f"{SHELLS[shell][0]} is not installed: scripts/setup.sh installs it (apt)")
    root = tmp_path / "root"
    sensors = DEVICES[device](root)
    os.environ["EDGEBENCH_STATE_DIR"] = str(root / "state")
    try:
        py_readings, py_sample = _python(root, sensors, tmp_path)
    finally:
        del os.environ["EDGEBENCH_STATE_DIR"]
    sh_readings, sh_sample = _shell(SHELLS[shell], root, "battery" if sensors["power"]["source"] == "battery" else
                                    "none")
    assert set(py_readings) <= set(READINGS_FIELDS) and set(sh_readings) <= set(READINGS_FIELDS)
    assert py_readings.pop("recorded_by") == "python" and sh_readings.pop("recorded_by") == "shell"
    assert sh_readings == json.loads(json.dumps(py_readings))
    py_sample.pop("t_ns"), sh_sample.pop("t_ns")
    assert sh_sample == py_sample
    assert all(is_sample_key(k) for k in sh_sample), [k for k in sh_sample if not is_sample_key(k)]


def test_the_host_makes_the_same_figures_of_either_runtime_and_reads_the_battery_right(tmp_path):
    """Two readings 0.5 s apart, recorded by each runtime: the same figures, the charging
    Xiaomi flagged with its sign from the stored calibration, the Pixel's draw positive."""
    figures = {}
    for device in ("pixel", "xiaomi_charging"):
        root = tmp_path / device
        sensors = DEVICES[device](root)
        per_runtime = []
        for runtime in ("python", "shell"):
            os.environ["EDGEBENCH_STATE_DIR"] = str(root / "state")
            try:
                readings, sample = _python(root, sensors, tmp_path) if runtime == "python" else \
                    _shell(SHELLS["dash"], root, "battery")
            finally:
                del os.environ["EDGEBENCH_STATE_DIR"]
            later = {**sample, "t_ns": 1_500_000_000, "worker_cpu_ticks": sample["worker_cpu_ticks"] + 50}
            records = [{**sample, "t_ns": 1_000_000_000}, later]
            columns, account = sample_figures(columns_of(records, *raw_columns(readings)), readings,
                                              {"sensors": sensors})
            per_runtime.append(({k: np.nan_to_num(v).tolist() for k, v in columns.items()}, account))
        assert per_runtime[0] == per_runtime[1]
        figures[device] = per_runtime[0]
    (pixel_cols, pixel_account), (xiaomi_cols, xiaomi_account) = figures["pixel"], figures["xiaomi_charging"]
    assert pixel_cols["power_w"][0] == pytest.approx(0.352 * 3.912)
    assert pixel_account["battery_sign_origin"].startswith("battery status at start: Discharging")
    assert pixel_cols["cpu_proc_pct"][1] == pytest.approx(100.0)  # 50 ticks in 0.5 s: one core
    assert pixel_cols["temp_skin_therm_c"] == [35.4, 35.4]
    assert xiaomi_cols["power_w"][0] == pytest.approx(0.512 * 4.310)
    assert xiaomi_account["battery_sign_origin"].startswith("calibrated on this device")
    assert xiaomi_account["power_flags"] == ["charging"] and "usb" in xiaomi_account["power_warning"]


def test_readings_the_host_cannot_interpret_are_named_gaps_not_numbers(tmp_path):
    """A run whose device read nothing where its readings name a source (a battery current and
    thermal zones that are null), a /proc/stat line that is not one, a garbage line, a cut last
    line: ingest and the report go on, the figures those readings feed are gaps, and each gap is
    named. A reading of the wrong type (text where a number belongs) is no gap: neither writer
    writes one, and the run is refused naming its line (figures.run_samples, issue 71)."""
    from edgebench.results.metrics import all_metrics
    from edgebench.results.store import Store

    root = tmp_path / "root"
    sensors = pixel(root)
    readings, sample = _shell(SHELLS["dash"], root, "battery")
    run = tmp_path / "run"
    run.mkdir()
    spec = {"model": "tiny", "method": "sgd", "backend": "executorch", "runtime": "native", "batch_size": 1,
            "sensors": sensors, "power_model": {"idle_w": 1.0, "max_w": 3.0}}
    (run / "meta.json").write_text(json.dumps({"run_id": "garbled", "spec": spec, "readings": readings,
                                               "device": {"mem_total_bytes": 4 << 30}}))
    bad = {"battery_current_ua": None, "thermal_zone0_mc": None, "thermal_zone1_mc": None,
           "proc_stat_cpu": "cpu garbage"}
    lines = [json.dumps({**sample, **bad, "t_ns": t * 100_000_000, "worker_cpu_ticks": t * 5}) for t in range(1, 30)]
    (run / "samples.jsonl").write_text("\n".join(lines[:10] + ["not json"] + lines[10:]) + '\n{"t_ns": 9')
    events = [{"t_ns": t * 100_000_000 + d, "event": e, "step": t, "phase": "measure", "loss": 5.0 - t / 10,
               "duration_s": 0.05} for t in range(2, 28) for d, e in ((0, "step_begin"), (50_000_000, "step_end"))]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "result.json").write_text(json.dumps({"run_id": "garbled", "recorded_by": "shell", "end": {
        "exit_code": 0, "exit_signal": None}}))
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run, device="phone")
        (row,) = all_metrics(store)
    assert row["status"] == "ok" and row["steps_measured"] == 26
    assert row["energy_per_step_j"] is None and row["power_mean_w"] is None  # no number from a garbled battery
    assert row["temp_peak_c"] is None and "its cgroup" in row["power_est_basis"]  # an estimate stands in, named
    gaps = row["figure_gaps"]
    for key in ("battery_current_ua", "thermal_zone0_mc", "thermal_zone1_mc", "proc_stat_cpu: 29 of 29 readings"):
        assert key in gaps, gaps
    (run / "samples.jsonl").write_text(json.dumps({**sample, **bad, "t_ns": 5, "thermal_zone0_mc": "hot"}) + "\n")
    with Store(tmp_path / "s.duckdb") as store, \
            pytest.raises(BadRecord, match="samples.jsonl line 1: sample.thermal_zone0_mc is 'hot', not a finite"):
        store.ingest_run(run, device="phone")


def test_the_native_worker_ends_with_the_exit_codes_the_host_reads(monkeypatch):
    """figures/status.py defines the workers' exit codes (the Python worker imports them); build.py
    generates the native worker's exit_codes.h from them, no native source defines one of its
    own, and a changed code changes the bundle's key (a cached worker with the old ones is rebuilt)."""
    import re

    from edgebench.figures import status
    from edgebench.native import build

    header = dict(re.findall(r"constexpr int (EXIT_[A-Z_]+) = (\d+);", build.exit_codes_header()))
    assert header == {name: str(getattr(status, name)) for name in dir(status) if re.fullmatch(r"EXIT_[A-Z_]+", name)}
    for source in build.SOURCES.iterdir():
        if source.suffix in (".cpp", ".h"):
            assert not re.search(r"\bEXIT_[A-Z_]+\s*=[^=]", source.read_text()), source.name
    key = build.bundle_key("x86_64")
    monkeypatch.setattr(status, "EXIT_OOM", 40)
    assert "constexpr int EXIT_OOM = 40;" in build.exit_codes_header() and build.bundle_key("x86_64") != key
