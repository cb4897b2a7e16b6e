"""The worker: one fresh process that loads the model and runs the training steps.

It writes events.jsonl (flushed per line) and reports how it ended through its exit
code; the supervisor turns that into result.json, even when the worker is killed.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebench.errors import EdgebenchError
from edgebench.figures.learning import DEFAULT_EVAL_EVERY, eval_point, heldout_counts, parse_target, reached
from edgebench.figures.run_events import MAX_TEXT_CHARS, Eval
from edgebench.figures.status import (
    EXIT_DIVERGED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NO_SPACE,
    EXIT_OK,
    EXIT_OOM,
    EXIT_UNSUPPORTED,
    LossWatch,
)
from edgebench.runner.oom_score import volunteer_for_oom_kill
from edgebench.runner.spec import RunSpec
from edgebench.telemetry.gpu import cuda_memory_sample
from edgebench.telemetry.trace import TraceWriter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import numpy as np

    from edgebench.model.config import VLMConfig

SUPERVISOR_PID_ENV = "EDGEBENCH_SUPERVISOR_PID"
HELDOUT_SEED = 1 << 31  # the held-out stream's seed offset (batches_for)
EVAL_WEIGHTS = "eval-weights-{step:06d}.safetensors"  # an exported program's weights at an evaluation point
PR_SET_PDEATHSIG = 1


class Interrupted(EdgebenchError):
    """Raised in the main thread when SIGTERM or SIGINT arrives, so the step loop stops cleanly."""


def _on_signal(signum: int, frame: object) -> None:
    # Once is enough: a second Ctrl-C must not break the recording of the first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Interrupted("Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name)


def die_with_parent(sig: int, env: str) -> None:
    """Asks the kernel to send `sig` to this process when its parent dies (Linux prctl), so
    a killed supervisor (or host command) never leaves a run going on unwatched; if the
    parent named in `env` is already gone, stop now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's own kill on the way out is all there is
    expected = os.environ.get(env)
    if expected and os.getppid() != int(expected):
        sys.exit(EXIT_INTERRUPTED)


def batches_for(spec: RunSpec, part: str = "train") -> Iterator[dict[str, np.ndarray]]:
    """The run's batches: its folder dataset, else the synthetic task (numpy, no torch)."""
    return batch_source(spec, part)()


def batch_source(spec: RunSpec, part: str = "train") -> Callable[[], Iterator[dict[str, np.ndarray]]]:
    """What makes the run's batches, the dataset read and the config resolved once: each call
    starts them again from the same seed (the held-out set is the same at every evaluation).

    With held-out evaluation, part "heldout" is what training never sees: a seed-fixed share
    of a folder dataset (the rest is "train"), or the synthetic task drawn from a stream of
    its own (seed + HELDOUT_SEED; training seeds stay below it). Held-out rows are never packed.
    """
    from edgebench.data.synthetic import synthetic_batches

    cfg = run_config(spec)
    heldout = part == "heldout"
    seed = spec.seed + HELDOUT_SEED if heldout else spec.seed
    packing = spec.packing and not heldout
    if spec.data_dir:
        from edgebench.data.folder import FolderDataset

        data = FolderDataset(spec.data_dir, spec.tokenizer, checkpoint=spec.checkpoint)
        if spec.eval_every or spec.target:
            data.hold_out(spec.eval_fraction, spec.seed + HELDOUT_SEED, part)
        return lambda: data.batches(cfg, spec.batch_size, spec.text_length, seed, spec.image_size, packing)
    return lambda: synthetic_batches(cfg, spec.batch_size, spec.text_length, seed, image_size=spec.image_size,
                                     packing=packing)


def image_budget(cfg: VLMConfig, max_image_size: int | None) -> VLMConfig:
    """The config with images resized to `max_image_size` before tiling (None: unchanged);
    the model's weights do not depend on it, only the number of views per image does."""
    import dataclasses

    if max_image_size is None or max_image_size == cfg.max_img_size:
        return cfg
    return dataclasses.replace(cfg, max_img_size=max_image_size).validate()


def run_config(spec: RunSpec) -> VLMConfig:
    """The config the run trains: the named one or the checkpoint's own, with its image budget."""
    from edgebench.model.checkpoint import read_config
    from edgebench.model.config import get_config

    cfg = get_config(spec.model) if spec.checkpoint is None else read_config(spec.checkpoint)
    return image_budget(cfg, spec.max_image_size)


