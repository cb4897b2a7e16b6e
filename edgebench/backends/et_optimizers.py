"""Method knobs the ExecuTorch backend applies around its training program (device side).

The joint forward-backward program returns the loss and the gradients; these steppers
decide what happens between program calls, the way the eager trainers do:

- `AccumulatingStep` (accumN): the program is exported for one micro-batch and called N
  times per step; its gradients (views of the plan's arena, overwritten by the next call)
  are added into one owned buffer per parameter, then one clipped update follows.
- `PerParameterStep` (fused update, LOMO): one update per parameter right after the
  program returns, without the global-norm clip (eager's fused/LOMO trainers cannot clip
  either: the norm is known only after the last gradient). The gradients themselves live
  in the program's static memory plan, so unlike eager this saves no gradient memory.
"""

from __future__ import annotations

from typing import Any

import torch

from edgebench.methods import optim


def _rows(t, size: int, i: int, parts: int):
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
        raise ValueError(f"accum{parts}: the batch size must be a multiple of {parts} (got {size})")
    return [tuple(_rows(t, size, i, parts).contiguous() for t in inputs) for i in range(parts)]


class AccumulatingStep:
    """N program calls, gradients summed (each scaled 1/N as eager's loss/N), one update."""

    def __init__(self, program: Any, update: Any, parts: int) -> None:
        self.program, self.update, self.parts = program, update, parts
        self.sums: dict[str, torch.Tensor] = {}

    def step(self, inputs: tuple[torch.Tensor, ...]) -> float:
        total = 0.0
        for i, micro in enumerate(split_inputs(inputs, self.parts)):
            total += self.program.forward_backward(micro) / self.parts
            for name, grad in self.program.grads.items():
                if i == 0:
                    if name in self.sums:
                        torch.mul(grad, 1.0 / self.parts, out=self.sums[name])
                    else:
                        self.sums[name] = grad / self.parts
                else:
                    self.sums[name].add_(grad, alpha=1.0 / self.parts)
        self.update.step(self.program.named_parameters(), self.sums)
        return total


class PerParameterStep:
    """`fused`: one torch optimizer per parameter (eager's FusedTrainer: nanoVLM's lr groups,
    the schedule, no clip). `lomo`: p -= lr * schedule * grad with one lr for all parameters
    (lomo-optim's Lomo in fp32 without clipping or weight decay)."""

    def __init__(self, program: Any, optimizer: str, lr: float, total_steps: int) -> None:
        self.program, self.optimizer, self.lr = program, optimizer, lr
        self.total_steps = max(1, total_steps)
        self.steps_done = 0
        self.optimizers: dict[str, torch.optim.Optimizer] = {}

    def _build(self, params: dict[str, torch.Tensor]) -> None:
        for name, tensor in params.items():
            lr = max(self.lr, optim.NANOVLM_LR_MP) if optim.is_projector(name) else self.lr
            self.optimizers[name] = optim.build_optimizer(self.optimizer, [{"params": [tensor], "lr": lr}])

    def step(self, inputs: tuple[torch.Tensor, ...]) -> float:
        loss = self.program.forward_backward(inputs)
        params, grads = self.program.named_parameters(), self.program.grads
        factor = optim.lr_factor(self.steps_done, self.total_steps)
        with torch.no_grad():
            if self.optimizer == "lomo":
                for name, tensor in params.items():
                    tensor.add_(grads[name], alpha=-self.lr * factor)
            else:
                if not self.optimizers:
                    self._build(params)
                optim.set_schedule(self.optimizers.values(), self.steps_done, self.total_steps)
                for name, tensor in params.items():
                    tensor.grad = grads[name]
                    self.optimizers[name].step()
                    tensor.grad = None
        self.steps_done += 1
        return loss


def program_stepper(method: Any, program: Any, update: Any, lr: float, total_steps: int):
    """The stepper for `method`'s knobs, or None where the plain program step + update applies."""
    if method.optimizer == "lomo" or method.fused_update:
        return PerParameterStep(program, method.optimizer, lr, total_steps)
    if method.accumulation > 1:
        return AccumulatingStep(program, update, method.accumulation)
    return None


def lowering(method: Any) -> dict[str, str]:
    """What the manifest records for the knobs applied here."""
    out = {}
    if method.accumulation > 1:
        out["accumulation"] = (f"program exported for one micro-batch (batch / {method.accumulation}); "
                               f"called {method.accumulation} times per step, gradients summed into owned "
                               "buffers (1/N each), then one clipped update")
    if method.optimizer == "lomo":
        out["optimizer"] = ("LOMO: p -= lr * schedule * grad per parameter right after the program call, "
                            "one lr, no clip (lomo-optim's fp32 path); gradients stay in the static plan")
    elif method.fused_update:
        out["fused_update"] = (f"one torch.optim {method.optimizer} per parameter, stepped right after the "
                               "program call, no global clip (as eager's fused trainer); gradients stay in "
                               "the static plan, so no gradient memory is saved")
    return out


def first_micro_batch(batch: dict[str, Any], parts: int) -> dict[str, Any]:
    """The shapes an accumN program was exported for: one micro-batch of `batch`."""
    size = batch["input_ids"].shape[0]
    return batch if parts == 1 else {k: _rows(v, size, 0, parts) for k, v in batch.items()}
