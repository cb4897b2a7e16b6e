"""A run's raw readings, line by line: samples.jsonl, one typed definition of a sample line for
its writers and every reader (issue 71).

Two writers write it: the Python sampler (`telemetry.sampler`) and the shell sweep
(`runner/sweep.sh`), the keys `figures.readings` names (tests/test_readings_parity.py holds
both to that table, and reads their lines back through this definition). Each line is one
JSON object of readings; `KINDS` and `PATTERNS` below say what each key holds:

- a whole number (`int`): a counter or a size, 0 to MAX_COUNT (the store's BIGINT), or of
  either sign where the device's own sign is kept (`battery_current_ua`);
- a number (`float`): finite (never NaN or infinity), within a float's range, 0 or more
  unless the key's reading may be negative (temperatures, rail currents);
- text (`str`): at most its own length (`battery_status`: 64 characters; `proc_stat_cpu`:
  MAX_TEXT_CHARS).

`t_ns` (the device's monotonic clock) is in every line; any other key may be null (a reading
that failed) or absent. A key the table does not name (a newer device's, a run from before
the table: `power_w`, `temp_c_max` are numbers, `LEGACY`) must be a plain name (`KEY`: lowercase letters, digits,
`_`, at most MAX_KEY_CHARS characters) and holds null, true or false, a finite number
(a whole one where its name ends as the store's whole columns do: `INTEGER_SUFFIXES`) or
text of at most MAX_TEXT_CHARS characters; it is kept (the store gives it a column). A
line holds at most MAX_KEYS keys; a nested object or list is never a reading.

What a bad line does is what a bad event does (`figures.run_events`): a line that is not a
JSON object (garbage, a killed writer's cut last line) or is an empty one is counted and dropped; an object with
a bad field raises `untrusted.BadRecord`, one line naming the file, the line, `sample.<key>`
and the value, and the run is refused (`edgebench ingest` stores nothing of it, exit 2). The
readers: `read_samples` (a run's own small file: figures, probe), `sample_of` one line at a
time (the live view, the supervisor), and the store, which parses big files with DuckDB and
checks every value there against the same table (`check_sql`), naming the line with
`find_bad_line` before it refuses.

Standard library only: the device side (the supervisor) imports it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgebench.figures.records import FIX, MAX_COUNT
from edgebench.telemetry.trace import parse_line, read_trace
from edgebench.untrusted import BadRecord, printable, quote

MAX_TEXT_CHARS = 4096  # /proc/stat's cpu line is ~100 characters
MAX_STATUS_CHARS = 64  # power_supply's status: "Not charging" is the longest
MAX_KEY_CHARS = 64
MAX_KEYS = 512  # a line's keys, and the distinct keys of a file the store reads (its columns)
MAX_LINE_BYTES = 16 * 2**20  # DuckDB's maximum_object_size: a longer line is not read (counted)
KEY = re.compile(rf"[a-z][a-z0-9_]{{0,{MAX_KEY_CHARS - 1}}}")
INTEGER_SUFFIXES = ("_bytes", "_ns", "_us", "_kills", "_flags", "_count")  # the store keeps these as BIGINT
BIGGEST = 1.7976931348623157e308  # a float's largest finite value

WHOLE, NUMBER, TEXT, OTHER = "whole", "number", "text", "other"


@dataclass(frozen=True)
class Kind:
    """What one key's value is: `what` (WHOLE, NUMBER, TEXT, or OTHER: a key the table does not
    name), from `low` to `high` (a number) or at most `high` characters (text)."""

    what: str
    low: float = 0
    high: float = MAX_COUNT

    def says(self) -> str:
        """The value it holds, for a message."""
        if self.what == WHOLE:
            return "a whole number " + ("0 or more" if self.low == 0 else f"from {self.low:,} to {self.high:,}")
        if self.what == NUMBER:
            return "a finite number" + (" 0 or more" if self.low == 0 else "")
        if self.what == TEXT:
            return f"text of at most {self.high:,} characters"
        return f"null, true, false, a finite number or text of at most {MAX_TEXT_CHARS:,} characters"


COUNT = Kind(WHOLE)
SIGNED = Kind(WHOLE, -MAX_COUNT - 1, MAX_COUNT)
AMOUNT = Kind(NUMBER, 0, BIGGEST)
READING = Kind(NUMBER, -BIGGEST, BIGGEST)  # a reading that may be negative
# key -> its kind (figures.readings.SAMPLE_KEYS names each; tests hold the two tables equal)
KINDS: Mapping[str, Kind] = {
    "t_ns": COUNT, "rss_bytes": COUNT, "cgroup_usage_bytes": COUNT, "cgroup_peak_bytes": COUNT,
    "cgroup_limit_bytes": COUNT, "cgroup_rss_bytes": COUNT, "cgroup_oom_kills": COUNT, "mem_available_bytes": COUNT,
    "proc_stat_cpu": Kind(TEXT, 0, MAX_TEXT_CHARS), "worker_cpu_ticks": COUNT, "cgroup_cpu_usage_ns": COUNT,
    "battery_current_ua": SIGNED, "battery_voltage_uv": COUNT, "battery_status": Kind(TEXT, 0, MAX_STATUS_CHARS),
    "uss_bytes": COUNT, "pss_bytes": COUNT, "cpu_throttled_us": COUNT, "throttle_flags": COUNT,
    "gpu_load_pct": AMOUNT,
}
# a key with a sensor's index or name in it -> its kind (figures.readings.SAMPLE_KEY_PATTERNS)
PATTERNS: Mapping[str, Kind] = {
    r"thermal_zone\d+_mc": READING, r"hwmon\d+_temp\d+_mc": READING, r"rail_[a-z0-9_]+_(mv|ma|mw)": READING,
    r"rail_[a-z0-9_]+_(v|a)": READING, r"rapl_[a-z0-9_]+_energy_uj": COUNT, r"cpu\d+_freq_mhz": AMOUNT,
    r"gpu_[a-z0-9_]+": READING,
}
# the figure columns a run recorded before devices recorded raw readings (figures.samples
# LEGACY_COLUMNS, FIGURE_COLUMNS; rails in watts under their figure's key)
LEGACY: Mapping[str, Kind] = {"power_w": READING, "power_w_est": READING, "temp_c_max": READING,
                              "cpu_sys_pct": AMOUNT, "cpu_proc_pct": AMOUNT, "cpu_cgroup_pct": AMOUNT}
LEGACY_PATTERNS: Mapping[str, Kind] = {r"rail_[a-z0-9_]+_w": READING}
_KNOWN = {**KINDS, **LEGACY}
_COMPILED = [(re.compile(p), kind) for p, kind in {**PATTERNS, **LEGACY_PATTERNS}.items()]
_CACHED = 4096  # keys whose kind is remembered (a hostile file may hold any number of names)


@functools.lru_cache(maxsize=_CACHED)
def kind_of(key: str) -> Kind | None:
    """The kind of a sample key; None for a key that is not a plain name (never a reading)."""
    if key in _KNOWN:
        return _KNOWN[key]
    for pattern, kind in _COMPILED:
        if pattern.fullmatch(key):
            return kind
    if not KEY.fullmatch(key):
        return None
    return SIGNED if key.endswith(INTEGER_SUFFIXES) else Kind(OTHER)


_CODES = {WHOLE: 0, NUMBER: 1, TEXT: 2, OTHER: 3}
_FAST: dict[str, tuple[int, float, float, Kind]] = {}  # key -> its kind as plain values, for the loop below


def _problem(record: Mapping[str, Any]) -> str | None:
    """What is wrong with one sample line (None: nothing). Comparisons refuse NaN, infinity and
    a whole number past a float's range at once; a line is checked in a few µs."""
    if len(record) > MAX_KEYS:
        return f"the sample holds {len(record):,} keys, more than the {MAX_KEYS} it may"
    if "t_ns" not in record:
        return "sample.t_ns is missing"
    fast = _FAST
    for key, value in record.items():
        spec = fast.get(key)
        if spec is None:
            kind = kind_of(key)
            if kind is None:
                return (f"sample key {quote(key)} is not a plain name (lowercase letters, digits, '_', "
                        f"at most {MAX_KEY_CHARS} characters)")
            spec = (_CODES[kind.what], kind.low, kind.high, kind)
            if len(fast) < _CACHED:
                fast[key] = spec
        code, low, high, kind = spec
        t = type(value)
        if code == 0:
            if t is int and low <= value <= high:
                continue
        elif code == 1:
            if (t is float or t is int) and low <= value <= high:
                continue
        elif code == 2:
            if t is str and len(value) <= high:
                continue
        elif (t is bool or (t is str and len(value) <= MAX_TEXT_CHARS)
              or ((t is float or t is int) and -BIGGEST <= value <= BIGGEST)):
            continue
        if value is None and key != "t_ns":  # a reading that failed
            continue
        if code == 2 and t is str:
            return f"sample.{key} holds {len(value):,} characters, more than the {int(high):,} it may " \
                   f"({quote(value, 40)})"
        return f"sample.{key} is {quote(value)}, not {kind.says()}"
    return None


