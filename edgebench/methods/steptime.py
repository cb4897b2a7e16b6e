"""A method's step time relative to plain SGD, estimated from a FLOP and memory-traffic model.

An estimate, never a measurement: a step costs its matrix-multiply FLOPs (forward 2 per weight
and token, attention's score and mix products, backward for input and weight gradients where
they are needed, the recomputed forward of checkpointing, MeZO's two forwards) plus the bytes
its elementwise passes move (the optimizer update over the trained weights, MeZO's five
regenerated perturbations, dequantising frozen int8/int4 weights in forward and backward),
weighed at MACHINE_BALANCE FLOPs per byte. Divided by the same figure for `sgd` on the same
model and shape, so the device's absolute speed cancels; the ratio ranks methods for one
device, it does not time them.
"""

from __future__ import annotations

from edgebench.methods.knobs import Method, parse_method
from edgebench.methods.optimizers import optimizer

# FLOPs a CPU core does in the time it moves one byte to or from DRAM (edge Arm and x86
# cores: ~10-50 GFLOP/s fp32 against ~5-10 GB/s per core); an assumption, the same for every device.
MACHINE_BALANCE = 4.0
# Bytes read and written per trained weight by one update (fp32 weight, gradient, states) and
# the forwards a step adds: each optimizer's descriptor (methods/optimizers.py, `update_bytes`,
# `extra_forwards`).
# MeZO: each of the five passes (perturb +, undo, perturb -, undo, update) draws z again;
# drawing a normal sample costs about as much as moving 16 bytes (Box-Muller on CPU).
MEZO_PASSES = 5
MEZO_BYTES_PER_WEIGHT_PASS = 28


def _forward_flops(cfg, batch: int, text_length: int, params) -> dict[str, float]:
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


def step_cost(cfg, method: Method | str, batch_size: int, text_length: int) -> float:
    """The step's cost in FLOP-equivalents (FLOPs + MACHINE_BALANCE x bytes moved); an estimate."""
    from edgebench.methods.memory import _params

    if isinstance(method, str):
        method = parse_method(method)
    params = _params(tuple(sorted(cfg.to_dict().items())), method.trainable, method.frozen_dtype)
    n_trained = sum(p.numel for p in params if p.trainable)
    fwd = _forward_flops(cfg, batch_size, text_length, params)
    forward = sum(fwd.values())
    if method.grad_mode == "zeroth-order":
        flops = 2 * forward
        moved = MEZO_PASSES * MEZO_BYTES_PER_WEIGHT_PASS * n_trained
    elif method.grad_mode == "forward-mode":
        flops = 3 * forward  # the primal and its tangent through every layer
        moved = 12 * n_trained
    else:
        # Input gradients flow wherever something below trains; weight gradients only for the
        # trained matrices (LoRA's and BitFit's are negligible).
        full = method.trainable in ("all", "freeze-vision")
        vision_backward = method.trainable != "freeze-vision"
        backward = (fwd["lm"] + fwd["head"]) * (2 if full else 1)
        if vision_backward:
            backward += fwd["vit"] * (2 if method.trainable == "all" else 1)
        recompute = (fwd["lm"] + (fwd["vit"] if vision_backward else 0)) if method.checkpointing else 0
        opt = optimizer(method.optimizer)
        flops = forward + backward + recompute + opt.extra_forwards * forward  # cg's line search
        moved = opt.update_bytes * n_trained
    frozen = sum(p.numel for p in params if p.packed)
    if frozen:  # dequantised in forward, again in backward (and recompute)
        passes = 1 if method.grad_mode != "backprop" else (3 if method.checkpointing else 2)
        moved += passes * 3 * frozen  # read the codes, write and read the bf16 copy
    return flops + MACHINE_BALANCE * moved


def relative_step_time(cfg, method: Method | str, batch_size: int, text_length: int) -> float:
    """The step time relative to `sgd` on the same model and shape; an estimate."""
    return step_cost(cfg, method, batch_size, text_length) / step_cost(cfg, "sgd", batch_size, text_length)
