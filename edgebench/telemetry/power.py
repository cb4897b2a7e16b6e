"""Power meters, read raw: each rail's values as its meter gives them, a battery's current,
voltage and status.

Measured sources (the first present wins, unless the profile's `sensors.power.source` names one;
each is one `PowerSource` descriptor in `POWER_SOURCES`, at the end of this module):
- `ina3221`: Jetson INA3221 rails in hwmon (JetPack 5+: in{k}_input mV and curr{k}_input mA) or
  NVIDIA's ina3221x IIO driver (JetPack 4: in_power{k}_input mW); the total sums the roots of
  the module's rail tree (`rails` module), so no rail is counted twice. Where the sysfs files cannot
  be read, jetson-stats' `jtop` service (if installed) gives the same rails (mW) and total,
  updated about once a second.
- `rapl`: x86 RAPL energy counters (energy_uj, wrapping at max_energy_range_uj).
- `pmic`: Raspberry Pi 5 `vcgencmd pmic_read_adc`, the paired rails' V and A
  (their sum under-reads the 5 V input).
- `battery`: Android power_supply/battery current_now (uA), voltage_now (uV) and status as read.
Rail sources record each rail under keys with the unit as read (`rail_<name>_mv`, `_ma`, `_mw`,
`_v`, `_a`; `rapl_<zone>_energy_uj`); `readings()` says which keys make each rail's watts (`raw`),
which rails sum to the device's power (`total_rails`, decided from the rail names at the start)
and what that total covers. The host makes the figures (edgebench.figures.power: rail watts,
the battery's sign, power, what it covers; edgebench.figures.estimate where no meter exists):
a device records no figure.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgebench.telemetry import battery
from edgebench.telemetry.battery import battery_dir
from edgebench.telemetry.rails import RAIL_TREES, SUM_OF_RAILS, RailTotal
from edgebench.telemetry.sysfs import (
    PreadFile,
    ProfileMismatch,
    Runner,
    SourceUnavailable,
    hwmon_dirs,
    iio_dirs,
    key_name,
    read_int,
    read_text,
    under,
    unique_names,
)


class PowerReader(Protocol):
    """A measured power source's reader, as the sampler drives it: `read(now_s)` gives a sample's
    keys, `readings()` says where they come from (meta.json `readings`)."""

    name: str

    def read(self, now_s: float) -> dict[str, Any]: ...

    def readings(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _as_read(text: str) -> int | str:
    """A counter file's value: the integer it holds, else the text itself (the host names it a gap)."""
    return int(text) if text.lstrip("-").isdigit() else text


class _Channel:
    """One INA3221 rail's files, by the unit of each (hwmon, JetPack 5+: in<k>_input mV and
    curr<k>_input mA; the ina3221x IIO driver, JetPack 4: in_power<k>_input mW), kept open."""

    def __init__(self, files: dict[str, Path]):
        self.files = {unit: PreadFile(path, 32) for unit, path in files.items()}

    def read(self) -> dict[str, int | str]:
        """{unit: value as read}; {} when a file cannot be read (a disabled channel fails with ENODATA)."""
        values: dict[str, int | str] = {}
        for unit, fh in self.files.items():
            text = fh.read()
            if not text:
                return {}
            values[unit] = _as_read(text)
        return values

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()


def ina3221_channels(root: str | Path) -> list[tuple[str, _Channel]]:
    """(label, channel) for every connected INA3221 rail, through hwmon (name `ina3221`,
    in<k>_label) or IIO (`ina3221x`, rail_name_<k>); skips `NC` rails and the sum channel."""
    channels: list[tuple[str, _Channel]] = []
    for directory in hwmon_dirs(root):
        if read_text(directory / "name") != "ina3221":
            continue
        for label_path in sorted(directory.glob("in[0-9]*_label")):
            k = label_path.name[2:-len("_label")]
            label = read_text(label_path) or ""
            files = {"mv": directory / f"in{k}_input", "ma": directory / f"curr{k}_input"}
            if label and label.upper() != "NC" and "sum" not in label.lower() \
                    and all(path.exists() for path in files.values()):
                channels.append((label, _Channel(files)))
    for directory in iio_dirs(root):
        for label_path in sorted(directory.glob("rail_name_[0-9]*")):
            k = label_path.name[len("rail_name_"):]
            label = read_text(label_path) or ""
            if label and label.upper() != "NC" and (directory / f"in_power{k}_input").exists():
                channels.append((label, _Channel({"mw": directory / f"in_power{k}_input"})))
    return channels


