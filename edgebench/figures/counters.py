"""Rates from cumulative counters a device records as read (RAPL's energy in µJ, a process's
CPU ticks, a cgroup's CPU nanoseconds): one definition of the rate between two readings and
of what a counter that falls means: it wrapped where its maximum is known, else no rate there."""

from __future__ import annotations

import numpy as np


def counter_rate(t_ns: np.ndarray, counter: np.ndarray, wraps_at: float | None = None) -> tuple[np.ndarray, int]:
    """Per second between successive readings, at the later one, and how many readings fell
    (no rate there: a counter reset, or a wrap past an unknown maximum)."""
    out = np.full(len(t_ns), np.nan)
    have = np.flatnonzero(np.isfinite(counter))
    if len(have) < 2:
        return out, 0
    dt = np.diff(t_ns[have]) / 1e9
    rise = np.diff(counter[have])
    if wraps_at is not None:
        rise = np.where(rise < 0, rise + wraps_at, rise)
    ok = (dt > 0) & (rise >= 0)
    out[have[1:][ok]] = rise[ok] / dt[ok]
    return out, int((rise < 0).sum())
