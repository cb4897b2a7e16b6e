"""What this device can measure: runs the sampler on this process for a moment and reports
each source (active, or why not) with its latest raw values, and the figures the host makes
of them (edgebench.figures: the same functions a run's figures come from). It runs telemetry
and makes figures of it, as a run's supervisor does, so it sits with the runner above both.

`python -m edgebench.runner.probe [--root DIR] [--sensors JSON] [--seconds S]` prints
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

import numpy as np

from edgebench.figures.run_samples import read_samples
from edgebench.figures.samples import raw_columns, read_columns, sample_figures
from edgebench.telemetry.sampler import Sampler
from edgebench.telemetry.sysfs import Runner


def probe(root: str | Path = "/", sensors: dict[str, Any] | None = None, seconds: float = 1.0,
          runner: Runner | None = None) -> dict[str, Any]:
    """{"sources_active", "sources_unavailable", "sources_failed", "latest": {raw key: value},
    "readings": where each was read, "figures": {figure: latest value}, "power": what the power
    figure covers, "summary"}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.jsonl"
        sampler = Sampler(out, os.getpid(), rate_hz=10, root=root, sensors=sensors, runner=runner).start()
        time.sleep(seconds)
        summary = sampler.stop()
        latest: dict[str, Any] = {}
        for record in read_samples(out).records:
            latest.update(record)
        readings = sampler.readings()
        columns, account = sample_figures(read_columns(out, *raw_columns(readings)), readings, {"sensors": sensors})
    latest.pop("t_ns", None)
    figures = {key: float(values[finite][-1]) for key, values in columns.items() if key != "t_ns"
               and (finite := np.isfinite(values)).any()}
    return {
        "sources_active": summary["sources_active"],
        "sources_unavailable": summary["sources_unavailable"],
        "sources_failed": summary["sources_failed"],
        "latest": dict(sorted(latest.items())),
        "readings": readings,
        "figures": figures,
        "power": account,
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
