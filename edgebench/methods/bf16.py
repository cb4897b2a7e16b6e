"""Full-parameter training with bf16 weights and no fp32 copy: SGD fused into backward
(LOMO, Lv et al. 2023) with stochastic rounding (Zamirai et al. 2020; Gupta et al. 2015).

Each weight is updated in its post-accumulate-grad hook and its gradient dropped at once, so
the step holds the bf16 weights, one gradient and the activations: no optimizer state, no
fp32 master weights. The token embedding's lookup makes a sparse gradient (the looked-up rows,
added into the tied head's dense one in place), so no second vocabulary-sized gradient is
held (nanovlm-222m: 67 MiB less peak). A bf16 weight has 8 significant bits, so an update
smaller than half its spacing (|w| / 256) rounds back to w and is lost; stochastic rounding
rounds the fp32 result up with a probability equal to the lost fraction, so every update
survives in expectation. `rounding="nearest"` is the plain bf16 update, for comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from edgebench.methods import optim
from edgebench.methods.knobs import Method
from edgebench.methods.trainer import FusedTrainer

CHUNK = 1 << 20  # elements updated at once: bounds the fp32 temporaries to a few MiB per weight
_LOW_BITS = 0xFFFF  # fp32 bits below bf16's mantissa


def stochastic_round_(target: torch.Tensor, value: torch.Tensor, generator: torch.Generator) -> None:
    """target (bf16) <- value (fp32) rounded to a neighbouring bf16 value, up with probability
    equal to the fraction the truncation drops (sign-magnitude: away from zero)."""
    bits = value.view(torch.int32)
    noise = torch.randint(0, _LOW_BITS + 1, bits.shape, dtype=torch.int32, generator=generator)
    target.copy_(((bits + noise) & ~_LOW_BITS).view(torch.float32))  # exact: low bits are zero


def sgd_update_(param: torch.Tensor, grad: torch.Tensor, lr: float, generator: torch.Generator | None,
                weight_decay: float = 0.0) -> None:
    """param -= lr * (grad + weight_decay * param) (torch SGD's L2) in fp32 arithmetic, a chunk
    at a time, rounded into param's dtype stochastically (`generator` given) or to nearest."""
    flat_p, flat_g = param.view(-1), grad.reshape(-1)
    for start in range(0, flat_p.numel(), CHUNK):
        p, g = flat_p[start : start + CHUNK], flat_g[start : start + CHUNK]
        value = p.float()
        g32 = torch.add(g.float(), value, alpha=weight_decay) if weight_decay else g.float()
        value.sub_(g32, alpha=lr)
        if generator is None:
            p.copy_(value)
        else:
            stochastic_round_(p, value, generator)


class Bf16SgdTrainer(FusedTrainer):
    """bf16 weights, SGD applied per weight inside backward (nanoVLM's projector/backbone lrs
    and schedule), rounded per the method. No global-norm clip: the norm is known only after
    the last gradient, as in every update-in-backward method."""

    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None):
        self.generator = torch.Generator().manual_seed(0) if method.rounding == "stochastic" else None
        self.factor = 1.0
        embedding = getattr(getattr(model, "decoder", None), "token_embedding", None)
        if isinstance(embedding, nn.Embedding):
            embedding.sparse = True
        super().__init__(method, model, lr, total_steps, weight_decay)

    def _update(self, group: dict[str, Any], param: nn.Parameter) -> Callable[[torch.Tensor], None]:
        peak_lr = group["lr"]

        def update(param: torch.Tensor) -> None:
            grad = param.grad
            assert grad is not None  # the hook runs once the gradient is accumulated
            grad = grad.to_dense() if grad.is_sparse else grad  # an untied embedding
            sgd_update_(param.data, grad, peak_lr * self.factor, self.generator, self.weight_decay)

        return update

    def _schedule(self) -> None:
        self.factor = optim.lr_factor(self.steps_done, self.total_steps)
