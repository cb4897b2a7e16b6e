"""The Pareto frontier of peak memory against time per step (lower is better on both).

A run is on the frontier when no other finished run of the same device and model is at
least as good on both and better on one. Runs that did not finish (oom, error, ...) or
lack either figure are not compared (on_frontier stays None).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

X_KEY, Y_KEY = "peak_mem_bytes", "step_time_median_s"


def frontier_indices(points: list[tuple[float, float]]) -> set[int]:
    """Indices of the non-dominated points (minimising both coordinates)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    keep, best_y = set(), float("inf")
    for i in order:
        if points[i][1] < best_y:
            keep.add(i)
            best_y = points[i][1]
    return keep


def _finished(row: dict[str, Any]) -> bool:
    return row.get("status") == "ok"


def mark_frontier(rows: list[dict[str, Any]], finished: Callable[[dict[str, Any]], bool] = _finished
                  ) -> list[dict[str, Any]]:
    """Sets `on_frontier` on each row, comparing finished rows of the same (device, model)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        if finished(row) and row.get(X_KEY) is not None and row.get(Y_KEY) is not None:
            groups[(row["device"], row["model"])].append(i)
    for members in groups.values():
        on = frontier_indices([(rows[i][X_KEY], rows[i][Y_KEY]) for i in members])
        for j, i in enumerate(members):
            rows[i]["on_frontier"] = j in on
    return rows
