"""Reads one run directory (meta.json, events.jsonl, result.json) and plans how DuckDB
reads its samples.jsonl.

samples.jsonl can hold millions of lines, so DuckDB parses it straight into the store
(scan_samples gives the columns); it reads events.jsonl's step rows too (read_steps). A line
it cannot parse (garbage, a killed runner's truncated last line) is counted and dropped; every
value of a line it parses is checked against the one definition of a sample line
(`figures.run_samples`) by the store (`Store._check_samples`) before the run's rows are kept.

events.jsonl is read checked first (`read_run_dir`: figures.run_events, the one definition of
its events), so a run whose trace holds a bad event is refused before DuckDB reads a row of it;
the step rows DuckDB makes of the same lines keep only steps, clocks and durations within that
definition's ranges (a whole step and clock 0 or more, a finite duration 0 or more) besides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from edgebench.errors import EdgebenchError
from edgebench.figures.run import HOST_EVALS
from edgebench.figures.run_end import RunEnd, result_end
from edgebench.figures.run_events import Diverged, Ended, RunEvents, read_events
from edgebench.figures.run_meta import RunMeta
from edgebench.figures.run_samples import INTEGER_SUFFIXES
from edgebench.untrusted import UnsafeName, regular_file

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

TAIL_BYTES = 1 << 16
DETECT_LINES = 4096  # DuckDB's type detection reads this many lines (its default, 20480, costs 3x)


# The most a run directory's file may hold (untrusted.regular_file): a day's samples at 20 Hz
# are ~1 GB; a run's events and JSON files far less.
RUN_FILE_CAPS = {"meta.json": 64 * 2**20, "result.json": 64 * 2**20, "events.jsonl": 4 * 2**30,
                 "samples.jsonl": 64 * 2**30, HOST_EVALS: 64 * 2**20}


class RunFileError(EdgebenchError, ValueError):
    """A run directory's file that is not what edgebench wrote (damaged JSON, no t_ns); the message says the fix."""


@dataclass
class TraceCounts:
    """What a reader had to skip in one trace file."""

    lines: int = 0
    bad_lines: int = 0
    truncated_last_line: bool = False


@dataclass
class RunFiles:
    """The parsed contents of a run directory."""

    path: Path
    meta: RunMeta  # meta.json, checked as it was read
    result: dict[str, Any] | None
    steps: pa.Table | None = None  # from events.jsonl: read_steps
    events_counts: TraceCounts = field(default_factory=TraceCounts)
    events: RunEvents = field(default_factory=RunEvents)  # events.jsonl, checked as it was read
    end: RunEnd | None = None  # result.json's end record, checked as it was read (None: it has none)

    @property
    def error_events(self) -> list[Ended | Diverged]:
        """The trace's error and diverged events, in its order."""
        return [e for e in self.events.events
                if isinstance(e, Diverged) or (isinstance(e, Ended) and e.event == "error")]

    @property
    def run_id(self) -> str:
        return str(self.meta.run_id or (self.result or {}).get("run_id") or self.path.name)


def _read_json_file(path: Path, required: bool) -> dict[str, Any] | None:
    if not path.exists():
        if required:
            raise FileNotFoundError(
                f"{path}: missing; a run directory needs meta.json (written by the runner at start)"
            )
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunFileError(f"{path}: not valid JSON ({exc}); re-collect the run directory") from exc
    except RecursionError:  # [[[[... thousands deep: no file edgebench writes
        raise RunFileError(f"{path}: nested too deep to be a file edgebench writes; re-collect the run directory") \
            from None
    if not isinstance(data, dict):
        raise RunFileError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _ends(path: Path) -> tuple[bytes, bytes]:
    """(the last whole line, what follows it), read from the end of the file; what follows
    the last newline is a killed writer's half-written line, or empty."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - TAIL_BYTES))
        chunk = fh.read()
    cut = chunk.rfind(b"\n")
    if cut < 0:  # no newline in reach: all of it is the unterminated line (or its end)
        return b"", chunk
    whole = [line for line in chunk[:cut].split(b"\n")[1 if size > TAIL_BYTES else 0:] if line.strip()]
    return (whole[-1] if whole else b""), chunk[cut + 1:]


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


NESTED = ("STRUCT", "MAP", "[]", "UNION", "JSON")


@dataclass
class SampleScan:
    """How DuckDB reads one samples.jsonl: the keys with the type to read each as (JSON for
    nested values and, in a full scan, for every key but t_ns)."""

    path: Path
    columns: dict[str, str]
    truncated_last_line: bool
    nested: set[str]  # keys whose values are objects or lists (stored as JSON text)
    checkable: bool = False  # a quick plan without nested values: key_mentions() can check it
    tail_colons: int = 0  # `:` in a truncated last line (not read, so not expected)

    def key_mentions(self) -> int:
        """`:` in the file's whole lines: one per key/value pair, more only where a text value holds one."""
        return _colons(self.path) - self.tail_colons

    def source(self, as_json: bool = False) -> str:
        """A read_json call over the file (every key as JSON: `as_json`); unreadable lines come back
        as rows of NULLs (counted)."""
        types = {k: "JSON" if as_json else v for k, v in self.columns.items()}
        cols = "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in types.items()) + "}"
        return (f"read_json({_literal(str(self.path))}, format='newline_delimited', columns={cols}, "
                f"ignore_errors=true)")


