"""A tight (monotonic, wall) clock pair, so the host can align device traces to wall time.

`python -m edgebench.telemetry.clock` prints one pair as JSON; host clock probes run it
over SSH and bracket it with their own clock reads.
"""

from __future__ import annotations

import json
import time


def clock_pair(tries: int = 5) -> dict[str, int]:
    """Reads the wall clock between two monotonic reads and keeps the tightest of `tries`.

    `mono_ns` is the midpoint of the two monotonic reads; `uncertainty_ns` is half their gap.
    """
    best = (2**63, 0, 0)  # (gap, mono, wall): any read beats it
    for _ in range(max(1, tries)):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if after - before < best[0]:
            best = (after - before, (before + after) // 2, wall)
    gap, mono, wall = best
    return {"mono_ns": mono, "wall_ns": wall, "uncertainty_ns": gap // 2}


def main() -> None:
    print(json.dumps(clock_pair()))


if __name__ == "__main__":
    main()
