"""What trains and how the rest is stored: freezing, LoRA (peft), BitFit, frozen-weight
storage (bf16 / int8), and activation checkpointing of the transformer blocks.

All of it changes the model in place from the methods side; the model files stay untouched.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from edgebench.methods.knobs import LORA_SUBSETS, Method, MethodError
from edgebench.model.recompute import recomputed, trains

if TYPE_CHECKING:
    import ctypes

LORA_RANK = 8
LORA_ALPHA = 16
# Every linear layer inside a transformer block (nanoVLM's module names), and the projector.
LORA_TARGETS = (
    r"(vision_encoder|decoder)\.blocks\.\d+\.(attn|mlp)\."
    r"(qkv_proj|q_proj|k_proj|v_proj|out_proj|fc1|fc2|gate_proj|up_proj|down_proj)"
    r"|MP\.proj"
)
_DECODER_LINEARS = r"(attn|mlp)\.(q_proj|k_proj|v_proj|out_proj|gate_proj|up_proj|down_proj)"
# lora-decoder's: the decoder's block linears and the projector (the vision encoder frozen whole).
LORA_DECODER_TARGETS = rf"decoder\.blocks\.\d+\.{_DECODER_LINEARS}|MP\.proj"
_BLOCK = re.compile(r"(vision_encoder|decoder)\.blocks\.\d+$")
_DECODER_BLOCK = re.compile(r"decoder\.blocks\.(\d+)\.")


def lora_targets(trainable: str, blocks: range | None = None) -> str:
    """The pattern of linear-layer names a LoRA subset adapts; `blocks`: only these decoder
    blocks' linears (a `lastK` method)."""
    if blocks is not None:
        return rf"decoder\.blocks\.({'|'.join(map(str, blocks))})\.{_DECODER_LINEARS}"
    return LORA_DECODER_TARGETS if trainable == "lora-decoder" else LORA_TARGETS


def trained_blocks(method: Method, model: nn.Module) -> range | None:
    """The decoder blocks a `lastK` method trains (None: it sets no such limit)."""
    if not method.last_blocks:
        return None
    depth = sum(1 for tower, _ in transformer_blocks(model) if tower == "decoder")
    if method.last_blocks > depth:
        raise MethodError(f"last{method.last_blocks} asks for more decoder blocks than the model has ({depth}); "
                          f"use last{depth} or fewer")
    return range(depth - method.last_blocks, depth)


def apply_trainable(method: Method, model: nn.Module) -> nn.Module:
    """Set requires_grad for the method's trainable subset; inject LoRA adapters (peft; on a
    meta-device model edgebench.methods.lora's peft-named layer) unless the model has them."""
    blocks = trained_blocks(method, model)
    if method.adapts and not any(".lora_" in n for n, _ in model.named_parameters()):
        targets = lora_targets(method.trainable, blocks)
        if next(model.parameters()).is_meta:  # counting, or the streamed build: peft's import (+211 MB RSS)
            from edgebench.methods.lora import inject_lora  # buys nothing there; same names and shapes

            inject_lora(model, targets, LORA_RANK, LORA_ALPHA)
        else:
            from peft import LoraConfig, inject_adapter_in_model

            config = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets)
            model = inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad = _trains(method.trainable, name, param) and _in_blocks(name, blocks)
    return model


def _in_blocks(name: str, blocks: range | None) -> bool:
    """Whether a parameter lies in one of the trained decoder blocks (every one without a limit)."""
    if blocks is None:
        return True
    found = _DECODER_BLOCK.match(name)
    return found is not None and int(found.group(1)) in blocks


def _trains(trainable: str, name: str, param: nn.Parameter) -> bool:
    if trainable == "all":
        return True
    if trainable == "freeze-vision":
        return not name.startswith("vision_encoder.")
    if trainable in LORA_SUBSETS:
        return ".lora_" in name
    if trainable == "bitfit":
        # BitFit (Ben Zaken et al. 2022) trains the biases; SmolLM2's linears have none, so
        # the norms' gains (1-D, like biases) train too, or the decoder would not adapt.
        return name.endswith(".bias") or (param.dim() == 1 and "norm" in name)
    raise ValueError(f"unknown trainable subset {trainable!r}")


