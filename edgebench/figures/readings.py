"""The raw readings a device records: every key a device runtime may write into
samples.jsonl, with what it is and its unit, and the `readings` block of meta.json that says
where each was read. The Python sampler and the shell sweep (edgebench/runner/sweep.sh) both
write these keys and no figure; tests/test_readings_parity.py holds the shell to this table.
What each key's value may be (its type, range, length) is `figures.run_samples`, the one
definition every reader checks a sample line against.

Values are copied as read (kB turned into bytes, µs into ns where a counter is given in those
units), never combined into a figure: power, energy, temperatures in °C, CPU shares and
device RAM are made on the host by the other modules of this package.
"""

from __future__ import annotations

import re

# key -> what it is (unit in the key's suffix)
SAMPLE_KEYS = {
    "t_ns": "the device's monotonic clock at the reading, ns",
    "rss_bytes": "resident set of the worker's process tree (VmRSS / statm)",
    "cgroup_usage_bytes": "the run's memory cgroup usage (memory.usage_in_bytes / memory.current)",
    "cgroup_peak_bytes": "the memory cgroup's high-water mark (max_usage_in_bytes, reset at start / memory.peak)",
    "cgroup_limit_bytes": "the memory cgroup's limit (absent when unlimited)",
    "cgroup_rss_bytes": "anonymous memory of the cgroup (memory.stat total_rss / anon)",
    "cgroup_oom_kills": "the cgroup's oom_kill counter (memory.oom_control / memory.events)",
    "mem_available_bytes": "MemAvailable of /proc/meminfo",
    "proc_stat_cpu": "the fields of /proc/stat's `cpu` line, as read (clock ticks, text)",
    "worker_cpu_ticks": "utime + stime of the worker's process tree (/proc/PID/stat, clock ticks)",
    "cgroup_cpu_usage_ns": "CPU time of the run's cgroup (cpuacct.usage, or cpu.stat usage_usec x 1000)",
    "battery_current_ua": "power_supply current_now as read (µA, the vendor's sign)",
    "battery_voltage_uv": "power_supply voltage_now (µV)",
    "battery_status": "power_supply status as read (Discharging, Charging, Full, Not charging)",
    "uss_bytes": "unique set size of the worker's tree (smaps_rollup)",
    "pss_bytes": "proportional set size of the worker's tree (smaps_rollup)",
    "cpu_throttled_us": "the cgroup's CPU throttled time (cpu.stat)",
    "throttle_flags": "the Raspberry Pi's get_throttled word",
    "gpu_load_pct": "the GPU's own load counter",
}
# keys with a sensor's index or name in them -> what they are
SAMPLE_KEY_PATTERNS = {
    r"thermal_zone\d+_mc": "a thermal zone's temp (m°C); meta.json readings.temperatures names it",
    r"hwmon\d+_temp\d+_mc": "an hwmon temp*_input (m°C); meta.json readings.temperatures names it",
    r"rail_[a-z0-9_]+_(mv|ma|mw)": "an INA3221 rail's voltage, current (hwmon) or power (IIO, jtop), as read",
    r"rail_[a-z0-9_]+_(v|a)": "a Pi 5 PMIC rail's volts or amps, as `vcgencmd pmic_read_adc` prints them",
    r"rapl_[a-z0-9_]+_energy_uj": "a RAPL zone's energy counter (µJ; wraps at its max_energy_range_uj)",
    r"cpu\d+_freq_mhz": "a core's scaling_cur_freq",
    r"gpu_[a-z0-9_]+": "the GPU's own counters (NVML, Jetson)",
}
# meta.json `readings`: where the device read what it recorded (written at the start of a run)
READINGS_FIELDS = {
    "recorded_by": "the runtime that recorded the run: python or shell",
    "clock_ticks": "USER_HZ, ticks per second of /proc/stat and /proc/PID/stat",
    "temperatures": "{raw key: the zone type or hwmon chip/label as read}",
    "battery": "{path, supplies: {name: {type, online}}, calibration: stored sign record or null}",
    "cgroup_cpu": "{path, cores: the CPU quota in cores} of a CPU-limited cgroup the run lives in",
    "rails": "{source, raw: {rail_<name>_w: the raw keys its watts are made from}, total_rails: the rails whose "
             "sum is the device's power, power_total, power_total_source; RAPL: max_energy_range_uj {raw key: µJ}}",
    "memory_cgroup": "the memory cgroup folder, and `peak_scope` (run: reset at start, or why not)",
}


def is_sample_key(key: str) -> bool:
    """A key a device may record (the module's tables)."""
    return key in SAMPLE_KEYS or any(re.fullmatch(p, key) for p in SAMPLE_KEY_PATTERNS)
