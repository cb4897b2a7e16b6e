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
from typing import TYPE_CHECKING, Iterable

from edgebench.methods.knobs import Method

if TYPE_CHECKING:
    import torch
    from torch import nn

# nanoVLM TrainConfig: lr_mp = 0.00512, lr_vision_backbone = lr_language_backbone = 5e-5.
NANOVLM_LR_MP = 5.12e-3
NANOVLM_LR_BACKBONE = 5e-5
MAX_GRAD_NORM = 1.0
WARMUP_FRACTION = 0.03  # nanoVLM: warmup over 3% of the steps
MIN_LR_FRACTION = 0.1  # nanoVLM: cosine decays to 10% of the peak
# Adam's and AdamW's hyperparameters (torch.optim's defaults) and AdamW's decoupled weight decay
# (Adam has none), written out for the optimizers that are not torch.optim (numpy_updates).
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
ADAMW_WEIGHT_DECAY = 0.01

# Backbone lr per optimizer when the caller gives none. Adaptive optimizers use nanoVLM's;
# plain gradient steps need a larger one to move in the few steps a benchmark runs.
DEFAULT_LR = {
    "sgd": 5e-2, "sgd-momentum": 1e-2, "lomo": 1e-2, "cg": 5e-2,
    "adam": NANOVLM_LR_BACKBONE, "adamw": NANOVLM_LR_BACKBONE,
    "adamw-8bit": NANOVLM_LR_BACKBONE, "adamw-4bit": NANOVLM_LR_BACKBONE,
    "galore": NANOVLM_LR_BACKBONE, "adafactor": 1e-3, "adalomo": 1e-3,
}
# Adapters (LoRA) and BitFit's biases train few weights, at a larger lr (peft's usual 1e-4..1e-3).
ADAPTER_LR = 1e-3


# Estimated-gradient methods step along random directions: the update's noise grows with the
# number of trained weights n, so their lr shrinks as 1/n past REFERENCE_PARAMS (MeZO's paper
# uses 1e-6..1e-7 on 13B-66B models).
GRAD_MODE_LR = {"zeroth-order": 1e-3, "forward-mode": 1e-4}
REFERENCE_PARAMS = 4_000_000


def default_lr(method: Method, n_trainable: int = 0) -> float:
    if method.grad_mode in GRAD_MODE_LR:
        return GRAD_MODE_LR[method.grad_mode] * min(1.0, REFERENCE_PARAMS / max(1, n_trainable))
    if method.trainable == "bitfit" and method.optimizer in ("adam", "adamw"):
        return ADAPTER_LR  # BitFit's paper: 1e-4..1e-3 for the few bias terms
    if method.trainable == "lora" and method.optimizer in ("adam", "adamw", "adamw-8bit", "adamw-4bit"):
        return ADAPTER_LR
    return DEFAULT_LR[method.optimizer]


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


def param_groups(model: nn.Module, lr: float) -> list[dict]:
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


def build_optimizer(optimizer: str, groups: list[dict]) -> torch.optim.Optimizer:
    """The library optimizer behind a knob value (the per-step ones; lomo/cg live elsewhere)."""
    import torch

    if optimizer == "sgd":
        return torch.optim.SGD(groups)
    if optimizer == "sgd-momentum":
        return torch.optim.SGD(groups, momentum=0.9)
    if optimizer == "adam":
        return torch.optim.Adam(groups, betas=ADAM_BETAS, eps=ADAM_EPS)
    if optimizer == "adamw":
        return torch.optim.AdamW(groups, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=ADAMW_WEIGHT_DECAY)
    if optimizer == "adafactor":
        return torch.optim.Adafactor(groups)
    if optimizer in ("adamw-8bit", "adamw-4bit"):
        from torchao.optim import AdamW4bit, AdamW8bit  # heavy import: only when used

        return (AdamW8bit if optimizer == "adamw-8bit" else AdamW4bit)(groups)
    if optimizer == "galore":
        from galore_torch import GaLoreAdamW

        return GaLoreAdamW(groups, no_deprecation_warning=True)  # groups from galore_groups()
    raise ValueError(f"no per-step optimizer for {optimizer!r}")


GALORE_RANK_MAX = 64
GALORE_UPDATE_PROJ_GAP = 200
GALORE_SCALE = 0.25


def is_galore_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """GaLore projects the transformer blocks' weight matrices (as in its paper), nothing else."""
    return len(shape) == 2 and ".blocks." in name and min(shape) >= 8


def galore_rank(shape: tuple[int, ...]) -> int:
    """Rank of the projection: GALORE_RANK_MAX, or a quarter of a small matrix's short side."""
    return max(2, min(GALORE_RANK_MAX, min(shape) // 4))


def galore_options(name: str, shape: tuple[int, ...]) -> dict:
    """GaLoreAdamW's group options for one parameter: its projection for a block matrix, else none."""
    if not is_galore_matrix(name, shape):
        return {}
    return {"rank": galore_rank(shape), "update_proj_gap": GALORE_UPDATE_PROJ_GAP,
            "scale": GALORE_SCALE, "proj_type": "std"}


def galore_groups(model: nn.Module, lr: float) -> list[dict]:
    """nanoVLM's groups, with each block matrix in a GaLore group of its rank."""
    return [{"params": [param], "lr": max(lr, NANOVLM_LR_MP) if is_projector(name) else lr,
             **galore_options(name, tuple(param.shape))}
            for name, param in model.named_parameters() if param.requires_grad]
