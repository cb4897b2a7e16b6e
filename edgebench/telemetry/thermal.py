"""Temperatures (thermal zones, hwmon sensors) and the Raspberry Pi's throttling flags, raw.

Keys: `thermal_zone<N>_mc` per thermal zone and `hwmon<N>_temp<k>_mc` per hwmon sensor, in
m°C as read; `names()` gives each one's zone type or chip and label as read, for meta.json's
readings (the host names the figures: edgebench.figures.thermal). `throttle_flags` is the raw
get_throttled word. A zone whose read fails is skipped: JetPack 6 fails powered-off zones
with EAGAIN, other drivers with EINVAL/ENODATA.
Zone names differ between releases (AGX Orin: `CPU-therm` on JetPack 5, `cpu-thermal` on
JetPack 6), so a profile's zones are case-insensitive names or patterns (`cpu-therm*`).
"""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

from edgebench.telemetry.sysfs import (
    PreadFile,
    ProfileMismatch,
    Runner,
    SourceUnavailable,
    hwmon_dirs,
    key_name,
    read_text,
    under,
)

OFFLINE_MILLI_C = -256000
ZONE_DIRS = ("/sys/class/thermal", "/sys/devices/virtual/thermal")

THROTTLE_BITS = {
    0: "under_voltage", 1: "freq_capped", 2: "throttled", 3: "soft_temp_limit",
}
SINCE_BOOT_SHIFT = 16


def decode_throttled(value: int) -> dict[str, list[str]]:
    """`vcgencmd get_throttled` word -> names active now (bits 0-3) and since boot (16-19)."""
    return {
        "now": [name for bit, name in THROTTLE_BITS.items() if value >> bit & 1],
        "since_boot": [name for bit, name in THROTTLE_BITS.items() if value >> (bit + SINCE_BOOT_SHIFT) & 1],
    }


class _TempFiles:
    """Reads a list of (key, m°C file), leaving out unreadable ones."""

    _files: list[tuple[str, PreadFile]]
    _names: dict[str, str]

    def read(self, now_s: float) -> dict[str, int]:
        out = {}
        for key, fh in self._files:
            text = fh.read()
            if text and text.lstrip("-").isdigit():
                out[key] = int(text)
        return out

    def names(self) -> dict[str, str]:
        """{raw key: the zone type or chip/label as read}: meta.json readings.temperatures."""
        return dict(self._names)

    def _online(self) -> bool:
        return any(v > OFFLINE_MILLI_C for v in self.read(0.0).values())

    def close(self) -> None:
        for _, fh in self._files:
            fh.close()


def zone_matches(zone_type: str, patterns: list[str]) -> bool:
    """A zone type against profile entries: names or shell patterns, case-insensitive."""
    return any(fnmatch.fnmatchcase(zone_type.lower(), p.lower()) for p in patterns)


class ThermalZones(_TempFiles):
    """Every thermal_zone*/temp (m°C) with its `type` as the name; `zones` (names or patterns)
    limits them, and a list matching none of the board's zones is a profile error naming them."""

    name = "thermal_zones"

    def __init__(self, root: str | Path = "/", zones: list[str] | None = None):
        found: list[Path] = []
        for directory in ZONE_DIRS:
            found = sorted(under(root, directory).glob("thermal_zone[0-9]*"), key=lambda p: int(p.name[12:]))
            if found:
                break
        types = [(read_text(p / "type") or p.name) for p in found]
        picked = [(t, p) for t, p in zip(types, found) if not zones or zone_matches(t, zones)]
        if zones and types and not picked:
            raise ProfileMismatch(f"sensors.thermal_zones {zones} match none of the thermal zones this board "
                                  f"reports: {types}; list some of these (names or patterns like 'cpu*')")
        self.chip_names = {key_name(t) for t in types}  # how thermal_hwmon names these zones' chips
        self._files = [(f"{p.name}_mc", PreadFile(p / "temp", 32)) for _, p in picked]
        self._names = {f"{p.name}_mc": t for t, p in picked}
        if not self._online():
            raise SourceUnavailable(f"no readable, online thermal zone under {under(root, ZONE_DIRS[0])} (tried "
                                    f"{[t for t, _ in picked]})")


class HwmonTemps(_TempFiles):
    """hwmon temp*_input (m°C), keyed `hwmon<N>_temp<k>_mc` and named `<chip> <label or tempN>`. Chips that mirror a
    thermal zone (the kernel's thermal_hwmon: `cpu_thermal` for zone `cpu-thermal`) are
    left out via `skip_chips`, so a sensor is not counted twice."""

    name = "hwmon_temps"

    def __init__(self, root: str | Path = "/", skip_chips: set[str] | None = None):
        sensors = []
        for directory in hwmon_dirs(root):
            chip = key_name(read_text(directory / "name") or directory.name)
            if chip in (skip_chips or set()):
                continue
            for path in sorted(directory.glob("temp[0-9]*_input")):
                stem = path.name[: -len("_input")]
                label = read_text(directory / f"{stem}_label") or stem
                sensors.append((f"{directory.name}_{stem}_mc", f"{chip} {label}", path))
        self._files = [(key, PreadFile(path, 32)) for key, _, path in sensors]
        self._names = {key: name for key, name, _ in sensors}
        if not self._online():
            raise SourceUnavailable(f"no readable hwmon temp*_input under {root}")


class PiThrottled:
    """`throttle_flags` from `vcgencmd get_throttled` (e.g. `throttled=0x50005`)."""

    name = "pi_throttled"
    command = ("vcgencmd", "get_throttled")

    def __init__(self, runner: Runner):
        self._runner = runner
        try:
            first = self.read(0.0)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SourceUnavailable(f"`{' '.join(self.command)}` failed: {exc}") from None
        if not first:
            raise SourceUnavailable(f"`{' '.join(self.command)}` printed no throttled=0x... line")

    def read(self, now_s: float) -> dict[str, int]:
        text = self._runner(self.command).strip()
        if not text.startswith("throttled="):
            return {}
        return {"throttle_flags": int(text.partition("=")[2], 16)}

    def close(self) -> None:
        pass
