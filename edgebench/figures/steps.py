"""Step figures from the worker's events: one definition shared by the host's run figures
(edgebench.figures.run), the store's metrics, `bench`, the report and the live view, so one
name never means two numbers. docs/figures.md explains each. Standard library only: the
Python supervisor prints its live figures with it too.

- step time: the wall time of one measured step (warmup excluded).
- `median`, `p90`: of the measured steps' times; percentiles interpolate linearly
  between the two nearest ranks (numpy's default, so `np.percentile` agrees).
- samples/s: batch size / median step time (a typical step, not dragged by one slow one).
- tokens/s: samples/s x text length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from edgebench.figures.run_events import Event, StepBegin, StepEnd


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100), linear between ranks, as numpy computes it."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def step_time_stats(durations: Iterable[Any]) -> dict[str, float] | None:
    """`n`, `median`, `p90`, `mean`, `min`, `max` of measured step times in seconds (None if none);
    a duration that is not a finite number (a damaged line) is left out."""
    times = [float(d) for d in durations if isinstance(d, (int, float)) and math.isfinite(d)]
    if not times:
        return None
    return {"n": len(times), "median": percentile(times, 50), "p90": percentile(times, 90),
            "mean": sum(times) / len(times), "min": min(times), "max": max(times)}


def samples_per_s(batch_size: int, median_step_s: float | None) -> float | None:
    """Throughput: batch size over the median step time."""
    return batch_size / median_step_s if median_step_s else None


def tokens_per_s(samples: float | None, text_length: int | None) -> float | None:
    return samples * text_length if samples and text_length else None


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """Repeats of one figure: `median`, `min`, `max` and `n` over the runs that have it."""
    have = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not have:
        return None
    return {"median": percentile(have, 50), "min": min(have), "max": max(have), "n": len(have)}


def step_statistics(events: Sequence[Event]) -> dict[str, Any]:
    """Step-time statistics and losses from the measured steps of an events trace (checked as it
    was read: figures.run_events)."""
    begins = [e for e in events if isinstance(e, StepBegin)]
    ends = [e for e in events if isinstance(e, StepEnd)]
    measured = [e for e in ends if e.phase == "measure"]
    losses = [e.loss for e in ends if e.loss is not None]
    return {
        "steps_done": len(measured),
        "last_step": begins[-1].step if begins else None,  # reached, finished or not
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "step_time_s": step_time_stats(e.duration_s for e in measured),
    }