def store_frozen(method: Method, model: nn.Module) -> None:
    """Hold trained weights in fp32 (or bf16), frozen weights in bf16, or frozen linears in
    int8 / int4 (edgebench.methods.int8, .int4).

    int8/int4: each frozen nn.Linear becomes int8 (per-channel) or int4 (group-wise) codes
    dequantised in its forward and backward; with int4 a frozen embedding the head shares too
    (int4.pack_tied_embedding); the other frozen weights (int8's embedding/tied head, norms,
    patch conv) go bf16. Every kept tensor gets its own storage, so a memory-mapped checkpoint file is released.
    """
    trained = torch.bfloat16 if method.trained_dtype == "bf16" else torch.float32
    for param in model.parameters():  # trained weights in their own dtype (see build_model_for)
        if param.requires_grad and param.dtype != trained:
            param.data = param.data.to(trained)
    if method.frozen_dtype == "fp32" or getattr(model, "streamed", False):
        return  # the streamed build made every tensor in its final form, in storage of its own
    if method.frozen_dtype in ("int8", "int4"):
        from edgebench.methods.int4 import Int4Linear, pack_tied_embedding
        from edgebench.methods.int8 import Int8Linear, quantize_frozen_linears

        if method.frozen_dtype == "int4" and hasattr(model, "decoder"):
            pack_tied_embedding(cast(nn.Module, model.decoder))
        quantize_frozen_linears(model, skip=_tied_ids(model), after_each=release_freed_memory,
                                cls=Int4Linear if method.frozen_dtype == "int4" else Int8Linear)
    for param in model.parameters():
        if not param.requires_grad:
            param.data = param.data.to(torch.bfloat16, copy=True)
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            setattr(module, name, buffer.clone())
    release_freed_memory()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, or None elsewhere (found once: find_library runs a subprocess)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def release_freed_memory() -> None:
    """Hand the heap pages freed by the conversion back to the OS (glibc's malloc_trim), so
    the high-precision weights just dropped do not stay in the process's RSS. No-op elsewhere."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20


def map_large_allocations() -> None:
    """From now on glibc serves every allocation of MMAP_THRESHOLD or more by its own mmap,
    so a freed activation goes back to the OS at once instead of staying in a fragmented heap
    (glibc's default threshold climbs to 32 MB as large blocks are freed). Process-wide: for
    the lowest-memory methods' worker processes. No-op elsewhere."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def _tied_ids(model: nn.Module) -> set[int]:
    """The embedding weight shared with the LM head: stays a bf16 embedding, not int8."""
    return {id(p) for n, p in model.named_parameters(remove_duplicate=False)
            if n.endswith("token_embedding.weight")}


def transformer_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The vision and decoder transformer blocks, each with its tower ("vision_encoder" or
    "decoder"), by nanoVLM's module names."""
    return [(found.group(1), m) for n, m in model.named_modules() if (found := _BLOCK.search(n))]


def checkpoint_blocks(model: nn.Module, per_view: bool = False) -> int:
    """Recompute each transformer block in backward instead of keeping its activations.

    Wraps each block's forward with edgebench.model.recompute, so only the block inputs are
    kept. A decoder block's parameters are its own; a vision block runs once per view under
    `per_view` (view-by-view), so its parameters are shared by as many segments. Returns the
    number of blocks wrapped.
    """
    blocks = transformer_blocks(model)
    for tower, block in blocks:
        inner = block.forward
        shared = per_view and tower == "vision_encoder"

        def forward(*args: Any, _inner: Callable[..., Any] = inner, _block: nn.Module = block,
                    _shared: bool = shared) -> Any:
            return recomputed(_inner, *args, trains=trains(_block),
                              shared=_shared)

        block.forward = forward
    if not blocks:
        raise ValueError("activation checkpointing found no `*.blocks.N` transformer blocks in the model")
    return len(blocks)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
