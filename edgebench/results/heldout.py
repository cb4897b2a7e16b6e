"""Held-out evaluation, on the host, of the weights an exported program's run saved at each
evaluation point (events.jsonl `eval_weights`, edgebench.runner.worker.Evaluation): an
ExecuTorch or ONNX Runtime program computes its loss only, so the host loads the saved
weights into the eager model the program was exported from and counts the held-out set as
an eager run does (edgebench.methods.evaluate). Its `eval` events, marked
`"evaluated_by": "host"` and timed by the device's saving, go to HOST_EVALS beside the run's
own trace; the figures read both (edgebench.figures.run.run_events).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from edgebench.figures.learning import heldout_counts
from edgebench.figures.run import HOST_EVALS
from edgebench.figures.run_events import MAX_TEXT_CHARS, Eval, EvalFailed, EvalWeights, read_events
from edgebench.figures.run_meta import RunMeta
from edgebench.runner.spec import RunSpec
from edgebench.runner.worker import EVAL_WEIGHTS
from edgebench.telemetry.trace import TraceWriter


def evaluate_saved_weights(run_dir: Path) -> int:
    """Evaluates each saved evaluation point not yet in HOST_EVALS; returns how many it did.
    One that cannot be evaluated here (its weights or data missing on this host) is recorded
    `eval_failed`, with the reason, and the run's other figures stand. The events are read checked
    (figures.run_events: a bad one raises untrusted.BadRecord); a saved point's file is named by
    its whole-number `after_steps` (runner.worker.EVAL_WEIGHTS), no path from the trace is opened."""
    try:  # most runs saved none: a byte search spares every ingest a parse of the whole trace
        if b'"eval_weights"' not in (run_dir / "events.jsonl").read_bytes():
            return 0
    except FileNotFoundError:
        return 0
    saved = [e for e in read_events(run_dir / "events.jsonl").events if isinstance(e, EvalWeights)]
    done = {e.after_steps for e in read_events(run_dir / HOST_EVALS).events
            if isinstance(e, (Eval, EvalFailed))} if saved else set()
    todo = sorted((e for e in saved if e.after_steps not in done), key=lambda e: e.after_steps)
    if not todo:
        return 0
    meta = RunMeta.from_json(json.loads((run_dir / "meta.json").read_text()), str(run_dir / "meta.json"))
    spec = RunSpec.from_dict(meta.spec)
    with TraceWriter(run_dir / HOST_EVALS) as out:
        try:
            model, counts = _evaluator(spec)
        except Exception as exc:  # e.g. the run's checkpoint or data folder is a device's path
            for event in todo:
                out.write(_failed(event, exc))
            return len(todo)
        for event in todo:
            begin = time.perf_counter()
            try:
                step = event.after_steps  # the file's name from a whole number (checked), never the device's text
                if step:  # step 0's weights are the exported ones: the model as built
                    _load(model, run_dir / EVAL_WEIGHTS.format(step=step))
                out.write({"t_ns": event.t_ns, "end_ns": event.end_ns, "event": "eval",
                           "after_steps": step, **counts(), "evaluated_by": "host",
                           "host_seconds": round(time.perf_counter() - begin, 3)})
            except Exception as exc:
                out.write(_failed(event, exc))
    return len(todo)


def _failed(event: EvalWeights, exc: Exception) -> dict[str, Any]:
    return {"t_ns": event.t_ns, "event": "eval_failed", "after_steps": event.after_steps,
            "evaluated_by": "host", "detail": f"{type(exc).__name__}: {exc}"[:MAX_TEXT_CHARS]}


def _evaluator(spec: RunSpec) -> tuple[Any, Any]:
    """(the eager model the run's program was exported from, counts()): counts() evaluates the
    model as it is now over the run's held-out set, as the eager backend does."""
    import torch

    from edgebench.data.synthetic import to_torch
    from edgebench.methods.evaluate import evaluate_batch
    from edgebench.runner.worker import batch_source
    from exporters.lora import write_lora_into_model
    from exporters.pipeline import build_training_model, request_for_spec

    model, method, _ = build_training_model(request_for_spec(spec))
    if method.trainable == "lora":
        write_lora_into_model(model)  # the program's own names for the adapters' weights
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if method.precision == "bf16" else None
    source = batch_source(spec, "heldout")
    batches = -(-spec.eval_samples // spec.batch_size)

    def counts() -> dict[str, float]:
        return heldout_counts(source(), batches,
                              lambda batch: evaluate_batch(model, to_torch(batch), autocast and autocast()))

    return model, counts


def _load(model: Any, path: Path) -> None:
    """The saved weights into `model`, every one by name and size (a name the model lacks, or a
    size it does not have, is an error); a flat tensor takes the model's shape."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(path))
    named = dict(model.named_parameters())
    unknown = sorted(set(saved) - set(named))
    if unknown:
        raise KeyError(f"{path}: weights the model has not: {unknown[:3]}")
    with torch.no_grad():
        for name, value in saved.items():
            if value.numel() != named[name].numel():
                raise ValueError(f"{path}: {name} holds {value.numel()} values, the model's {named[name].numel()}")
            named[name].copy_(value.reshape(named[name].shape))
