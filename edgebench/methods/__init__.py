"""The gradient-computation methods: knobs, presets, trainers and the analytic memory model.

`parse_method("lora+ckpt+bf16") -> Method`, `PRESETS`, `make_trainer(method, model, ...)`,
and `edgebench.methods.memory.predict(...)` (estimates, in bytes). Importing the package
does not import torch: knobs, presets and support tables stay usable without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgebench.methods.knobs import PRESETS, Method, MethodError, MethodUnavailable, parse_method

if TYPE_CHECKING:
    from torch import nn

    from edgebench.methods.trainer import Trainer

__all__ = ["PRESETS", "Method", "MethodError", "MethodUnavailable", "make_trainer", "parse_method"]


def make_trainer(method: Method | str, model: nn.Module, *, lr: float | None = None,
                 weight_decay: float | None = None, total_steps: int = 1000, fresh_weights: bool = False) -> Trainer:
    """The trainer for `method` (a Method or its text) on `model` (changed in place).

    `lr` is the backbone peak lr (None: the method's default, for a checkpoint's weights or,
    `fresh_weights`, for a config's random ones); nanoVLM's projector lr applies to `MP.*`
    when higher. `weight_decay`: None is the optimizer's default (trainer.Trainer).
    `total_steps` sizes the warmup + cosine schedule. The factory
    lives here, not beside the base class, so trainer modules never import each other in a circle.
    """
    from edgebench.methods import optim
    from edgebench.methods.int8 import held_dequantized
    from edgebench.methods.optimizers import optimizer
    from edgebench.methods.subsets import trainable_parameters
    from edgebench.methods.trainer import BackpropTrainer, FusedTrainer, LomoTrainer, prepare_model
    from edgebench.model.vision_language_model import set_flash_attention

    if isinstance(method, str):
        method = parse_method(method)
    model = prepare_model(method, model)
    model.chunked_loss = method.chunked_loss  # type: ignore[assignment]  # torch types Module attributes as tensors/modules only
    model.view_by_view = method.view_by_view  # type: ignore[assignment]
    set_flash_attention(model, method.flash_attention)
    model.frozen_block_scope = held_dequantized  # type: ignore[assignment]  # a frozen block's int8/int4 layers dequantise once for all its views
    if method.view_by_view:  # each view's freed activations leave the RSS instead of piling up in
        # glibc's heap (sgd over 10 views of 256 px: step peak 901 MiB without this, 512 with)
        from edgebench.methods.subsets import map_large_allocations

        map_large_allocations()
    if lr is None:
        lr = optim.default_lr(method, sum(p.numel() for p in trainable_parameters(model)),
                               fresh_weights=fresh_weights)
    cls: type[Trainer]
    if method.grad_mode == "zeroth-order":
        from edgebench.methods.mezo import MeZOTrainer as cls
    elif method.grad_mode == "forward-mode":
        from edgebench.methods.forward_grad import ForwardGradTrainer as cls
    elif optimizer(method.optimizer).trainer == "line-search":  # cg
        from edgebench.methods.cg import ConjugateGradientTrainer as cls
    elif optimizer(method.optimizer).trainer == "in-backward":  # lomo-optim's
        cls = LomoTrainer
    elif method.trained_dtype == "bf16":
        from edgebench.methods.bf16 import Bf16SgdTrainer as cls
    elif method.fused_update:
        cls = FusedTrainer
    else:
        cls = BackpropTrainer
    return cls(method, model, lr, total_steps, weight_decay)
