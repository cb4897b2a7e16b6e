"""External power traces: a timestamped CSV from a host-side meter (USB meter, smart plug).

Meters log in many shapes, so the columns are mapped by options: which column is the
time and how to read it (epoch seconds/ms/us/ns, ISO 8601, or a strptime format), and
either a power column or a voltage and a current column, each with its unit. The result
is a series of (host wall-clock ns, watts) that the store merges onto aligned steps.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np

from edgebench.errors import EdgebenchError

EPOCH_UNITS_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
SCALE = {"W": 1.0, "mW": 1e-3, "uW": 1e-6, "V": 1.0, "mV": 1e-3, "uV": 1e-6, "A": 1.0, "mA": 1e-3, "uA": 1e-6}


class TraceFileError(EdgebenchError, ValueError):
    """A meter's CSV that cannot be read as mapped (a column, a unit, a value); the message says the fix."""


@dataclass
class CsvMapping:
    """How to read one meter's CSV (the options of `edgebench import-trace`).

    time_format: `s`, `ms`, `us`, `ns` (numbers since the epoch, or since `time_origin`
    when given), `iso` (ISO 8601), or a strptime format such as `%Y-%m-%d %H:%M:%S.%f`.
    Naive date-times are read in `timezone` (an IANA name, default UTC).
    offset_s: the meter's clock minus the host's clock, subtracted from every time.
    """

    time_col: str = "time"
    time_format: str = "s"
    time_origin: str | None = None
    timezone: str = "UTC"
    power_col: str | None = None
    power_unit: str = "W"
    voltage_col: str | None = None
    voltage_unit: str = "V"
    current_col: str | None = None
    current_unit: str = "A"
    offset_s: float = 0.0
    delimiter: str = ","

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _parse_datetime_ns(text: str, fmt: str, tz: ZoneInfo) -> int:
    value = datetime.fromisoformat(text) if fmt == "iso" else datetime.strptime(text, fmt)
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _number(text: str, path: Path, line: int, column: str, parse: Callable[[str], float] = float) -> float:
    """One cell as a number; else TraceFileError naming the file, line and column."""
    try:
        value = parse(text)
    except ValueError:
        raise TraceFileError(f"{path}:{line}: column {column!r} holds {text!r}, not a number; fix that line or name "
                             "the right column") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceFileError(f"{path}:{line}: column {column!r} holds {text!r}, not a finite number; fix that line")
    return value


def _time_ns(rows: list[tuple[int, dict[str, str]]], m: CsvMapping, path: Path) -> np.ndarray:
    tz = ZoneInfo(m.timezone)
    if m.time_format in EPOCH_UNITS_NS:
        origin = _parse_datetime_ns(m.time_origin, "iso", tz) if m.time_origin else 0
        scale = EPOCH_UNITS_NS[m.time_format]
        if m.time_format == "ns":
            return np.array([origin + _number(r[m.time_col].strip(), path, line, m.time_col, int) for line, r in rows],
                            dtype=np.int64)
        return np.array([origin + round(_number(r[m.time_col].strip(), path, line, m.time_col) * scale)
                         for line, r in rows], dtype=np.int64)
    times = []
    for line, r in rows:
        try:
            times.append(_parse_datetime_ns(r[m.time_col].strip(), m.time_format, tz))
        except ValueError as exc:
            raise TraceFileError(f"{path}:{line}: time column {m.time_col!r} holds {r[m.time_col].strip()!r}, which "
                                 f"does not match --time-format {m.time_format!r} ({exc})") from None
    return np.array(times, dtype=np.int64)


def _unit(unit: str, option: str) -> float:
    if unit not in SCALE:
        raise TraceFileError(f"{option} {unit!r}: unknown unit; use one of {sorted(SCALE)}")
    return SCALE[unit]


def read_power_csv(path: str | Path, mapping: CsvMapping) -> tuple[np.ndarray, np.ndarray]:
    """Returns (host wall-clock ns, power W), sorted by time; rows with blank fields are skipped."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh, delimiter=mapping.delimiter)
        header = reader.fieldnames or []
        wanted = [mapping.time_col] + (
            [mapping.power_col] if mapping.power_col else [mapping.voltage_col, mapping.current_col]
        )
        if not mapping.power_col and not (mapping.voltage_col and mapping.current_col):
            raise TraceFileError(f"{path}: say which column holds power (--power-col) or voltage and current "
                                 "(--voltage-col and --current-col)")
        missing = [c for c in wanted if c not in header]
        if missing:
            raise TraceFileError(f"{path}: no column(s) {missing}; the header has {header}")
        rows = []
        for r in reader:  # (the line the row ends on, the row)
            if all((r.get(c) or "").strip() for c in wanted):
                rows.append((reader.line_num, r))
    if not rows:
        raise TraceFileError(f"{path}: no data rows with all of {wanted} filled")
    t_ns = _time_ns(rows, mapping, path)
    t_ns = t_ns - int(round(mapping.offset_s * 1e9))

    def column(name: str, unit: str, option: str) -> np.ndarray:
        scale = _unit(unit, option)
        return np.array([_number(r[name], path, line, name) for line, r in rows]) * scale

    if mapping.power_col:
        power = column(mapping.power_col, mapping.power_unit, "--power-unit")
    else:
        assert mapping.voltage_col and mapping.current_col  # else the check above raised
        power = (column(mapping.voltage_col, mapping.voltage_unit, "--voltage-unit")
                 * column(mapping.current_col, mapping.current_unit, "--current-unit"))
    order = np.argsort(t_ns, kind="stable")
    return t_ns[order], power[order]
