"""Power and energy, measured where the device has a meter, estimated where it has none.

Measured sources (the first present wins, unless the profile's `sensors.power.source` names one):
- `ina3221`: Jetson INA3221 rails in hwmon (in{k}_input mV x curr{k}_input mA); total =
  VDD_IN when present (Orin Nano/NX), else the sum of rails (which under-reads the input).
  Where the hwmon files cannot be read, jetson-stats' `jtop` service (if installed) gives
  the same chip's figures, updated about once a second.
- `rapl`: x86 RAPL energy counters (energy_uj, wrapping at max_energy_range_uj).
- `pmic`: Raspberry Pi 5 `vcgencmd pmic_read_adc`, sum of V x I over paired rails
  (under-reads the 5 V input).
- `battery`: Android power_supply/battery current_now (uA) x voltage_now (uV), signed by
  `battery_current_sign` so that discharging reads positive.
Each yields `power_w`, `energy_j` (since the start) and `rail_<name>_w`.

`PowerEstimate` (a profile's power model: idle + utilisation x (max - idle)) yields only
`power_w_est` / `energy_j_est`: an estimate is never written into the measured names.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from edgebench.telemetry.sysfs import (PreadFile, Runner, SourceUnavailable, hwmon_dirs, key_name, read_int,
                                       read_text, under, unique_names)

class Integrator:
    """Energy in joules from power samples (trapezoid rule between consecutive reads)."""

    def __init__(self) -> None:
        self.energy_j = 0.0
        self._last: tuple[float, float] | None = None

    def add(self, now_s: float, power_w: float) -> float:
        if self._last is not None and now_s > self._last[0]:
            self.energy_j += 0.5 * (power_w + self._last[1]) * (now_s - self._last[0])
        self._last = (now_s, power_w)
        return self.energy_j


class Ina3221Power:
    """Jetson INA3221 rails from hwmon sysfs; skips `NC` rails and the sum-of-shunts channel."""

    name = "ina3221"

    def __init__(self, root: str | Path = "/", rails: list[str] | None = None, total_rail: str | None = None):
        channels = []
        for directory in hwmon_dirs(root):
            if read_text(directory / "name") != "ina3221":
                continue
            for label_path in sorted(directory.glob("in[0-9]*_label")):
                k = label_path.name[2:-len("_label")]
                label = read_text(label_path) or ""
                if not label or label.upper() == "NC" or "sum" in label.lower():
                    continue
                volts, amps = directory / f"in{k}_input", directory / f"curr{k}_input"
                if (rails and label not in rails and label != total_rail) or not (volts.exists() and amps.exists()):
                    continue
                channels.append((label, PreadFile(volts, 32), PreadFile(amps, 32)))
        if not channels:
            raise SourceUnavailable(f"no ina3221 rails under {root} (hwmon name 'ina3221' with in<k>_label, "
                                    "in<k>_input, curr<k>_input)")
        keys = unique_names([f"rail_{key_name(label)}_w" for label, _, _ in channels])
        self._channels = [(key, label, v, a) for key, (label, v, a) in zip(keys, channels)]
        labels = {label for _, label, _, _ in self._channels}
        if total_rail and total_rail not in labels:
            raise SourceUnavailable(f"ina3221: the profile's total_rail {total_rail!r} is not among the rails "
                                    f"{sorted(labels)}")
        # The input rail measures the whole board; without one, the sum of rails under-reads it.
        self.total_rail = total_rail or ("VDD_IN" if "VDD_IN" in labels else None)
        self._energy = Integrator()

    def read(self, now_s: float) -> dict[str, float]:
        out: dict[str, float] = {}
        total = None
        for key, label, volts, amps in self._channels:
            mv, ma = volts.read(), amps.read()
            if not (mv and ma):
                continue  # a rail that cannot be read this time is simply absent
            watts = int(mv) * int(ma) / 1e6
            out[key] = round(watts, 4)
            if label == self.total_rail:
                total = watts
        if self.total_rail is None and out:
            total = sum(out.values())
        if total is not None:
            out["power_w"] = round(total, 4)
            out["energy_j"] = round(self._energy.add(now_s, total), 4)
        return out

    def close(self) -> None:
        for _, _, volts, amps in self._channels:
            volts.close()
            amps.close()


class JtopPower:
    """The same INA3221 figures through jetson-stats (`jtop`), where it is installed and its
    service runs; its values refresh at the service interval (1 s by default)."""

    name = "jtop"

    def __init__(self) -> None:
        try:
            from jtop import jtop, JtopException
        except ImportError:
            raise SourceUnavailable("jetson-stats (jtop) is not installed") from None
        self._jetson = jtop()
        try:
            self._jetson.start()
        except JtopException as exc:
            raise SourceUnavailable(f"jtop service not reachable: {exc} (sudo systemctl start jtop)") from None
        self._energy = Integrator()

    def read(self, now_s: float) -> dict[str, float]:
        readings = self._jetson.power  # mV, mA, mW
        out = {f"rail_{key_name(name)}_w": rail["power"] / 1000.0
               for name, rail in readings.get("rail", {}).items() if rail.get("online", True)}
        total = readings.get("tot", {}).get("power")
        if total is not None:
            out["power_w"] = total / 1000.0
            out["energy_j"] = round(self._energy.add(now_s, total / 1000.0), 4)
        return out

    def close(self) -> None:
        self._jetson.close()


def jetson_power(root: str | Path, rails: list[str] | None, total_rail: str | None) -> Ina3221Power | JtopPower:
    """INA3221 from hwmon, else through jtop; the error names both attempts."""
    try:
        return Ina3221Power(root, rails, total_rail)
    except SourceUnavailable as hwmon:
        try:
            return JtopPower()
        except SourceUnavailable as jtop:
            raise SourceUnavailable(f"{hwmon}; {jtop}") from None


class RaplPower:
    """x86 RAPL zones: `power_w` = sum of the package zones; every zone also as a rail."""

    name = "rapl"

    def __init__(self, root: str | Path = "/"):
        base = under(root, "/sys/class/powercap")
        zones = sorted(p for p in base.glob("intel-rapl:*") if (p / "energy_uj").exists())
        if not zones:
            raise SourceUnavailable(f"no RAPL zones under {base} (not an Intel/AMD x86 host, or no powercap driver)")
        names = unique_names([key_name(read_text(z / "name") or z.name) for z in zones])
        self._zones = []
        for zone, name in zip(zones, names):
            fh = PreadFile(zone / "energy_uj", 32)
            if fh.read() is None:
                raise SourceUnavailable(f"{zone}/energy_uj is not readable (root-only since Linux 5.10: run as root "
                                        "or make it readable)")
            top_level = zone.name.count(":") == 1
            self._zones.append((f"rail_{name}_w", name.startswith("package") and top_level, fh,
                                read_int(zone / "max_energy_range_uj")))
        self._last: dict[str, tuple[float, int]] = {}
        self.energy_j = 0.0

    def read(self, now_s: float) -> dict[str, float]:
        out: dict[str, float] = {}
        package_joules = package_dt = None
        for key, is_package, fh, max_range in self._zones:
            text = fh.read()
            if not text:
                continue
            uj = int(text)
            last = self._last.get(key)
            self._last[key] = (now_s, uj)
            if last is None or now_s <= last[0]:
                continue
            delta = uj - last[1]
            if delta < 0 and max_range:
                delta += max_range  # the counter wrapped
            out[key] = round(delta / 1e6 / (now_s - last[0]), 4)
            if is_package:
                package_joules = (package_joules or 0.0) + delta / 1e6
                package_dt = now_s - last[0]
        if package_joules is not None:
            self.energy_j += package_joules
            out["power_w"] = round(package_joules / package_dt, 4)
            out["energy_j"] = round(self.energy_j, 4)
        return out

    def close(self) -> None:
        for _, _, fh, _ in self._zones:
            fh.close()


PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=([-\d.eE+]+)[AV]\s*$")


def parse_pmic_read_adc(text: str) -> dict[str, float]:
    """Rail name -> watts from `vcgencmd pmic_read_adc` output; rails without both a
    current and a voltage line (e.g. EXT5V_V) are left out."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        match = PMIC_LINE.match(line)
        if match:
            (amps if match.group(2) == "A" else volts)[match.group(1)] = float(match.group(3))
    return {rail: volts[rail] * amps[rail] for rail in amps if rail in volts}


