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
from typing import Any, Iterator


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

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class TraceRead:
    """Records read from a trace, with counts of what could not be read."""

    records: list[dict[str, Any]] = field(default_factory=list)
    truncated_last_line: bool = False
    bad_lines: int = 0


def iter_trace(path: str | Path) -> Iterator[tuple[dict[str, Any] | None, bool]]:
    """Yields (record or None, is_last_unterminated) per line."""
    with open(path, "rb") as fh:
        data = fh.read()
    if not data:
        return  # an empty trace has no lines (not one truncated line)
    lines = data.split(b"\n")
    ends_with_newline = data.endswith(b"\n")
    if ends_with_newline:
        lines = lines[:-1]
    for i, raw in enumerate(lines):
        last_unterminated = (i == len(lines) - 1) and not ends_with_newline
        try:
            rec = json.loads(raw.decode("utf-8"))
            yield (rec if isinstance(rec, dict) else None), last_unterminated
        except (ValueError, UnicodeDecodeError):
            yield None, last_unterminated


def read_trace(path: str | Path) -> TraceRead:
    """Reads a JSONL trace; a missing file reads as empty."""
    out = TraceRead()
    if not Path(path).exists():
        return out
    for rec, last_unterminated in iter_trace(path):
        if rec is None:
            if last_unterminated:
                out.truncated_last_line = True
            else:
                out.bad_lines += 1
        else:
            out.records.append(rec)
    return out


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Writes a whole JSON file so that readers see the old or the new one, never half."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
