"""What happened in a run, event by event: events.jsonl, one typed definition for its writers
and every reader.

Three writers write it: the Python worker (`runner/worker.py`, through
`telemetry.trace.TraceWriter`), the native C++ worker (`native/common.cpp` `Events::write`,
called from worker.cpp, program.cpp, evaluation.cpp) and, for an exported program's held-out
evaluations, the host (`results/heldout.py`, into heldout.jsonl beside it). Each line is one
event, a JSON object whose `event` names its kind; each kind is a frozen dataclass below.
`tests/test_run_events.py` runs the Python worker and the native worker and reads their traces
back through it.

Readers read the trace once, where the file is read (`read_events`: the figures, status, the
supervisor, ingest, the held-out evaluations), or one event at a time (`event_of`: the live
view, a local run's progress), and use attributes after that. Each event is checked with the
one checker of records (`figures.records.read_record`): whole numbers in their range (clocks,
steps and counts never negative), durations finite and never negative, text of at most
MAX_TEXT_CHARS characters, one of the named choices. A loss is any number, and NaN or infinity
only where the trace records a diverged loss: in `diverged`, in the run's last `step_end` (the
step it diverged at: nothing trains after it) and in an evaluation's `loss_sum` (weights the
last update made NaN evaluate to NaN before the next step's loss says so). A bad field raises
`untrusted.BadRecord`: one line naming the file and the line, `<kind>.<field>` and the value.

A line that is not a JSON object (garbage, a killed writer's cut last line) is counted, as
`telemetry.trace.read_trace` counts it; an object whose `event` is not a kind named here (a
newer writer's, or none) is skipped: a newer writer does not break an older reader. A key an
event does not know is left out.

Standard library only: the device side (the supervisor) imports it.
"""

from __future__ import annotations

import itertools
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgebench.figures.records import Caps, JSONObject, Keys, free_object, number, read_record, refused, text, whole
from edgebench.telemetry.trace import read_trace

MAX_TEXT_CHARS = 1 << 20  # an error's detail: its message and 8 frames of traceback, a few KiB as written
MAX_OBJECT_CHARS = 1 << 20  # the memory model's prediction: a few hundred characters as written
MAX_DEPTH = 32
CAPS = Caps(text_chars=MAX_TEXT_CHARS, object_chars=MAX_OBJECT_CHARS, depth=MAX_DEPTH)
Phase = Literal["warmup", "measure"]
# The memory model's prediction (`methods.memory.predict`, or {"error": ...} where it failed):
# the figures read its peak
PREDICTION = Keys({"peak_bytes": int, "error": str})


@dataclass(frozen=True)
class Predicted:
    """The memory model's prediction for the run, before it loads."""

    event: Literal["predicted"] = "predicted"
    t_ns: int = whole()  # the device's monotonic clock, as every event's
    memory: JSONObject | None = free_object(PREDICTION)  # None: the native plan held none


@dataclass(frozen=True)
class Load:
    """The backend loading the model and program (`load_begin`), and ready (`load_end`)."""

    event: Literal["load_begin", "load_end"]
    t_ns: int = whole()


@dataclass(frozen=True)
class StepBegin:
    event: Literal["step_begin"] = "step_begin"
    t_ns: int = whole()
    step: int = whole()  # from 0, warmup steps included
    phase: Phase = "measure"  # a trace written before phases: every step measured


@dataclass(frozen=True)
class StepEnd:
    event: Literal["step_end"] = "step_end"
    t_ns: int = whole()
    step: int = whole()
    phase: Phase = "measure"
    loss: float | None = number(low=None, finite=False)  # non-finite only in the trace's last step_end
    duration_s: float | None = number()  # the step's wall time
    gpu_mem_allocated_bytes: int | None = whole()  # the CUDA allocator's counters (a CUDA run's)
    gpu_mem_reserved_bytes: int | None = whole()
    gpu_mem_peak_allocated_bytes: int | None = whole()


@dataclass(frozen=True)
class Eval:
    """A held-out evaluation's raw counts (`figures.learning.eval_point` makes its figures)."""

    event: Literal["eval"] = "eval"
    t_ns: int = whole()  # as it began
    end_ns: int = whole()  # as it ended (for the host's: as the device saved the weights)
    after_steps: int = whole()  # steps trained before it
    samples: int = whole()  # held-out samples evaluated
    tokens: int = whole()  # their answer tokens
    loss_sum: float = number(finite=False)  # the summed loss over those tokens
    correct: int = whole()  # samples whose whole answer greedy decoding reproduced
    evaluated_by: Literal["host"] | None = None  # "host": of saved weights (results.heldout)
    host_seconds: float | None = number()  # how long the host took


