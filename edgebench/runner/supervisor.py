"""The supervisor: runs one spec in a fresh worker process, samples it, and always
writes result.json — for an OOM kill, a timeout or a SIGTERM as much as for success.

It never imports torch, so its own footprint stays small on a 512 MB device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from edgebench.runner import worker
from edgebench.runner.facts import device_facts, library_versions
from edgebench.runner.figures import samples_per_s, step_time_stats
from edgebench.runner.spec import RunSpec
from edgebench.telemetry.clock import clock_pair
from edgebench.telemetry.contention import cpu_share, cpu_snapshot
from edgebench.telemetry.trace import read_trace, write_json_atomic

POLL_S = 0.02


def step_statistics(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Step-time statistics and losses from the measured steps of an events trace."""
    begins = [e for e in events if e.get("event") == "step_begin"]
    ends = [e for e in events if e.get("event") == "step_end"]
    measured = [e for e in ends if e.get("phase") == "measure"]
    times = [e["duration_s"] for e in measured]
    losses = [e["loss"] for e in ends]
    stats: dict[str, Any] = {
        "steps_done": len(measured),
        "last_step": begins[-1]["step"] if begins else None,  # reached, finished or not
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "step_time_s": step_time_stats(times),
    }
    return stats


def _status(exit_code: int | None, exit_signal: int | None, timed_out: bool, interrupted: bool,
            events: list[dict[str, Any]], oom_kills: int) -> tuple[str, str]:
    """Maps how the worker ended to (status, detail)."""
    last = next((e for e in reversed(events) if e.get("event") in
                 {"error", "oom", "diverged", "unsupported", "interrupted"}), None)
    if timed_out:
        return "timeout", "the run passed its wall-clock limit (timeout_s) and was killed"
    if exit_signal == signal.SIGKILL:
        reason = (f"cgroup oom_kill counter rose by {oom_kills}" if oom_kills
                  else "SIGKILL not sent by edgebench: the kernel's OOM killer is the usual cause")
        return "oom", f"worker killed by SIGKILL ({reason})"
    if interrupted or exit_code == worker.EXIT_INTERRUPTED:
        return "interrupted", "stopped by SIGTERM"
    by_code = {worker.EXIT_OK: "ok", worker.EXIT_DIVERGED: "diverged", worker.EXIT_OOM: "oom",
               worker.EXIT_UNSUPPORTED: "unsupported"}
    status = by_code.get(exit_code, "error")
    if status == "ok":
        return "ok", ""
    if last is not None:
        if last["event"] == "diverged":
            return status, f"non-finite loss {last.get('loss')} at step {last.get('step')}"
        return status, str(last.get("detail", ""))
    if exit_signal is not None:
        return "error", f"worker died from signal {signal.Signals(exit_signal).name}"
    return status, f"worker exited with code {exit_code}"


class Supervisor:
    def __init__(self, spec: RunSpec, out: str | Path, root: str = "/"):
        self.spec = spec
        self.out = Path(out)
        self.root = root
        self.interrupted = False
        self._facts: dict[str, Any] | None = None

    def _write_meta(self, clock_start: dict[str, int], clock_end: dict[str, int] | None,
                    predicted: Any) -> None:
        """meta.json at start, and again at the end with the end clock and the prediction."""
        if self._facts is None:  # read once: the device and its libraries do not change mid-run
            self._facts = {"device": device_facts(), "versions": library_versions()}
        write_json_atomic(self.out / "meta.json", {
            "run_id": self.spec.run_id,
            "spec": self.spec.to_dict(),
            **self._facts,
            "clock": {"start": clock_start, "end": clock_end},
            "predicted": predicted,
        })

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.interrupted = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def run(self) -> dict[str, Any]:
        from edgebench.telemetry.sampler import Sampler

        self.out.mkdir(parents=True, exist_ok=True)
        spec_path = self.out / "spec.json"
        self.spec.save(spec_path)
        clock_start = clock_pair()
        self._cpu_start = cpu_snapshot(self.root)
        self._write_meta(clock_start, None, None)
        self.child = None
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "edgebench.runner.worker", str(spec_path), "--out", str(self.out)],
                stdout=open(self.out / "worker.log", "ab"), stderr=subprocess.STDOUT,
            )
            sampler = Sampler(self.out / "samples.jsonl", self.child.pid, rate_hz=self.spec.sample_hz,
                              root=self.root, sensors=self.spec.sensors, power_model=self.spec.power_model)
            sampler.start()
            exit_code, exit_signal, maxrss, timed_out = self._wait()
            sampler_summary = sampler.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
        return self._finish(clock_start, exit_code, exit_signal, maxrss, timed_out, sampler_summary)

    def _wait(self) -> tuple[int | None, int | None, int, bool]:
        """Waits for the worker (wait4 gives its ru_maxrss); kills it past timeout_s."""
        deadline = None if self.spec.timeout_s is None else time.monotonic() + self.spec.timeout_s
        timed_out = False
        while True:
            pid, status, usage = os.wait4(self.child.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.monotonic() > deadline and not timed_out:
                timed_out = True
                self.child.kill()
            time.sleep(POLL_S)
        self.child.returncode = os.waitstatus_to_exitcode(status)
        exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        exit_signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        return exit_code, exit_signal, usage.ru_maxrss * 1024, timed_out

    def _finish(self, clock_start: dict[str, int], exit_code: int | None, exit_signal: int | None,
                maxrss: int, timed_out: bool, sampler: dict[str, Any]) -> dict[str, Any]:
        trace = read_trace(self.out / "events.jsonl")
        events = trace.records
        predicted = next((e.get("memory") for e in events if e.get("event") == "predicted"), None)
        self._write_meta(clock_start, clock_pair(), predicted)
        status, detail = _status(exit_code, exit_signal, timed_out, self.interrupted, events,
                                 sampler.get("cgroup_oom_kills_during_run") or 0)
        stats = step_statistics(events)
        median = (stats["step_time_s"] or {}).get("median")
        result = {
            "status": status,
            "detail": detail,
            "run_id": self.spec.run_id,
            "model": self.spec.checkpoint or self.spec.model,
            "method": self.spec.method,
            "backend": self.spec.backend,
            "batch_size": self.spec.batch_size,
            "exit_code": exit_code,
            "exit_signal": signal.Signals(exit_signal).name if exit_signal else None,
            **stats,
            "samples_per_s": samples_per_s(self.spec.batch_size, median),
            "cpu": cpu_share(self._cpu_start, cpu_snapshot(self.root)),
            "peak_rss_bytes_sampled": sampler.get("peak_rss_bytes"),
            "peak_rss_bytes_kernel": maxrss,
            "cgroup_peak_bytes": sampler.get("cgroup_peak_bytes"),
            "predicted_peak_bytes_est": (predicted or {}).get("peak_bytes"),
            "sampler": sampler,
            "events_truncated_last_line": trace.truncated_last_line,
            "events_bad_lines": trace.bad_lines,
        }
        write_json_atomic(self.out / "result.json", result)
        return result


def run_spec(spec: RunSpec, out: str | Path, root: str = "/") -> dict[str, Any]:
    """Runs one spec to completion (whatever happens) and returns its result.json."""
    return Supervisor(spec, out, root=root).run()
