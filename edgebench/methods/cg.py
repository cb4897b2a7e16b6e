"""Nonlinear conjugate gradient with Polak-Ribiere+ directions and an Armijo line search.

Polak & Ribiere 1969 / Polyak 1969; the "+" (beta clipped at 0, an automatic restart) is
Gilbert & Nocedal 1992, "Global convergence properties of conjugate gradient methods for
optimization" (SIAM J. Optim. 2(1)); backtracking with the Armijo sufficient-decrease condition
(Nocedal & Wright, Numerical Optimization, Alg. 3.1). Each step: one backward for the gradient,
direction d = -g + beta * d_prev (restarted to -g when beta <= 0, when d is not a descent
direction, or every `RESTART_EVERY` steps), then trial steps theta + alpha*d evaluated with
forward passes only. A trial is accepted only if L(theta + alpha*d) <= L(theta) + c*alpha*g.d,
which with g.d < 0 means the loss on the step's batch fell; a rejected trial is undone bitwise
(the few elements whose rounding would not come back are recorded and rewritten), and if no trial
passes the next step restarts from steepest descent. Memory: weights + gradient + previous
gradient + direction (like Adam's two states).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from edgebench.methods.exact import Record, add_recorded, restore, undo
from edgebench.methods.knobs import Method
from edgebench.methods.trainer import Batch, Trainer

ARMIJO_C = 1e-4
BACKTRACK = 0.5
MAX_TRIALS = 8
RESTART_EVERY = 20
GROW = 2.0  # the next step's first trial: the last accepted alpha times this


def _dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(sum(torch.sum(x.float() * y.float()) for x, y in zip(a, b)))


class ConjugateGradientTrainer(Trainer):
    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None):
        super().__init__(method, model, lr, total_steps, weight_decay)  # refuses any but 0
        self.alpha = lr
        self.grad_prev: list[torch.Tensor] | None = None
        self.direction: list[torch.Tensor] | None = None
        self.last_search: dict[str, Any] = {}

    def _gradient(self, batch: Batch) -> tuple[float, list[torch.Tensor]]:
        self.model.train()
        loss = self.loss(batch)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward is unannotated
        grads = cast(list[torch.Tensor], [p.grad for p in self.params])  # backward gave every weight one
        for p in self.params:
            p.grad = None
        return loss.item(), grads

    def _new_direction(self, grad: list[torch.Tensor]) -> list[torch.Tensor]:
        restart = self.direction is None or self.steps_done % RESTART_EVERY == 0
        if not restart:
            assert self.grad_prev is not None  # set by every step, before any direction
            beta = _dot(grad, [g - gp for g, gp in zip(grad, self.grad_prev)]) / max(
                _dot(self.grad_prev, self.grad_prev), 1e-30)
            restart = beta <= 0
        if restart:
            return [-g for g in grad]
        assert self.direction is not None  # restart covers None
        direction = [-g + beta * d for g, d in zip(grad, self.direction)]
        if _dot(grad, direction) >= 0:  # not a descent direction
            return [-g for g in grad]
        return direction

    def _move(self, direction: list[torch.Tensor], alpha: float) -> Record:
        """theta += alpha * d in place; returns what `_undo` needs to come back bitwise."""
        record: Record = []
        for p, d in zip(self.params, direction):
            add_recorded(p.data.view(-1), (alpha * d).view(-1), record)
        return record

    def _undo(self, direction: list[torch.Tensor], alpha: float, record: Record) -> None:
        for p, d in zip(self.params, direction):
            undo(p.data.view(-1), (alpha * d).view(-1))
        restore(record)

    def step(self, batch: Batch, consume: bool = False) -> float:  # reads the batch more than once: keeps it
        loss0, grad = self._gradient(batch)
        direction = self._new_direction(grad)
        slope = _dot(grad, direction)
        alpha, accepted_loss = self.alpha, None
        self.model.eval()
        with torch.no_grad():
            for trial in range(1, MAX_TRIALS + 1):  # noqa: B007 - the count is recorded after the loop
                record = self._move(direction, alpha)
                trial_loss = self.loss(batch).item()
                if trial_loss <= loss0 + ARMIJO_C * alpha * slope:
                    accepted_loss = trial_loss
                    break
                self._undo(direction, alpha, record)
                alpha *= BACKTRACK
        if accepted_loss is None:
            self.direction = None  # restart from steepest descent
            self.alpha = alpha
        else:
            self.direction = direction
            self.alpha = alpha * GROW
        self.grad_prev = grad
        self.last_search = {"loss_before": loss0, "loss_after": accepted_loss, "alpha": alpha,
                            "trials": trial, "slope": slope}
        self.steps_done += 1
        return loss0