class PiPmicPower:
    """Raspberry Pi 5 PMIC rails through `vcgencmd pmic_read_adc` (via the command runner)."""

    name = "pmic"
    command = ("vcgencmd", "pmic_read_adc")

    def __init__(self, runner: Runner):
        self._runner = runner
        self._energy = Integrator()
        try:
            rails = parse_pmic_read_adc(runner(self.command))
        except (OSError, subprocess.SubprocessError) as exc:  # not installed, not a Pi, old firmware
            raise SourceUnavailable(f"`{' '.join(self.command)}` failed: {exc}") from None
        if not rails:
            raise SourceUnavailable(f"`{' '.join(self.command)}` printed no paired current/volt rails (not a Pi 5?)")

    def read(self, now_s: float) -> dict[str, float]:
        rails = parse_pmic_read_adc(self._runner(self.command))
        if not rails:
            return {}
        out = {f"rail_{key_name(rail)}_w": round(watts, 4) for rail, watts in rails.items()}
        total = sum(rails.values())
        out["power_w"] = round(total, 4)
        out["energy_j"] = round(self._energy.add(now_s, total), 4)
        return out

    def close(self) -> None:
        pass


class BatteryPower:
    """Android battery: current_now (uA) x voltage_now (uV) x the profile's sign. Reads
    power_supply/battery, else the first supply whose type is Battery."""

    name = "battery"

    def __init__(self, root: str | Path = "/", current_sign: int = 1):
        supplies = under(root, "/sys/class/power_supply")
        batteries = [p for p in sorted(supplies.glob("*")) if read_text(p / "type") == "Battery"]
        base = supplies / "battery" if (supplies / "battery").exists() or not batteries else batteries[0]
        self._current = PreadFile(base / "current_now", 32)
        self._voltage = PreadFile(base / "voltage_now", 32)
        if self._current.read() is None or self._voltage.read() is None:
            raise SourceUnavailable(f"no readable {base}/current_now and voltage_now")
        if current_sign not in (1, -1):
            raise ValueError(f"sensors.battery_current_sign must be 1 or -1, not {current_sign!r}")
        self.sign = current_sign
        self.status = read_text(base / "status")  # "Charging" spoils the reading: reported in the summary
        self._energy = Integrator()

    def read(self, now_s: float) -> dict[str, float]:
        ua, uv = self._current.read(), self._voltage.read()
        if not (ua and uv):
            return {}
        watts = self.sign * int(ua) * int(uv) / 1e12
        return {"power_w": round(watts, 4), "energy_j": round(self._energy.add(now_s, watts), 4)}

    def close(self) -> None:
        self._current.close()
        self._voltage.close()


