"""Frozen linear layers held in int8 (per-output-channel absmax scale), dequantised on the fly.

Why not torchao's int8 weight-only tensor: under autograd its linear saves the dequantised
bf16 weight for backward (checked with saved-tensor hooks), so a LoRA step keeps a bf16 copy of
every frozen weight alive: +400 MB on nanoVLM-222M. Here the backward dequantises again instead,
so only the int8 codes and one scale per row stay resident.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

Dequantize = Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]  # (codes, scale, dtype) -> weight


def _dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return codes.to(dtype) * scale.to(dtype).unsqueeze(1)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of `x` runs in: autocast's where it is on, else x's own."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype


class DequantizedMatmul(torch.autograd.Function):
    """y = x W^T with W = dequantize(codes, scale, dtype); saves only the codes and scales, so
    nothing of size activations x weights stays alive for backward (which dequantises again)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
                dequantize: Dequantize) -> torch.Tensor:
        dtype = compute_dtype(x)
        ctx.save_for_backward(codes, scale)
        ctx.x_dtype, ctx.compute_dtype, ctx.dequantize = x.dtype, dtype, dequantize
        return F.linear(x.to(dtype), dequantize(codes, scale, dtype))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        codes, scale = ctx.saved_tensors
        weight = ctx.dequantize(codes, scale, ctx.compute_dtype)
        return (grad.to(ctx.compute_dtype) @ weight).to(ctx.x_dtype), None, None, None


class Dequantized(nn.Module):
    """A frozen linear whose weight is codes + scales, dequantised for each use (DequantizedMatmul);
    inside `held_dequantized` it dequantises once and keeps that weight for every call until the
    scope ends (a frozen encoder block run view by view: one dequantisation for 17 views)."""

    codes: torch.Tensor
    scale: torch.Tensor
    bias: nn.Parameter | None
    hold = False
    held: torch.Tensor | None = None

    dequantize: Dequantize  # each kind's own, a staticmethod (the function DequantizedMatmul calls again)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hold and not x.requires_grad:  # nothing for backward: the held weight serves
            dtype = compute_dtype(x)
            if self.held is None or self.held.dtype != dtype:
                self.held = self.dequantize(self.codes, self.scale, dtype)
            y = F.linear(x.to(dtype), self.held)
        else:
            y = DequantizedMatmul.apply(  # type: ignore[no-untyped-call]  # torch's Function.apply
                x, self.codes, self.scale, self.dequantize)
        return y if self.bias is None else y + self.bias.to(y.dtype)


@contextmanager
def held_dequantized(module: nn.Module) -> Iterator[None]:
    """Within: each Dequantized layer of `module` dequantises once and reuses that weight; the
    weights go when the scope ends."""
    layers = [m for m in module.modules() if isinstance(m, Dequantized)]
    for layer in layers:
        layer.hold = True
    try:
        yield
    finally:
        for layer in layers:
            layer.hold, layer.held = False, None


class Int8Linear(Dequantized):
    """A frozen nn.Linear stored as int8 codes + fp32 per-row scales (buffers, never trained)."""

    dequantize = staticmethod(_dequantize)

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("codes", torch.round(weight / scale.unsqueeze(1)).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features


def quantize_frozen_linears(model: nn.Module, skip: set[int], after_each: Callable[[], object] = lambda: None,
                            cls: Callable[[nn.Linear], nn.Module] = Int8Linear) -> int:
    """Replace every frozen nn.Linear (weight id not in `skip`) by `cls` (Int8Linear, or
    edgebench.methods.int4.Int4Linear); returns how many.

    `after_each` runs after each layer (the caller hands the freed weight back to the OS there,
    so the conversion never holds both precisions of the whole model)."""
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and not module.weight.requires_grad and id(module.weight) not in skip]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, cls(module))
        # the old weight may be shared with nothing else: drop it now (torch accepts None for a parameter)
        module.weight = None  # type: ignore[assignment]
        del module
        after_each()
    return len(targets)
