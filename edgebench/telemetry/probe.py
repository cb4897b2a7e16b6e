"""What this device can measure: runs the sampler on this process for a moment and reports
each source (active, or why not) with its latest values.

`python -m edgebench.telemetry.probe [--root DIR] [--sensors JSON] [--seconds S]` prints
the report as JSON (no host-side libraries needed; the fleet can run it over SSH).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from edgebench.telemetry.sampler import Sampler
from edgebench.telemetry.sysfs import Runner
from edgebench.telemetry.trace import read_trace


def probe(root: str | Path = "/", sensors: dict[str, Any] | None = None, power_model: dict[str, float] | None = None,
          seconds: float = 1.0, runner: Runner | None = None) -> dict[str, Any]:
    """{"sources_active", "sources_unavailable", "sources_failed", "latest": {key: value}, "summary"}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.jsonl"
        sampler = Sampler(out, os.getpid(), rate_hz=10, root=root, sensors=sensors, power_model=power_model,
                          runner=runner).start()
        time.sleep(seconds)
        summary = sampler.stop()
        latest: dict[str, Any] = {}
        for record in read_trace(out).records:
            latest.update(record)
    latest.pop("t_ns", None)
    return {
        "sources_active": summary["sources_active"],
        "sources_unavailable": summary["sources_unavailable"],
        "sources_failed": summary["sources_failed"],
        "latest": dict(sorted(latest.items())),
        "summary": summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="/", help="filesystem root for /proc and /sys (fixture trees)")
    parser.add_argument("--sensors", default="{}", help="the profile's sensors block as JSON")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print(json.dumps(probe(args.root, json.loads(args.sensors), seconds=args.seconds), indent=2, default=str))


if __name__ == "__main__":
    main()
