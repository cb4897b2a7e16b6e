"""How a run ended, from the raw facts of its end: one mapping for every runtime.

Each runtime records the facts as it saw them (result.json `end`, one typed record for both
writers: `figures.run_end.RunEnd`, parsed where result.json is read): the worker's exit code or
the number of the signal that ended it, whether the run passed its time limit or was stopped
(and by what), the memory cgroup's oom_kill counter at start and end, the kernel's own OOM
record where it could read one, why the worker could not start, and the tail of its log. A
worker killed by a signal is `oom` only on evidence (the counter rose, or the kernel logged
the kill); otherwise it is `killed`, with the signal named, or `error` for a crash. A
SIGKILL in a host-wide OOM (`host_oom`) is `killed` too, whatever the counter says: the kernel
also counts a kill for the whole host's sake in the victim's cgroup, but the run did not reach
its own budget, so it says nothing about whether the method fits.

A command measured by `edgebench measure` has exit codes of its own (RunEnd.exit_codes):
0 is ok, any other an error naming the code; its signals and the rest map as a worker's.

The worker's exit codes are defined here; the Python worker imports them, and a test holds
the native worker (edgebench/native/worker.cpp) to them. So is the rule that ends a run
`diverged` (LossWatch); the native worker's copy (common.h) is held to its constants by a test.
"""

from __future__ import annotations

import math
import signal
from collections import deque
from collections.abc import Sequence
from typing import Any

from edgebench.figures.run_end import RunEnd
from edgebench.figures.run_events import END_KINDS, Diverged, Ended, Event

EXIT_OK, EXIT_ERROR, EXIT_DIVERGED, EXIT_OOM, EXIT_UNSUPPORTED, EXIT_INTERRUPTED, EXIT_NO_SPACE = 0, 1, 3, 4, 5, 6, 7
BY_EXIT_CODE = {EXIT_OK: "ok", EXIT_DIVERGED: "diverged", EXIT_OOM: "oom", EXIT_UNSUPPORTED: "unsupported",
                EXIT_INTERRUPTED: "interrupted"}
STATUSES = ("ok", "oom", "diverged", "unsupported", "interrupted", "timeout", "killed", "error")
NO_SPACE = "no space left on device"
# a worker that dies of these crashed (a bug, a bad program): an error, not a kill from outside
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
HOST_MEMORY_LOW_BYTES = 64 * 2**20  # MemAvailable below this: the host's RAM as a whole ran out
CLEARLY_BELOW_LIMIT = 0.9  # a cgroup whose usage stayed under this share of its limit did not reach it
# A run diverged when a loss is not finite, or when the mean of its last DIVERGED_WINDOW losses
# passes DIVERGED_FACTOR times its first (docs/figures.md: the presets that learn on tiny at their
# default lrs reach at most 3.3x, lomo's early spikes; one spike alone reaches 5.1x, hence the mean)
DIVERGED_FACTOR = 5.0
DIVERGED_WINDOW = 5


