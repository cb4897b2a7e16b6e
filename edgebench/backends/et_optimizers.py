"""Method knobs the ExecuTorch backend applies around its training program (device side).

The joint forward-backward program returns the loss and the gradients; these steppers
decide what happens between program calls, the way the eager trainers do:

- `AccumulatingStep` (accumN): the program is exported for one micro-batch and called N
  times per step; it adds each gradient into a buffer of its own
  (exporters.et_methods.sum_gradients) and returns those sums; one update follows, its clip
  dividing them by N (eager's loss/N), and the sums are zeroed for the next step.
- `UpdatingProgram` (LOMO; the fused update of SGD/Adam/AdamW): the program applies the
  update itself, each gradient consumed by an in-place write of its weight as soon as the
  backward has computed it (exporters.et_methods.write_update), so the memory planner reuses
  the gradient's space, as eager's hooks free it; Adam's moments are program state. Here
  only the per-step scalars (scheduled lr, bias corrections) are computed, as its last input.
- `PerParameterStep` (the fused update of SGD-momentum/Adafactor): one update per parameter
  right after the program returns. Neither fused form clips (eager's cannot either: the norm
  is known only after the last gradient). Here the gradients live in the program's static
  memory plan, so unlike eager this saves no gradient memory.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import numpy as np
import torch

from edgebench.methods import optim
from edgebench.methods.knobs import MethodError
from edgebench.methods.optimizers import OPTIMIZERS, optimizer, run_weight_decay

# a batch tensor: torch's (program inputs) or numpy's (the example batch)
Array = TypeVar("Array", torch.Tensor, np.ndarray)


def batch_rows(t: Array, size: int, i: int, parts: int) -> Array:
    """Rows i, i+parts, ... of a batch tensor; `images` ([size * views, ...]: a fixed-shape
    program's rows hold the same number of views each) by its rows' views."""
    if t.shape[0] == size:
        return t[i::parts]
    per_row = t.reshape(size, t.shape[0] // size, *t.shape[1:])
    return per_row[i::parts].reshape(-1, *t.shape[1:])


def split_inputs(inputs: tuple[torch.Tensor, ...], parts: int) -> list[tuple[torch.Tensor, ...]]:
    """The micro-batches of eager's `split_batch` (rows i, i+parts, ...), as program inputs."""
    size = inputs[0].shape[0]
    if size % parts:
        raise MethodError(f"accum{parts}: the batch size must be a multiple of {parts} (got {size}); give a "
                          f"--batch-size that is a multiple of {parts}")
    return [tuple(batch_rows(t, size, i, parts).contiguous() for t in inputs) for i in range(parts)]


class AccumulatingStep:
    """N program calls, one update. The program sums the micro-batches' gradients itself in
    buffers it keeps, so no gradient is copied out here; the update divides them by N."""

    def __init__(self, program: Any, update: Any, parts: int) -> None:
        self.program, self.update, self.parts = program, update, parts

    def step(self, inputs: tuple[torch.Tensor, ...]) -> float:
        total = 0.0
        for micro in split_inputs(inputs, self.parts):
            total += self.program.forward_backward(micro) / self.parts
        sums = self.program.grads
        self.update.step(self.program.named_parameters(), sums, self.parts)
        torch._foreach_zero_(list(sums.values()))  # the program adds the next step's into them
        return total


class PerParameterStep:
    """`fused`: one torch optimizer per parameter (eager's FusedTrainer: nanoVLM's lr groups,
    the schedule, no clip)."""

    def __init__(self, program: Any, optimizer: str, lr: float, total_steps: int, weight_decay: float) -> None:
        self.program, self.optimizer, self.lr, self.weight_decay = program, optimizer, lr, weight_decay
        self.total_steps = max(1, total_steps)
        self.steps_done = 0
        self.optimizers: dict[str, torch.optim.Optimizer] = {}

    def _build(self, params: dict[str, torch.Tensor]) -> None:
        for name, tensor in params.items():
            lr = max(self.lr, optim.NANOVLM_LR_MP) if optim.is_projector(name) else self.lr
            self.optimizers[name] = optim.build_optimizer(self.optimizer, [{"params": [tensor], "lr": lr}],
                                                          self.weight_decay)

    def step(self, inputs: tuple[torch.Tensor, ...]) -> float:
        loss: float = self.program.forward_backward(inputs)
        params, grads = self.program.named_parameters(), self.program.grads
        if not self.optimizers:
            self._build(params)
        optim.set_schedule(self.optimizers.values(), self.steps_done, self.total_steps)
        with torch.no_grad():
            for name, tensor in params.items():
                tensor.grad = grads[name]
                self.optimizers[name].step()
                tensor.grad = None
        self.steps_done += 1
        return loss


# The update written into the program (exporters.et_methods.write_update): torch's single-
# tensor SGD / Adam / AdamW and lomo-optim's fp32 Lomo, with their descriptors' constants (betas,
# eps: methods/optimizers.py) and the run's weight decay, where the descriptor names a
# `program_update`. The program's last input, `hyper`: per lr group (backbones 0, projector 1)
# the factor weights are decayed by (1 - lr * wd for decoupled decay; 1 for L2, which the
# program adds to the gradient itself: its wd is baked in) and the step the update is scaled
# by, then Adam's sqrt(1 - beta2^t).
HYPER_SIZE = 5


def update_in_program(method: Any) -> bool:
    """Whether the export writes the method's update into the program: with `fused`, and always
    for an optimizer that updates inside backward (LOMO), where the descriptor has a rule for it."""
    opt = optimizer(method.optimizer)
    return bool(opt.program_update) and (opt.update_in_backward or method.fused_update)


def program_weight_decay(weight_decay: float | None, method: Any, manifest: dict[str, Any], directory: Any) -> float:
    """The run's weight decay (optimizers.run_weight_decay; RunSpec.weight_decay). An update
    written into the program has it baked in: a program exported for another value is refused."""
    from edgebench.backends.program import ProgramError

    value = run_weight_decay(method.optimizer, weight_decay)
    if update_in_program(method):
        exported = manifest.get("weight_decay", run_weight_decay(method.optimizer, None))
        if exported != value:
            raise ProgramError(f"{directory}: its update (written into the program) decays weights by {exported:g}, "
                               f"the run asks {value:g}; export it again with --weight-decay {value:g}")
    return value


def hyper_index(group: int, what: str) -> int:
    """Position in `hyper` of a group's "decay" or "step", or of "bias_correction2_sqrt"."""
    return HYPER_SIZE - 1 if what == "bias_correction2_sqrt" else 2 * group + ("decay", "step").index(what)


class UpdatingProgram:
    """A program that updates its weights itself: returns [loss, weights, optimizer state]."""

    def __init__(self, module: Any, method: Any, names: list[str], lr: float, total_steps: int,
                 weight_decay: float) -> None:
        self.module, self.method, self.names = module, method, names
        self.opt = optimizer(method.optimizer)
        self.decoupled_decay = weight_decay if self.opt.decay == "decoupled" else 0.0
        # lomo-optim has one lr; the fused trainer nanoVLM's two groups
        self.lrs = (lr, lr if self.opt.update_in_backward else max(lr, optim.NANOVLM_LR_MP))
        self.total_steps = max(1, total_steps)
        self.steps_done = 0
        self.params: dict[str, torch.Tensor] | None = None

    def hyper(self) -> torch.Tensor:
        """This step's scalars, computed as torch.optim computes them (Python floats)."""
        factor = optim.lr_factor(self.steps_done, self.total_steps)
        adam = self.opt.program_update == "adam"
        betas = cast(tuple[float, float], self.opt.betas)  # read only for adam, whose descriptors set them
        t = self.steps_done + 1
        values: list[float] = []
        for peak in self.lrs:
            lr = peak * factor
            decay = 1 - lr * self.decoupled_decay
            values += [decay, -lr / (1 - betas[0] ** t) if adam else -lr]
        values.append((1 - betas[1] ** t) ** 0.5 if adam else 1.0)
        return torch.tensor(values, dtype=torch.float32)

    def step(self, inputs: tuple[torch.Tensor, ...]) -> float:
        outputs = self.module.run_method("forward", (*inputs, self.hyper()), clone_outputs=False)
        if self.params is None:  # views of the program's weights (its memory plan)
            self.params = dict(zip(self.names, outputs[1:1 + len(self.names)]))
        self.steps_done += 1
        return float(outputs[0])

    def named_parameters(self) -> dict[str, torch.Tensor]:
        if self.params is None:
            raise RuntimeError("the program's parameters are known after its first step")
        return self.params


def program_stepper(method: Any, program: Any, update: Any, lr: float, total_steps: int,
                    weight_decay: float) -> PerParameterStep | AccumulatingStep | None:
    """The stepper for `method`'s knobs, or None where the plain program step + update applies
    (an UpdatingProgram steps itself)."""
    if method.fused_update:
        return PerParameterStep(program, method.optimizer, lr, total_steps, weight_decay)
    if method.accumulation > 1:
        return AccumulatingStep(program, update, method.accumulation)
    return None


# Optimizers whose state and step stay in the runtime process (torch.optim's API over the
# program's weights and the gradients it returns), with what they keep there (descriptors'
# `between_calls`).
BETWEEN_CALLS = {name: f"{o.between_calls[0]} ({o.between_calls[1]})"
                 for name, o in OPTIMIZERS.items() if o.between_calls}


def lowering(method: Any) -> dict[str, str]:
    """What the manifest records for the knobs applied here."""
    out: dict[str, str] = {}
    if method.optimizer in BETWEEN_CALLS and not method.fused_update:
        out["optimizer"] = (f"{BETWEEN_CALLS[method.optimizer]} between program calls, in the runtime "
                            "process (torch, not the .pte), over the program's weights in place and the "
                            "gradients it returns; clip and schedule as eager")
    if method.accumulation > 1:
        out["accumulation"] = (f"program exported for one micro-batch (batch / {method.accumulation}) and "
                               f"called {method.accumulation} times per step; it adds each gradient into a "
                               "buffer of its own as soon as the backward computes it "
                               "(exporters.et_methods.sum_gradients: the gradient's space is reused) and "
                               "returns the sums; one clipped update divides them by N (eager's loss/N), "
                               "then the sums are zeroed")
    if update_in_program(method):
        return out  # exporters.et_methods.write_update records it
    if method.fused_update:
        out["fused_update"] = (f"one torch.optim {method.optimizer} per parameter, stepped right after the "
                               "program call, no global clip (as eager's fused trainer); gradients stay in "
                               "the static plan, so no gradient memory is saved")
    return out


def first_micro_batch(batch: dict[str, Any], parts: int) -> dict[str, Any]:
    """The shapes an accumN program was exported for: one micro-batch of `batch`."""
    size = batch["input_ids"].shape[0]
    return batch if parts == 1 else {k: batch_rows(v, size, 0, parts) for k, v in batch.items()}
