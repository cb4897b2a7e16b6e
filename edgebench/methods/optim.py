"""Optimizers, learning rates and the schedule, set up the way nanoVLM's own trainer does.

nanoVLM (train.py) trains with AdamW, a separate higher lr for the modality projector `MP.*`
than for the two backbones, a cosine schedule with linear warmup to 10% of the peak lr, and
gradient clipping at 1.0. Every backprop method here keeps that recipe and changes only the
knob it is about.

Importing this module does not import torch (only `build_optimizer` does): the ONNX Runtime
device process, which has no torch, applies the same recipe with these functions and constants
(edgebench.backends.numpy_updates).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from edgebench.methods.knobs import Method
from edgebench.methods.optimizers import GALORE_SCALE, GALORE_UPDATE_PROJ_GAP, galore_rank, is_galore_matrix, optimizer

if TYPE_CHECKING:
    import torch
    from torch import nn

# nanoVLM TrainConfig: lr_mp = 0.00512 (the backbones' 5e-5 is the adaptive optimizers' default
# lr in their descriptors, methods/optimizers.py).
NANOVLM_LR_MP = 5.12e-3
MAX_GRAD_NORM = 1.0
WARMUP_FRACTION = 0.03  # nanoVLM: warmup over 3% of the steps
MIN_LR_FRACTION = 0.1  # nanoVLM: cosine decays to 10% of the peak

# Adapters (LoRA) and BitFit's biases train few weights, at a larger lr (peft's usual 1e-4..1e-3).
ADAPTER_LR = 1e-3
# Each *_LR below has a FRESH_ twin: the lr for a config's random weights (a run without a
# checkpoint), bench/learning.py's pick on tiny (the fastest to its held-out target; where none
# of its grid reached it within the cap, the lowest held-out loss there). A key it lacks keeps
# the checkpoint's lr.
FRESH_ADAPTER_LR = {"bitfit": 1.0, "lora": 3e-3}


# Estimated-gradient methods step along random directions: the update's noise grows with the
# number of trained weights n, so their lr shrinks as 1/n past REFERENCE_PARAMS (MeZO's paper
# uses 1e-6..1e-7 on 13B-66B models).
GRAD_MODE_LR = {"zeroth-order": 1e-3, "forward-mode": 1e-4}
# fresh, all weights trained: MeZO at 1e-3 diverged on tiny (held-out loss 15,126 after 200
# steps); over LoRA adapters (mezo-lora) 1e-3 stays the best
FRESH_GRAD_MODE_LR = {"zeroth-order": 3e-4, "forward-mode": 3e-4}
REFERENCE_PARAMS = 4_000_000

# bf16-stored weights (LOMO's fused SGD in bf16). Plain SGD's default (5e-2) moved nanovlm-222m's
# full-parameter loss 10.84 -> 9.78 -> 12.51 over three steps (no clipping in backward): too large.
BF16_TRAINED_LR = 1e-2
FRESH_BF16_TRAINED_LR = 3e-2


def default_lr(method: Method, n_trainable: int, *, fresh_weights: bool) -> float:
    """The backbone lr when the caller gives none: the optimizer's own (its descriptor: adaptive
    ones use nanoVLM's for a checkpoint, plain gradient steps a larger one to move in the few
    steps a benchmark runs; on a config's random weights, `fresh_weights`, the lr measured to
    learn soonest), the adapter lr for the subsets it names, a size-scaled one for estimated
    gradients.

    `n_trainable` (trained elements) and `fresh_weights` (RunSpec.fresh_weights) are required:
    every runtime must choose as eager does (an ExecuTorch run that did not scale MeZO's lr took
    222m's loss 10.84 -> 81.8 in three steps)."""
    if method.trained_dtype == "bf16":
        return FRESH_BF16_TRAINED_LR if fresh_weights else BF16_TRAINED_LR
    if method.grad_mode in GRAD_MODE_LR:
        table = FRESH_GRAD_MODE_LR if fresh_weights and method.trainable == "all" else GRAD_MODE_LR
        return table[method.grad_mode] * min(1.0, REFERENCE_PARAMS / max(1, n_trainable))
    opt = optimizer(method.optimizer)
    subset = "lora" if method.adapts else method.trainable  # lora-decoder takes LoRA's lrs (not measured apart)
    if subset in opt.adapter_lr_for:
        # peft's usual lr; BitFit's paper: 1e-4..1e-3 for the few bias terms
        return FRESH_ADAPTER_LR.get(subset, ADAPTER_LR) if fresh_weights else ADAPTER_LR
    return opt.fresh_lr if fresh_weights and opt.fresh_lr is not None else opt.default_lr


def is_projector(name: str) -> bool:
    """Parameters of nanoVLM's modality projector (`MP.*`), which get the higher lr."""
    return name.startswith("MP.") or ".MP." in name


def lr_groups(names: Iterable[str], lr: float) -> list[tuple[str, float, list[str]]]:
    """nanoVLM's lr groups over trainable parameter names, as (group, peak lr, names): the
    backbones at lr, the projector at max(lr, lr_mp); empty groups left out."""
    names = list(names)
    groups = [("backbones", lr, [n for n in names if not is_projector(n)]),
              ("MP", max(lr, NANOVLM_LR_MP), [n for n in names if is_projector(n)])]
    return [g for g in groups if g[2]]


def param_groups(model: nn.Module, lr: float) -> list[dict[str, Any]]:
    """Trainable parameters split as nanoVLM does (`lr_groups`), as torch.optim param groups."""
    params = {name: param for name, param in model.named_parameters() if param.requires_grad}
    return [{"params": [params[n] for n in names], "lr": peak, "name": group}
            for group, peak, names in lr_groups(params, lr)]


def lr_factor(step: int, total_steps: int) -> float:
    """nanoVLM's get_lr as a factor of the peak: linear warmup, cosine down to 10%."""
    warmup = max(1.0, total_steps * WARMUP_FRACTION)
    if step < warmup:
        return (step + 1) / warmup
    if step >= total_steps:
        return MIN_LR_FRACTION
    ratio = (step - warmup) / max(1.0, total_steps - warmup)
    return MIN_LR_FRACTION + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - MIN_LR_FRACTION)


