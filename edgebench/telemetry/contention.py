"""Raw snapshots for the noise guard (edgebench.figures.cpu): how much CPU the machine and the
run had, read before the worker starts and after it is reaped. The host compares two of them.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

from edgebench.telemetry.sysfs import under


def cpu_snapshot(root: str | Path = "/") -> dict[str, Any]:
    """The device's monotonic clock, /proc/stat's `cpu` line fields and how many cores it
    counts, /proc/loadavg as read, and this process's and its reaped children's CPU seconds."""
    snap: dict[str, Any] = {"t_ns": time.monotonic_ns()}
    try:
        lines = under(root, "/proc/stat").read_text().splitlines()
        snap["proc_stat_cpu"] = " ".join(lines[0].split()[1:]) if lines and lines[0].startswith("cpu ") else None
        snap["stat_cores"] = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit()) or None
    except OSError:
        pass
    try:
        snap["loadavg"] = under(root, "/proc/loadavg").read_text().strip()
    except OSError:
        pass
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    snap["run_cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return snap
