"""A method's step time relative to plain SGD, estimated from the work a step does and the
device's own rates (methods.device_speed).

An estimate, never a measurement. A step costs
- its matrix-multiply FLOPs (forward 2 per weight and token, attention's score and mix
  products, backward for input and weight gradients where they are needed, checkpointing's
  recomputed forward, MeZO's two forwards, cg's trial forwards) at the device's fp32 matmul
  rate, or at its bf16 rate for a method that computes in bf16;
- the elementwise work around those matmuls (norms, activations, softmax, residual adds), a
  share of the fp32 matmul time (ACTIVATION_SHARE: it does not speed up with bf16 matmuls);
- elementwise passes over weights at the device's time per pass: each matmul streaming its
  weight, the clip and each optimizer's update over the trained ones (its descriptor's
  `update_passes`), bf16 autocast's casts, dequantising frozen int8/int4 weights;
- normal samples drawn per trained weight (MeZO's five regenerated perturbations, the forward
  gradient's tangent) at the device's time per sample.
Divided by the same sum for `sgd` on the same model, shape and device, so the ratio ranks
methods for that device; it does not time them. `bench/step_model.py` checks the ratios against
measured ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from edgebench.methods.device_speed import DeviceSpeed
from edgebench.methods.knobs import Method, parse_method
from edgebench.methods.optimizers import Optimizer, optimizer

if TYPE_CHECKING:
    from edgebench.methods.memory import _Param
    from edgebench.model.config import VLMConfig

# The terms below were fitted together, on nanovlm-222m on a 2-core x86 host (AVX-512, AMX), to
# two runs of `bench/step_model.py --steps 4` (each preset within 24 % in both); a third checks
# them (docs/measurements.md).
# Elementwise work of forward and backward (norms, activations, softmax, residual adds) as a
# share of their fp32 matmul time (torch's profiler: 0.4-0.5 of aten::mm's time in SGD and LoRA
# steps, some of which the weight streaming below stands for).
ACTIVATION_SHARE = 0.3
# A matmul over few rows streams its weight matrix from memory each time it runs: passes over a
# weight per forward or backward of its layer (why batch 4 costs 2.4x batch 1, not 4x).
WEIGHT_STREAM_PASSES = 2.0
# Passes over each trained weight a backprop step makes besides the update: the global-norm
# clip (its norm and its scale: 1.1-1.4 passes timed alone), and one more for each further
# micro-batch, whose gradient is added to the last.
GRADIENT_PASSES = 1.0
# bf16 autocast: every weight a forward uses cast to bf16, each trained weight's bf16 gradient
# cast back, and the activations autocast converts at each op's boundary.
CAST_PASSES = 6.0
# Passes over a frozen packed weight per dequantisation (int4: two codes a byte, group scales).
DEQUANT_PASSES = {"int8": 3.0, "int4": 6.0}
# MeZO: each of the five passes (perturb +, undo, perturb -, undo, update) draws z again and
# adds it to every trained weight.
MEZO_PASSES = 5


def _forward_flops(cfg: VLMConfig, batch: int, text_length: int, params: Iterable[_Param]) -> dict[str, float]:
    """Forward FLOPs of the vision encoder, the decoder and the LM head, for one step's batch."""
    patches = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
    images = batch * cfg.n_tiles
    seq = cfg.sequence_length(text_length)
    vit_weights = sum(p.numel for p in params if p.name.startswith("vision_encoder.") and len(p.shape) >= 2)
    lm_weights = sum(p.numel for p in params if p.name.startswith("decoder.blocks.") and len(p.shape) >= 2)
    mp_weights = sum(p.numel for p in params if p.name.startswith("MP.") and len(p.shape) >= 2)
    vit = 2 * vit_weights * images * patches + 4 * cfg.vit_n_blocks * images * patches**2 * cfg.vit_hidden_dim
    lm = 2 * lm_weights * batch * seq + 4 * cfg.lm_n_blocks * batch * seq**2 * cfg.lm_hidden_dim
    head_positions = (seq if cfg.image_splitting else text_length) - 1
    head = 2 * cfg.lm_hidden_dim * cfg.lm_vocab_size * batch * head_positions
    return {"vit": vit + 2 * mp_weights * images * patches, "lm": lm, "head": head}


def _weights(cfg: VLMConfig, params: Iterable[_Param]) -> dict[str, float]:
    """The matrices' weights of each part _forward_flops counts (the head's: the embedding's when tied)."""
    head = "decoder.token_embedding." if cfg.lm_tie_weights else "decoder.head."
    parts = {"vit": ("vision_encoder.", "MP."), "lm": ("decoder.blocks.",), "head": (head,)}
    return {part: sum(p.numel for p in params if p.name.startswith(prefixes) and len(p.shape) >= 2)
            for part, prefixes in parts.items()}


