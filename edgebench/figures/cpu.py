"""CPU figures from raw counters: the device's and the worker's CPU use, and the noise guard.

The noise guard: a step time measured while other programs compete for the cores (or the
hypervisor steals them) can be several times too long, with nothing in the figure to say so.
Each runtime records a raw snapshot before the worker starts and after it ends: /proc/stat's
`cpu` line, how many cores it counts, /proc/loadavg, and the CPU time of the run (the Python
supervisor's getrusage of itself and its children as `run_cpu_s`; the shell's `times`
builtin as read). The difference says how much CPU the machine spent, how much of it was this
run, how much went to other processes and how much was stolen. A run is *disturbed* when
others or steal took more than DISTURBED_SHARE of the cores' time (docs/figures.md). The load
average lags by a minute and counts the run's own threads, so it informs but does not decide.
"""

from __future__ import annotations

import re
from typing import Any

DISTURBED_SHARE = 0.10  # of all cores' time, taken by other processes or steal
DEFAULT_CLOCK_TICKS = 100  # USER_HZ on every Linux arch edgebench targets
TIMES = re.compile(r"(\d+)m(\d+(?:\.\d*)?)s")


def stat_fields(text: Any) -> list[int] | None:
    """user nice system idle iowait irq softirq steal of a /proc/stat `cpu` line's fields (with or
    without the leading `cpu`); None when the text is not such a line."""
    if not isinstance(text, str):
        return None
    parts = text.split()
    if parts and parts[0] == "cpu":
        parts = parts[1:]
    try:
        values = [int(v) for v in parts[:8]]
    except ValueError:
        return None
    return values + [0] * (8 - len(values)) if len(values) >= 4 else None


def busy_idle_ticks(fields: list[int]) -> tuple[int, int]:
    """(all ticks, idle ticks): idle counts iowait; guest time is inside user already."""
    return sum(fields), fields[3] + fields[4]


def times_cpu_s(text: Any) -> float | None:
    """CPU seconds of a shell and its children from its `times` builtin's output (dash, busybox
    ash and mksh all print `XmY.Zs` pairs: the shell's user and system, then its children's)."""
    if not isinstance(text, str):
        return None
    found = [int(m) * 60 + float(s) for m, s in TIMES.findall(text)]
    return sum(found) if found else None


def run_cpu_s(snapshot: dict[str, Any]) -> float | None:
    """The run's CPU seconds in a snapshot, as whichever runtime recorded it."""
    value = snapshot.get("run_cpu_s")
    return float(value) if isinstance(value, (int, float)) else times_cpu_s(snapshot.get("times"))


def cpu_share(before: dict[str, Any] | None, after: dict[str, Any] | None,
              clock_ticks: int = DEFAULT_CLOCK_TICKS) -> dict[str, Any] | None:
    """What the run had between two raw snapshots; `disturbed` with the reason when others took
    too much, None (cannot tell) where /proc/stat was unreadable. None without both snapshots."""
    if not before or not after:
        return None
    wall = (int(after.get("t_ns") or 0) - int(before.get("t_ns") or 0)) / 1e9
    cores = int(after.get("stat_cores") or before.get("stat_cores") or 1)
    own_before, own_after = run_cpu_s(before), run_cpu_s(after)
    load = str(after.get("loadavg") or "").split()[:1]
    out: dict[str, Any] = {"wall_s": round(wall, 3), "cores": cores,
                           "run_cpu_s": round(own_after - own_before, 3)
                           if own_before is not None and own_after is not None else None,
                           "load_1m": float(load[0]) if load and load[0].replace(".", "", 1).isdigit() else None,
                           "disturbed": None, "disturbed_why": None}
    start, end = stat_fields(before.get("proc_stat_cpu")), stat_fields(after.get("proc_stat_cpu"))
    if start is None or end is None or wall <= 0 or out["run_cpu_s"] is None:
        return out
    capacity = wall * cores
    busy = (sum(end) - end[3] - end[4] - end[7] - (sum(start) - start[3] - start[4] - start[7])) / clock_ticks
    others = max(0.0, busy - out["run_cpu_s"])
    steal = max(0.0, (end[7] - start[7]) / clock_ticks)
    out.update({"others_cpu_s": round(others, 3), "steal_s": round(steal, 3),
                "others_share": round(others / capacity, 4), "steal_share": round(steal / capacity, 4)})
    why = []
    if out["others_share"] > DISTURBED_SHARE:
        why.append(f"other processes used {100 * out['others_share']:.0f}% of the CPU")
    if out["steal_share"] > DISTURBED_SHARE:
        why.append(f"the hypervisor stole {100 * out['steal_share']:.0f}% of the CPU")
    out["disturbed"], out["disturbed_why"] = bool(why), "; ".join(why) or None
    return out