def _colons(path: Path) -> int:
    """How many `:` the file holds: numpy over a memory map, in chunks that stay in the CPU's
    cache (no copy of the file; half the CPU of 64 MiB chunks)."""
    import mmap

    import numpy as np

    total, chunk = 0, 1 << 20
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for start in range(0, len(mapped), chunk):
            view = np.frombuffer(mapped, np.uint8, min(chunk, len(mapped) - start), start)
            total += int(np.count_nonzero(view == 58))
            del view  # the map cannot close while a view holds it
    return total


def scan_samples(con: DuckDBPyConnection, path: Path, full: bool = False) -> SampleScan | None:
    """The read plan for a samples.jsonl (None when there is none or it is empty).

    DuckDB parses the file itself straight into the store: several times faster than
    parsing in Python or Arrow first. Its type detection reads the first lines only; the
    keys of the last whole line (the sampler's final line has every source) are added.
    The quick plan reads those keys (numbers as DOUBLE, or BIGINT by name as the store
    keeps them); the store then checks that every key of every line arrived (the file's
    `:` count against the values stored). `full` lists every line's keys and reads each
    as JSON (the store falls back to it when the check fails: a key seen only mid-file, a
    type that changes, nested values).
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    last, tail = _ends(path)
    tail = tail.strip()
    truncated = bool(tail) and not _is_json_object(tail)
    source = f"{_literal(str(path))}, format='newline_delimited', ignore_errors=true"
    detected = {row[0]: row[1] for row in con.execute(
        f"DESCRIBE SELECT * FROM read_json({source}, sample_size={DETECT_LINES})").fetchall()}
    detected |= {k: t for k, t in _json_types(last).items() if k not in detected}
    nested = {k for k, t in detected.items() if any(n in t for n in NESTED)}
    if full:
        keys = [row[0] for row in con.execute(
            f"SELECT DISTINCT unnest(json_keys(json)) FROM read_ndjson_objects({source}) "
            "WHERE json_type(json) = 'OBJECT'").fetchall()]
        columns = {k: "JSON" for k in sorted(keys)}
    else:
        keys = list(detected)
        columns = {k: "JSON" if k in nested else t if t in ("VARCHAR", "BOOLEAN") else
                   "BIGINT" if k.endswith(INTEGER_SUFFIXES) else "DOUBLE" for k, t in detected.items()}
    if "t_ns" not in keys:
        raise RunFileError(f"{path}: sample lines have no t_ns field (device monotonic ns); is this a samples.jsonl?")
    columns = {"t_ns": "BIGINT", **{k: v for k, v in columns.items() if k != "t_ns"}}
    return SampleScan(path, columns, truncated, nested, checkable=not full and not nested,
                      tail_colons=tail.count(b":") if truncated else 0)


def _json_types(line: bytes) -> dict[str, str]:
    """The keys of one sample line with DuckDB's name for each value's type (the sampler's
    last line carries every source, so keys that first appear late are planned too)."""
    try:
        record = json.loads(line) if line else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    kinds = ((bool, "BOOLEAN"), (int, "BIGINT"), (float, "DOUBLE"), (str, "VARCHAR"), ((dict, list), "JSON"))
    return {k: next(t for kind, t in kinds if isinstance(v, kind)) for k, v in record.items()
            if v is not None and isinstance(v, (bool, int, float, str, dict, list))} if isinstance(record, dict) else {}


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError):
        return False


EVENT_FIELDS = ("t_ns", "event", "step", "phase", "loss", "duration_s")


def _events_sql(path: Path) -> str:
    """Each line of events.jsonl as one row: `obj` true for a JSON object (else the line is
    garbage or not an object) and its fields, each parsed once (a loss must be a number, a
    duration a finite one 0 or more: figures.run_events's ranges; read_run_dir checked each
    event against that definition before)."""
    paths = ", ".join(f"'$.{k}'" for k in EVENT_FIELDS)
    return f"""
        SELECT coalesce(json_type(json) = 'OBJECT', false) AS obj,
               TRY_CAST(f[1] ->> '$' AS BIGINT) AS t_ns, f[2] ->> '$' AS event,
               TRY_CAST(f[3] ->> '$' AS BIGINT) AS step, coalesce(f[4] ->> '$', 'measure') AS phase,
               CASE WHEN json_type(f[5]) IN ('DOUBLE', 'BIGINT', 'UBIGINT')
                    THEN TRY_CAST(f[5] ->> '$' AS DOUBLE) END AS loss,
               CASE WHEN isfinite(TRY_CAST(f[6] ->> '$' AS DOUBLE)) AND TRY_CAST(f[6] ->> '$' AS DOUBLE) >= 0
                    THEN TRY_CAST(f[6] ->> '$' AS DOUBLE) END AS duration_s
        FROM (SELECT json, json_extract(json, [{paths}]) AS f
              FROM read_ndjson_objects({_literal(str(path))}, ignore_errors=true))"""


STEPS_SQL = """
    WITH ev AS ({events}),
    grouped AS (
        SELECT phase, step,
               max(t_ns) FILTER (event = 'step_begin') AS begin_ns,
               max(t_ns) FILTER (event = 'step_end') AS end_ns,
               arg_max(duration_s, t_ns) FILTER (event = 'step_end') AS duration_s,
               arg_max(loss, t_ns) FILTER (event = 'step_end') AS loss
        FROM ev WHERE obj AND event IN ('step_begin', 'step_end') AND step >= 0 AND t_ns >= 0
                      AND phase IN ('warmup', 'measure')
        GROUP BY phase, step)
    SELECT step, phase,
           CASE WHEN begin_ns IS NULL AND end_ns IS NOT NULL AND duration_s IS NOT NULL
                THEN end_ns - CAST(trunc(duration_s * 1e9) AS BIGINT) ELSE begin_ns END AS begin_ns,
           end_ns,
           CASE WHEN duration_s IS NULL AND begin_ns IS NOT NULL AND end_ns IS NOT NULL
                THEN (end_ns - begin_ns) / 1e9 ELSE duration_s END AS duration_s,
           loss::DOUBLE AS loss
    FROM grouped ORDER BY coalesce(grouped.begin_ns, end_ns, 0), step"""


NO_STEPS = ("SELECT NULL::BIGINT AS step, NULL::VARCHAR AS phase, NULL::BIGINT AS begin_ns, NULL::BIGINT AS end_ns, "
            "NULL::DOUBLE AS duration_s, NULL::DOUBLE AS loss LIMIT 0")


def read_steps(con: DuckDBPyConnection, path: Path) -> tuple[pa.Table, TraceCounts]:
    """events.jsonl read by DuckDB: one row per step (begin/end on the device clock,
    duration, phase, loss) and what could not be read.

    A step_end without its step_begin (the begin line lost) gets its begin from
    `duration_s`; a step_begin without an end (the run died in that step) keeps a null end.
    """
    if not path.exists() or path.stat().st_size == 0:
        return con.sql(NO_STEPS).to_arrow_table(), TraceCounts()
    tail = _ends(path)[1].strip()
    truncated = bool(tail) and not _is_json_object(tail)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _events AS {_events_sql(path)}")  # the file parsed once
    try:
        lines, bad = con.execute("SELECT count(*), count(*) FILTER (NOT obj) FROM _events").fetchall()[0]
        steps = con.sql(STEPS_SQL.format(events="SELECT * FROM _events")).to_arrow_table()
    finally:
        con.execute("DROP TABLE _events")
    counts = TraceCounts(lines=lines, bad_lines=bad - int(truncated), truncated_last_line=truncated)
    return steps, counts


def read_run_dir(run_dir: str | Path, con: DuckDBPyConnection | None = None) -> RunFiles:
    """Reads a run directory as written by `python -m edgebench.runner`: meta.json (checked:
    figures.run_meta.RunMeta), result.json (its end record checked: figures.run_end.RunEnd),
    events.jsonl (each event checked: figures.run_events) and, given a DuckDB connection `con`,
    its step rows. A bad field raises untrusted.BadRecord naming the file and the field."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: not a directory; pass a run directory (meta.json, samples.jsonl, events.jsonl)"
        )
    for name, cap in RUN_FILE_CAPS.items():  # what ingest, its figures and the raw copy read after this
        try:
            regular_file(path, name, "run file", cap)
        except UnsafeName as exc:
            raise RunFileError(f"{exc}; not ingested") from None
    meta = RunMeta.from_json(_read_json_file(path / "meta.json", required=True), str(path / "meta.json"))
    result = _read_json_file(path / "result.json", required=False)  # raw: the store makes the figures
    end = None if result is None else result_end(result, str(path / "result.json"))
    events = read_events(path / "events.jsonl")
    if con is None:
        return RunFiles(path, meta, result, end=end, events=events)
    return RunFiles(path, meta, result, *read_steps(con, path / "events.jsonl"), end=end, events=events)
