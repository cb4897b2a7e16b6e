"""What the report's charts show, gathered once for both ways of drawing them: the PNGs
(plots.py, matplotlib) and the HTML report's interactive charts (charts.py, plotly).

Pure data: names made printable, timelines thinned, each configuration's spread, which
figure a panel shows (measured energy, else the estimate, labelled as such).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from edgebench.results.aggregate import config_label
from edgebench.results.metrics import forward_fill, joules_of_first, sample_columns, step_joules
from edgebench.results.store import Store
from edgebench.untrusted import printable

MAX_POINTS = 4000
NO_FINISHED = "no finished run: no frontier to draw"  # written on a frontier's chart where nothing finished
NAME_CHARS = 120  # a name from a device (a method, a status) is cut to this
MIB = 1 << 20


def names(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its texts (device, model, method, status, ...) as a chart draws them: printable,
    cut short. A control character would also reach the terminal, in matplotlib's "Glyph missing"
    warning."""
    return {k: printable(v, newlines=False, limit=NAME_CHARS) if isinstance(v, str) else v for k, v in row.items()}


def thinned(t: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples that have this field (lines are sparse), at most ~MAX_POINTS of them,
    always keeping the peak (a peak is the story)."""
    have = np.isfinite(values)
    t, values = t[have], values[have]
    if len(t) > MAX_POINTS:
        keep = np.union1d(np.linspace(0, len(t) - 1, MAX_POINTS).astype(int), [int(np.argmax(values))])
        t, values = t[keep], values[keep]
    return t, values


def energy_colour(rows: list[dict[str, Any]]) -> tuple[list[float | None], str]:
    """Measured energy per step when any run has it, else the estimate, labelled as such."""
    if any(r.get("energy_per_step_j") is not None for r in rows):
        return [r.get("energy_per_step_j") for r in rows], "energy per step (J, measured)"
    return [r.get("energy_per_step_j_est") for r in rows], "energy per step (J, ESTIMATED)"


def err(group: dict[str, Any], key: str, scale: float = 1.0) -> tuple[float, float]:
    """How far the configuration's min and max lie below and above its median."""
    s = (group.get("spread") or {}).get(key)
    if not s:
        return 0.0, 0.0
    return (s["median"] - s["min"]) / scale, (s["max"] - s["median"]) / scale


def comparison(groups: list[dict[str, Any]]
               ) -> tuple[list[str], list[str], dict[str, dict[str, dict[str, Any]]], list[tuple[str, str, float]]]:
    """The comparison across devices: the devices, the configurations without their device
    (model / method / backend (shape)), each finished one by configuration and device, and
    the panels (key, label, scale) some device has a figure for."""
    groups = [names(g) for g in groups]
    devices = sorted({g["device"] for g in groups})
    methods = sorted({config_label(g, device=False) for g in groups})
    by: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for g in groups:
        if str(g.get("status")).startswith("ok"):
            by[config_label(g, device=False)][g["device"]] = g
    finished = [g for m in by.values() for g in m.values()]
    energy_key = "energy_per_step_j" if any(g.get("energy_per_step_j") is not None for g in finished) \
        else "energy_per_step_j_est"
    panels: list[tuple[str, str, float]] = [
        ("step_time_median_s", "time per step, median (s)", 1),
        ("peak_mem_bytes", "peak memory, kernel (MiB)", MIB),
        (energy_key, "energy per step (J)" + (", ESTIMATED" if energy_key.endswith("_est") else ""), 1),
    ]
    return devices, methods, by, [p for p in panels if any(g.get(p[0]) is not None for g in finished)]


def pareto_y(groups: list[dict[str, Any]]) -> tuple[str, str]:
    """The frontier's y figure and what it is (titles and axes say it): the time to the target
    where every configuration has one (the frontier ranks them by it: results.pareto), else
    the time per step."""
    if groups and all(g.get("target") is not None for g in groups):
        targets: set[str] = {g["target"] for g in groups}
        return "time_to_target_s", f"time to the target ({', '.join(sorted(targets))})"
    return "step_time_median_s", "time per step"


def pareto_sets(groups: list[dict[str, Any]], y_key: str = "step_time_median_s"
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """A frontier's points: those with a peak and a `y_key` figure, the finished ones, the
    failed ones, and the devices' RAM sizes (bytes)."""
    done = [names(g) for g in groups if g.get("peak_mem_bytes") and g.get(y_key)]
    finished = [g for g in done if str(g.get("status")).startswith("ok")]
    failed = [g for g in done if not str(g.get("status")).startswith("ok")]
    return done, finished, failed, sorted({g["device_ram_bytes"] for g in groups if g.get("device_ram_bytes")})


def memory_samples(store: Store, run: dict[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """Seconds since the run's first sample, its RSS and cgroup usage samples, and each
    step's start in the same seconds."""
    s = store.samples(run["device"], run["run_id"], ["rss_bytes", "cgroup_usage_bytes"])
    t0 = s["t_ns"][0] if len(s["t_ns"]) else 0
    starts = (store.steps(run["device"], run["run_id"])["begin_ns"] - t0) / 1e9
    return (s["t_ns"] - t0) / 1e9, s, starts


def power_samples(store: Store, run: dict[str, Any], external: tuple[np.ndarray, np.ndarray] | None
                  ) -> tuple[np.ndarray, dict[str, np.ndarray], tuple[np.ndarray, np.ndarray] | None, np.ndarray]:
    """Seconds since the run's first sample, its per-sample figures (power_w, temp_c_max),
    the external meter's trace inside the run in the same seconds (None without one), and
    whether each sample was throttled."""
    s = sample_columns(store, run)
    t0 = s["t_ns"][0] if len(s["t_ns"]) else 0
    t = (s["t_ns"] - t0) / 1e9
    inside = None
    if external is not None and len(external[0]):
        et = (external[0] - t0) / 1e9
        keep = (et >= 0) & (et <= (t[-1] if len(t) else 0))
        inside = (et[keep], external[1][keep])
    return t, s, inside, np.nan_to_num(forward_fill(s["throttle_flags"])) != 0


def learning_curves(store: Store, runs: list[dict[str, Any]], groups: list[dict[str, Any]]
                    ) -> tuple[list[tuple[dict[str, Any], list[dict[str, Any]]]], str | None]:
    """The held-out curve of each run that evaluated, by configuration: (configuration, its
    points: after_steps, loss, accuracy, `run_id`, the training seconds before the
    evaluation (step times, evaluations left out) and `joules`), and what the joules are:
    "measured" where every point has measured power, else "estimated" where every point has
    the power model's; None (no joules) otherwise."""
    by_run = {(g["device"], run_id): g for g in groups for run_id in g["run_ids"]}
    curves: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for run in runs:
        curve = (json.loads(run.get("result_json") or "{}") or {}).get("eval_curve")
        group = by_run.get((run["device"], run["run_id"]))
        if not curve or group is None:
            continue
        steps = store.steps(run["device"], run["run_id"])
        joules = step_joules(store, run, steps, sample_columns(store, run))
        for p in curve:
            k = int(p["after_steps"] or 0)
            curves.setdefault(id(group), (names(group), []))[1].append(
                {**p, "run_id": printable(run["run_id"], newlines=False, limit=NAME_CHARS),
                 "seconds": float(steps["duration_s"][:k].sum()),
                 "measured": joules_of_first(joules["measured"], k), "estimated": joules_of_first(joules["est"], k)})
    points = [p for _, mine in curves.values() for p in mine]
    basis = next((b for b in ("measured", "estimated") if points and all(p[b] is not None for p in points)), None)
    for p in points:
        p["joules"] = p[basis] if basis else None
    return list(curves.values()), basis
