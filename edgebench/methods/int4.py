"""Frozen linear layers held in int4 (group-wise absmax scales), dequantised per layer on the fly.

Two signed 4-bit codes per byte plus one bf16 scale per GROUP input weights: 0.53 bytes per
weight instead of 2 (bf16) or 1.03 (edgebench.methods.int8). The forward and the backward
each dequantise the one layer they need to bf16 and drop it afterwards, so only the packed
codes stay resident (as in int8.py, and for the same reason: torchao's int4 weight-only
tensors need CUDA/tinygemm or an XPU/NPU layout on CPU, and under autograd would keep a
dequantised copy for backward).
"""

from __future__ import annotations

import torch
from torch import nn

from edgebench.methods.int8 import DequantizedMatmul
from edgebench.methods.knobs import MethodError

GROUP = 64  # input weights per scale (as llama.cpp's / GPTQ's common group sizes 32-128)


def pack(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (uint8 codes [out, in / 2], bf16 scales [out, in / group])."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // group, group)
    scale = groups.abs().amax(dim=2).clamp(min=1e-12) / 7.0
    codes = torch.round(groups / scale.unsqueeze(2)).clamp(-8, 7).to(torch.int8).reshape(out_features, in_features)
    nibbles = (codes & 0xF).to(torch.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), scale.to(torch.bfloat16)


def unpack(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The dequantised [out, in] weight in `dtype`."""
    low = (codes & 0xF).to(torch.int8)
    high = (codes >> 4).to(torch.int8)
    values = torch.stack((low, high), dim=2).reshape(codes.size(0), -1)
    values = values - ((values & 0x8) << 1)  # two's complement of the 4-bit code
    group = values.size(1) // scale.size(1)
    return (values.reshape(scale.size(0), scale.size(1), group).to(dtype) * scale.to(dtype).unsqueeze(2)).reshape(
        values.shape)


class Int4Linear(nn.Module):
    """A frozen nn.Linear stored as packed int4 codes + bf16 group scales (buffers, never trained)."""

    codes: torch.Tensor
    scale: torch.Tensor

    def __init__(self, linear: nn.Linear, group: int = GROUP):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        codes, scale = pack(linear.weight, group_size(linear.in_features, group))
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(
            linear.bias.detach().to(torch.bfloat16, copy=True), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = DequantizedMatmul.apply(  # type: ignore[no-untyped-call]  # torch's Function.apply
            x, self.codes, self.scale, unpack)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def group_size(in_features: int, group: int = GROUP) -> int:
    """`group`, or the largest even divisor of in_features below it (tiny models' odd widths)."""
    for size in range(min(group, in_features), 1, -1):
        if in_features % size == 0 and size % 2 == 0:
            return size
    raise MethodError(f"int4 frozen weights pack two values a byte: a linear layer needs an even number of input "
                      f"features, this model has one of {in_features}; use frozen-int8 (or qlora) instead of int4")
