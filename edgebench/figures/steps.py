"""One definition of each step figure, shared by the runner (result.json), the store's
metrics, `bench`, the report and the live view, so one name never means two numbers.
docs/figures.md explains each. Standard library only: it runs on the device.

- step time: the wall time of one measured step (warmup excluded).
- `median`, `p90`: of the measured steps' times; percentiles interpolate linearly
  between the two nearest ranks (numpy's default, so `np.percentile` agrees).
- samples/s: batch size / median step time (a typical step, not dragged by one slow one).
- tokens/s: samples/s x text length.
- device RAM: the memory the device's limit applies to: a lab device's cgroup (its usage,
  page cache included), else the board's own accounting (MemTotal - MemAvailable, every
  process). The worker's kernel RSS is another figure: it counts shared library pages
  the cgroup may not be charged for, and no page cache.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

UNLIMITED_BYTES = 1 << 60  # a cgroup limit of "max" reads as ~2^63
CGROUP_RAM = "device RAM (its cgroup, page cache included)"
BOARD_RAM = "device RAM (MemTotal - MemAvailable)"
WORKER_RSS = "kernel RSS of the worker process"


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100), linear between ranks, as numpy computes it."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def step_time_stats(durations: Iterable[float]) -> dict[str, float] | None:
    """`n`, `median`, `p90`, `mean`, `min`, `max` of measured step times in seconds (None if none)."""
    times = [float(d) for d in durations if d is not None and math.isfinite(d)]
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


def device_ram(cgroup_bytes: float | None, cgroup_limit: float | None, mem_total: float | None,
               mem_available: float | None) -> dict[str, Any] | None:
    """`{bytes, limit_bytes, what}`: the device's RAM in use against its limit (the module's
    docstring); None when neither accounting can be read."""
    if cgroup_bytes is not None and cgroup_limit and 0 < cgroup_limit < UNLIMITED_BYTES:
        return {"bytes": int(cgroup_bytes), "limit_bytes": int(cgroup_limit), "what": CGROUP_RAM}
    if mem_total and mem_available is not None:
        return {"bytes": int(mem_total - mem_available), "limit_bytes": int(mem_total), "what": BOARD_RAM}
    return None
