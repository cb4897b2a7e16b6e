"""A trained model's weights as nanoVLM and peft store them (`--save`).

nanoVLM's checkpoint holds plain fp32 linears, so each LoRA layer is saved merged (base +
scaling * B @ A, as peft's merge computes it), each frozen int8/int4 layer dequantised (the
weights the run trained with) and every bf16 tensor widened to fp32, one layer at a time as
it is written (a copy of the whole model would double a QLoRA run's peak on the device). A LoRA run's adapter also
goes beside it in peft's format (adapter_config.json + adapter_model.safetensors, keys
`base_model.model.<module>.lora_A.weight` as PeftModel.save_pretrained writes them), so
peft's PeftModel.from_pretrained puts it on the checkpoint the run started from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from edgebench.methods.int4 import Int4Embedding, Int4Head, Int4Linear, unpack
from edgebench.methods.int8 import _dequantize
from edgebench.methods.subsets import LORA_ALPHA, LORA_RANK, lora_targets
from edgebench.model.checkpoint import _safetensors, save_tensors

if TYPE_CHECKING:
    from edgebench.model.config import VLMConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

Make = Callable[[], torch.Tensor]  # a tensor made when it is written


def _weight(module: nn.Module) -> torch.Tensor:
    """A linear layer's weight in fp32, dequantised where it is stored as int8/int4 codes."""
    if hasattr(module, "codes"):
        codes, scale = cast(torch.Tensor, module.codes), cast(torch.Tensor, module.scale)
        return (unpack if isinstance(module, (Int4Linear, Int4Embedding)) else _dequantize)(codes, scale, torch.float32)
    return cast(torch.Tensor, module.weight).detach().float()


def _lora(module: nn.Module) -> tuple[nn.Linear, nn.Linear, float] | None:
    """(A, B, scaling) of a LoRA layer (peft's or edgebench.methods.lora's), else None."""
    if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
        return None
    scaling = cast("dict[str, float] | float", module.scaling)  # peft's: by adapter name
    lora_a, lora_b = cast(nn.ModuleDict, module.lora_A), cast(nn.ModuleDict, module.lora_B)
    name = next(iter(lora_a))
    return (cast(nn.Linear, lora_a[name]), cast(nn.Linear, lora_b[name]),
            scaling[name] if isinstance(scaling, dict) else scaling)


def _plain(name: str) -> str:
    return name.replace(".base_layer", "")


def merged_tensors(model: nn.Module) -> tuple[dict[str, Make], dict[str, torch.Tensor]]:
    """(each of the model's weights under nanoVLM's names, as a function that makes it in fp32,
    merged or dequantised, when it is written; the LoRA adapter's tensors)."""
    # (a lambda with defaults gets no type from the dict's: each is cast to Make)
    tensors: dict[str, Make] = {}
    adapter: dict[str, torch.Tensor] = {}
    done: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in done):
            continue
        if isinstance(module, Int4Head):  # the tied head: its embedding's codes, saved under the head's name too
            tensors[f"{name}.weight"] = cast(Make, lambda embedding=module.embedding[0]: _weight(embedding))
            continue
        lora = _lora(module)
        if lora is None and not hasattr(module, "codes"):
            continue
        base = cast(nn.Module, module.base_layer) if lora else module
        if lora:
            a, b, scaling = (lora[0].weight.detach().float(), lora[1].weight.detach().float(), lora[2])
            tensors[f"{name}.weight"] = cast(Make, lambda base=base, a=a, b=b, s=scaling: _weight(base) + s * (b @ a))
            adapter[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
            adapter[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
        else:
            tensors[f"{name}.weight"] = cast(Make, lambda base=base: _weight(base))
        if getattr(base, "bias", None) is not None:
            tensors[f"{name}.bias"] = cast(Make, lambda bias=base.bias: bias.detach().float())
        done.append(name)
    for key, tensor in model.state_dict().items():
        if not any(key.startswith(prefix + ".") for prefix in done):
            tensors[_plain(key)] = cast(Make, lambda tensor=tensor: tensor)
    return tensors, adapter


def save_trained(model: nn.Module, folder: str | Path) -> Path:
    """Writes the trained model as a nanoVLM checkpoint into `folder`, with its LoRA adapter in
    peft's format beside it when it has one."""
    tensors, adapter = merged_tensors(model)
    folder = save_tensors(cast("VLMConfig", model.cfg), tensors, folder)
    if adapter:
        vision = any(key.startswith("base_model.model.vision_encoder.") for key in adapter)
        config = {"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0,
                  "target_modules": lora_targets("lora" if vision else "lora-decoder"), "bias": "none",
                  "fan_in_fan_out": False, "task_type": None,
                  "inference_mode": True, "init_lora_weights": True, "modules_to_save": None}
        (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        partial = folder / (ADAPTER_WEIGHTS + ".partial")  # renamed when whole, as model.safetensors
        _safetensors().save_file(adapter, str(partial))
        os.replace(partial, folder / ADAPTER_WEIGHTS)
    return folder
