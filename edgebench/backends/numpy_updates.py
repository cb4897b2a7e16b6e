"""Weight updates done in numpy, in place on a runtime's own weight buffers (torch-free).

The ONNX Runtime backend hands these numpy views of the parameters and gradients its
CheckpointState holds, so an update writes ORT's weights directly, with no copy of them:

- `RecipeUpdate`: the methods' backprop update (edgebench.methods.trainer.BackpropTrainer):
  torch.nn.utils.clip_grad_norm_ over all trained gradients at optim.MAX_GRAD_NORM, nanoVLM's
  lr groups (optim.lr_groups), the warmup + cosine schedule (optim.lr_factor), then
  torch.optim.SGD's, Adam's or AdamW's update (bias correction; weight decay as torch applies
  it: L2 into SGD's and Adam's gradient, AdamW's decoupled), element for element as torch's
  single-tensor CPU path computes it. The recipe's functions
  and constants are edgebench.methods.optim's own (it imports no torch).
- `NumpyMeZO`: MeZO (Malladi et al. 2023, "Fine-Tuning Language Models with Just Forward
  Passes", arXiv:2305.17333, Algorithm 1), the same SPSA step, schedule and bitwise weight
  restore as edgebench.methods.mezo (and its L2 weight decay), with z drawn by numpy
  (`z_chunks`) and the loss from a callable (the runtime's forward at the weights as they are now).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from edgebench.methods import optim
from edgebench.methods import optimizers as optimizer_constants

# (a view of a parameter, the indices whose value would not come back, their values)
NumpyRecord = list[tuple[np.ndarray, np.ndarray, np.ndarray]]
EPS = 1e-3  # MeZO's perturbation scale (edgebench.methods.mezo.EPS)
CHUNK = 1 << 20  # elements of z drawn at once: bounds the temporary memory
UPDATE_CHUNK = 1 << 16  # elements Adam updates at once: its temporaries stay in the cache
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s
UPDATES = ("sgd", "adam", "adamw")  # optim.build_optimizer's, as RecipeUpdate applies them

# (name, parameter, gradient): numpy views of the runtime's buffers, read again each step.
Named = Callable[[], list[tuple[str, np.ndarray, np.ndarray]]]


def clip_coefficient(grads: list[np.ndarray], max_norm: float) -> float | None:
    """torch.nn.utils.clip_grad_norm_'s factor: max_norm / (global L2 norm + 1e-6), or None
    where it is >= 1 (torch multiplies by 1.0 there). The norm is summed in float64 over
    float32 pieces."""
    total = 0.0
    for grad in grads:
        flat = grad.reshape(-1)
        for start in range(0, flat.size, CHUNK):
            part = flat[start:start + CHUNK]
            total += float(np.dot(part, part))
    coef = max_norm / (math.sqrt(total) + CLIP_EPS)
    return coef if coef < 1.0 else None


class RecipeUpdate:
    """One step of the methods' recipe (module docstring) over a runtime's named (parameter,
    gradient) buffers: the gradients are clipped in place, the parameters updated in place.
    Adam's moments are numpy arrays here, allocated at the first step as torch.optim does."""

    def __init__(self, optimizer: str, named: Named, lr: float, total_steps: int, weight_decay: float) -> None:
        if optimizer not in UPDATES:
            raise ValueError(f"RecipeUpdate applies {', '.join(UPDATES)}, not {optimizer!r}")
        self.optimizer = optimizer
        self.named = named
        self.lr = lr
        decoupled = optimizer_constants.optimizer(optimizer).decay == "decoupled"
        self.l2, self.decoupled = (0.0, weight_decay) if decoupled else (weight_decay, 0.0)
        self.total_steps = max(1, total_steps)  # as methods.trainer.Trainer
        self.steps_done = 0
        self.peak_lr: dict[str, float] = {}
        self.moments: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.scratch = np.empty(UPDATE_CHUNK, dtype=np.float32)

    def step(self) -> None:
        named = self.named()
        if not self.peak_lr:
            self.peak_lr = {n: peak for _, peak, names in optim.lr_groups([n for n, _, _ in named], self.lr)
                            for n in names}
        coef = clip_coefficient([g for _, _, g in named], optim.MAX_GRAD_NORM)
        factor = optim.lr_factor(self.steps_done, self.total_steps)
        self.steps_done += 1
        for name, param, grad in named:
            lr = self.peak_lr[name] * factor
            if self.optimizer == "sgd" and self.l2:
                self._with_l2(param, grad, coef)  # g = coef * g + wd * p
                np.multiply(grad, np.float32(-lr), out=grad)
                np.add(param, grad, out=param)
            elif self.optimizer == "sgd":
                # g *= coef; p.add_(g, alpha=-lr), the two scalars folded into one pass
                np.multiply(grad, np.float32(-lr * (1.0 if coef is None else coef)), out=grad)
                np.add(param, grad, out=param)
            else:
                self._adam(name, param, grad, lr, coef)

    def _with_l2(self, param: np.ndarray, grad: np.ndarray, coef: float | None) -> None:
        """clip_grad_norm_'s `g *= coef`, then torch's L2 `g += wd * p`, UPDATE_CHUNK elements at a time."""
        p_flat, g_flat = param.reshape(-1), grad.reshape(-1)
        for start in range(0, p_flat.size, UPDATE_CHUNK):
            stop = min(p_flat.size, start + UPDATE_CHUNK)
            g, s = g_flat[start:stop], self.scratch[:stop - start]
            if coef is not None:
                g *= np.float32(coef)
            np.multiply(p_flat[start:stop], np.float32(self.l2), out=s)
            g += s

    def _adam(self, name: str, param: np.ndarray, grad: np.ndarray, lr: float, coef: float | None) -> None:
        """torch.optim.Adam / AdamW's _single_tensor_adam (no amsgrad, not maximize), after
        clip_grad_norm_'s `g *= coef`, over UPDATE_CHUNK elements at a time."""
        if name not in self.moments:
            self.moments[name] = (np.zeros(param.size, np.float32), np.zeros(param.size, np.float32))
        exp_avg, exp_avg_sq = self.moments[name]
        beta1, beta2 = optimizer_constants.ADAM_BETAS
        t = self.steps_done  # torch's state step, already counted for this update
        step_size = lr / (1 - beta1 ** t)
        bias_correction2_sqrt = (1 - beta2 ** t) ** 0.5
        decay = 1 - lr * self.decoupled if self.decoupled else None
        coef32 = None if coef is None else np.float32(coef)
        p_flat, g_flat = param.reshape(-1), grad.reshape(-1)
        for start in range(0, p_flat.size, UPDATE_CHUNK):
            stop = min(p_flat.size, start + UPDATE_CHUNK)
            p, g, m, v = p_flat[start:stop], g_flat[start:stop], exp_avg[start:stop], exp_avg_sq[start:stop]
            s = self.scratch[:stop - start]
            if coef32 is not None:
                g *= coef32
            if self.l2:  # grad = grad.add(param, alpha=weight_decay)
                np.multiply(p, np.float32(self.l2), out=s)
                g += s
            if decay is not None:
                p *= decay  # param.mul_(1 - lr * weight_decay)
            np.subtract(g, m, out=s)  # exp_avg.lerp_(grad, 1 - beta1)
            s *= 1 - beta1
            m += s
            v *= beta2  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            np.multiply(g, 1 - beta2, out=s)
            s *= g
            v += s
            np.sqrt(v, out=s)  # denom = exp_avg_sq.sqrt() / bias_correction2_sqrt + eps
            s /= bias_correction2_sqrt
            s += optimizer_constants.ADAM_EPS
            np.divide(m, s, out=s)  # param.addcdiv_(exp_avg, denom, value=-step_size)
            s *= -step_size
            p += s


