"""How a run's worker ended: result.json's `end` record, one typed definition for its two
writers and every reader.

The Python supervisor (`runner/supervisor.py`) builds a `RunEnd` and writes `to_json()`; the
shell sweep (`runner/sweep.sh`, `end_json`) prints the same keys (`tests/test_host_oom.py` runs
it and holds its record to these fields). Readers parse the record once, where result.json is
read (`result_end`: ingest's `results/runfiles.read_run_dir`, `figures.run`'s run-directory
readers, the sweep, live), and use attributes after that (`figures.status.run_status` maps them
to a status). Each field below says what it holds; docs/interfaces.md points here.

`from_json` checks every field against its type with the one checker of records
(`figures.records.read_record`): whole numbers in their range (byte counts and counters never
negative; a NaN or a float is not a whole number), true/false, text of at most MAX_TEXT_CHARS
characters, one of the named choices. A bad one raises `untrusted.BadRecord`, one line naming
the file, `end.<field>` and the value. A key the record does not hold takes its default (records
written before a field existed); a key it does not know is left out. This module declares the
fields, the caps and the old keys; it adds one rule of its own: the peak and how it was read go
together.

Records written before the kernel's peak had one field still read (LEGACY_KEYS):
`worker_maxrss_bytes` (the Python supervisor's wait4) becomes `worker_peak_bytes` with
`worker_peak_from="ru_maxrss"`, `worker_hwm_bytes` (the shell's last VmHWM) the same with
`"vm_hwm"`.

The constructor checks nothing: a writer always writes its record, whatever it holds.

Standard library only: the device side (the supervisor) imports it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from edgebench.figures.records import Caps, Renamed, read_record, refused, whole

RECORD = "end"
MAX_TEXT_CHARS = 16_384  # 4x the longest text a writer keeps (4,096 bytes of worker.log)
CAPS = Caps(text_chars=MAX_TEXT_CHARS)  # it holds no JSON object
# How the worker's kernel peak was read: wait4's ru_maxrss of the reaped worker (the Python
# supervisor), or the last VmHWM of /proc/PID/status read while it ran (the shell sweep).
PeakFrom = Literal["ru_maxrss", "vm_hwm"]
# What a worker's exit code means: edgebench's worker's codes, or a measured command's own
ExitCodes = Literal["edgebench", "command"]
LEGACY_KEYS = {"worker_maxrss_bytes": Renamed("worker_peak_bytes", {"worker_peak_from": "ru_maxrss"}),
               "worker_hwm_bytes": Renamed("worker_peak_bytes", {"worker_peak_from": "vm_hwm"})}


@dataclass(frozen=True)
class RunEnd:
    """result.json `end`: how the worker ended, as its supervisor saw it (raw facts; the host maps
    them to a status, `figures.status.run_status`)."""

    exit_code: int | None = whole(0, 255)  # its exit status; None: a signal ended it, or it never ran
    exit_signal: int | None = whole(1, 127)  # the number of the signal that ended it
    timed_out: bool = False  # it passed the run's timeout_s and was killed
    stopped_by: str | None = None  # the signal the user sent ("Ctrl-C (SIGINT)", "SIGTERM")
    oom_kills_start: int | None = whole()  # the memory cgroup's oom_kill counter as the worker started
    oom_kills_end: int | None = whole()  # ... and as it ended
    kernel_oom: str | None = None  # the kernel's log line of its OOM kill (/dev/kmsg; null from a shell)
    kernel_oom_constraint: str | None = None  # CONSTRAINT_MEMCG (a cgroup's limit) or CONSTRAINT_NONE (the host)
    mem_available_low_bytes: int | None = whole()  # the lowest MemAvailable its samples read
    cgroup_usage_at_low_bytes: int | None = whole()  # the run's cgroup usage then
    cgroup_limit_bytes: int | None = whole()  # the run's cgroup limit; None: none
    start_problem: str | None = None  # why the worker could not be started at all, with the fix
    write_failure: str | None = None  # the error that stopped the run directory's writes
    disk_full: bool = False  # the run directory's disk was full at the end
    worker_peak_bytes: int | None = whole()  # the kernel's peak RSS of the worker process
    worker_peak_from: PeakFrom | None = None  # how worker_peak_bytes was read (PeakFrom)
    worker_log_tail: str | None = None  # the end of worker.log, kept when the worker wrote no event
    # whose exit codes `exit_code` follows: edgebench's worker's (figures.status EXIT_*), or a command's
    # own (`edgebench measure`: 0 ok, any other an error with its code; its log tail always kept)
    exit_codes: ExitCodes = "edgebench"

    @classmethod
    def from_json(cls, data: object, source: str) -> RunEnd:
        """The record `data` read from `source` (the file, for the message), every field checked;
        BadRecord naming the file and the field otherwise."""
        end = read_record(cls, data, source, CAPS, RECORD, LEGACY_KEYS)
        if (end.worker_peak_bytes is None) != (end.worker_peak_from is None):
            raise refused(source, f"{RECORD}.worker_peak_bytes and worker_peak_from go together (the peak and how "
                                  f"it was read), this record has one of them")
        return end

    def to_json(self) -> dict[str, Any]:
        """The record as result.json holds it: every field, by name."""
        return dataclasses.asdict(self)


def result_end(result: dict[str, Any], source: str) -> RunEnd | None:
    """The `end` record of a result.json read from `source`, checked (RunEnd.from_json); None for
    a result without one (an attempt cut off, a run recorded before raw end facts)."""
    end = result.get(RECORD)
    return None if end is None else RunEnd.from_json(end, source)

