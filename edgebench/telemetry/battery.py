"""The Android battery on the device: where it is, the supplies beside it, the sign
calibration stored on the device (`edgebench sensors --calibrate`, run unplugged), and what
its readings mean (which sign is discharging, whether the phone was on external power:
`determine_sign`, `external_power`), decided here for the device's own report and for the
host's figures (edgebench.figures.power) alike.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from edgebench.errors import EdgebenchError
from edgebench.telemetry.sysfs import read_int, read_text, under

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


class CalibrationError(EdgebenchError):
    """The battery sign cannot be calibrated now; the message says what to change."""


def battery_dir(root: str | Path) -> Path:
    """power_supply/battery, else the first supply whose type is Battery."""
    supplies = under(root, "/sys/class/power_supply")
    if (supplies / "battery").exists():
        return supplies / "battery"
    batteries = [p for p in sorted(supplies.glob("*")) if read_text(p / "type") == "Battery"]
    return batteries[0] if batteries else supplies / "battery"


def state_file() -> Path:
    """Where this device keeps its battery calibration: $EDGEBENCH_STATE_DIR, else
    ~/.local/state/edgebench (on the device: the calibration belongs to the phone)."""
    base = os.environ.get("EDGEBENCH_STATE_DIR") or Path.home() / ".local" / "state" / "edgebench"
    return Path(base) / "battery_sign.json"


def stored_calibration(path: str | Path | None = None) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path or state_file()).read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("battery_current_sign") in (1, -1) else None


def calibrate_battery_sign(root: str | Path = "/", path: str | Path | None = None) -> dict[str, Any]:
    """Reads the battery while it discharges and stores which sign makes that positive.

    Raises CalibrationError (with the fix) when the phone is not discharging or draws too
    little to tell the sign."""
    base = battery_dir(root)
    status, ua = read_text(base / "status"), read_int(base / "current_now")
    if ua is None:
        raise CalibrationError(f"{base}/current_now is not readable: no battery to calibrate here")
    if status != "Discharging":
        raise CalibrationError(f"battery status is {status!r}, not 'Discharging': unplug USB (use wireless adb or "
                               "Termux SSH over Wi-Fi) so the phone runs on its battery, then calibrate again")
    if abs(ua) < MIN_CALIBRATION_UA:
        raise CalibrationError(f"current_now is {ua} uA, too small to tell the sign (< {MIN_CALIBRATION_UA} uA): "
                               "turn the screen on or start some load, then calibrate again")
    record = {"battery_current_sign": 1 if ua > 0 else -1, "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "status": status, "current_now_ua": ua, "supply": str(base)}
    target = Path(path or state_file())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, target)
    record["stored_in"] = str(target)
    return record


def supplies(root: str | Path) -> dict[str, dict[str, str | None]]:
    """{name: {type, online}} of every power supply, as read (an external one online means charging)."""
    base = under(root, "/sys/class/power_supply")
    return {p.name: {"type": read_text(p / "type"), "online": read_text(p / "online")} for p in sorted(base.glob("*"))}


def main() -> None:
    """`python -m edgebench.telemetry.battery [--root DIR] [--calibrate]`: the battery's sign
    as the sampler would determine it now (JSON), or a calibration stored on this device;
    the host runs it over SSH/adb where edgebench's CLI is not installed."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--root", default="/", help="filesystem root holding /sys (fixture trees)")
    parser.add_argument("--calibrate", action="store_true", help="store the sign; run with the phone unplugged")
    args = parser.parse_args()
    if args.calibrate:
        try:
            print(json.dumps(calibrate_battery_sign(args.root)))
        except CalibrationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    base = battery_dir(args.root)
    status, ua = read_text(base / "status"), read_int(base / "current_now")
    if ua is None:
        print(f"error: {base}/current_now is not readable: no battery here", file=sys.stderr)
        sys.exit(2)
    sign, origin, verified = determine_sign(status, ua, stored_calibration(), "auto")
    flag = external_power(status, supplies(args.root))
    print(json.dumps({"status": status, "current_now_ua": ua, "battery_current_sign": sign, "origin": origin,
                      "verified": verified, "external_power": flag[0] if flag else None}))


if __name__ == "__main__":
    main()
