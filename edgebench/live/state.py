"""What the live view knows about a run so far, built from followed records."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from edgebench.figures.memory import device_ram
from edgebench.figures.run import run_figures
from edgebench.figures.run_end import RunEnd, result_end
from edgebench.figures.run_events import Diverged, Ended, Event, Load, StepBegin, StepEnd, event_of
from edgebench.figures.run_meta import RunMeta
from edgebench.figures.run_samples import sample_of
from edgebench.figures.samples import FIGURE_COLUMNS, columns_of, raw_columns, sample_figures
from edgebench.figures.steps import step_statistics
from edgebench.live.follow import Update
from edgebench.untrusted import BadRecord

HISTORY = 120  # samples kept for sparklines
WINDOW = 40  # raw samples the live figures are made from (rates need the readings before)


@dataclass
class LiveState:
    source: str = ""
    device: str | None = None
    meta: RunMeta | None = None  # meta.json, checked once as it arrived
    result: dict[str, Any] | None = None
    end: RunEnd | None = None  # result.json's end record, checked once as it arrived
    figures: dict[str, Any] | None = None  # once result.json is there: the run's figures, as the store makes them
    ended: str | None = None  # the line saying the run (or its sweep) ended, once the view has nothing more to follow
    last_sample: dict[str, Any] = field(default_factory=dict)  # latest value of every field (lines are sparse)
    samples: list[dict[str, Any]] = field(default_factory=list)  # every raw sample: the summary's figures need them
    events: list[Event] = field(default_factory=list)  # each checked as it arrived (figures.run_events.event_of)
    samples_seen: int = 0
    peak_rss_bytes: int = 0
    rss_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    power_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    losses: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    steps_done: dict[str, int] = field(default_factory=lambda: {"warmup": 0, "measure": 0})
    last_step: StepEnd | None = None
    phase: str = "waiting"
    errors: list[str] = field(default_factory=list)
    bad_lines: int = 0
    follow_error: str | None = None

    def apply(self, up: Update) -> None:
        if up.meta is not None:
            try:
                self.meta = RunMeta.from_json(up.meta, f"{self.source}/meta.json")
            except BadRecord as exc:  # shown as the view's note; the run is followed without its facts
                self.follow_error = str(exc)
        if up.result is not None:
            try:
                self.end = result_end(up.result, f"{self.source}/result.json")
                self.result = up.result
            except BadRecord as exc:  # shown as the view's note; the run's figures are not made from it
                self.follow_error = str(exc)
        if up.error:
            self.follow_error = up.error
        self.bad_lines += up.bad_lines
        for rec in up.samples:
            self._sample(rec)
        for ev in up.events:
            self._event(ev)
        if self.result is not None and (up.result or up.samples or up.events):
            meta = self.meta or RunMeta(recorded_raw=False)  # no meta.json read: as a run recorded before it
            self.figures = run_figures(meta, self.result, self.end, self.events,
                                       columns_of(self.samples, *raw_columns(self.readings)), self.device == "local")

    def _sample(self, rec: dict[str, Any]) -> None:
        try:
            sample_of(rec, f"{self.source}/samples.jsonl sample {self.samples_seen + 1}")
        except BadRecord as exc:  # shown as the view's note; the sample is left out
            self.follow_error = str(exc)
            return
        self.samples_seen += 1
        self.last_sample.update(rec)
        self.samples.append(rec)
        rss = rec.get("rss_bytes")
        if isinstance(rss, (int, float)):
            self.peak_rss_bytes = max(self.peak_rss_bytes, int(rss))
            self.rss_history.append(rss)
        now = self._figures_now()
        self.last_sample.update(now)
        power = now.get("power_w", now.get("power_w_est"))
        if power is not None:
            self.power_history.append(power)

    def _figures_now(self) -> dict[str, float]:
        """The figures of the latest sample, made by the host's functions from the recent raw ones."""
        columns, _ = sample_figures(columns_of(self.samples[-WINDOW:], *raw_columns(self.readings)), self.readings,
                                    self.spec)
        latest = {key: float(columns[key][-1]) for key in FIGURE_COLUMNS if len(columns[key])}
        return {key: value for key, value in latest.items() if value == value}  # NaN: not read at this sample

    def _event(self, rec: dict[str, Any]) -> None:
        try:
            ev = event_of(rec, f"{self.source}/events.jsonl")
        except BadRecord as exc:  # shown as the view's note; the event is left out
            self.follow_error = str(exc)
            return
        if ev is None:  # a kind this edgebench does not know
            return
        self.events.append(ev)
        if isinstance(ev, Load):
            self.phase = "loading" if ev.event == "load_begin" else "training"
        elif isinstance(ev, StepBegin):
            self.phase = ev.phase
        elif isinstance(ev, StepEnd):
            self.steps_done[ev.phase] = self.steps_done.get(ev.phase, 0) + 1
            self.last_step = ev
            if ev.loss is not None:
                self.losses.append(ev.loss)
        elif isinstance(ev, Diverged) or (isinstance(ev, Ended) and ev.event == "error"):
            self.errors.append(f"{ev.event}: {ev.detail if isinstance(ev, Ended) else ''}".strip(": "))

    # ---- derived figures -----------------------------------------------------------
    @property
    def spec(self) -> dict[str, Any]:
        return self.meta.spec if self.meta is not None else {}

    @property
    def readings(self) -> dict[str, Any]:
        """Where the run's readings come from (meta.json `readings`; {} before it says)."""
        return (self.meta.readings if self.meta is not None else None) or {}

    @property
    def run_id(self) -> str:
        return str((self.meta.run_id if self.meta is not None else None) or (self.result or {}).get("run_id") or "?")

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def status(self) -> str:
        return str(self.figures["status"]) if self.figures else self.phase

    @property
    def device_ram(self) -> dict[str, Any] | None:
        """The device's RAM in use now, against the limit that applies to it (edgebench.figures.memory.device_ram)."""
        s = self.last_sample
        return device_ram(s.get("cgroup_usage_bytes"), s.get("cgroup_limit_bytes"),
                          self.meta.device.mem_total_bytes if self.meta is not None else None,
                          s.get("mem_available_bytes"),
                          shared_host=self.device == "local")

    @property
    def step_stats(self) -> dict[str, float] | None:
        """The measured steps' time statistics so far, as the summary and the store make them
        (edgebench.figures.steps.step_statistics)."""
        stats: dict[str, float] | None = step_statistics(self.events)["step_time_s"]
        return stats

    @property
    def step_time_s(self) -> float | None:
        """The median step time so far (the summary's `median`)."""
        stats = self.step_stats
        return stats["median"] if stats else None

    @property
    def steps_total(self) -> int | None:
        steps = self.spec.get("steps")
        return int(steps) if isinstance(steps, int) and not self.spec.get("duration_s") else None

    @property
    def eta_s(self) -> float | None:
        total, step = self.steps_total, self.step_time_s
        if total is None or step is None or self.finished:
            return None
        return max(0, total - self.steps_done.get("measure", 0)) * step
