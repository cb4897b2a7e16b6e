"""How a run's worker ended: result.json's `end` record, one typed definition for its two
writers and every reader.

The Python supervisor (`runner/supervisor.py`) builds a `RunEnd` and writes `to_json()`; the
shell sweep (`runner/sweep.sh`, `end_json`) prints the same keys (`tests/test_host_oom.py` runs
it and holds its record to these fields). Readers parse the record once, where result.json is
read (`result_end`: ingest's `results/runfiles.read_run_dir`, `figures.run`'s run-directory
readers, the sweep, live), and use attributes after that (`figures.status.run_status` maps them
to a status). Each field below says what it holds; docs/interfaces.md points here.

`from_json` checks every field against its type: whole numbers in their range (byte counts and
counters never negative; a NaN or a float is not a whole number), true/false, text of bounded
length, one of the named choices. A bad one raises `untrusted.BadRecord`, one line naming the
file, `end.<field>` and the value. A key the record does not hold takes its default (records
written before a field existed); a key it does not know is left out.

Records written before the kernel's peak had one field still read: `worker_maxrss_bytes` (the
Python supervisor's wait4) becomes `worker_peak_bytes` with `worker_peak_from="ru_maxrss"`,
`worker_hwm_bytes` (the shell's last VmHWM) the same with `"vm_hwm"`.

The constructor checks nothing: a writer always writes its record, whatever it holds.

Standard library only: the device side (the supervisor) imports it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from edgebench.untrusted import BadRecord, printable, quote

RECORD = "end"
MAX_COUNT = 2**63 - 1  # the store's BIGINT
MAX_TEXT_CHARS = 16_384  # 4x the longest text a writer keeps (4,096 bytes of worker.log)
# How the worker's kernel peak was read: wait4's ru_maxrss of the reaped worker (the Python
# supervisor), or the last VmHWM of /proc/PID/status read while it ran (the shell sweep).
PeakFrom = Literal["ru_maxrss", "vm_hwm"]
LEGACY_PEAK_KEYS: dict[str, PeakFrom] = {"worker_maxrss_bytes": "ru_maxrss", "worker_hwm_bytes": "vm_hwm"}
FIX = "it is not what edgebench writes (a damaged or foreign file): collect the run again, or move it aside"


def _whole(low: int = 0, high: int = MAX_COUNT) -> Any:
    return field(default=None, metadata={"range": (low, high)})


@dataclass(frozen=True)
class RunEnd:
    """result.json `end`: how the worker ended, as its supervisor saw it (raw facts; the host maps
    them to a status, `figures.status.run_status`)."""

    exit_code: int | None = _whole(0, 255)  # its exit status; None: a signal ended it, or it never ran
    exit_signal: int | None = _whole(1, 127)  # the number of the signal that ended it
    timed_out: bool = False  # it passed the run's timeout_s and was killed
    stopped_by: str | None = None  # the signal the user sent ("Ctrl-C (SIGINT)", "SIGTERM")
    oom_kills_start: int | None = _whole()  # the memory cgroup's oom_kill counter as the worker started
    oom_kills_end: int | None = _whole()  # ... and as it ended
    kernel_oom: str | None = None  # the kernel's log line of its OOM kill (/dev/kmsg; null from a shell)
    kernel_oom_constraint: str | None = None  # CONSTRAINT_MEMCG (a cgroup's limit) or CONSTRAINT_NONE (the host)
    mem_available_low_bytes: int | None = _whole()  # the lowest MemAvailable its samples read
    cgroup_usage_at_low_bytes: int | None = _whole()  # the run's cgroup usage then
    cgroup_limit_bytes: int | None = _whole()  # the run's cgroup limit; None: none
    start_problem: str | None = None  # why the worker could not be started at all, with the fix
    write_failure: str | None = None  # the error that stopped the run directory's writes
    disk_full: bool = False  # the run directory's disk was full at the end
    worker_peak_bytes: int | None = _whole()  # the kernel's peak RSS of the worker process
    worker_peak_from: PeakFrom | None = None  # how worker_peak_bytes was read (PeakFrom)
    worker_log_tail: str | None = None  # the end of worker.log, kept when the worker wrote no event

    @classmethod
    def from_json(cls, data: object, source: str) -> RunEnd:
        """The record `data` read from `source` (the file, for the message), every field checked;
        BadRecord naming the file and the field otherwise."""
        where = printable(source, newlines=False, limit=300)
        if not isinstance(data, dict):
            raise BadRecord(f"{where}: {RECORD} is {quote(data)}, not a JSON object; {FIX}")
        keys = {f.name: f.name for f in dataclasses.fields(cls)}
        if "worker_peak_bytes" not in data:  # written before the peak had one field
            legacy = next((k for k in LEGACY_PEAK_KEYS if data.get(k) is not None), None)
            if legacy is not None:
                data = {**data, "worker_peak_bytes": data[legacy], "worker_peak_from": LEGACY_PEAK_KEYS[legacy]}
                keys["worker_peak_bytes"] = legacy
        values = {f.name: _checked(f, data.get(f.name, f.default), f"{where}: {RECORD}.{keys[f.name]}")
                  for f in dataclasses.fields(cls)}
        if (values["worker_peak_bytes"] is None) != (values["worker_peak_from"] is None):
            raise BadRecord(f"{where}: {RECORD}.worker_peak_bytes and worker_peak_from go together (the peak and "
                            f"how it was read), this record has one of them; {FIX}")
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The record as result.json holds it: every field, by name."""
        return dataclasses.asdict(self)


def result_end(result: dict[str, Any], source: str) -> RunEnd | None:
    """The `end` record of a result.json read from `source`, checked (RunEnd.from_json); None for
    a result without one (an attempt cut off, a run recorded before raw end facts)."""
    end = result.get(RECORD)
    return None if end is None else RunEnd.from_json(end, source)


def _kinds(name: str) -> tuple[type | tuple[str, ...], bool]:
    """A field's declared type as (int, bool, str, or a Literal's choices), and whether None is allowed."""
    hint = _HINTS[name]
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    (kind,) = [a for a in args if a is not type(None)]
    if typing.get_origin(kind) is Literal:
        return typing.get_args(kind), type(None) in args
    return kind, type(None) in args


def _checked(spec: dataclasses.Field[Any], value: object, name: str) -> Any:
    kind, nullable = _kinds(spec.name)
    if value is None and nullable:
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise BadRecord(f"{name} is {quote(value)}, not true or false; {FIX}")
    elif kind is int:
        low, high = spec.metadata.get("range", (0, MAX_COUNT))
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            bounds = "0 or more" if (low, high) == (0, MAX_COUNT) else f"from {low:,} to {high:,}"
            raise BadRecord(f"{name} is {quote(value)}, not a whole number {bounds}; {FIX}")
    elif kind is str:
        if not isinstance(value, str):
            raise BadRecord(f"{name} is {quote(value)}, not text; {FIX}")
        if len(value) > MAX_TEXT_CHARS:
            raise BadRecord(f"{name} holds {len(value):,} characters, more than the {MAX_TEXT_CHARS:,} it may "
                            f"({quote(value, 40)}); {FIX}")
    elif isinstance(kind, tuple):
        if value not in kind:
            raise BadRecord(f"{name} is {quote(value)}, not one of {', '.join(kind)}; {FIX}")
    else:  # a field of a type this module does not check: a programming error, caught by its tests
        raise TypeError(f"RunEnd.{spec.name}: no check for {kind!r}")
    return value


_HINTS = typing.get_type_hints(RunEnd)