def predicted_memory(spec: RunSpec) -> dict[str, Any] | None:
    """The method's memory prediction (an estimate), or None where it cannot be made."""
    from edgebench.backends import BACKENDS

    if getattr(BACKENDS.get(spec.backend), "torch_free", False):
        return None  # the memory model describes eager torch runs
    try:
        from edgebench.methods import memory, parse_method

        return memory.predict(run_config(spec), parse_method(spec.method), spec.batch_size,
                              spec.text_length, image_size=spec.image_size)
    except Exception as exc:  # a prediction must never stop the run
        return {"error": f"{type(exc).__name__}: {exc}"}


def train(spec: RunSpec, events: TraceWriter, out: str = ".") -> int:
    """Runs warmup then measured steps (then saves the weights if asked); returns the exit code."""
    from edgebench.backends import BACKENDS, UnsupportedBackend, create

    if spec.threads and not getattr(BACKENDS.get(spec.backend), "torch_free", False):
        import torch

        torch.set_num_threads(spec.threads)
    events.write({"t_ns": time.monotonic_ns(), "event": "predicted", "memory": predicted_memory(spec)})
    batches = batches_for(spec)
    events.write({"t_ns": time.monotonic_ns(), "event": "load_begin"})
    try:
        backend = create(spec)
        backend.setup(spec, next(batches))
    except UnsupportedBackend as exc:
        events.write({"t_ns": time.monotonic_ns(), "event": "unsupported", "detail": _cut(str(exc))})
        return EXIT_UNSUPPORTED
    events.write({"t_ns": time.monotonic_ns(), "event": "load_end"})

    # The CUDA allocator is readable only from inside this process: record it per step.
    gpu_memory = cuda_memory_sample if spec.accelerator == "cuda" else dict
    deadline = None if spec.duration_s is None else time.monotonic() + spec.duration_s
    evaluation = Evaluation(spec, backend, events, Path(out))
    watch = LossWatch()
    step = 0
    while True:
        phase = "warmup" if step < spec.warmup_steps else "measure"
        measured = step - spec.warmup_steps
        if evaluation.due(step) and evaluation.run(step):
            break  # the target is reached: what it cost is what the run is for
        if phase == "measure":
            if deadline is None and measured >= spec.steps:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
        batch = next(batches)
        begin = time.monotonic_ns()
        events.write({"t_ns": begin, "event": "step_begin", "step": step, "phase": phase})
        loss = float(backend.step(batch, consume=True))  # its pixels need not live through backward
        del batch  # nor while the next batch is made (17 views: 51 MB)
        end = time.monotonic_ns()
        events.write({"t_ns": end, "event": "step_end", "step": step, "phase": phase,
                      "loss": loss, "duration_s": (end - begin) / 1e9, **gpu_memory()})
        if watch.diverged(loss):
            events.write({"t_ns": end, "event": "diverged", "step": step, "loss": loss})
            return EXIT_DIVERGED
        step += 1
    if evaluation.wanted and evaluation.last != step:
        evaluation.run(step)  # after the last step
    if spec.save_dir:
        folder = Path(out) / spec.save_dir  # an absolute save_dir stays as it is
        events.write({"t_ns": time.monotonic_ns(), "event": "save_begin", "path": str(folder)})
        backend.save(folder)  # type: ignore[attr-defined]  # eager's; other backends refuse --save earlier
        events.write({"t_ns": time.monotonic_ns(), "event": "save_end", "path": str(folder)})
    backend.close()
    return EXIT_OK


