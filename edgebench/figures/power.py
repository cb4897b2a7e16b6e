"""Measured power: a battery's draw with its sign determined, or a device's rails summed as
its meter's description says, and what the figure covers.

A battery (Android power_supply) is recorded raw: current_now (µA) with the vendor's sign,
voltage_now (µV) and its status, at every reading. Which sign means discharging is
determined here, not assumed (vendors differ; a Xiaomi Mi 8 reads negative while
*charging*): from a Discharging status at the start of the run; else from a calibration
stored on the device (`edgebench sensors --calibrate`, run unplugged), recorded in the run's
readings; else the profile's sign; else the kernel ABI's (current_now < 0 while discharging),
the last two marked unverified. A run that saw the phone on external power is flagged: the
battery current then leaves out what the supply provides.

Rails (Jetson INA3221, x86 RAPL, Pi 5 PMIC) are recorded as each rail's value; the device's
power is the sum of the rails its readings name as the total (the rail tree's roots, or the
module input), decided from the rail names when the run started.
"""

from __future__ import annotations

from typing import Any

# A discharging phone draws tens to hundreds of mA; below 10 mA the sign could be noise.
MIN_CALIBRATION_UA = 10_000
EXTERNAL_SUPPLY_TYPES = ("USB", "Mains", "Wireless")  # power_supply `type`s (USB_PD, USB_DCP... start with USB)
ON_EXTERNAL_POWER = ("Charging", "Full", "Not charging")
CALIBRATE_HINT = "run `edgebench sensors --calibrate` once with the phone unplugged"


def determine_sign(status: str | None, ua: int, stored: dict[str, Any] | None,
                   profile_sign: int | str) -> tuple[int, str, bool]:
    """(sign, where it comes from, verified on this device) of a battery's current_now."""
    if status == "Discharging" and abs(ua) >= MIN_CALIBRATION_UA:
        sign = 1 if ua > 0 else -1
        origin = "battery status at start: Discharging"
        others = [(stored and stored.get("battery_current_sign"), "the stored calibration"),
                  (profile_sign if profile_sign in (1, -1) else None, "the profile")]
        origin += "".join(f"; differs from {name} ({other:+d})" for other, name in others
                          if other in (1, -1) and other != sign)
        return sign, origin, True
    if stored and stored.get("battery_current_sign") in (1, -1):
        return int(stored["battery_current_sign"]), f"calibrated on this device at {stored.get('calibrated_at')}", True
    if profile_sign in (1, -1):
        return int(profile_sign), f"the profile, not verified on this device: {CALIBRATE_HINT}", False
    return -1, f"the kernel's convention (current_now < 0 when discharging), not verified: {CALIBRATE_HINT}", False


def external_power(status: str | None, supplies: dict[str, Any] | None) -> tuple[str, str] | None:
    """(flag, why the battery figure is incomplete) when the phone is on external power; the
    supplies are those the device saw online ({name: {type, online}})."""
    if status not in ON_EXTERNAL_POWER:
        return None
    online = [name for name, s in sorted((supplies or {}).items()) if isinstance(s, dict)
              and str(s.get("type") or "").startswith(EXTERNAL_SUPPLY_TYPES) and str(s.get("online")) == "1"]
    by = ", ".join(online) or "an external supply"
    if status == "Not charging":
        return "charging_disabled", (f"on {by} with charging disabled (status 'Not charging'): the supply feeds the "
                                     "phone, so the battery current leaves out what it provides; unplug USB")
    return "charging", (f"battery status is {status} ({by} online): current_now is the charger's input net of "
                        "what the phone draws, not the draw; unplug USB")


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