def bad_sample(source: str, what: str) -> BadRecord:
    """The BadRecord of a sample line read from `source` (the file and its line)."""
    return BadRecord(f"{printable(source, newlines=False, limit=300)}: {what}; {FIX}")


def sample_of(record: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """`record` (one parsed sample line read from `source`: the file and its line) when every
    key and value is what this definition says; BadRecord naming the source and the key otherwise."""
    problem = _problem(record)
    if problem is not None:
        raise bad_sample(source, problem)
    return record


@dataclass(frozen=True)
class RunSamples:
    """A samples.jsonl's lines, checked, with what could not be read (as telemetry.trace counts it)."""

    records: list[Mapping[str, Any]] = field(default_factory=list)
    truncated_last_line: bool = False
    bad_lines: int = 0


def read_samples(path: str | Path) -> RunSamples:
    """The checked sample lines of `path`; a missing file reads as none. A bad line raises
    BadRecord naming the file and its line."""
    trace = read_trace(path)
    records: list[Mapping[str, Any]] = []
    for record, line in zip(trace.records, trace.line_numbers):
        if not record:  # `{}` holds no reading: counted, as the store's reader counts it
            continue
        problem = _problem(record)
        if problem is not None:
            raise bad_sample(f"{path} line {line}", problem)
        records.append(record)
    empty = len(trace.records) - len(records)
    return RunSamples(records, trace.truncated_last_line, trace.bad_lines + empty)


# ---- the store: DuckDB parses the file, this table checks its values ------------------------

def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _bad_sql(key: str, c: str) -> str:
    """A SQL condition, true where `c` (the JSON text DuckDB read for `key`, NULL for null) is
    not of the key's kind (null never is, but for t_ns). DuckDB writes each JSON value back as
    yyjson does: a whole number as its digits, any other number with a point or an exponent."""
    kind = kind_of(key)
    if kind is None:
        return "true"
    text = f"(left({c}, 1) <> '\"' OR (length({c}) > {{chars}} + 2 AND length(CAST({c} AS JSON) ->> '$') > {{chars}}))"
    if kind.what == WHOLE:
        bad = (f"NOT regexp_full_match({c}, '-?[0-9]+') OR TRY_CAST({c} AS BIGINT) IS NULL "
               f"OR TRY_CAST({c} AS BIGINT) < {int(kind.low)}")
    elif kind.what == NUMBER:
        bad = f"NOT coalesce(isfinite(TRY_CAST({c} AS DOUBLE)) AND TRY_CAST({c} AS DOUBLE) >= {kind.low!r}, false)"
    elif kind.what == TEXT:
        bad = text.format(chars=int(kind.high))
    else:
        bad = (f"NOT ({c} IN ('true', 'false') OR coalesce(isfinite(TRY_CAST({c} AS DOUBLE)), false) "
               f"OR NOT {text.format(chars=MAX_TEXT_CHARS)})")
    return f"({c} IS NULL OR {bad})" if key == "t_ns" else f"({c} IS NOT NULL AND ({bad}))"


def check_sql(source: str, keys: list[str]) -> str:
    """A query over `source` (a read_json of a samples.jsonl with every key in `keys` read as
    JSON) giving, for the first line found holding a value that is not of its kind, that key and
    its value (no row: every value is); lines DuckDB could not parse (every column null) are left
    out, as they are counted."""
    columns = ['CAST("' + k.replace('"', '""') + '" AS VARCHAR)' for k in keys]
    bad = [_bad_sql(k, c) for k, c in zip(keys, columns)]
    parsed = " OR ".join(f"{c} IS NOT NULL" for c in columns)
    which = " ".join(f"WHEN {b} THEN {_sql_literal(k)}" for k, b in zip(keys, bad))
    value = " ".join(f"WHEN {b} THEN {c}" for c, b in zip(columns, bad))
    return (f"SELECT CASE {which} END, CASE {value} END FROM {source} "
            f"WHERE ({' OR '.join(bad)}) AND ({parsed}) LIMIT 1")


def keys_problem(keys: list[str]) -> str | None:
    """Why the keys a file's lines hold cannot be a samples.jsonl's (None: they can)."""
    if len(keys) > MAX_KEYS:
        return f"its lines hold {len(keys):,} distinct keys, more than the {MAX_KEYS} a samples.jsonl may"
    bad = next((k for k in keys if kind_of(k) is None), None)
    if bad is not None:
        return f"sample key {quote(bad)} is not a plain name (lowercase letters, digits, '_', " \
               f"at most {MAX_KEY_CHARS} characters)"
    return None


def find_bad_line(path: Path, key: str, value: str) -> BadRecord:
    """The BadRecord of the first line of `path` that is not a sample of this definition (the
    store's check found `key` holding `value` in one), read line by line with the lines DuckDB
    skips (too long, not a JSON object) skipped too."""
    with open(path, "rb") as fh:
        for n, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES:
                while raw and not raw.endswith(b"\n"):
                    raw = fh.readline(MAX_LINE_BYTES + 1)
                continue
            record = parse_line(raw)
            if record is not None:
                try:
                    sample_of(record, f"{path} line {n}")
                except BadRecord as exc:
                    return exc
    return bad_sample(str(path), f"sample.{key} is {quote(_json_value(value))}, not {_says(key)}")


def _says(key: str) -> str:
    kind = kind_of(key)
    return "a plain name's reading" if kind is None else kind.says()


def _json_value(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return text
