"""`python -m edgebench.runner.sweep DIR`: run every DIR/specs/*.json in order.

Made to be started detached on a device: each run goes to DIR/runs/<run_id>/, the state
of every run is kept in DIR/sweep.json, and a run that already has result.json is not
run again, so a restarted sweep resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import run_spec
from edgebench.telemetry.trace import write_json_atomic


def spec_files(sweep_dir: Path) -> list[Path]:
    return sorted((sweep_dir / "specs").glob("*.json"))


def run_sweep(sweep_dir: str | Path) -> dict[str, Any]:
    sweep_dir = Path(sweep_dir)
    state: dict[str, Any] = {"pid": os.getpid(), "state": "running", "started_wall_ns": time.time_ns(),
                             "runs": {}}
    stop = {"requested": False}

    def on_sigterm(signum: int, frame: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_sigterm)
    for path in spec_files(sweep_dir):
        spec = RunSpec.load(path)
        run_id = spec.run_id or path.stem
        spec.run_id = run_id
        run_dir = sweep_dir / "runs" / run_id
        done = run_dir / "result.json"
        if done.exists():
            state["runs"][run_id] = json.loads(done.read_text())["status"]
            continue
        if stop["requested"]:
            state["runs"][run_id] = "not started"
            continue
        state["runs"][run_id] = "running"
        write_json_atomic(sweep_dir / "sweep.json", state)
        state["runs"][run_id] = run_spec(spec, run_dir)["status"]
        write_json_atomic(sweep_dir / "sweep.json", state)
    state["state"] = "interrupted" if stop["requested"] else "finished"
    state["finished_wall_ns"] = time.time_ns()
    write_json_atomic(sweep_dir / "sweep.json", state)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgebench.runner.sweep",
                                     description="Run every DIR/specs/*.json in order (resumable).")
    parser.add_argument("dir")
    args = parser.parse_args(argv)
    state = run_sweep(args.dir)
    print(json.dumps(state["runs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