def _wanted(label: str, rails: list[str] | None, total_rail: str | None, rail_tree: str | None) -> bool:
    """A rail the profile lists, or one the total needs (total_rail, the tree's roots)."""
    roots = RAIL_TREES[rail_tree].roots if rail_tree in RAIL_TREES else []
    return not rails or label in rails or label == total_rail or label in roots


class _Rails:
    """Rails by label, each value recorded as `rail_<label>_<unit>`, with a RailTotal saying which
    sum to the device's power; shared by the sysfs reader and the jtop fallback."""

    name: str

    def _setup(self, units: dict[str, list[str]], total_rail: str | None, rail_tree: str | None) -> None:
        """`units`: {label: the units its values are read in}, in the order found."""
        self._names = dict(zip(units, unique_names([key_name(label) for label in units])))
        self._raw = {f"rail_{self._names[label]}_w": [f"rail_{self._names[label]}_{u}" for u in label_units]
                     for label, label_units in units.items()}
        self.total = RailTotal(set(units), total_rail, rail_tree)

    def _record(self, values: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Sample keys of {label: {unit: value as read}}; rails not set up are left out."""
        return {f"rail_{self._names[label]}_{unit}": value for label, by_unit in values.items()
                if label in self._names for unit, value in by_unit.items()}

    def readings(self) -> dict[str, Any]:
        what = self.total.describe()
        return {"source": self.name, "raw": self._raw,
                "total_rails": [f"rail_{self._names[r]}_w" for r in self.total.rails],
                "power_total": what["power_total"], "power_total_source": what["power_total_source"]}


class Ina3221Power(_Rails):
    """Jetson INA3221 rails from sysfs, hwmon (JetPack 5+) or IIO (JetPack 4). `rails` limits
    the rails recorded (the total's rails are always read); the total follows RailTotal."""

    name = "ina3221"

    def __init__(self, root: str | Path = "/", rails: list[str] | None = None, total_rail: str | None = None,
                 rail_tree: str | None = None):
        found = ina3221_channels(root)
        if not found:
            raise SourceUnavailable(f"no ina3221 rails under {root} (hwmon named 'ina3221' with in<k>_label, or the "
                                    "ina3221x IIO driver with rail_name_<k>)")
        keep = [(label, ch) for label, ch in found if _wanted(label, rails, total_rail, rail_tree)]
        for label, ch in found:
            if (label, ch) not in keep:
                ch.close()
        self._channels = keep
        self._setup({label: list(ch.files) for label, ch in keep}, total_rail, rail_tree)

    def read(self, now_s: float) -> dict[str, Any]:
        # a rail that cannot be read this time is simply absent
        return self._record({label: channel.read() for label, channel in self._channels})

    def close(self) -> None:
        for _, channel in self._channels:
            channel.close()


def jtop_rail_mw(power: dict[str, Any]) -> dict[str, Any]:
    """{rail label: mW} from jtop's `jetson.power` ({'rail': {name: {'power': mW, 'online'}},
    'tot': {...}}). jtop moves the input rail (VDD_IN, POM_5V_IN) out of 'rail' into 'tot' with
    its 'name'; it is put back here. A 'tot' without a name is jtop's own sum: left out."""
    mw = {name: rail["power"] for name, rail in (power.get("rail") or {}).items()
          if rail.get("online", True) and rail.get("power") is not None}
    total = power.get("tot") or {}
    if total.get("name") and total.get("power") is not None:
        mw[total["name"]] = total["power"]
    return mw


class JtopPower(_Rails):
    """The same INA3221 rails through jetson-stats (`jtop`), where the sysfs files cannot be
    read: each rail's power as jtop gives it (mW), the total as Ina3221Power's. Values refresh
    at the service interval (1 s by default). `client`: an object with `.power` and `.close()`
    (a started `jtop.jtop()` by default)."""

    name = "jtop"

    def __init__(self, rails: list[str] | None = None, total_rail: str | None = None, rail_tree: str | None = None,
                 client: Any = None):
        if client is None:
            try:
                from jtop import JtopException, jtop
            except ImportError:
                raise SourceUnavailable("jetson-stats (jtop) is not installed") from None
            client = jtop()
            try:
                client.start()
            except JtopException as exc:
                raise SourceUnavailable(f"jtop service not reachable: {exc} (sudo systemctl start jtop)") from None
        self._client = client
        labels = [label for label in jtop_rail_mw(client.power) if _wanted(label, rails, total_rail, rail_tree)]
        if not labels:
            client.close()
            raise SourceUnavailable("jtop reports no power rails")
        self._setup({label: ["mw"] for label in labels}, total_rail, rail_tree)

    def read(self, now_s: float) -> dict[str, Any]:
        return self._record({label: {"mw": mw} for label, mw in jtop_rail_mw(self._client.power).items()})

    def close(self) -> None:
        self._client.close()


def jetson_power(root: str | Path, rails: list[str] | None, total_rail: str | None,
                 rail_tree: str | None = None) -> Ina3221Power | JtopPower:
    """INA3221 from sysfs, else through jtop; the error names both attempts."""
    try:
        return Ina3221Power(root, rails, total_rail, rail_tree)
    except SourceUnavailable as sysfs:
        try:
            return JtopPower(rails, total_rail, rail_tree)
        except SourceUnavailable as jtop:
            raise SourceUnavailable(f"{sysfs}; {jtop}") from None


class RaplPower:
    """x86 RAPL zones, each as a rail: its energy counter as read (`rapl_<zone>_energy_uj`), and
    where it wraps (max_energy_range_uj) once in the readings; the host makes watts from
    successive reads. The device's power is the sum of the package zones."""

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
            self._zones.append((name, name.startswith("package") and top_level, fh,
                                read_int(zone / "max_energy_range_uj")))

    def read(self, now_s: float) -> dict[str, int | str]:
        return {f"rapl_{name}_energy_uj": _as_read(text) for name, _, fh, _ in self._zones if (text := fh.read())}

    def readings(self) -> dict[str, Any]:
        return {"source": self.name, "raw": {f"rail_{name}_w": [f"rapl_{name}_energy_uj"] for name, *_ in self._zones},
                "max_energy_range_uj": {f"rapl_{name}_energy_uj": top for name, _, _, top in self._zones},
                "total_rails": [f"rail_{name}_w" for name, package, _, _ in self._zones if package],
                "power_total": "sum of package zones", "power_total_source": "RAPL package zones (CPU package only)"}

    def close(self) -> None:
        for _, _, fh, _ in self._zones:
            fh.close()


PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=([-\d.eE+]+)[AV]\s*$")


def parse_pmic_read_adc(text: str) -> dict[str, dict[str, float]]:
    """Rail name -> {"v": volts, "a": amps} as `vcgencmd pmic_read_adc` prints them; rails
    without both a current and a voltage line (e.g. EXT5V_V) are left out."""
    read: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = PMIC_LINE.match(line)
        if match:
            read.setdefault(match.group(1), {})[match.group(2).lower()] = float(match.group(3))
    return {rail: values for rail, values in read.items() if len(values) == 2}


class PiPmicPower:
    """Raspberry Pi 5 PMIC rails through `vcgencmd pmic_read_adc` (via the command runner):
    each paired rail's volts and amps as printed (`rail_<name>_v`, `rail_<name>_a`)."""

    name = "pmic"
    command = ("vcgencmd", "pmic_read_adc")

    def __init__(self, runner: Runner):
        self._runner = runner
        try:
            rails = parse_pmic_read_adc(runner(self.command))
        except (OSError, subprocess.SubprocessError) as exc:  # not installed, not a Pi, old firmware
            raise SourceUnavailable(f"`{' '.join(self.command)}` failed: {exc}") from None
        if not rails:
            raise SourceUnavailable(f"`{' '.join(self.command)}` printed no paired current/volt rails (not a Pi 5?)")
        self._names = [key_name(rail) for rail in rails]

    def read(self, now_s: float) -> dict[str, float]:
        rails = parse_pmic_read_adc(self._runner(self.command))
        return {f"rail_{key_name(rail)}_{unit}": value for rail, values in rails.items()
                for unit, value in values.items()}

    def readings(self) -> dict[str, Any]:
        return {"source": self.name,
                "raw": {f"rail_{name}_w": [f"rail_{name}_v", f"rail_{name}_a"] for name in self._names},
                "total_rails": [f"rail_{name}_w" for name in self._names], "power_total": SUM_OF_RAILS,
                "power_total_source": "V x I over the PMIC's paired rails; under-reads the 5 V input (EXT5V_V has no "
                                      "current)"}

    def close(self) -> None:
        pass


class BatteryPower:
    """Android battery: current_now (uA, the vendor's sign), voltage_now (uV) and status as read,
    from power_supply/battery, else the first supply whose type is Battery. Which sign means
    discharging, and whether the phone was on external power, the host decides
    (edgebench.figures.power) from these and `readings()`: the supplies seen at the start and a
    calibration stored on the device."""

    name = "battery"

    def __init__(self, root: str | Path = "/", current_sign: int | str = "auto", state_path: str | Path | None = None):
        if current_sign not in (1, -1, "auto"):
            raise ProfileMismatch(f"sensors.power.battery_current_sign must be 1, -1 or auto, not {current_sign!r}; "
                                  "fix it in the device profile")
        self._root = root
        self._dir = battery_dir(root)
        self._current = PreadFile(self._dir / "current_now", 32)
        self._voltage = PreadFile(self._dir / "voltage_now", 32)
        self._status = PreadFile(self._dir / "status", 64)
        if not self._current.read() or self._voltage.read() is None:
            raise SourceUnavailable(f"no readable {self._dir}/current_now and voltage_now")
        self._calibration = battery.stored_calibration(state_path)

    def read(self, now_s: float) -> dict[str, Any]:
        ua, uv, status = self._current.read(), self._voltage.read(), self._status.read()
        out: dict[str, Any] = {"battery_status": status} if status else {}
        if ua and uv and ua.lstrip("-").isdigit() and uv.lstrip("-").isdigit():
            out.update(battery_current_ua=int(ua), battery_voltage_uv=int(uv))
        return out

    def readings(self) -> dict[str, Any]:
        return {"path": str(self._dir), "supplies": battery.supplies(self._root), "calibration": self._calibration}

    def close(self) -> None:
        self._current.close()
        self._voltage.close()
        self._status.close()


def power_settings(sensors: dict[str, Any] | None) -> dict[str, Any]:
    """The profile's `sensors.power` block with defaults; `{}` (no profile) means auto-detect.

    Also takes a flat `battery_current_sign` at the top level of `sensors`.
    """
    sensors = sensors or {}
    power = dict(sensors.get("power") or {})
    power.setdefault("source", "auto")
    power.setdefault("battery_current_sign", sensors.get("battery_current_sign", "auto"))
    rails = [r for r in power.get("rails") or [] if r != "*"]
    power["rails"] = rails or None
    return power


def measured_power_source(root: str | Path, runner: Runner,
                          sensors: dict[str, Any] | None) -> tuple[PowerReader | None, dict[str, str]]:
    """The first measured power source this device has (or the one the profile names), and
    why each one tried before it is unavailable."""
    power = power_settings(sensors)
    wanted = power["source"]
    if wanted not in ("auto", "none", *POWER_SOURCES):
        raise ProfileMismatch(f"sensors.power.source is {wanted!r}; use auto, none or one of {sorted(POWER_SOURCES)} "
                              "in the device profile")
    if wanted == "none":
        return None, {"power": "the profile says this device has no power monitor (sensors.power.source: none)"}
    reasons: dict[str, str] = {}
    for name, source in POWER_SOURCES.items():
        if wanted in ("auto", name):
            try:
                return source.make(root, runner, power), reasons
            except SourceUnavailable as exc:
                reasons[name] = str(exc)
    return None, reasons


# --- the power sources: one descriptor each --------------------------------------------------


@dataclass(frozen=True)
class PowerSource:
    """A measured power source a profile can name (`sensors.power.source`), with everything
    edgebench derives from it: the reader, the sampling intervals, the board probe's lines and
    the readiness check. Adding a source = one descriptor here + its reader class above.

    make(root, runner, power): the reader (a PowerReader: `.name`, `.read(now_s)`, `.readings()`, `.close()`);
      raises SourceUnavailable when the board has none. `power`: power_settings' block.
    intervals_s: seconds between reads (telemetry.sampler.INTERVALS_S), by the name of each reader
      `make` can return (ina3221 falls back to its jtop reader, which refreshes once a second).
    probe: POSIX shell lines of the board probe (devices.detect.PROBE: `$R` is the board's root,
      `kv KEY VALUE` prints a fact), each fact under the source's name; no Python needed.
    ready(found, power): what the probe's values for it (`found`, in order) say, against the
      profile's power block: (status "ok" | "warn", detail, whether `fix` applies).
    fix: the devices.readiness.FIXES piece that makes it readable (None: no command does).
    """

    name: str
    make: Callable[[str | Path, Runner, dict[str, Any]], PowerReader]
    intervals_s: dict[str, float]
    probe: str
    ready: Callable[[list[str], dict[str, Any]], tuple[str, str, bool]]
    fix: str | None = None


def _pairs(found: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for a, _, b in (value.partition("\t") for value in found)]


def _ina3221_ready(found: list[str], power: dict[str, Any]) -> tuple[str, str, bool]:
    readable = sorted({label for label, value in _pairs(found) if value.strip() and label not in ("NC",)
                       and "sum of shunt" not in label})
    lost = [r for r in power.get("rails") or [] if r != "*" and r not in readable]
    if readable and not lost:
        return "ok", f"INA3221 rails {', '.join(readable)}", False
    if readable:
        return "warn", (f"rails {', '.join(lost)} not found (found {', '.join(readable)}); fix `sensors.power.rails` "
                        "in a copy of the profile"), False
    return "warn", ("no readable INA3221 rail under /sys/bus/i2c/devices/*/hwmon: power falls back to jtop, else "
                    "estimates"), True


def _pmic_ready(found: list[str], power: dict[str, Any]) -> tuple[str, str, bool]:
    rails = int(found[0]) if found and found[0].strip().isdigit() else 0
    if rails:
        return "ok", f"vcgencmd pmic_read_adc: {rails} rails", False
    return "warn", "vcgencmd pmic_read_adc does not answer: power is estimated", True


def _battery_ready(found: list[str], power: dict[str, Any]) -> tuple[str, str, bool]:
    current, voltage = (_pairs(found) or [("", "")])[0]
    if current.strip() and voltage.strip():
        return "ok", "battery current_now and voltage_now readable", False
    return "warn", ("/sys/class/power_supply/battery/current_now not readable (SELinux on some phones): power is "
                    "estimated"), True


def _rapl_ready(found: list[str], power: dict[str, Any]) -> tuple[str, str, bool]:
    zones = _pairs(found)
    if any(value.strip() for _, value in zones):
        return "ok", f"RAPL {', '.join(name for name, _ in zones)}", False
    if not zones:  # nothing to make readable: no chmod applies
        return "warn", "no RAPL zones under /sys/class/powercap (no powercap driver here): power is estimated", False
    return "warn", "RAPL energy counters not readable: power is estimated", True


POWER_SOURCES: dict[str, PowerSource] = {
    s.name: s
    for s in (
        PowerSource(
            "ina3221",
            make=lambda root, runner, power: jetson_power(
                root, power["rails"], power.get("total_rail"), power.get("rail_tree")
            ),
            intervals_s={"ina3221": 0.1, "jtop": 0.5},  # INA3221 reads go over I2C
            probe=r"""for h in "$R"/sys/bus/i2c/devices/*/hwmon/hwmon* "$R"/sys/class/hwmon/hwmon*; do
  [ "$(cat "$h/name" 2>/dev/null)" = ina3221 ] || continue
  for l in "$h"/in*_label; do
    [ -r "$l" ] && kv ina3221 "$(cat "$l")	$(cat "${l%_label}_input" 2>/dev/null)"
  done
done
""",
            ready=_ina3221_ready,
            fix="jtop",
        ),
        PowerSource(
            "rapl",
            make=lambda root, runner, power: RaplPower(root),
            intervals_s={"rapl": 0.1},
            probe=r"""for z in "$R"/sys/class/powercap/intel-rapl:*; do
  [ -e "$z/energy_uj" ] && kv rapl "$(cat "$z/name" 2>/dev/null)	$(cat "$z/energy_uj" 2>/dev/null)"
done
""",
            ready=_rapl_ready,
            fix="rapl",
        ),
        PowerSource(
            "pmic",
            make=lambda root, runner, power: PiPmicPower(runner),
            intervals_s={"pmic": 0.5},  # vcgencmd is a process spawn
            probe=r"""command -v vcgencmd >/dev/null 2>&1 \
    && kv pmic "$(vcgencmd pmic_read_adc 2>/dev/null | grep -c current)"
""",
            ready=_pmic_ready,
            fix="vcgencmd",
        ),
        PowerSource(
            "battery",
            make=lambda root, runner, power: BatteryPower(root, power["battery_current_sign"]),
            intervals_s={"battery": 0.1},
            probe=r"""b="$R/sys/class/power_supply/battery"
[ -e "$b" ] && kv battery "$(cat "$b/current_now" 2>/dev/null)	$(cat "$b/voltage_now" 2>/dev/null)"
""",
            ready=_battery_ready,
        ),
    )
}


def reader_intervals() -> dict[str, float]:
    """Seconds between reads of every reader a power source can return (sampler.INTERVALS_S)."""
    return {reader: s for source in POWER_SOURCES.values() for reader, s in source.intervals_s.items()}
