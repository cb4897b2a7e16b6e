"""What a run learned, from the held-out evaluations recorded as raw counts (events.jsonl
`eval`: samples, summed loss, answer tokens, exactly matched answers; for an exported
program, the host's heldout.jsonl: edgebench.results.heldout), and
what it cost to get there: the steps, the seconds of training (evaluation time is not
training time) and, in results.metrics, the joules until the target was first reached.

One definition of a target for the command line, the worker (which stops once it is
reached) and the host (which finds where it was reached).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from edgebench.errors import EdgebenchError
from edgebench.figures.run_events import Eval, EvalFailed, Event, StepEnd

# metric: True where higher is better
TARGET_METRICS = {"accuracy": True, "loss": False}
TARGET_EXAMPLE = "accuracy=0.9 or loss=2.0"
DEFAULT_EVAL_EVERY = 10  # steps between evaluations when only a target is given
SHORT_ANSWER_TOKENS = 16  # an accuracy target needs answers no longer (exact match of a long text says little)
# learning_figures' figures a table row carries (the store's metrics, bench's table); eval_curve stays in result.json
LEARNING_COLUMNS = ("eval_loss_first", "eval_loss_last", "eval_accuracy_first", "eval_accuracy_last", "eval_count",
                    "eval_time_s", "target", "target_reached", "steps_to_target", "time_to_target_s")


class TargetError(EdgebenchError, ValueError):
    """A --target that names no metric edgebench evaluates, or no number."""


def parse_target(text: str) -> tuple[str, float]:
    """'accuracy=0.9' -> ('accuracy', 0.9); the error names what can be asked."""
    metric, sep, number = text.partition("=")
    metric = metric.strip().lower()
    if not sep or metric not in TARGET_METRICS:
        raise TargetError(f"{text!r}: a target is METRIC=VALUE with METRIC one of {', '.join(TARGET_METRICS)} "
                          f"(held-out), e.g. {TARGET_EXAMPLE}")
    try:
        value = float(number)
    except ValueError:
        raise TargetError(f"{text!r}: {number.strip()!r} is not a number; e.g. {TARGET_EXAMPLE}") from None
    if not math.isfinite(value) or (metric == "accuracy" and not 0 < value <= 1) or value < 0:
        raise TargetError(f"{text!r}: accuracy is a fraction in (0, 1], loss a number >= 0; e.g. {TARGET_EXAMPLE}")
    return metric, value


def heldout_counts(batches: Iterator[dict[str, Any]], count: int,
                   evaluate: Callable[[dict[str, Any]], dict[str, float]]) -> dict[str, float]:
    """An evaluation's raw counts (an `eval` event's), summed over `count` held-out batches: the
    worker's on the device and the host's of saved weights (edgebench.results.heldout) alike."""
    counts = {"samples": 0, "tokens": 0, "loss_sum": 0.0, "correct": 0}
    for _ in range(count):
        for key, value in evaluate(next(batches)).items():
            counts[key] += value
    return counts


def eval_point(event: Eval) -> dict[str, Any]:
    """One evaluation's figures from its raw counts: held-out loss per answer token, and the
    share of samples whose whole answer greedy decoding reproduced."""
    tokens, samples = event.tokens, event.samples
    return {"after_steps": event.after_steps,
            "loss": event.loss_sum / tokens if tokens else None,
            "accuracy": event.correct / samples if samples else None,
            "seconds": (event.end_ns - event.t_ns) / 1e9}


def reached(point: dict[str, Any], metric: str, value: float) -> bool:
    got = point.get(metric)
    if got is None:
        return False
    return bool(got >= value) if TARGET_METRICS[metric] else bool(got <= value)


def learning_figures(events: Sequence[Event], target: str | None) -> dict[str, Any]:
    """The held-out curve's first and last points, evaluation time, and where the target was
    first reached: steps trained (warmup included: it trains too) and seconds of training."""
    evals = [e for e in events if isinstance(e, Eval)]
    points = [eval_point(e) for e in evals]
    failed = next((e.detail for e in events if isinstance(e, EvalFailed)), None)
    out: dict[str, Any] = {"eval_count": len(points), "eval_failed": failed}
    if not points and not target:
        return out
    by_host = any(e.evaluated_by == "host" for e in evals)
    out["eval_by"] = "the host, from the weights the run saved" if by_host else "the run"
    first, last = (points[0], points[-1]) if points else ({}, {})
    out.update(eval_loss_first=first.get("loss"), eval_loss_last=last.get("loss"),
               eval_accuracy_first=first.get("accuracy"), eval_accuracy_last=last.get("accuracy"),
               eval_time_s=sum(p["seconds"] for p in points), eval_curve=points, target=target)
    if target:
        metric, value = parse_target(target)
        hit = next((p for p in points if reached(p, metric, value)), None)
        out["target_reached"] = hit is not None
        out["steps_to_target"] = hit["after_steps"] if hit else None
        out["time_to_target_s"] = _training_seconds(events, hit["after_steps"]) if hit else None
    return out


def memory_apart(events: Sequence[Event], columns: dict[str, np.ndarray]) -> dict[str, int | None]:
    """The worker's sampled RSS peak inside the evaluations and outside them (none without
    evaluations): the kernel's peak covers both, so these say whether evaluating raised it."""
    evals = [e for e in events if isinstance(e, Eval)]
    if not evals or "t_ns" not in columns or "rss_bytes" not in columns:
        return {}
    t_ns, rss = np.asarray(columns["t_ns"], dtype=np.int64), np.asarray(columns["rss_bytes"], dtype=float)
    inside = np.zeros(len(t_ns), dtype=bool)
    for e in evals:
        inside |= (t_ns >= e.t_ns) & (t_ns <= e.end_ns)
    have = np.isfinite(rss)
    return {f"{name}_peak_rss_bytes_sampled": int(rss[have & where].max()) if (have & where).any() else None
            for name, where in (("eval", inside), ("train", ~inside))}


def _training_seconds(events: Sequence[Event], steps: int) -> float:
    """Seconds spent in the first `steps` steps (warmup included), evaluations left out."""
    durations = [e.duration_s or 0.0 for e in events if isinstance(e, StepEnd)]
    return float(sum(durations[:steps]))
