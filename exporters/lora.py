"""LoRA written into the model itself, for export: peft's layers swapped for a plain linear.

ONNX Runtime 1.19's generate_artifacts fails on the graph peft's LoRA layer exports
("Argument mismatch when removing edge" in its pre-training graph optimizer: the adapter
dispatch, dtype casts and Identity dropout leave edges it cannot rewire). `LoRALinear`
computes the same function, `W x + b + scaling * B(A(x))` (Hu et al. 2021, "LoRA",
arXiv:2106.09685), with peft's own submodules and tensors, so every parameter keeps its
peft name (`...base_layer.weight`, `...lora_A.default.weight`) and its value: an eager
peft model and the exported graph train the same weights, name for name.

The ExecuTorch export writes it in too: torch.export then traces one line, not peft's
adapter dispatch and checks, for every layer (nanoVLM-222M LoRA's strict torch.export 65.4 ->
57.1 s).
It reads the weights in peft's order and casts where peft casts, so the `.pte` is the one
peft's layer gives, byte for byte (tests/test_export_executorch.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

ADAPTER = "default"  # peft's adapter name (edgebench.methods.subsets injects one adapter)


class LoRALinear(nn.Module):
    """y = base_layer(x) + scaling * lora_B(lora_A(x)), with peft's modules (no dropout: the
    methods inject LoRA with lora_dropout=0)."""

    def __init__(self, peft_layer: LoraLayer) -> None:
        super().__init__()
        self.base_layer = peft_layer.base_layer
        # peft's nn.ModuleDicts of an nn.Linear per adapter (typed Module by ModuleDict: their weights Any)
        self.lora_A: Any = peft_layer.lora_A
        self.lora_B: Any = peft_layer.lora_B
        self.scaling = float(peft_layer.scaling[ADAPTER])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base: torch.Tensor = self.base_layer(x)  # first, as in peft: torch.export lifts weights in order of use
        a, b = self.lora_A[ADAPTER].weight, self.lora_B[ADAPTER].weight
        x = x if x.dtype == a.dtype else x.to(a.dtype)  # peft's casts, where dtypes differ
        result = base + F.linear(F.linear(x, a), b) * self.scaling
        return result if result.dtype == base.dtype else result.to(base.dtype)


def write_lora_into_model(model: nn.Module) -> int:
    """Replace every peft LoRA linear in `model` by a `LoRALinear` over the same tensors.
    Returns how many layers were replaced (0: the model has no peft LoRA layers)."""
    from peft.tuners.lora import LoraLayer

    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, LoraLayer) and isinstance(module.base_layer, nn.Linear)]
    for name, module in targets:
        if list(module.active_adapters) != [ADAPTER] or not isinstance(module.lora_dropout[ADAPTER], nn.Identity):
            raise ValueError(f"{name}: LoRALinear writes one adapter {ADAPTER!r} without dropout")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module))
    return len(targets)
