"""Running specs on this host, each in its own supervisor process, with progress."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from edgebench.runner.spec import RunSpec
from edgebench.telemetry.trace import TraceTail


def run_local(spec: RunSpec, run_dir: Path, on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Runs the spec under a fresh supervisor process and returns its result.json.

    A separate supervisor per spec keeps every run's memory its own. `on_progress` gets
    the number of finished steps (warmup included) as they happen.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.json"
    spec.save(spec_path)
    with open(run_dir / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgebench.runner", str(spec_path), "--out", str(run_dir)],
            stdout=subprocess.DEVNULL, stderr=log)
    events = TraceTail(run_dir / "events.jsonl")
    steps_done = 0
    while proc.poll() is None:
        steps_done += sum(1 for e in events.read() if e.get("event") == "step_end")
        if on_progress is not None:
            on_progress(steps_done)
        time.sleep(0.25)
    result_path = run_dir / "result.json"
    if not result_path.exists():
        log_text = (run_dir / "supervisor.log").read_text(errors="replace")[-2000:]
        return {"run_id": spec.run_id, "method": spec.method, "backend": spec.backend,
                "model": spec.model, "status": "error",
                "detail": f"supervisor exited {proc.returncode} without result.json: {log_text}"}
    return json.loads(result_path.read_text())
