"""Frozen linear layers held in int4 (group-wise absmax scales), dequantised per layer on the fly.

Two signed 4-bit codes per byte plus one bf16 scale per GROUP input weights: 0.53 bytes per
weight instead of 2 (bf16) or 1.03 (edgebench.methods.int8). The forward and the backward
each dequantise the one layer they need to bf16 and drop it afterwards, so only the packed
codes stay resident (as in int8.py, and for the same reason: torchao's int4 weight-only
tensors need CUDA/tinygemm or an XPU/NPU layout on CPU, and under autograd would keep a
dequantised copy for backward).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from edgebench.methods.int8 import Dequantized, DequantizedMatmul
from edgebench.methods.knobs import MethodError

GROUP = 64  # input weights per scale (as llama.cpp's / GPTQ's common group sizes 32-128)
# weights packed or dequantised at once: both make a few copies of the part, so a large weight
# goes a few thousand rows at a time (nanovlm-460m's 12,288-wide projector packed whole: +130 MiB
# at load; dequantised whole, 71 MB made at once against 47 in parts)
PART_ELEMENTS = 4096 * 960
HEAD_ROWS = 4096  # vocabulary rows of the tied head dequantised at once (7.5 MiB bf16 at 960 wide)


def pack(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (uint8 codes [out, in / 2], bf16 scales [out, in / group]), PART_ELEMENTS at a time."""
    rows = max(1, PART_ELEMENTS // weight.size(1))
    parts = [_pack_rows(weight[start:start + rows], group) for start in range(0, weight.size(0), rows)]
    if len(parts) == 1:
        return parts[0]
    return torch.cat([codes for codes, _ in parts]), torch.cat([scale for _, scale in parts])


def _pack_rows(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // group, group)
    scale = groups.abs().amax(dim=2).clamp(min=1e-12) / 7.0
    codes = torch.round(groups / scale.unsqueeze(2)).clamp(-8, 7).to(torch.int8).reshape(out_features, in_features)
    nibbles = (codes & 0xF).to(torch.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), scale.to(torch.bfloat16)


@functools.cache
def _byte_values(dtype: torch.dtype) -> torch.Tensor:
    """[256, 2]: the two signed codes (low nibble, high nibble) each byte holds, in `dtype`."""
    return torch.tensor([[((b & 0xF) ^ 8) - 8, ((b >> 4) ^ 8) - 8] for b in range(256)], dtype=dtype)


def unpack(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The dequantised [out, in] weight in `dtype`, PART_ELEMENTS at a time written into its place."""
    rows = max(1, PART_ELEMENTS // (2 * codes.size(1)))
    if codes.size(0) <= rows:
        return _unpack_rows(codes, scale, dtype)
    weight = torch.empty(codes.size(0), 2 * codes.size(1), dtype=dtype)
    for start in range(0, codes.size(0), rows):
        weight[start:start + rows] = _unpack_rows(codes[start:start + rows], scale[start:start + rows], dtype)
    return weight


def _unpack_rows(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each byte looks up its two values in a table (one gather), 3.6x faster than unpacking
    nibbles and fixing signs tensor-wide, the same values: dequantising was three quarters of an
    int4 layer's time on 1,024 positions."""
    values = F.embedding(codes.to(torch.int32), _byte_values(dtype))  # [out, in / 2, 2]
    group = 2 * codes.size(1) // scale.size(1)
    return (values.reshape(scale.size(0), scale.size(1), group) * scale.to(dtype).unsqueeze(2)).reshape(
        codes.size(0), -1)


class Int4Linear(Dequantized):
    """A frozen nn.Linear stored as packed int4 codes + bf16 group scales (buffers, never trained)."""

    dequantize = staticmethod(unpack)

    def __init__(self, linear: nn.Linear, group: int = GROUP):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        codes, scale = pack(linear.weight, group_size(linear.in_features, group))
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(
            linear.bias.detach().to(torch.bfloat16, copy=True), requires_grad=False)


class Int4Embedding(nn.Module):
    """A frozen token embedding stored as int4 codes + bf16 group scales: a lookup dequantises
    only the rows it reads. The tied LM head reads the same codes (Int4Head)."""

    codes: torch.Tensor
    scale: torch.Tensor

    def __init__(self, weight: torch.Tensor, group: int = GROUP):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        size = group_size(self.embedding_dim, group)
        codes, scale = pack(weight, size)  # in parts: the whole table in fp32 would be 188 MB
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = ids.reshape(-1)
        return unpack(self.codes[rows], self.scale[rows], torch.bfloat16).view(*ids.shape, self.embedding_dim)


class Int4Head(nn.Module):
    """The LM head tied to an Int4Embedding: logits over a block of HEAD_ROWS vocabulary rows at a
    time, each block's weight dequantised in forward and again in backward (DequantizedMatmul),
    so no [vocab, hidden] copy exists (nanovlm-460m's would be 90 MiB in bf16)."""

    def __init__(self, embedding: Int4Embedding):
        super().__init__()
        self.embedding = [embedding]  # shared, not a submodule: its buffers are saved once, under its name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes, scale = self.embedding[0].codes, self.embedding[0].scale
        return torch.cat([DequantizedMatmul.apply(x, codes[start:start + HEAD_ROWS],  # type: ignore[no-untyped-call]
                                                  scale[start:start + HEAD_ROWS], unpack)
                          for start in range(0, codes.size(0), HEAD_ROWS)], dim=-1)


def pack_tied_embedding(decoder: nn.Module) -> bool:
    """Store a frozen token embedding the LM head shares as int4 (Int4Embedding + Int4Head);
    False where it trains or the head has its own weight (left as it is)."""
    embedding, head = decoder.token_embedding, decoder.head
    if not isinstance(embedding, nn.Embedding) or embedding.weight.requires_grad or \
            getattr(head, "weight", None) is not embedding.weight:
        return False
    packed = Int4Embedding(embedding.weight.detach())
    decoder.token_embedding, decoder.head = packed, Int4Head(packed)
    return True


def group_size(in_features: int, group: int = GROUP) -> int:
    """`group`, or the largest even divisor of in_features below it (tiny models' odd widths)."""
    for size in range(min(group, in_features), 1, -1):
        if in_features % size == 0 and size % 2 == 0:
            return size
    raise MethodError(f"int4 frozen weights pack two values a byte: a linear layer needs an even number of input "
                      f"features, this model has one of {in_features}; use frozen-int8 (or qlora) instead of int4")