@dataclass(frozen=True)
class EvalFailed:
    """An evaluation that could not be made; training went on without evaluations."""

    event: Literal["eval_failed"] = "eval_failed"
    t_ns: int = whole()
    after_steps: int | None = whole()
    detail: str | None = text()
    evaluated_by: Literal["host"] | None = None


@dataclass(frozen=True)
class EvalWeights:
    """An exported program's evaluation point: the trained weights saved for the host to
    evaluate (runner.worker.EVAL_WEIGHTS, named by `after_steps`, never by the trace's text)."""

    event: Literal["eval_weights"] = "eval_weights"
    t_ns: int = whole()
    end_ns: int = whole()
    after_steps: int = whole()


@dataclass(frozen=True)
class Save:
    """The trained weights being saved (`save_begin`) and saved (`save_end`)."""

    event: Literal["save_begin", "save_end"]
    t_ns: int = whole()
    path: str | None = text()  # the folder the weights went to, as the device named it (shown, never opened)


@dataclass(frozen=True)
class Memory:
    """The native worker's own kernel RSS peak, written as it ends."""

    event: Literal["memory"] = "memory"
    t_ns: int = whole()
    vm_hwm_bytes: int = whole()


@dataclass(frozen=True)
class Diverged:
    """The loss diverged (figures.status.LossWatch): the run ends here."""

    event: Literal["diverged"] = "diverged"
    t_ns: int = whole()
    step: int = whole()
    loss: float | None = number(low=None, finite=False)


# The kinds of event that end a run saying why in a line of text: the backend cannot run the
# spec here, a signal stopped it, an error, no memory left
EndedBy = Literal["unsupported", "interrupted", "error", "oom"]


@dataclass(frozen=True)
class Ended:
    """The run ended (`event` says how: EndedBy), and `detail` says why."""

    event: EndedBy
    t_ns: int = whole()
    detail: str | None = text()  # the error and where it came from; "stopped by <signal>"


Event = Predicted | Load | StepBegin | StepEnd | Eval | EvalFailed | EvalWeights | Save | Memory | Diverged | Ended
# The events a run ends with (figures.status reads the last of them)
END_KINDS = (Diverged, Ended)
# kind -> its dataclass
KINDS: Mapping[str, type[Any]] = {
    **{cls.event: cls for cls in (Predicted, StepBegin, StepEnd, Eval, EvalFailed, EvalWeights, Memory, Diverged)},
    **{kind: cls for cls in (Load, Save, Ended) for kind in typing.get_args(typing.get_type_hints(cls)["event"])}}


@dataclass(frozen=True)
class RunEvents:
    """A trace's events, checked, with what could not be read (as telemetry.trace.TraceRead counts it)."""

    events: list[Event] = field(default_factory=list)
    truncated_last_line: bool = False
    bad_lines: int = 0


def event_of(record: Mapping[str, Any], source: str) -> Event | None:
    """The event of one trace line read from `source` (the file and its line, for the message),
    every field checked; None for a kind this edgebench does not know; BadRecord naming the
    source, the kind and the field otherwise."""
    kind = record.get("event")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return None
    event: Event = read_record(cls, record, source, CAPS, kind)
    if isinstance(event, (Eval, EvalWeights)) and event.end_ns < event.t_ns:
        raise refused(source, f"{kind}.end_ns {event.end_ns} is before its t_ns {event.t_ns}")
    return event


def events_of(records: Iterable[Mapping[str, Any]], source: str, lines: Iterable[int] | None = None) -> list[Event]:
    """The events of a trace's records (each line's number in `lines`; by their order otherwise),
    each checked (`event_of`), kinds not known here left out; a non-finite loss anywhere but in
    `diverged`, the last `step_end` or an evaluation's sum is a BadRecord."""
    out: list[Event] = []
    steps: list[tuple[StepEnd, str]] = []
    for record, line in zip(records, itertools.count(1) if lines is None else lines):
        at = f"{source} line {line}"
        event = event_of(record, at)
        if event is not None:
            out.append(event)
        if isinstance(event, StepEnd):
            steps.append((event, at))
    for step, at in steps[:-1]:
        if step.loss is not None and not math.isfinite(step.loss):
            raise refused(at, f"step_end.loss is {step.loss} at step {step.step}, a non-finite loss in a step the "
                              "run went on from (a diverged loss ends the run)")
    return out


def read_events(path: str | Path) -> RunEvents:
    """The checked events of the trace at `path` (events.jsonl, or the host's heldout.jsonl);
    a missing file reads as none. A bad event raises BadRecord naming the file and its line."""
    trace = read_trace(path)
    return RunEvents(events_of(trace.records, str(path), trace.line_numbers), trace.truncated_last_line,
                     trace.bad_lines)
