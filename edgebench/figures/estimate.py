"""Estimated power where a device has no meter: a profile's power model (idle_w, max_w)
scaled by the device's own CPU use, never another device's or process's: its cgroup's share
of the cores its quota allows on a lab device (a CPU-limited cgroup is the device), else the
whole board's (/proc/stat). Named `_est` everywhere; it never fills a measured column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CGROUP_BASIS = "cpu_cgroup_pct"
BOARD_BASIS = "cpu_sys_pct"


def power_model(spec: dict[str, Any]) -> tuple[float, float] | None:
    """(idle_w, max_w) of the run's power model; None without a usable one."""
    model = spec.get("power_model") or {}
    try:
        idle, most = float(model["idle_w"]), float(model["max_w"])
    except (KeyError, TypeError, ValueError):
        return None
    return (idle, most) if 0 <= idle <= most else None


def estimated_watts(idle_w: float, max_w: float, cpu_pct: Any) -> np.ndarray:
    """idle + utilisation x (max - idle), utilisation the CPU use clipped to 0-100 %."""
    share = np.clip(np.asarray(cpu_pct, dtype=float) / 100.0, 0.0, 1.0)
    return idle_w + share * (max_w - idle_w)


def basis(readings: dict[str, Any]) -> tuple[str, str]:
    """(the CPU-use column that scales the estimate, what it is)."""
    cgroup = readings.get("cgroup_cpu") or {}
    if cgroup.get("cores"):
        cores = float(cgroup["cores"])
        plural = "" if cores == 1 else "s"
        return CGROUP_BASIS, f"the CPU use of its cgroup {cgroup.get('path')} ({cores:g} core{plural})"
    return BOARD_BASIS, "the whole system's CPU use (/proc/stat)"
