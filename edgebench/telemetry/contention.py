"""How much of the CPU a run really had: the noise guard.

A step time measured while other programs compete for the cores (or the hypervisor
steals them) can be several times too long, with nothing in the figure to say so. The
supervisor takes a snapshot before the worker starts and one after it is reaped; the
difference says how much CPU the machine spent, how much of it was this run (worker +
supervisor + sampler), how much went to other processes, and how much was stolen.
A run is *disturbed* when others or steal took more than DISTURBED_SHARE of the cores'
time (docs/figures.md). The load average is recorded beside them: it lags by a minute
and counts the run's own threads, so it informs but does not decide.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

from edgebench.telemetry.sysfs import under

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DISTURBED_SHARE = 0.10  # of all cores' time, taken by other processes or steal


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_snapshot(root: str | Path = "/") -> dict[str, Any]:
    """Cumulative machine CPU time (busy and steal, seconds), this process's and its reaped
    children's CPU seconds, the 1-minute load average and a monotonic time."""
    snap: dict[str, Any] = {"t_s": time.monotonic(), "cores": _cores()}
    try:
        first = under(root, "/proc/stat").read_text().split("\n", 1)[0].split()
        values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
        snap["busy_s"] = (sum(values) - values[3] - values[4] - values[7]) / CLOCK_TICKS
        snap["steal_s"] = values[7] / CLOCK_TICKS
        snap["all_cores"] = len([line for line in under(root, "/proc/stat").read_text().splitlines()
                                 if line.startswith("cpu") and line[3:4].isdigit()]) or snap["cores"]
    except (OSError, ValueError, IndexError):
        pass
    try:
        snap["load_1m"] = float(under(root, "/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    snap["own_cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return snap


def cpu_share(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the run had between two snapshots; `disturbed` with the reason when others took too much."""
    wall = after["t_s"] - before["t_s"]
    out: dict[str, Any] = {"wall_s": round(wall, 3), "cores": after["cores"],
                           "run_cpu_s": round(after["own_cpu_s"] - before["own_cpu_s"], 3),
                           "load_1m": after.get("load_1m"), "disturbed": False, "disturbed_why": None}
    if "busy_s" not in before or "busy_s" not in after or wall <= 0:
        out["disturbed"] = None  # cannot tell: no /proc/stat
        return out
    capacity = wall * after.get("all_cores", after["cores"])
    others = max(0.0, (after["busy_s"] - before["busy_s"]) - out["run_cpu_s"])
    steal = max(0.0, after["steal_s"] - before["steal_s"])
    out.update({"others_cpu_s": round(others, 3), "steal_s": round(steal, 3),
                "others_share": round(others / capacity, 4), "steal_share": round(steal / capacity, 4)})
    why = []
    if out["others_share"] > DISTURBED_SHARE:
        why.append(f"other processes used {100 * out['others_share']:.0f}% of the CPU")
    if out["steal_share"] > DISTURBED_SHARE:
        why.append(f"the hypervisor stole {100 * out['steal_share']:.0f}% of the CPU")
    out["disturbed"], out["disturbed_why"] = bool(why), "; ".join(why) or None
    return out
