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


def new_run_id(device: str, spec: RunSpec) -> str:
    """A sortable, unique, filesystem-safe run id."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = f"{stamp}-{device}-{spec.model}-{spec.method}-{spec.backend}-{secrets.token_hex(2)}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


class StepCounter:
    """Counts finished steps (warmup included) in a growing events.jsonl, reading only what is new."""

    def __init__(self, events_path: Path):
        self.path = events_path
        self.offset = 0
        self.count = 0

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return self.count
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self.offset += len(complete)
        self.count += complete.count(b'"event":"step_end"')
        return self.count


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
    steps_done = StepCounter(run_dir / "events.jsonl")
    while proc.poll() is None:
        if on_progress is not None:
            on_progress(steps_done())
        time.sleep(0.25)
    result_path = run_dir / "result.json"
    if not result_path.exists():
        log = (run_dir / "supervisor.log").read_text(errors="replace")[-2000:]
        return {"run_id": spec.run_id, "method": spec.method, "backend": spec.backend,
                "model": spec.model, "status": "error",
                "detail": f"supervisor exited {proc.returncode} without result.json: {log}"}
    return json.loads(result_path.read_text())
