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
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgebench.backends.program import BATCH_INPUTS, check_batch, open_program, program_lr
from edgebench.cli_types import MAX_SEED
from edgebench.methods.knobs import MAX_ACCUMULATION
from edgebench.native.memory import PTE, predict
from edgebench.runner.native import BATCHES, PLAN, PLAN_FORMAT
from edgebench.runner.spec import MAX_DURATION_S, MAX_STEPS, MAX_THREADS, RunSpec


@dataclass(frozen=True)
class Whole:
    """A whole number from `least` to `most`."""

    least: int
    most: int


@dataclass(frozen=True)
class Real:
    """A finite number from `least` (more than it, with `above`) to `most`."""

    least: float
    most: float
    above: bool = False


TEXT = "text"  # read where it is used (kind, optimizer, dtype, a name in the program)
NAME = "name"  # a file name joined to a folder: one plain path component ('/' nowhere, not '.' first)
NAME_END = "name-end"  # what follows a NAME in one file name ('/' nowhere)
MORE = "more"  # the value before it repeats (an input's dimensions)
INT64 = 2**63 - 1
# What each line's values may be, in order. The one definition of the plan's ranges: write_plan
# checks every line it writes against it, and the worker every line it reads (build.py
# generates it into plan_values.h), so a hand-edited plan cannot make it crash, hang or write
# outside its folders. A key not here (`predicted`: JSON, echoed) is not checked.
PLAN_VALUES: dict[str, tuple[Whole | Real | str, ...]] = {
    "kind": (TEXT,),
    "optimizer": (TEXT,),
    "group_lr": (Real(0.0, math.inf, above=True),) * 2,
    "total_steps": (Whole(1, 2 * MAX_STEPS),),  # warmup and measured
    "warmup_steps": (Whole(0, MAX_STEPS),),
    "steps": (Whole(1, MAX_STEPS),),
    "duration_s": (Real(0.0, MAX_DURATION_S),),  # 0: `steps` steps
    "warmup_fraction": (Real(0.0, 1.0),),
    "min_lr_fraction": (Real(0.0, 1.0),),
    "clip": (Real(0.0, math.inf),),  # 0: none
    "momentum": (Real(0.0, 1.0),),
    "betas": (Real(0.0, 1.0),) * 2,
    "eps": (Real(0.0, math.inf),),
    "weight_decay": (Real(0.0, math.inf), TEXT),  # and its kind: l2 or decoupled
    "accumulation": (Whole(1, MAX_ACCUMULATION),),
    "threads": (Whole(0, MAX_THREADS),),  # 0: the runtime's default
    "seed": (Whole(0, MAX_SEED),),
    "mezo_eps": (Real(0.0, math.inf, above=True),),
    "eval_every": (Whole(0, INT64),),  # 0: none
    "eval_weights": (NAME, Whole(1, 20), NAME_END),  # 20 digits hold any step
    "batches": (NAME,),
    "batch_count": (Whole(1, 2 * MAX_STEPS * MAX_ACCUMULATION),),
    "input": (TEXT, TEXT, Whole(1, 2**31 - 1), MORE),  # ExecuTorch's sizes are int32
    "param": (TEXT, Whole(0, 1), Whole(0, 2**62)),  # lr group; elements (4 bytes each: a size that fits 64 bits)
}


def _refused(rule: Whole | Real | str, text: str) -> bool:
    """Whether the worker refuses `text` as a value of `rule` (plan.cpp's check)."""
    if isinstance(rule, Whole):
        return not re.fullmatch(r"[+-]?[0-9]+", text) or not rule.least <= int(text) <= rule.most
    if isinstance(rule, Real):
        try:
            value = float(text)
        except ValueError:
            return True
        return not math.isfinite(value) or value < rule.least or (rule.above and value == rule.least) \
            or value > rule.most
    if rule == NAME:
        return "/" in text or text.startswith(".")
    return rule == NAME_END and "/" in text


def plan_problem(line: str) -> str | None:
    """What the worker would refuse in one plan line (None: nothing), by PLAN_VALUES."""
    key, *values = line.split()
    rules = PLAN_VALUES.get(key)
    if rules is None:
        return None
    more = rules[-1] == MORE
    if more:
        rules = rules[:-1]
    if len(values) < len(rules) or (len(values) > len(rules) and not more):
        return f"{key}: {len(values)} values, the worker reads {len(rules)}"
    for i, text in enumerate(values):
        rule = rules[min(i, len(rules) - 1)]
        if _refused(rule, text):
            return f"{key}: {text!r} is not a {rule}"
    return None


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
    from edgebench.backends.et_optimizers import program_weight_decay
    from edgebench.figures.learning import DEFAULT_EVAL_EVERY
    from edgebench.methods import optim
    from edgebench.methods.optimizers import optimizer

    opt = optimizer(method.optimizer)
    lr = program_lr(spec.lr, method, manifest, fresh_weights=spec.fresh_weights)
    weight_decay = program_weight_decay(spec.weight_decay, method, manifest, spec.program)
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
        f"weight_decay {weight_decay!r} {opt.decay}",
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
    # from a checked RunSpec none is refused: one that is would be a range here that is not the host's
    problems = [why for why in map(plan_problem, lines[1:]) if why]
    if problems:
        raise ValueError(f"run {spec.run_id}: the native worker would refuse its plan: {'; '.join(problems)}")
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
