"""Per-sample figures from a run's raw readings: CPU shares, each rail's watts, measured and
estimated power, temperatures, on the device's clock. The store, the report and the live view
all read a run's samples through `sample_figures`, so every runtime's samples give the same
figures.

A run recorded before devices recorded raw readings carries the figure columns themselves
(`power_w`, `power_w_est`, `temp_c_max`): they are used where no raw reading stands. One
recorded before rails were raw has its rails in watts under the figure's own key
(`rail_<name>_w`, edgebench.figures.power.rail_keys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgebench.figures import estimate, power, thermal
from edgebench.figures.counters import counter_rate
from edgebench.figures.cpu import DEFAULT_CLOCK_TICKS, busy_idle_ticks, stat_fields
from edgebench.figures.run_samples import read_samples

TEXT_COLUMNS = ("proc_stat_cpu", "battery_status")
NUMBER_COLUMNS = ("rss_bytes", "cgroup_usage_bytes", "cgroup_peak_bytes", "cgroup_limit_bytes", "cgroup_oom_kills",
                  "mem_available_bytes", "worker_cpu_ticks", "cgroup_cpu_usage_ns", "battery_current_ua",
                  "battery_voltage_uv", "throttle_flags")
LEGACY_COLUMNS = ("power_w", "power_w_est", "temp_c_max", "cgroup_peak_bytes")
FIGURE_COLUMNS = ("power_w", "power_w_est", "temp_c_max", "cpu_sys_pct", "cpu_proc_pct", "cpu_cgroup_pct")


def raw_columns(readings: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(number columns, text columns) the figures of a run with these readings are made from."""
    rails = power.rail_keys(readings.get("rails") or {})
    numbers = [*NUMBER_COLUMNS, *LEGACY_COLUMNS, *(readings.get("temperatures") or {}),
               *(key for keys in rails.values() for key in keys)]
    return list(dict.fromkeys(numbers)), list(TEXT_COLUMNS)


def read_columns(path: str | Path, numbers: Iterable[str], texts: Iterable[str] = ()) -> dict[str, np.ndarray]:
    """The named columns of a samples.jsonl, for a run's own small file (the store reads big ones);
    every line checked (figures.run_samples: a bad one raises BadRecord naming it)."""
    return columns_of(read_samples(path).records, numbers, texts)


def columns_of(records: Iterable[Mapping[str, Any]], numbers: Iterable[str], texts: Iterable[str] = ()
               ) -> dict[str, np.ndarray]:
    """The named columns of sample records (NaN or None where a line lacks a key or holds
    something else), in time order."""
    records = sorted((r for r in records if isinstance(r.get("t_ns"), int)), key=lambda r: int(r["t_ns"]))
    out = {"t_ns": np.array([r["t_ns"] for r in records], dtype=np.int64)}
    for key in numbers:
        out[key] = np.array([_number(r.get(key)) for r in records], dtype=np.float64)
    for key in texts:
        out[key] = np.array([r.get(key) if isinstance(r.get(key), str) else None for r in records], dtype=object)
    return out


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan


def _system_pct(stat: np.ndarray) -> np.ndarray:
    """Busy share of all cores between consecutive /proc/stat readings."""
    out = np.full(len(stat), np.nan)
    last: tuple[int, int] | None = None
    for i, text in enumerate(stat):
        fields = stat_fields(text)
        if fields is None:
            continue
        now = busy_idle_ticks(fields)
        if last is not None and now[0] > last[0]:
            total, idle = now[0] - last[0], now[1] - last[1]
            out[i] = 100.0 * (total - idle) / total
        last = now
    return out


def _column(columns: dict[str, np.ndarray], key: str) -> np.ndarray:
    got = columns.get(key)
    return np.asarray(got, dtype=np.float64) if got is not None else np.full(len(columns["t_ns"]), np.nan)


def _statuses(column: np.ndarray | None) -> list[str]:
    """The battery statuses in the order they were seen, each change once."""
    seen: list[str] = []
    for status in column if column is not None else []:
        if isinstance(status, str) and (not seen or seen[-1] != status):
            seen.append(status)
    return seen


