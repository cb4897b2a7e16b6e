"""Writes run directories in the documented format (docs/interfaces.md) for results,
report and live tests, with known step boundaries, power and clocks."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgebench.telemetry.trace import write_json_atomic


@dataclass
class FakeRun:
    """A run whose every figure is known: steps of `step_s` seconds, samples at `sample_hz`."""

    run_id: str = "run-a"
    model: str = "tiny"
    method: str = "adamw"
    backend: str = "eager"
    batch_size: int = 2
    text_length: int = 16
    steps: int = 10
    warmup_steps: int = 1
    step_s: float = 0.2
    sample_hz: float = 50.0
    mono0_ns: int = 5_000_000_000_000  # device monotonic at load_begin
    boot_wall_ns: int = 1_780_000_000_000_000_000  # device wall - mono
    rss_base: int = 200 << 20
    rss_per_step: int = 1 << 20
    mem_total_bytes: int = 4 << 30
    cgroup_limit_bytes: int | None = None
    power: Callable[[np.ndarray], np.ndarray] | None = lambda t_s: 3.0 + 0.5 * np.sin(t_s)  # noqa: E731
    power_est: Callable[[np.ndarray], np.ndarray] | None = None
    temp: Callable[[np.ndarray], np.ndarray] | None = lambda t_s: 45.0 + t_s  # noqa: E731
    throttle_after_s: float | None = None
    status: str | None = "ok"
    loss0: float = 10.0
    loss_rate: float = 0.9  # each step's loss over the one before (> 1: the run does not learn)
    predicted_peak: int | None = None  # the memory model's prediction, as the worker records it
    extra_fields: dict = field(default_factory=dict)

    @property
    def load_s(self) -> float:
        return 0.1

    def step_windows_ns(self) -> list[tuple[str, int, int, int]]:
        """(phase, step, begin_ns, end_ns) for every step, warmup first."""
        out, t = [], self.mono0_ns + int(self.load_s * 1e9)
        for i in range(self.warmup_steps + self.steps):
            phase, step = ("warmup", i) if i < self.warmup_steps else ("measure", i - self.warmup_steps)
            out.append((phase, step, t, t + int(self.step_s * 1e9)))
            t += int(self.step_s * 1e9)
        return out

    def end_ns(self) -> int:
        return self.step_windows_ns()[-1][3] + int(0.05e9)

    def loss(self, i: int) -> float:
        return self.loss0 * self.loss_rate ** i

    def sample_times_ns(self) -> np.ndarray:
        period = int(1e9 / self.sample_hz)
        times = np.arange(self.mono0_ns, self.end_ns(), period, dtype=np.int64)
        return np.append(times, self.end_ns())  # the sampler's final sample at stop

    def sample_record(self, t_ns: int) -> dict:
        t_s = (t_ns - self.mono0_ns) / 1e9
        steps_done = max(0, int((t_s - self.load_s) / self.step_s))
        rec = {"t_ns": int(t_ns), "rss_bytes": self.rss_base + self.rss_per_step * steps_done,
               "mem_available_bytes": self.mem_total_bytes // 2, "cpu_proc_pct": 180.0}
        if self.cgroup_limit_bytes:
            rec["cgroup_limit_bytes"] = self.cgroup_limit_bytes
            rec["cgroup_usage_bytes"] = rec["rss_bytes"] + (8 << 20)
        if self.power:
            rec["power_w"] = float(self.power(np.array(t_s)))
        if self.power_est:
            rec["power_w_est"] = float(self.power_est(np.array(t_s)))
        if self.temp:
            rec["temp_c_max"] = float(self.temp(np.array(t_s)))
        if self.throttle_after_s is not None:
            rec["throttle_flags"] = 4 if t_s >= self.throttle_after_s else 0
        rec.update(self.extra_fields)
        return rec

    def meta(self) -> dict:
        return {
            "run_id": self.run_id,
            "spec": {
                "model": self.model,
                "method": self.method,
                "backend": self.backend,
                "batch_size": self.batch_size,
                "text_length": self.text_length,
                "warmup_steps": self.warmup_steps,
                "steps": self.steps,
                "sample_hz": self.sample_hz,
            },
            "device": {
                "hostname": "fixture",
                "arch": "aarch64",
                "cpu_count": 4,
                "mem_total_bytes": self.mem_total_bytes,
            },
            "clock": {
                "start": {"mono_ns": self.mono0_ns, "wall_ns": self.mono0_ns + self.boot_wall_ns},
                "end": {"mono_ns": self.end_ns(), "wall_ns": self.end_ns() + self.boot_wall_ns},
            },
            "predicted": {"peak": self.rss_base},
        }

    def events(self) -> list[dict]:
        ev = [{"t_ns": self.mono0_ns, "event": "load_begin"},
              {"t_ns": self.mono0_ns + int(self.load_s * 1e9), "event": "load_end"}]
        if self.predicted_peak is not None:
            ev.insert(0, {"t_ns": self.mono0_ns, "event": "predicted", "memory": {"peak_bytes": self.predicted_peak}})
        for i, (phase, step, begin, end) in enumerate(self.step_windows_ns()):
            ev.append({"t_ns": begin, "event": "step_begin", "step": step, "phase": phase})
            ev.append({"t_ns": end, "event": "step_end", "step": step, "phase": phase, "loss": self.loss(i),
                       "duration_s": (end - begin) / 1e9})
        return ev

    def result(self) -> dict:
        durations = [self.step_s] * self.steps
        return {
            "status": self.status,
            "detail": "",
            "run_id": self.run_id,
            "model": self.model,
            "method": self.method,
            "backend": self.backend,
            "steps_done": self.steps,
            "last_step": self.steps - 1,
            "peak_rss_bytes_sampled": self.rss_base + self.rss_per_step * (self.steps + self.warmup_steps),
            "peak_rss_bytes_kernel": self.rss_base + self.rss_per_step * (self.steps + self.warmup_steps) + (4 << 20),
            "step_time_s": {"median": float(np.median(durations)), "p90": float(np.percentile(durations, 90))},
            "loss_first": self.loss(0),
            "loss_last": self.loss(self.steps + self.warmup_steps - 1),
        }

    def write(self, root: Path, garbage: bool = False) -> Path:
        """Writes the whole run at once; `garbage` adds a bad line and a truncated last line."""
        out = Path(root) / self.run_id
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "meta.json", self.meta())
        lines = [json.dumps(self.sample_record(int(t))) for t in self.sample_times_ns()]
        if garbage:
            lines.insert(len(lines) // 2, "not json at all")
        text = "\n".join(lines) + "\n" + ('{"t_ns": 12, "rss_by' if garbage else "")
        (out / "samples.jsonl").write_text(text)
        (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.events()))
        if self.status:
            write_json_atomic(out / "result.json", self.result())
        return out


def eval_event(after: int, loss: float, correct: int, t_ns: int) -> dict:
    """A held-out evaluation as the worker records it: 10 samples, 20 answer tokens."""
    return {"event": "eval", "after_steps": after, "t_ns": t_ns, "end_ns": t_ns + 500_000_000, "samples": 10,
            "tokens": 20, "loss_sum": loss * 20, "correct": correct}


def evaluated(run: FakeRun, root: Path, losses: dict[int, float], target: str | None,
              correct: dict[int, int] | None = None) -> Path:
    """The run's directory with held-out evaluations (after_steps: loss; `correct` of 10 samples
    each) and its target in the spec."""
    run_dir = run.write(root)
    windows = run.step_windows_ns()
    evals = [eval_event(after, loss, (correct or {}).get(after, 0), windows[min(after, len(windows) - 1)][2])
             for after, loss in losses.items()]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in run.events() + evals))
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["spec"]["target"] = target
    (run_dir / "meta.json").write_text(json.dumps(meta))
    return run_dir


def store_of(root: Path, runs: dict[str, list[FakeRun]], result: Callable[[FakeRun], dict] | None = None) -> Path:
    """A real DuckDB store at root/edgebench.duckdb holding `runs` by device; `result(run)`
    gives fields to add to a run's result.json (what a supervisor would have written)."""
    from edgebench.results.store import Store

    path = Path(root) / "edgebench.duckdb"
    with Store(path) as store:
        for device, device_runs in runs.items():
            for run in device_runs:
                run_dir = run.write(Path(root) / "src" / device)
                extra = result(run) if result else None
                if extra:
                    written = json.loads((run_dir / "result.json").read_text())
                    (run_dir / "result.json").write_text(json.dumps({**written, **extra}))
                store.ingest_run(run_dir, device=device)
    return path


def probes_for(run: FakeRun, offset_ns: int, drift: float, ref_mono_ns: int, times_s: list[float],
               rtts_ms: list[float], asymmetry: list[float] | None = None) -> list[dict]:
    """Clock probes for a device whose host time = mono + offset + drift*(mono - ref).

    `asymmetry` (0..1) places the device's reading inside the round trip (0.5 = middle).
    """
    probes = []
    for i, (t_s, rtt_ms) in enumerate(zip(times_s, rtts_ms)):
        mono = run.mono0_ns + int(t_s * 1e9)
        host_at_read = mono + offset_ns + round(drift * (mono - ref_mono_ns))
        frac = asymmetry[i] if asymmetry else 0.5
        rtt = int(rtt_ms * 1e6)
        probes.append({"host_send_ns": host_at_read - int(rtt * frac), "device_mono_ns": mono,
                       "device_wall_ns": mono + run.boot_wall_ns, "host_recv_ns": host_at_read + rtt - int(rtt * frac)})
    return probes