def set_schedule(optimizers: Iterable[torch.optim.Optimizer], step: int, total_steps: int) -> None:
    """Set every group's lr to its peak (kept as `peak_lr`) times the schedule factor."""
    factor = lr_factor(step, total_steps)
    for opt in optimizers:
        for group in opt.param_groups:
            group.setdefault("peak_lr", group["lr"])
            group["lr"] = group["peak_lr"] * factor


def build_optimizer(name: str, groups: list[dict[str, Any]], weight_decay: float) -> torch.optim.Optimizer:
    """The library optimizer behind a knob value (the per-step ones; lomo/cg have their own
    trainers), with its descriptor's constants and the run's `weight_decay`
    (optimizers.run_weight_decay), which the library applies its own way (the descriptor's
    `decay`); its module is imported only now."""
    import importlib

    opt = optimizer(name)
    if opt.trainer != "step":
        raise ValueError(f"no per-step optimizer for {name!r}: its trainer ({opt.trainer}) owns the update")
    module, _, cls = opt.build.partition(":")
    options: dict[str, Any] = {}
    if opt.momentum:
        options["momentum"] = opt.momentum
    if opt.betas is not None:
        options["betas"] = opt.betas
    if opt.eps is not None:
        options["eps"] = opt.eps
    options["weight_decay"] = weight_decay
    options.update(opt.build_options)
    built: torch.optim.Optimizer = getattr(importlib.import_module(module), cls)(groups, **options)
    return built


def galore_options(name: str, shape: tuple[int, ...]) -> dict[str, Any]:
    """GaLoreAdamW's group options for one parameter: its projection for a block matrix, else none."""
    if not is_galore_matrix(name, shape):
        return {}
    return {"rank": galore_rank(shape), "update_proj_gap": GALORE_UPDATE_PROJ_GAP,
            "scale": GALORE_SCALE, "proj_type": "std"}


def galore_groups(model: nn.Module, lr: float) -> list[dict[str, Any]]:
    """nanoVLM's groups, with each block matrix in a GaLore group of its rank."""
    return [{"params": [param], "lr": max(lr, NANOVLM_LR_MP) if is_projector(name) else lr,
             **galore_options(name, tuple(param.shape))}
            for name, param in model.named_parameters() if param.requires_grad]