class PowerEstimate:
    """`power_w_est` = idle_w + cpu utilisation x (max_w - idle_w), from a profile's power model."""

    name = "power_estimate"

    def __init__(self, power_model: dict[str, Any]):
        try:
            self.idle_w, self.max_w = float(power_model["idle_w"]), float(power_model["max_w"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"power_model needs numbers idle_w and max_w, got {power_model!r}") from None
        self._energy = Integrator()

    def estimate(self, now_s: float, cpu_sys_pct: float) -> dict[str, float]:
        watts = self.idle_w + min(max(cpu_sys_pct / 100.0, 0.0), 1.0) * (self.max_w - self.idle_w)
        return {"power_w_est": round(watts, 4), "energy_j_est": round(self._energy.add(now_s, watts), 4)}


def power_settings(sensors: dict[str, Any] | None) -> dict[str, Any]:
    """The profile's `sensors.power` block with defaults; `{}` (no profile) means auto-detect.

    Also takes a flat `battery_current_sign` at the top level of `sensors`.
    """
    sensors = sensors or {}
    power = dict(sensors.get("power") or {})
    power.setdefault("source", "auto")
    power.setdefault("battery_current_sign", sensors.get("battery_current_sign", 1))
    rails = [r for r in power.get("rails") or [] if r != "*"]
    power["rails"] = rails or None
    return power


def measured_power_source(root: str | Path, runner: Runner,
                          sensors: dict[str, Any] | None) -> tuple[Any, dict[str, str]]:
    """The first measured power source this device has (or the one the profile names), and
    why each one tried before it is unavailable."""
    power = power_settings(sensors)
    wanted = power["source"]
    makers = {
        "ina3221": lambda: jetson_power(root, power["rails"], power.get("total_rail")),
        "rapl": lambda: RaplPower(root),
        "pmic": lambda: PiPmicPower(runner),
        "battery": lambda: BatteryPower(root, int(power["battery_current_sign"])),
    }
    if wanted not in ("auto", "none", *makers):
        raise ValueError(f"sensors.power.source is {wanted!r}; use auto, none or one of {sorted(makers)}")
    if wanted == "none":
        return None, {"power": "the profile says this device has no power monitor (sensors.power.source: none)"}
    reasons: dict[str, str] = {}
    for name, make in makers.items():
        if wanted in ("auto", name):
            try:
                return make(), reasons
            except SourceUnavailable as exc:
                reasons[name] = str(exc)
    return None, reasons