class LossWatch:
    """The divergence rule, fed each step's loss in turn (warmup steps too: they train)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.recent: deque[float] = deque(maxlen=DIVERGED_WINDOW)

    def diverged(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        if self.first is None:
            self.first = loss
        self.recent.append(loss)
        return sum(self.recent) / len(self.recent) > DIVERGED_FACTOR * self.first


def signal_name(number: Any) -> str | None:
    """SIGKILL for 9; the number as text where Linux has no such signal; None for none."""
    if not isinstance(number, int) or isinstance(number, bool):
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def loader_problem(log_tail: str) -> str | None:
    """The dynamic loader's complaint in the native worker's log (a library missing or of
    another arch), as one line with the fix; None if there is none."""
    for line in (log_tail or "").splitlines():
        if "error while loading shared libraries" in line or "cannot open shared object" in line:
            return (f"the native worker could not start: {line.strip()}; its bundle is incomplete: deploy "
                    "again (deploy ships lib/ beside the worker) or use --runtime python")
        if "Exec format error" in line or "cannot execute binary" in line:
            return (f"the native worker could not be started: {line.strip()}; it was built for another arch: "
                    "deploy again so the host builds it for this one (or use --runtime python)")
    return None


def oom_kills_during(end: RunEnd) -> int:
    start, stop = end.oom_kills_start, end.oom_kills_end
    return stop - start if start is not None and stop is not None and stop > start else 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def host_oom(end: RunEnd) -> str | None:
    """Why an OOM kill of the worker was the host's, not its budget's, or None. Only a run with a
    memory limit of its own (a cgroup's) has a budget apart from the host's RAM: on a board the
    whole RAM is its budget, and a global OOM there is the run's. The kernel's word wins
    (CONSTRAINT_NONE: it killed for the whole host; CONSTRAINT_MEMCG: for a cgroup's limit); where
    it has none, the samples tell: MemAvailable ran out while the cgroup stayed below its limit."""
    limit = end.cgroup_limit_bytes
    constraint = end.kernel_oom_constraint
    if limit is None or constraint not in (None, "CONSTRAINT_NONE"):
        return None
    if constraint == "CONSTRAINT_NONE":
        return f"the kernel killed for the whole host (CONSTRAINT_NONE), not for the run's {_mib(limit)} limit"
    low, used = end.mem_available_low_bytes, end.cgroup_usage_at_low_bytes
    if low is not None and used is not None and low < HOST_MEMORY_LOW_BYTES and used < CLEARLY_BELOW_LIMIT * limit:
        return (f"the host's MemAvailable fell to {_mib(low)} while the run's cgroup used {_mib(used)} "
                f"of its {_mib(limit)}")
    return None


def _by_signal(end: RunEnd, number: int) -> tuple[str, str]:
    name = signal_name(number) or str(number)
    host = host_oom(end) if number == signal.SIGKILL else None
    if host:
        return "killed", (f"worker killed by {name} in a host-wide OOM ({host}): the method did not exceed its "
                          "budget; other programs took the host's memory. Run it again")
    if oom_kills_during(end):
        return "oom", f"worker killed by {name} (cgroup oom_kill counter rose by {oom_kills_during(end)})"
    if end.kernel_oom:
        return "oom", f"worker killed by {name} (kernel: {end.kernel_oom})"
    if number in CRASH_SIGNALS:
        return "error", (f"the worker crashed ({name}); worker.log in the run directory has its last words; "
                         "report it with the spec (spec.json)")
    if number == signal.SIGKILL:
        return "killed", (f"worker killed by {name}, not by edgebench; no OOM record (the cgroup's oom_kill "
                          "counter did not move, the kernel log has no OOM kill of it): killed from outside")
    return "killed", f"worker killed by {name}"


def _by_exit(end: RunEnd, events: Sequence[Event]) -> tuple[str, str]:
    code = end.exit_code
    tail = " ".join((end.worker_log_tail or "").split()[-40:])
    if end.exit_codes == "command":  # a measured command's own codes: only 0 says it went well
        if code == EXIT_OK:
            return "ok", ""
        return "error", f"the command exited with code {code}" + (f": {tail}" if tail else "")
    last = next((e for e in reversed(events) if isinstance(e, END_KINDS)), None)
    if code == EXIT_NO_SPACE:
        why = last.detail or "" if isinstance(last, Ended) else ""
        return "error", f"{NO_SPACE}: the worker could not write its trace" + (f" ({why})" if why else "")
    status = BY_EXIT_CODE.get(code, "error") if code is not None else "error"
    if status == "ok":
        return "ok", ""
    if last is not None:
        if isinstance(last, Diverged):
            loss = last.loss
            if loss is not None and math.isfinite(loss):
                return status, (f"loss {loss:.4g} at step {last.step}: the mean of the last {DIVERGED_WINDOW} "
                                f"losses rose past {DIVERGED_FACTOR:g}x the first")
            return status, f"non-finite loss {loss} at step {last.step}"
        return status, last.detail or ""
    if status == "interrupted":
        return status, "stopped by a signal to the worker"
    problem = loader_problem(end.worker_log_tail or "")
    if problem:
        return status, problem
    return status, f"worker exited with code {code}" + (f": {tail}" if tail else "")


def run_status(end: RunEnd, events: Sequence[Event]) -> tuple[str, str]:
    """(status, detail) of a run from its raw end facts and its events (checked as they were read:
    figures.run_events)."""
    if end.timed_out:
        return "timeout", "the run passed its wall-clock limit (timeout_s) and was killed"
    if end.stopped_by:
        return "interrupted", f"stopped by {end.stopped_by}"
    if end.start_problem:
        return "error", end.start_problem
    failure = end.write_failure
    if failure:
        where = NO_SPACE if end.disk_full else "cannot write"
        return "error", f"{where} in the run directory: {failure}"
    number = end.exit_signal
    if number is not None:
        status, detail = _by_signal(end, number)
    elif end.exit_code is None:
        return "error", "the run has no record of how its worker ended (the supervisor was killed, or the device "\
                        "restarted); its events so far are kept"
    else:
        status, detail = _by_exit(end, events)
    if status in ("error", "killed") and end.disk_full and NO_SPACE not in detail:
        return "error", f"{NO_SPACE} in the run directory ({detail})"
    return status, detail
