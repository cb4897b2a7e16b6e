"""Step marks for your own script, measured by `edgebench measure -- CMD ...`.

    from edgebench import measure

    for batch in loader:
        with measure.step():              # or measure.step(loss=...), or record_loss inside
            loss = train_step(batch)
            measure.record_loss(loss)

or, in Zeus's style, `measure.begin_window("step")` ... `measure.end_window("step")`. Each
step or window becomes a `step_begin`/`step_end` pair in the run's events.jsonl, the same
events edgebench's own worker writes (edgebench.figures.run_events), so step time, energy per
step and the frontier come out of the same figures. A window is a step: one is open at a time
(a step inside a window, or two windows at once, is refused), and `step(warmup=True)` marks a
step the figures leave out of step time, as a run's warmup.

`edgebench measure` names the events file in EDGEBENCH_MEASURE_EVENTS (EVENTS_ENV); without it
(the script run on its own) nothing is written and the script runs unchanged. Misuse (ending a
window never begun, a loss outside a step) raises ValueError either way, so a script behaves the
same measured or not. A loss is any number (`float(x)`: a 0-d tensor too); one that is not
finite is written as null with `loss_text`, since a trace holds a non-finite loss only where a
run diverged. Marks from one process of the command: each process would count its own steps.

Standard library only (and edgebench.telemetry.trace's writer): no torch, nothing heavy.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from edgebench.telemetry.trace import TraceWriter

EVENTS_ENV = "EDGEBENCH_MEASURE_EVENTS"  # the events.jsonl of the run the script is measured in
STEP = "step"  # the window `step()` opens
# A measured command's run in the store (its spec, meta.json): method and backend, whatever it runs
METHOD = "measure"
BACKEND = "command"


class _Open:
    """The step or window open now."""

    def __init__(self, name: str, number: int, phase: str, begin_ns: int, loss: float | None):
        self.name, self.number, self.phase, self.begin_ns, self.loss = name, number, phase, begin_ns, loss


class _Marks:
    """The process's marks: the writer (opened at the first mark, where measured), the step count
    and the open step."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writer: TraceWriter | None = None
        self.path: str | None = None
        self.steps = 0
        self.open: _Open | None = None

    def _write(self, record: dict[str, Any]) -> None:
        """Appends one event where the process is measured; a write that fails is said once on
        stderr and marks stop (the run's figures go on without them: the script is not stopped)."""
        path = os.environ.get(EVENTS_ENV)
        if not path:
            return
        try:
            if self.writer is None or self.path != path:
                self.writer, self.path = TraceWriter(path), path
            self.writer.write(record)
        except OSError as exc:
            print(f"edgebench.measure: cannot write step marks to {path}: {exc}; marks stop here", file=sys.stderr)
            os.environ.pop(EVENTS_ENV, None)

    def begin(self, name: str, warmup: bool = False, loss: float | None = None) -> None:
        with self.lock:
            if self.open is not None:
                raise ValueError(f"edgebench.measure: {name!r} begins while {self.open.name!r} is open; steps and "
                                 "windows do not overlap (each is one step of the run's figures)")
            now = time.monotonic_ns()
            self.open = _Open(name, self.steps, "warmup" if warmup else "measure", now, loss)
            self.steps += 1
            self._write({"t_ns": now, "event": "step_begin", "step": self.open.number, "phase": self.open.phase,
                         "window": name})

    def end(self, name: str) -> float:
        with self.lock:
            now = time.monotonic_ns()
            opened = self.open
            if opened is None or opened.name != name:
                raise ValueError(f"edgebench.measure: {name!r} ends but " + (
                    "nothing is open" if opened is None else f"{opened.name!r} is open") + "; end what you began")
            self.open = None
            seconds = (now - opened.begin_ns) / 1e9
            record: dict[str, Any] = {"t_ns": now, "event": "step_end", "step": opened.number, "phase": opened.phase,
                                      "duration_s": seconds, "window": name}
            if opened.loss is not None:
                if math.isfinite(opened.loss):
                    record["loss"] = opened.loss
                else:
                    record["loss_text"] = str(opened.loss)
            self._write(record)
            return seconds

    def loss(self, value: Any) -> None:
        loss = _number(value)
        with self.lock:
            if self.open is None:
                raise ValueError("edgebench.measure: record_loss outside a step; call it inside `with measure.step()` "
                                 "or between begin_window and end_window")
            self.open.loss = loss


_MARKS = _Marks()


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"edgebench.measure: a loss is a number, not {type(value).__name__}") from exc


def active() -> bool:
    """Whether this process is measured by `edgebench measure` (its marks are written)."""
    return bool(os.environ.get(EVENTS_ENV))


@contextmanager
def step(loss: Any = None, warmup: bool = False) -> Iterator[None]:
    """One training step: its wall time (and `loss`, or the one `record_loss` gives inside) is
    recorded as the run's step. `warmup=True`: a step left out of step time, as a run's warmup.
    A step that raises still ends (its time is recorded) and the exception goes on."""
    _MARKS.begin(STEP, warmup, None if loss is None else _number(loss))
    try:
        yield
    finally:
        _MARKS.end(STEP)


def begin_window(name: str) -> None:
    """Zeus's style: a step begins, named `name` (any text); end it with end_window(name)."""
    _MARKS.begin(str(name))


def end_window(name: str) -> float:
    """Ends the window `name`; returns its wall time in seconds (the run's figures add its energy)."""
    return _MARKS.end(str(name))


def record_loss(value: Any) -> None:
    """The open step's loss (a number, or anything float() takes: a 0-d tensor)."""
    _MARKS.loss(value)
