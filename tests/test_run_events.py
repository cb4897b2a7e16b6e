"""events.jsonl (issue 71: everything from outside is checked once, at the boundary, against one
typed definition): `figures.run_events` is the one definition of each event; the Python worker's
trace reads back through it (a tiny real run), the native worker's too (tests/test_native.py
reads each of its runs through it); a damaged trace is one line naming events.jsonl, the line,
the event's field and the value, and `edgebench ingest` stores nothing of it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from edgebench.figures.run import figures_of_run_dir, status_of_run_dir
from edgebench.figures.run_events import (
    KINDS,
    MAX_TEXT_CHARS,
    Diverged,
    Eval,
    StepBegin,
    StepEnd,
    event_of,
    events_of,
    read_events,
)
from edgebench.figures.steps import step_statistics
from edgebench.runner import supervisor
from edgebench.runner.spec import RunSpec
from edgebench.untrusted import BadRecord
from results_fixtures import FakeRun
from test_untrusted import one_line_exit_2

FIX = "it is not what edgebench writes"


def tiny(**overrides) -> RunSpec:
    fields = dict(model="tiny", method="sgd", steps=3, warmup_steps=1, batch_size=2, text_length=16,
                  sample_hz=20, run_id="events", threads=1)
    return RunSpec(**{**fields, **overrides})


# --- the writers ------------------------------------------------------------------------------

def test_the_python_workers_events_read_back_through_the_definition(tmp_path):
    """A tiny eager run that evaluates and saves writes every kind its loop writes; each reads
    back checked, and the figures made of them are the raw lines' (the same steps, losses)."""
    supervisor.run_spec(tiny(eval_every=2, eval_samples=2, save_dir="saved"), tmp_path)
    trace = read_events(tmp_path / "events.jsonl")
    kinds = [e.event for e in trace.events]
    assert {"predicted", "load_begin", "load_end", "step_begin", "step_end", "eval", "save_begin",
            "save_end"} <= set(kinds), kinds
    raw = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert len(trace.events) == len(raw) and trace.bad_lines == 0  # every line a known, good event
    ends = [e for e in trace.events if isinstance(e, StepEnd)]
    assert [e.loss for e in ends] == [r["loss"] for r in raw if r["event"] == "step_end"]
    assert all(isinstance(e, Eval) and e.samples == 2 and e.end_ns >= e.t_ns for e in trace.events
               if e.event == "eval")
    assert figures_of_run_dir(tmp_path)["status"] == "ok"


def test_a_diverged_python_run_keeps_its_non_finite_loss_readable(tmp_path):
    """A NaN loss is what a diverged run records: in its last step_end and in `diverged`."""
    supervisor.run_spec(tiny(lr=1e30, steps=8), tmp_path)
    events = read_events(tmp_path / "events.jsonl").events
    (diverged,) = [e for e in events if isinstance(e, Diverged)]
    last = [e for e in events if isinstance(e, StepEnd)][-1]
    assert diverged.loss is not None and not math.isfinite(diverged.loss) and last.step == diverged.step
    assert figures_of_run_dir(tmp_path)["status"] == "diverged"


def test_every_kind_the_writers_write_is_defined():
    """The kinds the Python worker, the native worker (its Events::write calls and Failure events)
    and the host write are the kinds defined here, no more and no fewer."""
    import re

    from edgebench.native.build import SOURCES

    root = Path(__file__).resolve().parents[1] / "edgebench"
    python = set(re.findall(r'"event": "(\w+)"', (root / "runner" / "worker.py").read_text()))
    python |= set(re.findall(r'"event": "(\w+)"', (root / "results" / "heldout.py").read_text()))
    native = set()
    for path in sorted(SOURCES.glob("*.cpp")):
        if path.name == "worker_tests.cpp":
            continue
        text = path.read_text()
        native |= set(re.findall(r'events(?:->|\.)write\("(\w+)"', text))
        native |= set(re.findall(r'Failure\(\w+, "(\w+)"', text))
    assert python | native == set(KINDS), (python | native) ^ set(KINDS)


# --- damaged traces ---------------------------------------------------------------------------

