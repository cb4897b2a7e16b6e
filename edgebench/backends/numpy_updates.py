"""Weight updates done in numpy, in place on a runtime's own weight buffers (torch-free).

The ONNX Runtime backend hands these numpy views of the parameters and gradients its
CheckpointState holds, so an update writes ORT's weights directly, with no copy of them:

- `InPlaceSGD`: SGD with torch's global-norm gradient clip (clip_grad_norm_), which ORT
  1.19's own SGD optimizer cannot do without a dead momentum buffer per weight.
- `NumpyMeZO`: MeZO (Malladi et al. 2023, "Fine-Tuning Language Models with Just Forward
  Passes", arXiv:2305.17333, Algorithm 1), the same SPSA step and bitwise weight restore as
  edgebench.methods.mezo, with z drawn by numpy (`z_chunks`) and the loss from a callable
  (the runtime's forward at the weights as they are now).
"""

from __future__ import annotations

import math
from typing import Callable, Iterator

import numpy as np

EPS = 1e-3  # MeZO's perturbation scale (edgebench.methods.mezo.EPS)
CHUNK = 1 << 20  # elements of z drawn at once: bounds the temporary memory
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


class InPlaceSGD:
    """p -= lr * clip(g) over (parameter, gradient) numpy views."""

    def __init__(self, pairs: Callable[[], list[tuple[np.ndarray, np.ndarray]]], lr: float,
                 max_grad_norm: float | None) -> None:
        self.pairs = pairs  # read each step: the runtime owns the buffers
        self.lr = lr
        self.max_grad_norm = max_grad_norm

    def step(self) -> None:
        pairs = self.pairs()
        scale = self.lr
        if self.max_grad_norm:
            total = math.sqrt(sum(float(np.dot(g.reshape(-1), g.reshape(-1))) for _, g in pairs))
            scale *= min(1.0, self.max_grad_norm / (total + CLIP_EPS))
        for param, grad in pairs:
            np.multiply(grad, np.float32(-scale), out=grad)
            np.add(param, grad, out=param)


def z_chunks(seed: int, index: int, n: int) -> Iterator[tuple[slice, np.ndarray]]:
    """(slice, z ~ N(0, 1) float32) over a flattened parameter of n elements; the same
    (seed, index) gives the same z, so it is regenerated instead of stored."""
    rng = np.random.default_rng([seed, index])
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        yield slice(start, stop), rng.standard_normal(stop - start, dtype=np.float32)


class NumpyMeZO:
    """SPSA over `params` (flat float32 views of the trained weights): the loss at
    theta + eps z and theta - eps z, g = (L+ - L-) / 2 eps, theta -= lr g z.

    Each perturbation is undone on its own; the elements whose rounding would not come
    back are recorded and written back (as edgebench.methods.exact), so theta is restored
    bitwise without a copy of it.
    """

    def __init__(self, params: list[np.ndarray], lr: float, seed: int = 0) -> None:
        self.params = [p.reshape(-1) for p in params]
        if any(not np.shares_memory(flat, p) for flat, p in zip(self.params, params)):
            raise ValueError("NumpyMeZO needs contiguous parameter buffers (it updates them in place)")
        self.lr = lr
        self.eps = EPS
        self.seeds = np.random.default_rng(seed)
        self.projected_grad = 0.0

    def _add(self, seed: int, scale: float, record: list | None = None) -> None:
        for index, flat in enumerate(self.params):
            for part, z in z_chunks(seed, index, flat.size):
                delta = z * np.float32(scale)
                view = flat[part]
                if record is not None:
                    moved = view + delta
                    bad = np.flatnonzero((moved - delta) != view)
                    if bad.size:
                        record.append((view, bad.astype(np.int32), view[bad].copy()))
                    view[...] = moved
                else:
                    view += delta

    def _undo(self, seed: int, scale: float, record: list) -> None:
        for index, flat in enumerate(self.params):
            for part, z in z_chunks(seed, index, flat.size):
                flat[part] -= z * np.float32(scale)
        for view, indices, values in record:
            view[indices] = values

    def _loss_at(self, loss: Callable[[], float], seed: int, scale: float) -> float:
        record: list = []
        self._add(seed, scale, record)
        value = float(loss())
        self._undo(seed, scale, record)
        return value

    def estimate(self, loss: Callable[[], float], seed: int) -> tuple[float, float]:
        """(projected gradient, mean loss) from the +eps / -eps forwards; weights restored bitwise."""
        plus, minus = self._loss_at(loss, seed, self.eps), self._loss_at(loss, seed, -self.eps)
        return (plus - minus) / (2 * self.eps), (plus + minus) / 2

    def next_seed(self) -> int:
        return int(self.seeds.integers(0, 2**31 - 1))

    def step(self, loss: Callable[[], float]) -> float:
        """One SPSA step, `loss` being the batch's loss at the current weights; returns
        MeZO's logged loss (the mean of the two)."""
        seed = self.next_seed()
        self.projected_grad, mean = self.estimate(loss, seed)
        self._add(seed, -self.lr * self.projected_grad)
        return mean
