"""Pruned fine-tuning: the transformer blocks' linear weights pruned before the first step, by
magnitude to a stated sparsity or to a 2:4 pattern (Wanda's and SparseGPT's two forms, here
by |w| alone), and held pruned through training by a mask per weight.

The weights stay dense fp32 and CPU kernels multiply the zeros too: pruning here saves no
memory and no time, it costs one byte a weight for its mask (counted by the memory model). What
it measures is what training a pruned model costs and how its loss moves.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where a model is pruned: method parsing imports this module torch-free
    import torch
    from torch import nn

PRUNE_TOKEN = re.compile(r"prune(\d+)$")  # `prune{P}` in a method's text
TWO_OF_FOUR = "2:4"  # `prune2of4`: in every 4 consecutive inputs of a row, the 2 smallest |w| are zero


def magnitude(percent: int) -> str:
    """The `prune` knob of `prune{percent}`: that share of each weight's smallest |w| zeroed."""
    return f"magnitude{percent}"


def prunable(name: str, shape: tuple[int, ...]) -> bool:
    """A linear weight inside a transformer block (vision or decoder): the weights pruning
    takes; embeddings, the LM head, the projector and norms stay whole."""
    return ".blocks." in name and name.endswith(".weight") and len(shape) == 2


def mask_of(weight: torch.Tensor, prune: str) -> torch.Tensor:
    """The bool mask (True: kept) of `weight` under `prune` (`magnitude{P}` or TWO_OF_FOUR)."""
    import torch

    size = weight.abs().float()
    if prune == TWO_OF_FOUR:
        rows, columns = size.shape
        if columns % 4:
            raise ValueError(f"2:4 pruning needs inputs in groups of 4, got {columns}")
        groups = size.reshape(rows, columns // 4, 4)
        kept = torch.zeros_like(groups, dtype=torch.bool)
        kept.scatter_(2, groups.topk(2, dim=2).indices, True)
        return kept.reshape(rows, columns)
    percent = int(prune.removeprefix("magnitude"))
    zeroed = size.numel() * percent // 100
    if zeroed == 0:
        return torch.ones_like(size, dtype=torch.bool)
    order = size.flatten().argsort(stable=True)  # ties: the earlier element goes first, so the count is exact
    kept = torch.ones(size.numel(), dtype=torch.bool)
    kept[order[:zeroed]] = False
    return kept.reshape(size.shape)


def prune(model: nn.Module, method_prune: str) -> dict[nn.Parameter, torch.Tensor]:
    """Zero the pruned part of every trained prunable weight of `model` in place; returns
    {weight: its mask} for `hold`."""
    masks = {weight: mask_of(weight.detach(), method_prune) for name, weight in model.named_parameters()
             if weight.requires_grad and prunable(name, tuple(weight.shape))}
    hold(masks)
    return masks


def mask_gradients(masks: dict[nn.Parameter, torch.Tensor]) -> None:
    """Zero the pruned weights' gradients, before the clip and the step see them."""
    for weight, mask in masks.items():
        if weight.grad is not None:
            weight.grad.mul_(mask)


def hold(masks: dict[nn.Parameter, torch.Tensor]) -> None:
    """Zero the pruned weights (again after a step: weight decay and Adam's moments move them)."""
    import torch

    with torch.no_grad():
        for weight, mask in masks.items():
            weight.mul_(mask)