STEP = {"t_ns": 10, "event": "step_end", "step": 2, "phase": "measure", "loss": 1.5, "duration_s": 0.2}
HOSTILE = [
    ({"t_ns": 10, "event": "step_begin", "step": "3"}, "step_begin.step is '3', not a whole number 0 or more"),
    ({"t_ns": 10, "event": "step_begin", "step": -1}, "step_begin.step is -1, not a whole number 0 or more"),
    ({**STEP, "duration_s": math.nan}, "step_end.duration_s is nan, not a number 0 or more"),
    ({**STEP, "duration_s": -0.5}, "step_end.duration_s is -0.5, not a number 0 or more"),
    ({**STEP, "phase": "cooldown"}, "step_end.phase is 'cooldown', not one of warmup, measure"),
    ({**STEP, "step": 1.5}, "step_end.step is 1.5, not a whole number"),
    ({"t_ns": 10, "event": "error", "detail": "x" * 10_000_000}, "error.detail holds 10,000,000 characters"),
    ({"t_ns": 10, "event": "memory", "vm_hwm_bytes": True}, "memory.vm_hwm_bytes is True, not a whole number"),
    ({"event": "load_begin"}, "load_begin.t_ns is missing"),
    ({"t_ns": 10, "event": "predicted", "memory": {"peak_bytes": "huge"}}, "predicted.memory.peak_bytes is 'huge'"),
    ({"t_ns": 10, "event": "eval_weights", "end_ns": 20, "after_steps": "../x"}, "eval_weights.after_steps is '../x'"),
    ({"t_ns": 10, "event": "eval", "end_ns": 5, "after_steps": 0, "samples": 1, "tokens": 1, "loss_sum": 1.0,
      "correct": 0}, "eval.end_ns 5 is before its t_ns 10"),
]


@pytest.mark.parametrize("event,words", HOSTILE, ids=[w.split(" ")[0] for _, w in HOSTILE])
def test_a_bad_event_is_one_line_naming_the_file_the_line_and_the_field(event, words):
    with pytest.raises(BadRecord) as refused:
        event_of(event, "run/events.jsonl line 7")
    message = str(refused.value)
    assert message.startswith(f"run/events.jsonl line 7: {words}") and FIX in message, message
    assert "\n" not in message and len(message) < 400


def test_a_non_finite_loss_is_read_only_where_the_run_diverged():
    steps = [{**STEP, "t_ns": i, "step": i, "loss": loss} for i, loss in enumerate((2.0, math.inf, 1.0))]
    with pytest.raises(BadRecord, match=r"^events line 2: step_end\.loss is inf at step 1, a non-finite loss"):
        events_of(steps, "events")
    last = events_of([*steps[:1], steps[2], {**STEP, "t_ns": 3, "step": 3, "loss": math.nan},
                      {"t_ns": 3, "event": "diverged", "step": 3, "loss": math.nan}], "events")
    assert isinstance(last[-1], Diverged) and math.isnan(last[-2].loss)  # type: ignore[union-attr]
    with pytest.raises(BadRecord, match="step_end.loss is '1.0', not a number"):
        event_of({**STEP, "loss": "1.0"}, "events")


def test_a_kind_this_edgebench_does_not_know_is_left_out_and_its_figures_stand(tmp_path):
    run = FakeRun(run_id="r1").write(tmp_path / "src")
    before = figures_of_run_dir(run)
    lines = (run / "events.jsonl").read_text()
    newer = json.dumps({"t_ns": 1, "event": "checkpointed", "step": "whatever", "bytes": -5})
    (run / "events.jsonl").write_text(newer + "\n" + lines + json.dumps({"t_ns": 2, "note": "no kind"}) + "\n")
    assert figures_of_run_dir(run) == before
    assert event_of({"event": 5}, "x") is None and event_of({}, "x") is None


def test_last_step_is_the_checked_step_of_the_last_step_begin():
    events = events_of([{"t_ns": 1, "event": "step_begin", "step": 0, "phase": "warmup"},
                        {**STEP, "t_ns": 2, "step": 0, "phase": "warmup"},
                        {"t_ns": 3, "event": "step_begin", "step": 0}], "events")
    assert isinstance(events[-1], StepBegin) and events[-1].phase == "measure"  # a trace before phases
    stats = step_statistics(events)
    assert stats["last_step"] == 0 and stats["steps_done"] == 0 and stats["loss_first"] == 1.5


