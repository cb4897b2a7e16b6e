"""Which methods fit a memory budget, by the analytic memory model (estimates).

`edgebench predict` ranks them for a device; `bench` and `deploy` refuse a run whose predicted
peak exceeds what a run may take on the device (methods.budget), naming methods that fit instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgebench.methods.device_speed import DeviceSpeed
from edgebench.methods.knobs import PRESETS, Method, MethodError, parse_method

if TYPE_CHECKING:
    from edgebench.model.config import VLMConfig

# nanovlm-460m at nanoVLM main's 2048-px images (17 views, 1,137 decoder positions): MeZO, and
# LoRA on the decoder's last 6 blocks, within a 1 GiB board's budget; LoRA on the whole decoder
# within a 1.5 GiB board's; nanovlm-222m: both within a 1 GiB board's.
# LoRA on the decoder over int4 frozen weights (the encoder forward only, view by view), its
# adapters in bf16 stepped by SGD inside backward (no optimizer state: AdamW's, and torch.optim's
# import of torch._dynamo, put it at 1,045 MiB), and MeZO over LoRA adapters;
# docs/measurements.md has their kernel peaks.
VLM_1GIB_LORA = "lora-decoder+frozen-int4+bf16-weights+sr+ckpt+chunked-ce+view-by-view+flash-attn"
VLM_1GIB_MEZO = "mezo-lora+frozen-int4+view-by-view+chunked-ce+flash-attn"
# The same LoRA on the last 6 of nanovlm-460m's 32 decoder blocks: backward stops there, so the
# 26 below keep nothing for it and the projector's input is not kept (sparse backpropagation).
VLM_1GIB_SPARSE_LORA = VLM_1GIB_LORA.replace("lora-decoder+", "lora-decoder+last6+")
# nanovlm-222m full-parameter on a 1 GiB board on the native ExecuTorch worker: bf16 weights,
# SGD written into the program a block of rows at a time with stochastic rounding, checkpointed
# blocks (docs/native.md).
NATIVE_1GIB_FULL = "all+bf16-weights+sr+ckpt"
# The preset each 1 GiB configuration builds on, run without its memory levers: what the memory
# costs in step time (bench/methods.py --price).
UNCONSTRAINED = {VLM_1GIB_LORA: "lora-decoder", VLM_1GIB_MEZO: "mezo-lora"}
# Combinations ranked beside the presets.
COMBINATIONS = ("lora+ckpt+frozen-int8", "mezo-lora+frozen-int8", VLM_1GIB_LORA, VLM_1GIB_MEZO, VLM_1GIB_SPARSE_LORA,
                NATIVE_1GIB_FULL)


def rank(cfg: VLMConfig, batch_size: int, text_length: int, image_size: int | None, usable: int,
         speed: DeviceSpeed, native: Callable[[Method, int], dict[str, Any] | None] | None = None,
         unavailable: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every preset and combination with its predicted peak and its step time relative to sgd at
    the device's rates (estimates; methods.steptime, None for a bf16 method where the device's
    bf16 matmul cost is unknown): the ones that fit first, fastest first (unknown last); then the
    rest, smallest peak first. `native(method, batch)`: the native worker's figures instead of
    a torch process's (edgebench.native.memory), None for a method it does not run (left out).
    A method this model cannot take (int4 on an odd width) is left out, its reason in `unavailable`."""
    from edgebench.methods import memory
    from edgebench.methods.steptime import relative_step_time

    rows = []
    for name in [*PRESETS, *COMBINATIONS]:
        method = parse_method(name)
        batch = max(batch_size, method.accumulation)
        try:
            figures = memory.predict(cfg, method, batch, text_length, image_size=image_size)
        except MethodError as exc:
            if unavailable is not None:
                unavailable[name] = str(exc)
            continue
        peak = figures["peak_bytes"]
        if native is not None:
            worker = native(method, batch)
            if worker is None:
                continue
            peak = worker["peak_bytes"]
        relative = relative_step_time(cfg.with_image_size(image_size), method, batch, text_length, speed)
        rows.append({"method": name, "batch_size": batch, "peak_bytes_est": peak,
                     "fits_est": peak <= usable,
                     "trainable_params": figures["trainable_params"],
                     "step_time_vs_sgd_est": None if relative is None else round(relative, 3)})
    return sorted(rows, key=lambda r: (not r["fits_est"], (r["step_time_vs_sgd_est"] is None,
                                                           r["step_time_vs_sgd_est"] or 0) if r["fits_est"]
                                       else (False, r["peak_bytes_est"])))
