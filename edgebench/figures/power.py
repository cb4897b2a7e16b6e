"""Measured power: a battery's draw with its sign determined, or a device's rails summed as
its meter's description says, and what the figure covers.

A battery (Android power_supply) is recorded raw: current_now (µA) with the vendor's sign,
voltage_now (µV) and its status, at every reading. Which sign means discharging is determined,
not assumed (vendors differ; a Xiaomi Mi 8 reads negative while *charging*), by
telemetry/battery.py, as the device's own report determines it: from a Discharging status at
the start of the run; else from a calibration stored on the device (`edgebench sensors
--calibrate`, run unplugged), recorded in the run's readings; else the profile's sign; else the
kernel ABI's (current_now < 0 while discharging), the last two marked unverified. A run that
saw the phone on external power is flagged: the battery current then leaves out what the supply
provides.

Rails (Jetson INA3221, x86 RAPL, Pi 5 PMIC) are recorded as their meters give them, the unit
in each key: mV and mA, mW, V and A, or a RAPL zone's energy counter in µJ. Each rail's watts
are made here from the keys the run's readings name for it (`raw`); a RAPL rail's from the
counter's rise between successive readings, across its wrap at max_energy_range_uj (the first
reading has none). The device's power is the sum of the rails its readings name as the total
(the rail tree's roots, or the module input), decided from the rail names when the run started.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgebench.figures.counters import counter_rate
from edgebench.telemetry.battery import determine_sign, external_power


def battery_watts(current_ua: Any, voltage_uv: Any, sign: int) -> Any:
    """Watts drawn from the battery (a number, or numpy arrays element by element)."""
    return sign * current_ua * voltage_uv / 1e12


def battery_account(battery: dict[str, Any], first_status: str | None, first_ua: int | None, statuses: list[str],
                    profile_sign: int | str) -> dict[str, Any]:
    """The sign to use and what the battery figure covers: `battery_current_sign`, its origin,
    the statuses seen, `power_flags` and `power_warning`."""
    sign, origin, verified = determine_sign(first_status, first_ua or 0, battery.get("calibration"), profile_sign)
    flags: dict[str, str] = {}
    for status in statuses:
        flag = external_power(status, battery.get("supplies"))
        if flag:
            flags.setdefault(*flag)
    if not verified:
        flags["battery_sign_unverified"] = f"battery sign from {origin}"
    return {"battery_current_sign": sign, "battery_sign_origin": origin, "battery_status_seen": statuses,
            "power_total": "battery", "power_flags": sorted(flags), "power_warning": "; ".join(flags.values()) or None}


def profile_sign(spec: dict[str, Any]) -> int | str:
    """The battery sign the device profile gives (sensors.power.battery_current_sign), or auto."""
    sensors = spec.get("sensors") or {}
    power = sensors.get("power") or {}
    sign = power.get("battery_current_sign", sensors.get("battery_current_sign", "auto"))
    return sign if sign in (1, -1) else "auto"


def rail_keys(rails: dict[str, Any]) -> dict[str, list[str]]:
    """{rail_<name>_w: the raw keys it is made from} of the readings' `rails`; a run recorded
    before rails were raw names only its total rails, recorded in watts under those keys."""
    raw = rails.get("raw")
    return raw if isinstance(raw, dict) else {key: [key] for key in rails.get("total_rails") or []}


def rail_watts(t_ns: np.ndarray, raw: dict[str, np.ndarray], wraps_at: dict[str, Any]) -> tuple[np.ndarray, str | None]:
    """(watts per sample, why some or all are missing) of one rail from its raw columns
    ({key: values}), by the unit each key ends with; `wraps_at`: {counter key: max_energy_range_uj}."""
    units = {key.rsplit("_", 1)[-1]: values for key, values in raw.items()}
    if set(units) == {"w"}:  # recorded as watts (runs before rails were raw)
        return units["w"], None
    if set(units) == {"mw"}:
        return units["mw"] / 1e3, None
    if set(units) == {"mv", "ma"}:
        return units["mv"] * units["ma"] / 1e6, None
    if set(units) == {"v", "a"}:
        return units["v"] * units["a"], None
    if len(raw) == 1 and next(iter(raw)).endswith("_energy_uj"):
        key, counter = next(iter(raw.items()))
        top = wraps_at.get(key)
        return counter_watts(t_ns, counter, top if isinstance(top, (int, float)) and top > 0 else None)
    return np.full(len(t_ns), np.nan), "not a rail reading this host knows how to make watts of"


def counter_watts(t_ns: np.ndarray, uj: np.ndarray, wraps_at: float | None) -> tuple[np.ndarray, str | None]:
    """Watts between successive readings of an energy counter (µJ), at the later one: the counter
    starts again from 0 past `wraps_at`. A fall with no known wrap gives no watts, named."""
    uj_per_s, falls = counter_rate(t_ns, uj, wraps_at)
    why = (f"{falls} readings fall below the one before and the run's readings give no max_energy_range_uj "
           "to wrap at: no watts across them")
    return uj_per_s / 1e6, why if falls else None