def _runs(method: Method, opt: Optimizer, lm_share: float = 1.0) -> dict[str, float]:
    """How many times a step runs each part: forwards, backwards (2: input and weight
    gradients, 1: input gradients only) and recomputed forwards, by grad mode. `lm_share`: the
    share of the decoder's blocks backward reaches (a `lastK` method's K of them)."""
    if method.grad_mode == "zeroth-order":
        return {"vit": 2, "lm": 2, "head": 2}
    if method.grad_mode == "forward-mode":
        return {"vit": 3, "lm": 3, "head": 3}  # the primal and its tangent through every layer
    # Input gradients flow wherever something below trains; weight gradients only for the
    # trained matrices (LoRA's and BitFit's are negligible).
    full = method.trainable in ("all", "freeze-vision")
    vision_backward = not method.vision_frozen
    forwards = 1 + opt.extra_forwards  # cg's trial forwards
    lm = forwards + ((2 if full else 1) + (1 if method.checkpointing else 0)) * lm_share
    vit = forwards + ((2 if method.trainable == "all" else 1) + (1 if method.checkpointing else 0)
                      if vision_backward else 0)
    return {"vit": vit, "lm": lm, "head": forwards + (2 if full else 1)}


def _work(cfg: VLMConfig, method: Method, batch_size: int, text_length: int) -> tuple[float, float, float]:
    """(matmul FLOPs, elementwise passes over one weight, normal samples) of one step."""
    from edgebench.methods.memory import _params

    params = _params(tuple(sorted(cfg.to_dict().items())), method.trainable, method.frozen_dtype, method.last_blocks)
    n_trained = sum(p.numel for p in params if p.trainable)
    opt = optimizer(method.optimizer)
    runs = _runs(method, opt, (method.last_blocks or cfg.lm_n_blocks) / cfg.lm_n_blocks)
    flops = sum(runs[part] * f for part, f in _forward_flops(cfg, batch_size, text_length, params).items())
    streamed = sum(runs[part] * w for part, w in _weights(cfg, params).items())
    passes = method.accumulation * WEIGHT_STREAM_PASSES * streamed  # again for each micro-batch
    normals = 0.0
    if method.grad_mode == "zeroth-order":
        passes += MEZO_PASSES * n_trained
        normals = MEZO_PASSES * n_trained
    elif method.grad_mode == "forward-mode":
        passes += opt.update_passes * n_trained
        normals = n_trained
    else:
        passes += (GRADIENT_PASSES + (method.accumulation - 1) + opt.update_passes) * n_trained
    if method.precision == "bf16":
        casts = 2 if method.checkpointing else 1
        passes += CAST_PASSES * casts * method.accumulation * sum(p.numel for p in params if not p.packed)
    frozen = sum(p.numel for p in params if p.packed)
    if frozen:  # dequantised in forward, again in backward (and recompute)
        dequantisations = 1 if method.grad_mode != "backprop" else (3 if method.checkpointing else 2)
        passes += method.accumulation * dequantisations * DEQUANT_PASSES[method.frozen_dtype] * frozen
    return flops, passes, normals


def step_seconds(cfg: VLMConfig, method: Method | str, batch_size: int, text_length: int,
                 speed: DeviceSpeed) -> float | None:
    """The modelled step time at `speed`'s rates (an estimate; its ratio to sgd's is what ranks).
    None for a method that computes in bf16 where the device's bf16 matmul cost is unknown."""
    if isinstance(method, str):
        method = parse_method(method)
    flops, passes, normals = _work(cfg, method, batch_size, text_length)
    matmul_cost = speed.bf16_matmul_cost if method.precision == "bf16" else 1.0
    if matmul_cost is None:  # bf16, its cost on this device unknown
        return None
    return (flops * (matmul_cost + ACTIVATION_SHARE) / (speed.matmul_gflops * 1e9)
            + (passes * speed.pass_ns + normals * speed.normal_ns) * 1e-9)


def relative_step_time(cfg: VLMConfig, method: Method | str, batch_size: int, text_length: int,
                       speed: DeviceSpeed) -> float | None:
    """The step time relative to `sgd` on the same model, shape and device; an estimate. None
    for a bf16 method where the device's bf16 matmul cost is unknown."""
    seconds = step_seconds(cfg, method, batch_size, text_length, speed)
    sgd = step_seconds(cfg, "sgd", batch_size, text_length, speed)
    assert sgd is not None  # sgd computes in fp32
    return None if seconds is None else seconds / sgd