def _rail_watts(columns: dict[str, np.ndarray], rails: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({rail_<name>_w: watts per sample}, {raw keys: why they make no watts}) of the readings' rails."""
    watts, gaps = {}, {}
    for rail, keys in power.rail_keys(rails).items():
        watts[rail], why = power.rail_watts(columns["t_ns"], {key: _column(columns, key) for key in keys},
                                            rails.get("max_energy_range_uj") or {})
        if why:
            gaps[", ".join(keys)] = why
    return watts, gaps


def _measured_power(columns: dict[str, np.ndarray], readings: dict[str, Any], spec: dict[str, Any],
                    rail_watts: dict[str, np.ndarray]) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Watts per sample from the battery or the rails, and what they cover; None without a meter
    or where none of its readings makes watts (the estimate then stands in)."""
    ua, uv = _column(columns, "battery_current_ua"), _column(columns, "battery_voltage_uv")
    battery = readings.get("battery")
    if battery is not None and np.isfinite(ua).any():
        status = columns.get("battery_status")
        first = int(np.flatnonzero(np.isfinite(ua))[0])
        first_status = status[first] if status is not None and isinstance(status[first], str) else \
            next(iter(_statuses(status)), None)
        account = power.battery_account(battery, first_status, int(ua[first]), _statuses(status),
                                        power.profile_sign(spec))
        return power.battery_watts(ua, uv, account["battery_current_sign"]), {"power_source": "battery", **account}
    rails = readings.get("rails") or {}
    total = rails.get("total_rails") or []
    if total:
        empty = np.full(len(columns["t_ns"]), np.nan)
        watts = np.sum([rail_watts.get(key, empty) for key in total], axis=0)
        if np.isfinite(watts).any():
            return watts, {"power_source": rails.get("source"), "power_total": rails.get("power_total"),
                           "power_total_source": rails.get("power_total_source"), "power_flags": [],
                           "power_warning": None}
    legacy = _column(columns, "power_w")
    return (legacy, {"power_source": "recorded power_w"}) if np.isfinite(legacy).any() else (None, {})


def sample_figures(columns: dict[str, np.ndarray], readings: dict[str, Any], spec: dict[str, Any]
                   ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(figure columns on the samples' clock, the power account: what `power_w` covers and
    why it may fall short, or the estimate's model and basis)."""
    t_ns = np.asarray(columns["t_ns"], dtype=np.int64)
    clock = readings.get("clock_ticks") or DEFAULT_CLOCK_TICKS
    cores = float((readings.get("cgroup_cpu") or {}).get("cores") or 0)
    stat = columns.get("proc_stat_cpu")
    cgroup_ns_per_s = counter_rate(t_ns, _column(columns, "cgroup_cpu_usage_ns"))[0]
    out: dict[str, np.ndarray] = {
        "t_ns": t_ns,
        "cpu_sys_pct": _system_pct(stat) if stat is not None else np.full(len(t_ns), np.nan),
        "cpu_proc_pct": 100.0 * counter_rate(t_ns, _column(columns, "worker_cpu_ticks"))[0] / clock,
        "cpu_cgroup_pct": (np.minimum(100.0, 100.0 * cgroup_ns_per_s / 1e9 / cores)
                           if cores else np.full(len(t_ns), np.nan)),
    }
    rail_watts, rail_gaps = _rail_watts(columns, readings.get("rails") or {})
    out.update(rail_watts)
    measured, account = _measured_power(columns, readings, spec, rail_watts)
    out["power_w"] = measured if measured is not None else np.full(len(t_ns), np.nan)
    out["power_w_est"] = _column(columns, "power_w_est")
    model = estimate.power_model(spec)
    if measured is None and model is not None:
        key, what = estimate.basis(readings)
        if np.isfinite(out[key]).any():
            out["power_w_est"] = estimate.estimated_watts(*model, out[key])
            account = {"power_source": "estimate", "power_model": {"idle_w": model[0], "max_w": model[1]},
                       "power_est_basis": what}
    keys = thermal.temperature_keys(readings.get("temperatures") or {})
    temps = {key: thermal.celsius(_column(columns, raw)) for raw, key in keys.items()}
    out.update(temps)
    if temps:
        stacked = np.vstack(list(temps.values()))
        seen = np.isfinite(stacked).any(axis=0)
        out["temp_c_max"] = np.where(seen, np.nanmax(np.where(np.isfinite(stacked), stacked, -np.inf), axis=0), np.nan)
    else:
        out["temp_c_max"] = _column(columns, "temp_c_max")
    gaps = {**figure_gaps(columns, readings), **rail_gaps}
    return out, {**account, "gaps": gaps} if gaps else account


def figure_gaps(columns: dict[str, np.ndarray], readings: dict[str, Any]) -> dict[str, str]:
    """{raw key: why} for readings the host could not turn into a figure: a source the device
    named but whose values are missing or not numbers (a store keeps such a value as null), a
    /proc/stat line that is not one. Each is a gap in its figure, never a wrong number."""
    gaps: dict[str, str] = {}
    rails = power.rail_keys(readings.get("rails") or {})
    expected = [*(readings.get("temperatures") or {}), *(key for keys in rails.values() for key in keys)]
    if readings.get("battery") is not None:
        expected += ["battery_current_ua", "battery_voltage_uv"]
    if (readings.get("cgroup_cpu") or {}).get("cores"):
        expected.append("cgroup_cpu_usage_ns")
    for key in expected:
        if len(columns["t_ns"]) and not np.isfinite(_column(columns, key)).any():
            gaps[key] = "named in the run's readings, but no reading is a number"
    stat = columns.get("proc_stat_cpu")
    texts = [v for v in (stat if stat is not None else []) if isinstance(v, str)]
    bad = sum(1 for v in texts if stat_fields(v) is None)
    if bad:
        gaps["proc_stat_cpu"] = f"{bad} of {len(texts)} readings are not /proc/stat's cpu fields"
    return gaps
