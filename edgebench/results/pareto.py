"""The Pareto frontier of peak memory against time per step (lower is better on both),
among the runs (or configurations) that learned: the one definition bench, report, the
study and the HTML all use.

A run is on the frontier when its loss fell (last < first) and no other finished run that
learned, of the same device, model and run shape (batch, steps, text length, image size,
data, target), is at least as good on both and better on one. A finished run whose loss did
not fall is never on it (on_frontier False): being small and fast without learning is no
result. Runs that did not finish (oom, error, ...) or lack either figure are not compared
(on_frontier stays None).

Runs with a held-out target (`--target`) are ranked by what learning cost: peak memory
against the time to the target, among the runs that reached it; one that did not reach it
within its cap is never on the frontier.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

X_KEY, Y_KEY, TARGET_Y_KEY = "peak_mem_bytes", "step_time_median_s", "time_to_target_s"
# runs that differ here stay apart
SHAPE_KEYS = ("batch_size", "steps", "text_length", "image_size", "data", "target", "lr", "weight_decay", "threads")


def frontier_indices(points: list[tuple[float, float]]) -> set[int]:
    """Indices of the non-dominated points (minimising both coordinates)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    keep, best_y = set(), float("inf")
    for i in order:
        if points[i][1] < best_y:
            keep.add(i)
            best_y = points[i][1]
    return keep


def learned(row: dict[str, Any]) -> bool | None:
    """Whether the loss fell from the first step to the last (None: no loss recorded)."""
    first, last = row.get("loss_first"), row.get("loss_last")
    return None if first is None or last is None else last < first


def loss_drop_pct(row: dict[str, Any]) -> float | None:
    """How much the loss fell, as % of the first step's loss (negative: it rose)."""
    first, last = row.get("loss_first"), row.get("loss_last")
    return None if first is None or last is None or not first else 100 * (first - last) / abs(first)


def _finished(row: dict[str, Any]) -> bool:
    return row.get("status") == "ok"


def mark_frontier(rows: list[dict[str, Any]], finished: Callable[[dict[str, Any]], bool] = _finished
                  ) -> list[dict[str, Any]]:
    """Sets `on_frontier` on each row, comparing the finished rows that learned within one
    device, model and run shape."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        y_key, qualifies = (TARGET_Y_KEY, row.get("target_reached")) if row.get("target") else (Y_KEY, learned(row))
        if finished(row) and row.get(X_KEY) is not None and (row.get(y_key) is not None or row.get("target")):
            if qualifies:
                groups[(row["device"], row["model"], *(row.get(k) for k in SHAPE_KEYS))].append(i)
            else:
                row["on_frontier"] = False
    for members in groups.values():
        y_key = TARGET_Y_KEY if rows[members[0]].get("target") else Y_KEY
        on = frontier_indices([(rows[i][X_KEY], rows[i][y_key]) for i in members])
        for j, i in enumerate(members):
            rows[i]["on_frontier"] = j in on
    return rows
