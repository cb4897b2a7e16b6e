"""Reads one run directory (meta.json, samples.jsonl, events.jsonl, result.json) into Arrow.

samples.jsonl can hold millions of lines, so it is parsed by Arrow's multithreaded JSON
reader; a file Arrow refuses (a truncated last line from a killed runner, a garbage line,
a column whose type changes between blocks) is read again with the tolerant
`read_trace`, which counts what it had to skip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json

from edgebench.telemetry.trace import read_trace


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
    samples: pa.Table
    steps: pa.Table
    samples_counts: TraceCounts
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


def _columns_from_records(records: list[dict[str, Any]]) -> pa.Table:
    """Arrow table over the union of keys (from_pylist would keep only the first row's keys)."""
    keys: dict[str, None] = {}
    for rec in records:
        keys.update(dict.fromkeys(rec))
    columns = {}
    for key in keys:
        values = [rec.get(key) for rec in records]
        if any(isinstance(v, (dict, list)) for v in values):
            values = [None if v is None else json.dumps(v) for v in values]
        try:
            columns[key] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[key] = pa.array([None if v is None else str(v) for v in values], type=pa.string())
    return pa.table(columns)


def _flatten_nested(table: pa.Table) -> pa.Table:
    """Nested values (structs, lists) become JSON text so every column is a scalar."""
    for i, col_field in enumerate(table.schema):
        if pa.types.is_nested(col_field.type):
            as_text = pa.array([None if v is None else json.dumps(v) for v in table.column(i).to_pylist()], pa.string())
            table = table.set_column(i, col_field.name, as_text)
    return table


def read_samples(path: Path) -> tuple[pa.Table, TraceCounts]:
    """All sample lines of a samples.jsonl as one Arrow table.

    A truncated last line (the usual trace of a killed runner) is cut off before Arrow
    parses the rest, so only garbage in the middle of a file takes the slow path.
    """
    empty = pa.table({"t_ns": pa.array([], pa.int64())})
    if not path.exists() or path.stat().st_size == 0:
        return empty, TraceCounts()
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    tail_record = json.loads(tail) if tail.strip() and _is_json_object(tail) else None
    try:
        table = pa_json.read_json(pa.BufferReader(data[:cut])) \
            if cut else empty
        if tail_record is not None:
            table = pa.concat_tables([table, _columns_from_records([tail_record])], promote_options="permissive")
        counts = TraceCounts(lines=table.num_rows + int(bool(tail.strip()) and tail_record is None),
                             truncated_last_line=bool(tail.strip()) and tail_record is None)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        trace = read_trace(path)
        table = _columns_from_records(trace.records) if trace.records else empty
        counts = TraceCounts(
            lines=len(trace.records) + trace.bad_lines + int(trace.truncated_last_line),
            bad_lines=trace.bad_lines,
            truncated_last_line=trace.truncated_last_line,
        )
    if "t_ns" not in table.column_names:
        raise ValueError(f"{path}: sample lines have no t_ns field (device monotonic ns); is this a samples.jsonl?")
    return _flatten_nested(table), counts


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
    samples, samples_counts = read_samples(path / "samples.jsonl")
    events = read_trace(path / "events.jsonl")
    events_counts = TraceCounts(
        lines=len(events.records) + events.bad_lines + int(events.truncated_last_line),
        bad_lines=events.bad_lines,
        truncated_last_line=events.truncated_last_line,
    )
    errors = [ev for ev in events.records if ev.get("event") in ("error", "diverged")]
    return RunFiles(path, meta, result, samples, steps_from_events(events.records), samples_counts, events_counts, errors)
