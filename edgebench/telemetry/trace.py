"""Append-only JSONL traces: every line flushed as written, every reader tolerant.

A killed process leaves a readable prefix; a truncated last line or a garbage line is
counted by the reader instead of failing it.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class TraceWriter:
    """Writes one JSON object per line and flushes it to the kernel at once."""

    def __init__(self, path: str | Path, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._fsync = fsync
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class TraceRead:
    """Records read from a trace, with counts of what could not be read."""

    records: list[dict[str, Any]] = field(default_factory=list)
    line_numbers: list[int] = field(default_factory=list)  # each record's line in the file, from 1
    truncated_last_line: bool = False
    bad_lines: int = 0


def parse_line(raw: bytes | str) -> dict[str, Any] | None:
    """One trace line as a record, or None when it is not a JSON object."""
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


class TraceTail:
    """Follows a growing trace: each `read()` returns the records of the lines completed
    since the last call. A line still being written waits for its newline; a file that
    shrank (replaced) is read again from the start."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self.partial = b""
        self.bad_lines = 0

    def read_lines(self) -> list[bytes]:
        """The complete, non-blank lines appended since the last call."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(size - self.offset)
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [line for line in lines if line.strip()]

    def read(self) -> list[dict[str, Any]]:
        """The new records; lines that are not JSON objects are counted in `bad_lines`."""
        records = []
        for line in self.read_lines():
            rec = parse_line(line)
            if rec is None:
                self.bad_lines += 1
            else:
                records.append(rec)
        return records


def read_trace(path: str | Path) -> TraceRead:
    """Reads a whole JSONL trace; a missing file reads as empty. Garbage lines are counted;
    an unterminated last line that does not parse is the mark of a killed writer."""
    out = TraceRead()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return out
    lines = data.split(b"\n")
    unterminated = lines.pop()  # b"" when the file ends with a newline
    for number, raw in enumerate(lines, 1):
        rec = parse_line(raw)
        if rec is None:
            out.bad_lines += 1
        else:
            out.records.append(rec)
            out.line_numbers.append(number)
    if unterminated.strip():
        rec = parse_line(unterminated)
        if rec is None:
            out.truncated_last_line = True
        else:
            out.records.append(rec)
            out.line_numbers.append(len(lines) + 1)
    return out


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Writes a whole JSON file so that readers see the old or the new one, never half."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
