"""Forward gradients: a gradient estimate from one forward-mode pass, no backward.

Baydin, Pearlmutter, Syme, Wood & Torr 2022, "Gradients without Backpropagation"
(arXiv:2202.08587): draw a tangent v ~ N(0, I), compute the directional derivative
d = grad(L) . v with forward-mode AD (here torch.func.jvp), and step along g = d * v, an
unbiased estimate of grad(L). Memory: the weights, one tangent per trainable weight, and the
forward's dual temporaries; nothing is kept for a backward pass.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.func import functional_call, jvp

from edgebench.methods import optim
from edgebench.methods.knobs import Method
from edgebench.methods.trainer import Batch, Trainer, model_inputs


class ForwardGradTrainer(Trainer):
    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None, seed: int = 0):
        super().__init__(method, model, lr, total_steps, weight_decay)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.tangents = torch.Generator().manual_seed(seed)
        self.directional_derivative = 0.0

    @torch.no_grad()
    def step(self, batch: Batch, consume: bool = False) -> float:  # reads the batch more than once: keeps it
        self.model.train()
        primals = tuple(p.detach() for p in self.params)
        tangents = tuple(torch.randn(p.shape, generator=self.tangents, dtype=p.dtype) for p in primals)
        inputs = model_inputs(batch)

        def loss_of(*weights: torch.Tensor) -> torch.Tensor:
            with self.autocast():
                loss: torch.Tensor = functional_call(self.model, dict(zip(self.names, weights)), inputs, strict=False)
                return loss

        # without has_aux, jvp returns (output, directional derivative)
        loss, derivative = cast(tuple[torch.Tensor, torch.Tensor], jvp(loss_of, primals, tangents))
        self.directional_derivative = derivative.item()
        lr = self.lr * optim.lr_factor(self.steps_done, self.total_steps)
        if self.weight_decay:  # SGD's L2 on the estimate: theta -= lr * (d v + wd theta)
            torch._foreach_mul_(tuple(self.params), 1 - lr * self.weight_decay)
        for param, tangent in zip(self.params, tangents):
            param.add_(tangent, alpha=-lr * self.directional_derivative)
        self.steps_done += 1
        return loss.item()
