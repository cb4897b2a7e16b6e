"""Build a fresh model one layer at a time, each frozen linear packed the moment it exists.

Building nanovlm-460m the ordinary way allocates all its weights before anything can be
quantised: 920 MB even in bf16, past a 1 GiB device before training starts. Here the model
is laid out on the meta device (no storage), the method's trainable subset and LoRA adapters
(edgebench.methods.lora: peft's import alone is 211 MB) are set there, and then each module
gets its storage (in its final dtype), nanoVLM's initialisation (normal 0.02
linears/embeddings/convolutions, unit norms, uniform position embeddings; peft's LoRA init),
and, if it is a frozen linear, its int8/int4 packing, before the next module is built. The
peak is the packed model plus one layer; large blocks are mapped one by one from then on
(subsets.map_large_allocations), so freed activations leave the RSS too. The draws follow the same distributions as
`build_model`, not the same values (the random stream is consumed in another order).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from edgebench.methods.knobs import Method
from edgebench.methods.subsets import apply_trainable, map_large_allocations, release_freed_memory
from edgebench.model.config import VLMConfig


def build_streamed(method: Method, cfg: VLMConfig) -> nn.Module:
    """A freshly initialised model for `method`, its frozen linears already int8/int4 (and its
    LoRA adapters in place: `apply_trainable` sees them and does not inject again)."""
    from edgebench.methods.int4 import Int4Linear
    from edgebench.methods.int8 import Int8Linear
    from edgebench.model.layout import meta_layout
    from edgebench.model.vision_language_model import VisionLanguageModel

    map_large_allocations()
    with meta_layout():
        model = apply_trainable(method, VisionLanguageModel(cfg))  # LoRA: edgebench.methods.lora
    packed = {"int4": Int4Linear, "int8": Int8Linear}.get(method.frozen_dtype)
    frozen = torch.bfloat16 if method.frozen_dtype != "fp32" else torch.float32
    trained = torch.bfloat16 if method.trained_dtype == "bf16" else torch.float32
    # meta tensor id -> (it, its storage): the tied head is made once
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, module in list(model.named_modules()):
        fresh = _materialise(module, made, trained, frozen)
        if not fresh:
            continue  # no storage of its own, or only weights made already (the tied head)
        _initialise(name, module, cfg)
        if packed is not None and type(module) is nn.Linear and not module.weight.requires_grad:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, packed(module))
            for key in fresh:  # the unpacked weight goes now, back to the OS, not at the end
                del made[key]
            # the module list above still holds the module (torch accepts None for a parameter)
            module.weight = module.bias = None  # type: ignore[assignment]
            release_freed_memory()
    if method.frozen_dtype == "int4":
        from edgebench.methods.int4 import pack_tied_embedding

        pack_tied_embedding(cast(nn.Module, model.decoder))
    release_freed_memory()
    # store_frozen has nothing left to convert or copy
    model.streamed = True  # type: ignore[assignment]  # torch types Module attributes as tensors/modules only
    return model


def _materialise(module: nn.Module, made: dict[int, tuple[torch.Tensor, torch.Tensor]], trained: torch.dtype,
                 frozen: torch.dtype) -> list[int]:
    """Give the module's own meta parameters (in the trained or frozen dtype) and buffers CPU
    storage (a tensor made before for another module is shared); returns the keys made now."""
    fresh: list[int] = []
    # a Parameter goes back only into _parameters (made as one for a Parameter)
    for table in (cast(dict[str, torch.Tensor | None], module._parameters), module._buffers):
        for key, tensor in table.items():
            if tensor is None or not tensor.is_meta:
                continue
            if id(tensor) not in made:
                dtype = tensor.dtype if table is module._buffers else trained if tensor.requires_grad else frozen
                storage = torch.empty(tensor.shape, dtype=dtype)
                made[id(tensor)] = (tensor, nn.Parameter(storage, tensor.requires_grad)
                                    if isinstance(tensor, nn.Parameter) else storage)
                fresh.append(id(tensor))
            table[key] = made[id(tensor)][1]
    return fresh


@torch.no_grad()
def _initialise(name: str, module: nn.Module, cfg: VLMConfig) -> None:
    """nanoVLM's initialisation of this module's own tensors (peft's for LoRA's A and B)."""
    from edgebench.model.language_model import RMSNorm, RotaryEmbedding
    from edgebench.model.vision_transformer import ViTPatchEmbeddings

    if ".lora_A." in f".{name}.":
        nn.init.kaiming_uniform_(cast(torch.Tensor, module.weight), a=math.sqrt(5))
    elif ".lora_B." in f".{name}.":
        nn.init.zeros_(cast(torch.Tensor, module.weight))
    elif isinstance(module, (nn.Linear, nn.Conv2d, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(cast(torch.Tensor, module.bias))
    elif isinstance(module, (nn.LayerNorm, RMSNorm)):
        nn.init.ones_(module.weight)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(cast(torch.Tensor, module.bias))
    elif isinstance(module, ViTPatchEmbeddings):
        module.position_embedding.uniform_()
    elif isinstance(module, RotaryEmbedding):
        module.inv_freq.copy_(RotaryEmbedding(cfg).inv_freq)
    else:
        raise TypeError(f"streamed build: no initialisation known for {name} ({type(module).__name__})")
