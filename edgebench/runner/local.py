"""Running specs on this host, each in its own supervisor process, with progress."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from edgebench.runner.spec import RunSpec
from edgebench.telemetry.trace import read_trace


def new_run_id(device: str, spec: RunSpec) -> str:
    """A sortable, unique, filesystem-safe run id."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = f"{stamp}-{device}-{spec.model}-{spec.method}-{spec.backend}-{secrets.token_hex(2)}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def steps_done(run_dir: Path) -> int:
    """How many steps (warmup included) the worker has finished so far."""
    return sum(1 for e in read_trace(run_dir / "events.jsonl").records if e.get("event") == "step_end")


def run_local(spec: RunSpec, run_dir: Path, on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Runs the spec under a fresh supervisor process and returns its result.json.

    A separate supervisor per spec keeps every run's memory its own.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.json"
    spec.save(spec_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgebench.runner", str(spec_path), "--out", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=open(run_dir / "supervisor.log", "ab"))
    while proc.poll() is None:
        if on_progress is not None:
            on_progress(steps_done(run_dir))
        time.sleep(0.25)
    result_path = run_dir / "result.json"
    if not result_path.exists():
        log = (run_dir / "supervisor.log").read_text(errors="replace")[-2000:]
        return {"run_id": spec.run_id, "method": spec.method, "backend": spec.backend,
                "model": spec.model, "status": "error",
                "detail": f"supervisor exited {proc.returncode} without result.json: {log}"}
    return json.loads(result_path.read_text())