def _damaged_run(tmp_path: Path, event: dict, name: str = "r1") -> tuple[Path, int]:
    """A good run directory whose events.jsonl has `event` on a line of its own: (the run, the line)."""
    run = FakeRun(run_id=name).write(tmp_path / "src")
    lines = (run / "events.jsonl").read_text().splitlines()
    lines.insert(3, json.dumps(event))
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    return run, 4


@pytest.mark.parametrize("event,words", [HOSTILE[0], HOSTILE[1], HOSTILE[2], HOSTILE[6]],
                         ids=["last_step-text", "step-negative", "duration-nan", "detail-10MB"])
def test_ingest_of_a_run_with_a_bad_event_says_which_without_a_traceback_and_stores_nothing(
        tmp_path, edgebench_here, event, words):
    run, line = _damaged_run(tmp_path, event)
    done = edgebench_here("ingest", str(run), "--store", "s/store.duckdb", cwd=tmp_path)
    one_line_exit_2(done, f"{run / 'events.jsonl'} line {line}: {words}")
    assert "x" * 100 not in done.stderr
    assert not (tmp_path / "s" / "raw").exists()
    with pytest.raises(BadRecord, match="events.jsonl line 4"):
        figures_of_run_dir(run)
    result = json.loads((run / "result.json").read_text())  # with raw end facts, its status reads the events too
    (run / "result.json").write_text(json.dumps({**result, "end": {"exit_code": 1}}))
    with pytest.raises(BadRecord, match="events.jsonl line 4"):
        status_of_run_dir(run)


def test_a_damaged_trace_stores_nothing_while_a_good_run_beside_it_goes_in(tmp_path):
    from edgebench.results.store import Store

    bad, _ = _damaged_run(tmp_path, HOSTILE[1][0], "bad")
    good = FakeRun(run_id="good").write(tmp_path / "src")
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(BadRecord, match="step_begin.step is -1"):
            store.ingest_run(bad, device="pi")
        store.ingest_run(good, device="pi")
        assert [r["run_id"] for r in store.runs()] == ["good"]
        assert store.con.execute("SELECT count(*) FROM steps WHERE step < 0").fetchall() == [(0,)]


def test_the_live_view_names_a_bad_event_and_leaves_it_out(tmp_path):
    from edgebench.live.follow import LocalRun
    from edgebench.live.state import LiveState

    run, _ = _damaged_run(tmp_path, {**STEP, "loss": "low"})
    source = LocalRun(run)
    state = LiveState(source=source.label)
    state.apply(source.poll())
    assert state.follow_error is not None and "events.jsonl: step_end.loss is 'low'" in state.follow_error
    assert all(isinstance(e.loss, float) for e in state.events if isinstance(e, StepEnd))
    assert state.last_step is not None and state.last_step.step == FakeRun().steps - 1


def test_the_supervisor_says_a_foreign_trace_is_one_and_still_writes_its_result(tmp_path):
    sup = supervisor.Supervisor(RunSpec(model="tiny", method="sgd", run_id="x"), tmp_path / "run")
    sup.out.mkdir(parents=True)
    sup._cpu_start = {}
    (sup.out / "events.jsonl").write_text(json.dumps({"t_ns": 1, "event": "predicted", "memory": [1]}) + "\n")
    from edgebench.telemetry.clock import clock_pair

    result = sup._finish(clock_pair(), 0, None, 0, False, {})
    assert result["status"] == "error" and "events.jsonl line 1: predicted.memory is [1], not a JSON object" \
        in result["detail"]
    assert (sup.out / "result.json").exists()


def test_detail_is_capped_by_the_python_writer():
    from edgebench.runner.worker import _cut

    assert _cut("e" * 10) == "e" * 10
    long = _cut("e" * (MAX_TEXT_CHARS + 5))
    assert len(long) == MAX_TEXT_CHARS and event_of({"t_ns": 1, "event": "error", "detail": long}, "x")
