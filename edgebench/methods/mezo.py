"""MeZO: memory-efficient zeroth-order optimisation.

Malladi et al. 2023, "Fine-Tuning Language Models with Just Forward Passes" (NeurIPS 2023,
arXiv:2305.17333), Algorithm 1: SPSA with the random-seed trick. Each step draws a seed s,
perturbs the weights in place by +eps*z and -eps*z (z regenerated from s each time, never
stored), takes the projected gradient g = (L+ - L-) / 2eps and updates theta -= lr * g * z with
z regenerated once more. Memory stays that of inference plus one chunk of z.

Floating-point rounding would leave weights an ulp off after +eps, -2eps, +eps (about 45% of
elements). Here each perturbation is undone on its own (+eps, undo, -eps, undo) and the few
elements whose rounding would not come back are recorded and written back
(edgebench.methods.exact): the weights are restored bitwise, with no copy of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from edgebench.methods import optim
from edgebench.methods.exact import Record, add_recorded, merged, restore, undo
from edgebench.methods.knobs import Method
from edgebench.methods.trainer import Batch, Trainer

EPS = 1e-3  # the paper's perturbation scale
CHUNK = 1 << 20  # elements of z generated at once: bounds the temporary memory


class MeZOTrainer(Trainer):
    def __init__(self, method: Method, model: nn.Module, lr: float, total_steps: int,
                 weight_decay: float | None = None, seed: int = 0):
        super().__init__(method, model, lr, total_steps, weight_decay)
        self.eps = EPS
        self.seeds = torch.Generator().manual_seed(seed)
        self.projected_grad = 0.0

    def _z_chunks(self, seed: int, index: int, param: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
        """(slice, z) over the flattened parameter; the same seed gives the same z."""
        gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
        n = param.numel()
        for start in range(0, n, CHUNK):
            stop = min(n, start + CHUNK)
            yield slice(start, stop), torch.randn(stop - start, generator=gen, dtype=torch.float32)

    def _add(self, seed: int, scale: float, record: Record | None = None) -> None:
        """theta += scale * z in place, chunk by chunk; with `record`, undoable bitwise.

        A weight's per-chunk records are merged into one as soon as the weight is done: left
        apart, each chunk's small records sit in the heap between its 4 MiB temporaries and pin
        the holes (nanovlm-222m kept 517 MiB resident for ~133 MiB of records)."""
        for index, param in enumerate(self.params):
            flat = param.data.view(-1)
            parts: Record = []
            for part, z in self._z_chunks(seed, index, param):
                delta = (scale * z).to(flat.dtype)
                if record is None:
                    flat[part] += delta
                else:
                    add_recorded(flat[part], delta, parts)
            if record is not None and parts:  # parts fill only with a record
                record.append(merged(flat, parts))

    def _undo(self, seed: int, scale: float, record: Record) -> None:
        for index, param in enumerate(self.params):
            flat = param.data.view(-1)
            for part, z in self._z_chunks(seed, index, param):
                undo(flat[part], (scale * z).to(flat.dtype))
        restore(record)

    def _loss_at(self, batch: Batch, seed: int, scale: float) -> float:
        """The loss at theta + scale * z; theta is back bitwise afterwards."""
        record: Record = []
        self._add(seed, scale, record)
        loss = self.loss(batch).item()
        self._undo(seed, scale, record)
        return loss

    @torch.no_grad()
    def estimate(self, batch: Batch, seed: int) -> tuple[float, float]:
        """(projected gradient, loss) from the +eps / -eps forwards; weights restored bitwise."""
        loss_plus = self._loss_at(batch, seed, self.eps)
        loss_minus = self._loss_at(batch, seed, -self.eps)
        return (loss_plus - loss_minus) / (2 * self.eps), (loss_plus + loss_minus) / 2

    @torch.no_grad()
    def step(self, batch: Batch, consume: bool = False) -> float:  # reads the batch more than once: keeps it
        """One SPSA step; returns the mean of the two perturbed losses (MeZO's logged loss)."""
        self.model.eval()
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.seeds))
        self.projected_grad, loss = self.estimate(batch, seed)
        lr = self.lr * optim.lr_factor(self.steps_done, self.total_steps)
        if self.weight_decay:  # SGD's L2 on the estimate (MeZO's code): theta -= lr * (g z + wd theta)
            torch._foreach_mul_(tuple(self.params), 1 - lr * self.weight_decay)
        self._add(seed, -lr * self.projected_grad)
        self.steps_done += 1
        return loss