def z_chunk(seed: int, index: int, part: slice) -> np.ndarray:
    """z ~ N(0, 1) float32 for `part` (one CHUNK) of flattened parameter `index`: its own
    stream, keyed by (seed, index, chunk), so chunks can be drawn in any order, on any thread,
    and the same z is regenerated instead of stored."""
    rng = np.random.default_rng([seed, index, part.start // CHUNK])
    z: np.ndarray = rng.standard_normal(part.stop - part.start, dtype=np.float32)
    return z


def chunk_slices(n: int) -> list[slice]:
    return [slice(start, min(n, start + CHUNK)) for start in range(0, n, CHUNK)]


def z_chunks(seed: int, index: int, n: int) -> Iterator[tuple[slice, np.ndarray]]:
    """(slice, z) over a flattened parameter of n elements, chunk by chunk."""
    for part in chunk_slices(n):
        yield part, z_chunk(seed, index, part)


class NumpyMeZO:
    """SPSA over `params` (flat float32 views of the trained weights): the loss at
    theta + eps z and theta - eps z, g = (L+ - L-) / 2 eps, theta -= lr g z.

    Each perturbation is undone on its own; the elements whose rounding would not come
    back are recorded and written back (as edgebench.methods.exact), so theta is restored
    bitwise without a copy of it.
    """

    def __init__(self, params: list[np.ndarray], lr: float, seed: int = 0, total_steps: int = 1,
                 threads: int = 1, weight_decay: float = 0.0) -> None:
        self.params = [p.reshape(-1) for p in params]
        if any(not np.shares_memory(flat, p) for flat, p in zip(self.params, params)):
            raise ValueError("NumpyMeZO needs contiguous parameter buffers (it updates them in place)")
        self.lr = lr
        self.weight_decay = weight_decay  # SGD's L2, as edgebench.methods.mezo
        self.total_steps = max(1, total_steps)  # the schedule's length, as methods.trainer.Trainer
        self.steps_done = 0
        self.eps = EPS
        self.seeds = np.random.default_rng(seed)
        self.projected_grad = 0.0
        self.chunks = [(index, part) for index, flat in enumerate(self.params) for part in chunk_slices(flat.size)]
        # numpy's generator and ufuncs release the GIL: chunks are drawn and applied in parallel
        # (numpy's standard_normal takes ~10 ns a value on one thread, torch's randn ~5).
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def _each_chunk(self, work: Callable[[int, slice], NumpyRecord]) -> NumpyRecord:
        results = (self.pool.map(lambda chunk: work(*chunk), self.chunks) if self.pool
                   else (work(*chunk) for chunk in self.chunks))
        return [entry for result in results for entry in result]

    def _add(self, seed: int, scale: float, record: NumpyRecord | None = None) -> None:
        def add(index: int, part: slice) -> NumpyRecord:
            delta = z_chunk(seed, index, part) * np.float32(scale)
            view = self.params[index][part]
            if record is None:
                view += delta
                return []
            moved = view + delta
            bad = np.flatnonzero((moved - delta) != view)
            kept = [(view, bad.astype(np.int32), view[bad].copy())] if bad.size else []
            view[...] = moved
            return kept

        recorded = self._each_chunk(add)
        if record is not None:
            record.extend(recorded)

    def _undo(self, seed: int, scale: float, record: NumpyRecord) -> None:
        def undo(index: int, part: slice) -> NumpyRecord:
            self.params[index][part] -= z_chunk(seed, index, part) * np.float32(scale)
            return []

        self._each_chunk(undo)
        for view, indices, values in record:
            view[indices] = values

    def _loss_at(self, loss: Callable[[], float], seed: int, scale: float) -> float:
        record: NumpyRecord = []
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
        """One SPSA step, `loss` being the batch's loss at the current weights, at the lr's
        place on the schedule (optim.lr_factor); returns MeZO's logged loss (the mean of the two)."""
        seed = self.next_seed()
        self.projected_grad, mean = self.estimate(loss, seed)
        lr = self.lr * optim.lr_factor(self.steps_done, self.total_steps)
        if self.weight_decay:
            for flat in self.params:
                flat *= np.float32(1 - lr * self.weight_decay)
        self._add(seed, -lr * self.projected_grad)
        self.steps_done += 1
        return mean
