"""The native worker's plan: all one run needs, as files a C++ program reads without a JSON
parser, numpy or torch (written on the host, so a board without Python can run it).

`plan.txt` holds one `key values...` per line (the worker's `Plan` reads it); `batches.bin`
holds every step's inputs, raw and little-endian, in the program's input order (an accumN
step's micro-batches one after another). The learning rates, lr groups and the method's
constants come from edgebench.methods, as the Python ExecuTorch backend takes them, so both
workers train the same way. Plans are content-addressed in the export cache: repeats of a
run share one, and deploy ships it once per device.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from edgebench.backends.program import BATCH_INPUTS, check_batch, open_program, program_lr
from edgebench.native.memory import PTE, predict
from edgebench.runner.native import BATCHES, PLAN, PLAN_FORMAT
from edgebench.runner.spec import RunSpec


def native_reason(method: Any) -> str | None:
    """Why the native worker cannot run `method` (a methods.Method); None if it can (the
    optimizer's descriptor says whether worker.cpp has its update: methods/optimizers.py)."""
    from edgebench.methods.optimizers import optimizer

    opt = optimizer(method.optimizer)
    if opt.native:
        return None
    if opt.between_calls:  # its update lives in a Python library
        return (f"{method.optimizer}'s update is {opt.between_calls[0]}, a Python library the native "
                "worker does not have; use --runtime python")
    return f"the native worker (edgebench/native/worker.cpp) has no {method.optimizer} update; use --runtime python"


def _kind(method: Any) -> str:
    from edgebench.backends.et_optimizers import update_in_program

    if method.grad_mode == "zeroth-order":
        return "forward-only"
    return "updating" if update_in_program(method) else "joint"


def _lines(spec: RunSpec, method: Any, manifest: dict[str, Any], batch_count: int) -> list[str]:
    from edgebench.figures.learning import DEFAULT_EVAL_EVERY
    from edgebench.methods import optim
    from edgebench.methods.optimizers import optimizer

    opt = optimizer(method.optimizer)
    lr = program_lr(spec.lr, method, manifest, fresh_weights=spec.fresh_weights)
    # nanoVLM's groups: the projector at max(lr, lr_mp); lomo-optim and MeZO have one lr
    one_lr = opt.update_in_backward or method.grad_mode == "zeroth-order"
    projector_lr = lr if one_lr else max(lr, optim.NANOVLM_LR_MP)
    kind = _kind(method)
    clip = 0.0 if (method.fused_update or kind != "joint") else optim.MAX_GRAD_NORM
    shapes = {i["name"]: i for i in manifest["inputs"]}
    lines = [
        PLAN_FORMAT,
        f"kind {kind}",
        f"optimizer {method.optimizer if kind != 'forward-only' else 'mezo'}",
        f"group_lr {lr!r} {projector_lr!r}",
        f"total_steps {spec.warmup_steps + spec.steps}",
        f"warmup_steps {spec.warmup_steps}",
        f"steps {spec.steps}",
        f"duration_s {spec.duration_s or 0}",
        f"warmup_fraction {optim.WARMUP_FRACTION!r}",
        f"min_lr_fraction {optim.MIN_LR_FRACTION!r}",
        f"clip {clip!r}",
        # the optimizer's constants, as methods.optim.build_optimizer passes them (0: it has none)
        f"momentum {opt.momentum!r}",
        f"betas {(opt.betas or (0.0, 0.0))[0]!r} {(opt.betas or (0.0, 0.0))[1]!r}",
        f"eps {opt.eps or 0.0!r}",
        f"weight_decay {opt.weight_decay!r}",
        f"accumulation {method.accumulation}",
        f"threads {spec.threads or 0}",
        f"seed {spec.seed}",
        f"mezo_eps {_mezo_eps()!r}",
        # held-out evaluation points (0: none), where the worker saves its weights for the host to evaluate
        f"eval_every {spec.eval_every or (DEFAULT_EVAL_EVERY if spec.target else 0)}",
        f"eval_weights {_eval_weights()}",
        f"batches {BATCHES}",
        f"batch_count {batch_count}",
    ]
    for name in BATCH_INPUTS:
        lines.append(" ".join(["input", name, shapes[name]["dtype"], *map(str, shapes[name]["shape"])]))
    # a forward-only program's weights are inputs of known size; 0: the program's own (joint)
    sizes = {i["name"]: int(np.prod(i["shape"])) for i in manifest["inputs"]}
    for name in manifest["trainable_parameters"]:
        lines.append(f"param {name} {1 if optim.is_projector(name) else 0} {sizes.get(name, 0)}")
    return lines


def _eval_weights() -> str:
    """EVAL_WEIGHTS (the Python worker's name for an evaluation point's weights) as the worker
    fills it in: PREFIX WIDTH SUFFIX around its one field, the zero-padded step."""
    from edgebench.runner.worker import EVAL_WEIGHTS

    parts = re.fullmatch(r"(\S+)\{step:0(\d+)d\}(\S+)", EVAL_WEIGHTS)
    assert parts, f"EVAL_WEIGHTS {EVAL_WEIGHTS!r} is not PREFIX{{step:0Nd}}SUFFIX, which the native worker reads"
    return " ".join(parts.groups())


def _mezo_eps() -> float:
    from edgebench.methods.mezo import EPS

    return EPS


def _micro_batches(batch: dict[str, Any], parts: int) -> list[dict[str, np.ndarray]]:
    """Rows i, i+parts, ... of each input, as the Python worker splits an accumN step."""
    from edgebench.backends.et_optimizers import batch_rows

    size = batch["input_ids"].shape[0]
    return [{k: batch_rows(v, size, i, parts) for k, v in batch.items()} for i in range(parts)]


def write_plan(spec: RunSpec, cache: Path) -> Path:
    """Writes (or finds) the plan of `spec` against its exported program; returns its folder.

    Raises UnsupportedBackend when the native worker cannot run the method."""
    from edgebench.backends.base import UnsupportedBackend
    from edgebench.methods import parse_method
    from edgebench.runner.worker import batches_for
    from exporters.pipeline import build_whole, locked

    method = parse_method(spec.method)
    reason = native_reason(method)
    if reason:
        raise UnsupportedBackend(f"method {spec.method!r} on the native ExecuTorch worker: {reason}")
    if spec.program is None:
        raise UnsupportedBackend(f"run {spec.run_id}: no exported program to plan for (spec.program is unset)")
    program, manifest = open_program(spec, "executorch", method.knobs())  # made for this method
    steps = spec.warmup_steps + spec.steps
    batches = batches_for(spec)
    next(batches)  # the Python worker's setup takes the first batch as its example: the steps start after it
    micro = []
    for _ in range(steps):
        micro += _micro_batches(next(batches), method.accumulation)
    check_batch(manifest, micro[0], program)
    lines = _lines(spec, method, manifest, len(micro))
    # the host's prediction of the worker's peak, which the worker echoes as its `predicted` event
    predicted = predict(manifest, (program / PTE).stat().st_size, method)
    lines.append("predicted " + json.dumps(predicted, separators=(",", ":")))
    digest = hashlib.sha256("\n".join(lines).encode())
    for batch in micro:
        for name in BATCH_INPUTS:
            digest.update(np.ascontiguousarray(batch[name]).tobytes())
    folder = cache / "native-plans" / digest.hexdigest()[:24]

    def build(work: Path) -> None:
        with open(work / BATCHES, "wb") as fh:
            for batch in micro:
                for name in BATCH_INPUTS:
                    fh.write(np.ascontiguousarray(batch[name]).astype(batch[name].dtype.newbyteorder("<")).tobytes())
        (work / PLAN).write_text("\n".join(lines) + "\n")

    with locked(folder):
        if not (folder / PLAN).is_file():
            build_whole(folder, build)
    return folder
