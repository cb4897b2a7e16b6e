"""`make_trainer`: a model and a Method in, a `Trainer` with `step(batch) -> loss` out.

Backprop methods live here (plain, accumulated, bf16 autocast, fused update-in-backward,
LOMO/AdaLomo); zeroth-order, forward-mode and conjugate gradient have their own modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from edgebench.methods import optim, pruning
from edgebench.methods.knobs import Method, MethodError, MethodUnavailable, parse_method
from edgebench.methods.subsets import (
    apply_trainable,
    checkpoint_blocks,
    store_frozen,
    trainable_parameters,
)

if TYPE_CHECKING:
    from edgebench.model.config import VLMConfig

Batch = dict[str, torch.Tensor]


class Trainer:
    """One method applied to one model. `step(batch)` returns that batch's loss (before the
    update); `model` is the model being trained (with adapters, if any).

    `step(batch, consume=True)`: the caller gives the batch away. A trainer that reads it in one
    forward pass drops its images as soon as that pass is done: backward reads only what autograd
    saved, so the pixels (nanovlm-460m at main's images: 17 views, 51 MiB) are not held through
    backward. Trainers that read the batch more than once (MeZO, cg, forward gradients) keep it.

    `weight_decay`: RunSpec.weight_decay (None: the optimizer's default), applied as the
    optimizer's descriptor says (`decay`: L2 or decoupled); one it cannot apply is refused here."""

    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None):
        from edgebench.methods.optimizers import decay_refusal, run_weight_decay

        refusal = decay_refusal(method.optimizer, weight_decay)
        if refusal:
            raise MethodUnavailable(refusal)
        self.method = method
        self.model = model
        self.lr = lr
        self.weight_decay = run_weight_decay(method.optimizer, weight_decay)
        self.total_steps = max(1, total_steps)
        self.steps_done = 0
        self.params = trainable_parameters(model)
        if not self.params:
            raise ValueError(f"method {method.name!r}: no trainable parameters in the model")

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """bf16 autocast of the compute when the method asks for it."""
        if self.method.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def loss(self, batch: Batch, consume: bool = False) -> torch.Tensor:
        """The batch's loss; padded keys are masked by its `attention_mask` (as nanoVLM trains).
        `consume`: the batch's last forward pass: its images leave it once the pass is done."""
        with self.autocast():
            loss: torch.Tensor = self.model(*model_inputs(batch))
        if consume:
            del batch["images"]
        return loss

    def step(self, batch: Batch, consume: bool = False) -> float:
        raise NotImplementedError


class BackpropTrainer(Trainer):
    """Backward pass, global-norm clip 1.0, then one optimizer step over the schedule; a pruned
    method's zeros (edgebench.methods.pruning) kept out of the gradients and the weights."""

    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None):
        super().__init__(method, model, lr, total_steps, weight_decay)
        groups = (optim.galore_groups(model, lr) if method.optimizer == "galore"
                  else optim.param_groups(model, lr))
        self.optimizer = optim.build_optimizer(method.optimizer, groups, self.weight_decay)
        self.masks = pruning.prune(model, method.prune) if method.prune else {}

    def step(self, batch: Batch, consume: bool = False) -> float:
        self.model.train()
        total = 0.0
        for micro in split_batch(batch, self.method.accumulation, getattr(self.model, "cfg", None)):
            loss = self.loss(micro, consume) / self.method.accumulation
            loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward is unannotated
            total += loss.item()
        pruning.mask_gradients(self.masks)
        torch.nn.utils.clip_grad_norm_(self.params, optim.MAX_GRAD_NORM)
        optim.set_schedule([self.optimizer], self.steps_done, self.total_steps)
        self.optimizer.step()
        pruning.hold(self.masks)
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        return total


class FusedTrainer(Trainer):
    """Update each parameter inside backward as soon as its gradient is accumulated, then free
    that gradient (torch's `register_post_accumulate_grad_hook`, one optimizer per parameter).

    Only one parameter's gradient exists at a time, so the gradients' memory nearly vanishes.
    The price: no global-norm clipping (the norm is known only after the last gradient).
    Subclasses change what the update is (`_update`) and how the schedule reaches it (`_schedule`).
    """

    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None):
        super().__init__(method, model, lr, total_steps, weight_decay)
        self.optimizers: list[torch.optim.Optimizer] = []
        for group in optim.param_groups(model, lr):
            for param in group["params"]:
                param.register_post_accumulate_grad_hook(_then_free_grad(self._update(group, param)))

    def _update(self, group: dict[str, Any], param: nn.Parameter) -> Callable[[torch.Tensor], object]:
        """What runs on `param` once its gradient is complete: its own optimizer's step."""
        opt = optim.build_optimizer(self.method.optimizer, [{**group, "params": [param]}], self.weight_decay)
        self.optimizers.append(opt)
        return lambda _param: opt.step()

    def _schedule(self) -> None:
        optim.set_schedule(self.optimizers, self.steps_done, self.total_steps)

    def step(self, batch: Batch, consume: bool = False) -> float:
        self.model.train()
        self._schedule()
        loss = self.loss(batch, consume)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward is unannotated
        self.steps_done += 1
        return loss.item()


