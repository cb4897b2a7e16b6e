"""Reads one run directory (meta.json, events.jsonl, result.json) and plans how DuckDB
reads its samples.jsonl.

samples.jsonl can hold millions of lines, so DuckDB parses it straight into the store
(scan_samples gives the columns); a line it cannot parse (garbage, a killed runner's
truncated last line) becomes a row of NULLs that the store counts and drops.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from edgebench.telemetry.trace import read_trace


TAIL_BYTES = 1 << 16
INTEGER_SUFFIXES = ("_bytes", "_ns", "_us", "_kills", "_flags", "_count")  # the store keeps these as BIGINT


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
    meta: dict[str, Any]
    result: dict[str, Any] | None
    steps: pa.Table
    events_counts: TraceCounts
    error_events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or (self.result or {}).get("run_id") or self.path.name)


def _read_json_file(path: Path, required: bool) -> dict[str, Any] | None:
    if not path.exists():
        if required:
            raise FileNotFoundError(f"{path}: missing; a run directory needs meta.json (written by the runner at start)")
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); re-collect the run directory") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _tail(path: Path) -> bytes:
    """What follows the last newline (a killed runner's half-written line), read from the end."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - TAIL_BYTES))
        chunk = fh.read()
    cut = chunk.rfind(b"\n")
    return chunk[cut + 1:] if cut >= 0 or size <= TAIL_BYTES else chunk


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
    key_mentions: int | None = None  # `":` in the file's whole lines: one per key, if nothing is nested

    def source(self) -> str:
        """A read_json call over the file; unreadable lines come back as rows of NULLs (counted)."""
        cols = "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in self.columns.items()) + "}"
        return (f"read_json({_literal(str(self.path))}, format='newline_delimited', columns={cols}, "
                f"ignore_errors=true)")


def _count(path: Path, needle: bytes) -> int:
    """Occurrences of a two-byte needle in a file, read in chunks."""
    total, last = 0, b""
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            total += (last + chunk[:1]).count(needle) + chunk.count(needle)
            last = chunk[-1:]
    return total


def scan_samples(con: Any, path: Path, full: bool = False) -> SampleScan | None:
    """The read plan for a samples.jsonl (None when there is none or it is empty).

    DuckDB parses the file itself, in parallel, straight into the store: several times
    faster than parsing in Python or Arrow first. Its type detection reads the first lines
    only. The quick plan reads the keys it saw (numbers as DOUBLE, or BIGINT by name as
    the store keeps them) and counts the file's `":` so the store can check afterwards that
    every key of every line arrived; `full` lists every line's keys and reads each as JSON
    (the store falls back to it when the check fails: a key first seen late, a type that
    changes, nested values).
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    tail = _tail(path).strip()
    truncated = bool(tail) and not _is_json_object(tail)
    source = f"{_literal(str(path))}, format='newline_delimited', ignore_errors=true"
    detected = {row[0]: row[1] for row in con.execute(f"DESCRIBE SELECT * FROM read_json({source})").fetchall()}
    nested = {k for k, t in detected.items() if any(n in t for n in NESTED)}
    if full:
        keys = [row[0] for row in con.execute(
            f"SELECT DISTINCT unnest(json_keys(json)) FROM read_ndjson_objects({source}) "
            "WHERE json_type(json) = 'OBJECT'").fetchall()]
        columns = {k: "JSON" for k in sorted(keys)}
        mentions = None
    else:
        keys = list(detected)
        columns = {k: "JSON" if k in nested else t if t in ("VARCHAR", "BOOLEAN") else
                   "BIGINT" if k.endswith(INTEGER_SUFFIXES) else "DOUBLE" for k, t in detected.items()}
        mentions = None if nested else _count(path, b'":') - (tail.count(b'":') if truncated else 0)
    if "t_ns" not in keys:
        raise ValueError(f"{path}: sample lines have no t_ns field (device monotonic ns); is this a samples.jsonl?")
    columns = {"t_ns": "BIGINT", **{k: v for k, v in columns.items() if k != "t_ns"}}
    return SampleScan(path, columns, truncated, nested, mentions)


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError):
        return False


def steps_from_events(events: list[dict[str, Any]]) -> pa.Table:
    """One row per step: begin/end on the device clock, duration, phase and loss.

    A step_end without its step_begin (the begin line lost) gets its begin from
    `duration_s`; a step_begin without an end (the run died in that step) keeps a null end.
    """
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for ev in events:
        kind = ev.get("event")
        if kind not in ("step_begin", "step_end") or "step" not in ev:
            continue
        key = (str(ev.get("phase", "measure")), int(ev["step"]))
        row = rows.setdefault(key, {"phase": key[0], "step": key[1], "begin_ns": None, "end_ns": None,
                                    "duration_s": None, "loss": None})
        if kind == "step_begin":
            row["begin_ns"] = int(ev["t_ns"])
        else:
            row["end_ns"] = int(ev["t_ns"])
            row["duration_s"] = ev.get("duration_s")
            loss = ev.get("loss")
            row["loss"] = float(loss) if isinstance(loss, (int, float)) else None
    ordered = sorted(rows.values(), key=lambda r: (r["begin_ns"] or r["end_ns"] or 0, r["step"]))
    for row in ordered:
        if row["end_ns"] is not None:
            if row["begin_ns"] is None and row["duration_s"] is not None:
                row["begin_ns"] = row["end_ns"] - int(float(row["duration_s"]) * 1e9)
            if row["duration_s"] is None and row["begin_ns"] is not None:
                row["duration_s"] = (row["end_ns"] - row["begin_ns"]) / 1e9
    return pa.table({
        "step": pa.array([r["step"] for r in ordered], pa.int64()),
        "phase": pa.array([r["phase"] for r in ordered], pa.string()),
        "begin_ns": pa.array([r["begin_ns"] for r in ordered], pa.int64()),
        "end_ns": pa.array([r["end_ns"] for r in ordered], pa.int64()),
        "duration_s": pa.array([None if r["duration_s"] is None else float(r["duration_s"]) for r in ordered], pa.float64()),
        "loss": pa.array([r["loss"] for r in ordered], pa.float64()),
    })


def read_run_dir(run_dir: str | Path) -> RunFiles:
    """Parses a run directory as written by `python -m edgebench.runner`."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory; pass a run directory (meta.json, samples.jsonl, events.jsonl)")
    meta = _read_json_file(path / "meta.json", required=True) or {}
    result = _read_json_file(path / "result.json", required=False)
    events = read_trace(path / "events.jsonl")
    events_counts = TraceCounts(
        lines=len(events.records) + events.bad_lines + int(events.truncated_last_line),
        bad_lines=events.bad_lines,
        truncated_last_line=events.truncated_last_line,
    )
    errors = [ev for ev in events.records if ev.get("event") in ("error", "diverged")]
    return RunFiles(path, meta, result, steps_from_events(events.records), events_counts, errors)
