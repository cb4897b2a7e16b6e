"""Energy over time windows from a sampled power trace.

The trace is taken as piecewise linear between its samples (what the trapezoid rule
assumes), and each window's energy is the exact integral of that line, including the
partial segments at the window's edges. Windows not fully covered by the trace get NaN:
an energy figure that silently drops part of a step would look plausible and be wrong.
"""

from __future__ import annotations

import numpy as np


def _cumulative(t_s: np.ndarray, p_w: np.ndarray) -> np.ndarray:
    """Integral of the trace from its first sample to each sample, in joules."""
    return np.concatenate([[0.0], np.cumsum(np.diff(t_s) * (p_w[1:] + p_w[:-1]) / 2)])


def _antiderivative(t_s: np.ndarray, p_w: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    k = np.clip(np.searchsorted(t_s, x, side="right") - 1, 0, len(t_s) - 2)
    dt = t_s[k + 1] - t_s[k]
    slope = np.divide(p_w[k + 1] - p_w[k], dt, out=np.zeros_like(dt), where=dt > 0)
    p_x = p_w[k] + slope * (x - t_s[k])
    area: np.ndarray = cum[k] + (x - t_s[k]) * (p_w[k] + p_x) / 2
    return area


def clean_trace(t_ns: np.ndarray, p_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drops samples without a power value and sorts by time; times become float seconds.

    Times are taken relative to the first sample before the conversion so that ns
    precision survives float64 even for host epoch times.
    """
    t_ns = np.asarray(t_ns, dtype=np.int64)
    p_w = np.asarray(p_w, dtype=np.float64)
    ok = np.isfinite(p_w)
    t_ns, p_w = t_ns[ok], p_w[ok]
    order = np.argsort(t_ns, kind="stable")
    return t_ns[order], p_w[order]


def window_energy_j(t_ns: np.ndarray, p_w: np.ndarray, begin_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Exact integral of the piecewise-linear power trace over each [begin, end] window."""
    t_ns, p_w = clean_trace(t_ns, p_w)
    begin_ns = np.asarray(begin_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    out = np.full(begin_ns.shape, np.nan)
    if len(t_ns) < 2 or not len(begin_ns):
        return out
    origin = t_ns[0]
    t_s = (t_ns - origin) / 1e9
    cum = _cumulative(t_s, p_w)
    covered = (begin_ns >= t_ns[0]) & (end_ns <= t_ns[-1]) & (end_ns >= begin_ns)
    a = (begin_ns[covered] - origin) / 1e9
    b = (end_ns[covered] - origin) / 1e9
    out[covered] = _antiderivative(t_s, p_w, cum, b) - _antiderivative(t_s, p_w, cum, a)
    return out


def window_mean_peak_w(t_ns: np.ndarray, p_w: np.ndarray, begin_ns: int, end_ns: int) -> tuple[float, float]:
    """Time-weighted mean power over one window, and the peak sample inside it."""
    t_clean, p_clean = clean_trace(t_ns, p_w)
    energy = window_energy_j(t_clean, p_clean, np.array([begin_ns]), np.array([end_ns]))[0]
    inside = p_clean[(t_clean >= begin_ns) & (t_clean <= end_ns)]
    duration_s = (end_ns - begin_ns) / 1e9
    mean = energy / duration_s if duration_s > 0 else float("nan")
    return float(mean), float(inside.max()) if len(inside) else float("nan")