class Evaluation:
    """Held-out evaluation inside the training loop: before the first step, after every
    `eval_every` steps and after the last. Each is one `eval` event of raw counts
    (edgebench.figures.learning makes the figures), timed apart from the steps. An exported
    program computes its loss only: there, each evaluation point saves the trained weights
    instead (`eval_weights`: EVAL_WEIGHTS in the run directory) and the host evaluates them
    after the run (edgebench.results.heldout), so a target cannot stop such a run early. An
    evaluation that fails is recorded (`eval_failed`) and training goes on without it."""

    def __init__(self, spec: RunSpec, backend: Any, events: TraceWriter, out: Path):
        self.spec, self.backend, self.events, self.out = spec, backend, events, out
        self.wanted = bool(spec.eval_every or spec.target)
        self.every = spec.eval_every or DEFAULT_EVAL_EVERY
        self.batches = -(-spec.eval_samples // spec.batch_size)
        self.target = parse_target(spec.target) if spec.target else None
        self.heldout: Callable[[], Iterator[dict[str, np.ndarray]]] | None = None  # made at the first evaluation
        self.last: int | None = None

    def due(self, step: int) -> bool:
        return self.wanted and step % self.every == 0

    def run(self, step: int) -> bool:
        """Evaluates after `step` steps (or saves the weights to evaluate); True when the target is reached."""
        self.last = step
        begin = time.monotonic_ns()
        try:
            if not hasattr(self.backend, "evaluate"):
                self._save_weights(step, begin)
                return False
            counts = self._counts()
        except (Interrupted, MemoryError):
            raise
        except Exception as exc:  # the training figures stand without it
            self.events.write({"t_ns": begin, "event": "eval_failed", "after_steps": step,
                               "detail": _cut(f"{type(exc).__name__}: {exc}")})
            self.wanted = False
            return False
        end = time.monotonic_ns()
        self.events.write({"t_ns": begin, "end_ns": end, "event": "eval", "after_steps": step, **counts})
        point = Eval(t_ns=begin, end_ns=end, after_steps=step, samples=int(counts["samples"]),
                     tokens=int(counts["tokens"]), loss_sum=float(counts["loss_sum"]), correct=int(counts["correct"]))
        return self.target is not None and reached(eval_point(point), *self.target)

    def _counts(self) -> dict[str, float]:
        self.heldout = self.heldout or batch_source(self.spec, "heldout")
        return heldout_counts(self.heldout(), self.batches, self.backend.evaluate)

    def _save_weights(self, step: int, begin: int) -> None:
        from edgebench.backends.program import write_trainable

        if step:  # before the first step the weights are the exported ones, which the host builds itself
            write_trainable(self.out / EVAL_WEIGHTS.format(step=step), self.backend.named_parameters())
        self.events.write({"t_ns": begin, "end_ns": time.monotonic_ns(), "event": "eval_weights", "after_steps": step})


def _cut(detail: str) -> str:
    """An event's detail as the trace may hold it (figures.run_events.MAX_TEXT_CHARS at most)."""
    return detail if len(detail) <= MAX_TEXT_CHARS else detail[:MAX_TEXT_CHARS - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgebench.runner.worker")
    parser.add_argument("spec")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    die_with_parent(signal.SIGKILL, SUPERVISOR_PID_ENV)  # a dying supervisor takes its worker with it
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    spec = RunSpec.load(args.spec)
    volunteer_for_oom_kill()  # the OOM killer takes this process, never its supervisor
    try:
        events = TraceWriter(Path(args.out) / "events.jsonl")
    except OSError as exc:
        print(f"cannot open the events trace: {exc}", file=sys.stderr)
        return EXIT_NO_SPACE if exc.errno == errno.ENOSPC else EXIT_ERROR
    try:
        return _ended(events, spec, args.out)
    except Interrupted:  # a signal while the end itself was being recorded: it is recorded enough
        return EXIT_INTERRUPTED
    except OSError as exc:  # the disk is full: nothing more can be written; the supervisor says so
        if exc.errno == errno.ENOSPC:
            return EXIT_NO_SPACE
        raise
    finally:
        try:
            events.close()
        except OSError:
            pass


def _ended(events: TraceWriter, spec: RunSpec, out: str) -> int:
    """Runs training and writes how it ended as the last event; returns the exit code."""
    try:
        return train(spec, events, out)
    except Interrupted as exc:
        events.write({"t_ns": time.monotonic_ns(), "event": "interrupted", "detail": _cut(f"stopped by {exc}")})
        return EXIT_INTERRUPTED
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise
        detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        events.write({"t_ns": time.monotonic_ns(), "event": "error", "detail": _cut(detail)})
        return EXIT_ERROR
    except MemoryError as exc:
        events.write({"t_ns": time.monotonic_ns(), "event": "oom", "detail": _cut(f"MemoryError: {exc}")})
        return EXIT_OOM
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        if "out of memory" in str(exc).lower():  # e.g. CUDA OOM, DefaultCPUAllocator
            events.write({"t_ns": time.monotonic_ns(), "event": "oom", "detail": _cut(detail)})
            return EXIT_OOM
        events.write({"t_ns": time.monotonic_ns(), "event": "error", "detail": _cut(detail)})
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
