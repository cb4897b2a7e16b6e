"""The analytic memory model: what a method needs, predicted from the config before it runs.

All figures are estimates (bytes) and say so: every key ends in `_bytes` and the dict carries
`"estimate": True`. Parameter counts come from the real module structure built on torch's meta
device (no memory), with the method's trainable subset applied, so LoRA, BitFit and frozen
storage are counted exactly. Activations kept for backward are counted per transformer block
from the config (the tensors autograd saves in edgebench's nanoVLM, checked with
saved-tensor hooks). The process's runtime baseline (Python, torch and the libraries a method
imports) was measured once on x86_64 Linux, Python 3.11, torch 2.13 CPU; it is a constant, and
dominates the tiny model's peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from edgebench.methods.knobs import Method, parse_method
from edgebench.methods.optim import galore_rank, is_galore_matrix
from edgebench.methods.subsets import apply_trainable

MiB = 1 << 20
# Measured once: the runner worker's RSS before it builds the model (torch, numpy,
# edgebench, telemetry imported), and what importing each library adds. Estimates, not
# measurements of the device at hand.
RUNTIME_BASELINE_BYTES_EST = 295 * MiB
# peft's figure includes the transformers and torchao it imports.
LIBRARY_BASELINE_BYTES_EST = {"peft": 209 * MiB, "torchao": 83 * MiB, "galore_torch": 134 * MiB,
                              "lomo_optim": 19 * MiB}
# What the first backward and optimizer step add beyond the tensors counted here (autograd
# engine's worker threads, allocator arenas): measured once on the tiny model, batch 1.
STEP_RUNTIME_OVERHEAD_BYTES_EST = 25 * MiB
MEZO_CHUNK_ELEMENTS = 1 << 20
# edgebench.methods.exact: ~7.5% of elements need a recorded fix-up, 8 bytes each.
RESTORE_RECORD_BYTES_PER_WEIGHT_EST = 0.6


@dataclass
class _Param:
    name: str
    shape: tuple[int, ...]
    trainable: bool
    int8: bool  # stored as int8 codes + a per-row fp32 scale (edgebench.methods.int8)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@functools.lru_cache(maxsize=64)
def _params(cfg_items: tuple, trainable: str, frozen_dtype: str) -> tuple[_Param, ...]:
    from edgebench.model.config import VLMConfig
    from edgebench.model.vision_language_model import VisionLanguageModel

    cfg = VLMConfig(**dict(cfg_items))
    with torch.device("meta"):
        model = apply_trainable(Method(trainable=trainable), VisionLanguageModel(cfg))
    tied = {id(model.decoder.token_embedding.weight)}
    int8 = set()
    if frozen_dtype == "int8":  # the layers edgebench.methods.int8 quantises
        int8 = {id(m.weight) for m in model.modules() if type(m) is nn.Linear
                and not m.weight.requires_grad and id(m.weight) not in tied}
    return tuple(_Param(n, tuple(p.shape), p.requires_grad, id(p) in int8)
                 for n, p in model.named_parameters())


def _weights(params, frozen_dtype: str) -> int:
    total = 0
    for p in params:
        if p.trainable or frozen_dtype == "fp32":
            total += 4 * p.numel
        elif p.int8:
            total += p.numel + 4 * p.shape[0]
        else:
            total += 2 * p.numel
    return total


def _optimizer_state(method: Method, trainable: list[_Param]) -> int:
    opt = method.optimizer
    total = 0
    for p in trainable:
        n = p.numel
        if opt in ("sgd", "lomo"):
            continue
        if opt in ("sgd-momentum", "cg"):  # momentum buffer / CG direction
            total += 4 * n
        elif opt in ("adam", "adamw"):
            total += 8 * n
        elif opt in ("adafactor", "adalomo"):  # factored second moment for matrices
            total += 4 * (p.shape[0] + p.numel // p.shape[0]) if len(p.shape) >= 2 else 4 * n
        elif opt in ("adamw-8bit", "adamw-4bit"):
            block, per = (256, 1.0) if opt == "adamw-8bit" else (128, 0.5)
            if n >= 4096 and n % block == 0:  # torchao quantises only these
                total += 2 * int(n * per + 4 * n // block)
            else:
                total += 8 * n
        elif opt == "galore":
            if is_galore_matrix(p.name, p.shape):
                r = galore_rank(p.shape)
                rows, cols = p.shape
                # projector (small side x r) and Adam's two states of the projected gradient
                total += 4 * min(rows, cols) * r + 8 * r * max(rows, cols)
            else:
                total += 8 * n
        else:
            raise ValueError(f"memory model: no state formula for optimizer {opt!r}")
    return total


def _block_activation_elements(cfg, batch: int, text_length: int) -> dict[str, int]:
    """Elements autograd keeps per transformer block (fp32 model), by vision / decoder.

    The vision encoder sees every tile of every sample (cfg.n_tiles); the decoder sees the
    whole sequence, image positions included (cfg.sequence_length).
    """
    n = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
    images = batch * cfg.n_tiles
    seq = cfg.sequence_length(text_length)
    # ViT block: LN in/out, qkv output, softmax, attention out, LN2 in/out (8 D), MLP (2 I).
    vit = images * n * (8 * cfg.vit_hidden_dim + 2 * cfg.vit_inter_dim + cfg.vit_n_heads * n)
    # Decoder block: RMSNorm x/x*r/out twice, q, expanded k and v, attention out (10 D),
    # gated MLP (4 I), causal softmax.
    lm = batch * seq * (10 * cfg.lm_hidden_dim + 4 * cfg.lm_inter_dim + cfg.lm_n_heads * seq)
    return {"vit": vit, "lm": lm, "vit_input": images * n * cfg.vit_hidden_dim,
            "lm_input": batch * seq * cfg.lm_hidden_dim}


def _activations(cfg, method: Method, batch: int, text_length: int) -> tuple[int, int]:
    """(bytes kept for backward, bytes of the largest transient), for one micro-batch."""
    elem = 2 if method.precision == "bf16" else 4
    micro = max(1, batch // method.accumulation)
    blocks = _block_activation_elements(cfg, micro, text_length)
    n = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
    seq = cfg.sequence_length(text_length)
    # The head runs on every position of input_ids but the last (v0.1: the image prefix skipped).
    head_positions = (seq if cfg.image_splitting else text_length) - 1
    logits = 4 * micro * head_positions * cfg.lm_vocab_size  # fp32 (autocast keeps CE in fp32)
    largest_block = elem * max(blocks["vit"], blocks["lm"])
    transient = largest_block + 2 * logits
    if not method.uses_backward:
        return 0, transient
    vision_frozen = method.trainable == "freeze-vision"
    if method.checkpointing:  # block inputs only, and one block recomputed at a time
        vit = 0 if vision_frozen else cfg.vit_n_blocks * blocks["vit_input"] * elem
        lm = cfg.lm_n_blocks * blocks["lm_input"] * elem
        transient += largest_block
    else:
        vit = 0 if vision_frozen else cfg.vit_n_blocks * blocks["vit"] * elem
        lm = cfg.lm_n_blocks * blocks["lm"] * elem
    tiles = micro * cfg.n_tiles
    images = 0 if vision_frozen else 4 * tiles * 3 * cfg.vit_img_size**2
    extras = elem * (tiles * n * 2 * cfg.vit_hidden_dim + micro * seq * 3 * cfg.lm_hidden_dim) + logits
    return vit + lm + images + extras, transient


def _libraries(method: Method) -> list[str]:
    libs = []
    if method.trainable == "lora":
        libs.append("peft")
    if method.optimizer in ("adamw-8bit", "adamw-4bit") and "peft" not in libs:
        libs.append("torchao")
    if method.optimizer == "galore":
        libs.append("galore_torch")
    if method.optimizer in ("lomo", "adalomo"):
        libs.append("lomo_optim")
    return libs


def predict(cfg, method: Method | str, batch_size: int, text_length: int,
            image_size: int | None = None) -> dict:
    """Predicted memory of one training step (bytes, estimates) and its peak.

    Keys: weights, gradients (tangents for forward-mode; gradient + previous gradient for cg),
    optimizer_state, activations (kept for backward), temporaries (largest transient),
    runtime_baseline (Python + torch + libraries), load_peak (building the fp32 model first),
    peak; each `<name>_bytes`, plus `"estimate": True`, and the shape they follow:
    `sequence_length` (decoder positions a sample takes, image included) and `image_tiles`
    (images the vision encoder sees per sample).
    """
    if isinstance(cfg, str):
        from edgebench.model.config import get_config

        cfg = get_config(cfg)
    if isinstance(method, str):
        method = parse_method(method)
    cfg = cfg.with_image_size(image_size)
    params = _params(tuple(sorted(cfg.to_dict().items())), method.trainable, method.frozen_dtype)
    trainable = [p for p in params if p.trainable]
    n_trainable = sum(p.numel for p in trainable)
    weights = _weights(params, method.frozen_dtype)
    largest = 4 * max(p.numel for p in trainable)

    if method.grad_mode == "zeroth-order":
        gradients = 0
    elif method.grad_mode == "forward-mode":
        gradients = 4 * n_trainable  # one tangent per trainable weight
    elif method.fused_update or method.optimizer in ("lomo", "adalomo"):
        gradients = 2 * largest  # at most a couple of gradients alive at once
    elif method.optimizer == "cg":
        gradients = 8 * n_trainable  # this step's gradient and the previous one
    else:
        gradients = 4 * n_trainable
    state = 0 if method.grad_mode != "backprop" else _optimizer_state(method, trainable)
    activations, temporaries = _activations(cfg, method, batch_size, text_length)
    if method.grad_mode == "zeroth-order":
        temporaries += 4 * 4 * min(MEZO_CHUNK_ELEMENTS, largest // 4)
        temporaries += int(RESTORE_RECORD_BYTES_PER_WEIGHT_EST * n_trainable)
    if method.grad_mode == "forward-mode":
        temporaries *= 2  # every forward temporary carries its tangent
    if method.optimizer == "cg":
        temporaries += 4 * n_trainable  # the new direction while the old one is alive
    baseline = RUNTIME_BASELINE_BYTES_EST + sum(LIBRARY_BASELINE_BYTES_EST[lib] for lib in _libraries(method))
    if method.uses_backward:
        baseline += STEP_RUNTIME_OVERHEAD_BYTES_EST
    train_peak = baseline + weights + gradients + state + activations + temporaries
    # build_model_for builds in bf16 when frozen weights are stored below fp32.
    load_peak = baseline + (2 if method.frozen_dtype != "fp32" else 4) * sum(p.numel for p in params)
    return {
        "weights_bytes": weights,
        "gradients_bytes": gradients,
        "optimizer_state_bytes": state,
        "activations_bytes": activations,
        "temporaries_bytes": temporaries,
        "runtime_baseline_bytes": baseline,
        "load_peak_bytes": load_peak,
        "peak_bytes": max(train_peak, load_peak),
        "trainable_params": n_trainable,
        "total_params": sum(p.numel for p in params),
        "sequence_length": cfg.sequence_length(text_length),
        "image_tiles": cfg.n_tiles,
        "estimate": True,
    }