def _then_free_grad(update: Callable[[torch.Tensor], object]) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        with torch.no_grad():
            update(param)
        param.grad = None

    return hook


class LomoTrainer(Trainer):
    """LOMO / AdaLomo (Lv et al. 2023/2024) from lomo-optim: the update runs in gradient hooks
    during backward and each gradient is dropped right after. One lr for all parameters
    (lomo-optim has no groups); no clipping (its norm clip needs a second backward pass)."""

    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None):
        super().__init__(method, model, lr, total_steps, weight_decay)
        import importlib

        from edgebench.methods.optimizers import optimizer

        module, _, cls = optimizer(method.optimizer).build.partition(":")  # lomo_optim's Lomo / AdaLomo
        if method.optimizer == "adalomo" and not torch.cuda.is_available():
            raise MethodUnavailable(
                "adalomo: lomo-optim's AdaLomo allocates its state with .cuda(), so it needs a CUDA "
                "device (torch sees none); on CPU use lomo or adafactor"
            )

        self.optimizer = getattr(importlib.import_module(module), cls)(model, lr=lr, weight_decay=self.weight_decay)

    def step(self, batch: Batch, consume: bool = False) -> float:
        self.model.train()
        loss = self.loss(batch, consume)
        self.optimizer.fused_backward(loss, self.lr * optim.lr_factor(self.steps_done, self.total_steps))
        self.steps_done += 1
        return loss.item()


def model_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The model's positional inputs (input_ids, images, labels, attention_mask); a batch
    without a mask (hand-made) attends to every token."""
    return batch["input_ids"], batch["images"], batch["labels"], batch.get("attention_mask")


def split_batch(batch: Batch, parts: int, cfg: VLMConfig | None = None) -> list[Batch]:
    """`parts` equal micro-batches of one batch (the same effective batch): rows i, i+parts, ...

    Each row keeps its own images: in main's layout (`cfg.image_splitting`) a row holds
    several views (tiles, and with packing several samples), counted by its placeholders.
    """
    if parts == 1:
        return [batch]
    size = batch["input_ids"].shape[0]
    if size % parts:
        raise MethodError(
            f"accum{parts} splits each batch into {parts} micro-batches: the batch size must be "
            f"a multiple of {parts} (got {size}); give a --batch-size that is a multiple of {parts}"
        )
    images = batch["images"]
    if images.shape[0] == size:  # one image per row
        return [{k: v[i::parts] for k, v in batch.items()} for i in range(parts)]
    assert cfg is not None, "several views per row: split_batch needs the model's cfg"
    views = ((batch["input_ids"] == cfg.image_token_id).sum(dim=1) // cfg.n_image_tokens).tolist()
    starts = [sum(views[:b]) for b in range(size)]
    return [{**{k: v[i::parts] for k, v in batch.items() if k != "images"},
             "images": torch.cat([images[starts[b]:starts[b] + views[b]] for b in range(i, size, parts)])}
            for i in range(parts)]


def prepare_model(method: Method, model: nn.Module) -> nn.Module:
    """Apply the method's model-side knobs: trainable subset, frozen storage, checkpointing."""
    model = apply_trainable(method, model)
    store_frozen(method, model)
    if method.checkpointing:
        checkpoint_blocks(model, per_view=method.view_by_view)
    return model


def build_model_for(method: Method | str, name_or_dir: str, image_size: int | None = None) -> nn.Module:
    """Build a fresh model the way the method stores it, so loading never peaks higher than
    training: methods that keep weights in bf16/int8 build in bf16 (half the fp32 peak), int4
    layer by layer (edgebench.methods.streaming); `make_trainer` then gives the trained weights
    their dtype. Checkpoints load as they are.
    """
    from edgebench.model import CONFIG_NAMES, build_model

    if isinstance(method, str):
        method = parse_method(method)
    low_precision = method.frozen_dtype != "fp32" or method.trained_dtype != "fp32"
    if not low_precision or name_or_dir not in CONFIG_NAMES:
        return build_model(name_or_dir, image_size=image_size)
    if method.frozen_dtype == "int4":  # layer by layer: even bf16 would not fit where int4 is needed
        from edgebench.methods.streaming import build_streamed
        from edgebench.model import get_config

        return build_streamed(method, get_config(name_or_dir).with_image_size(image_size))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return build_model(name_or_dir, image_size=image_size)
    finally:
        torch.set_default_dtype(previous)
