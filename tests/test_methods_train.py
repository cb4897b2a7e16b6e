"""Every preset lowers the tiny model's loss on the synthetic task within a bounded number of
steps. The decrease is measured: the batch's loss is evaluated before and after training by a
plain forward pass, not taken from the trainer."""

from __future__ import annotations

import pytest
import torch

from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import PRESETS, MethodUnavailable, make_trainer, parse_method
from edgebench.model import build_model, get_config

# Estimated-gradient methods get more steps (and, on 2M weights, a larger step than their
# 222M-safe defaults); every other preset runs with its own default lr.
STEPS = {"backprop": 6, "zeroth-order": 40, "forward-mode": 40}
LR = {"mezo": 1e-2, "forward-grad": 3e-4}
MIN_DECREASE = {"backprop": 0.05, "zeroth-order": 0.005, "forward-mode": 0.005}


def _eval_loss(trainer, batch: dict[str, torch.Tensor]) -> float:
    """A fresh forward pass (in the method's precision), apart from the trainer's own loss."""
    with torch.no_grad():
        return trainer.loss(batch).float().item()


NEEDS_CUDA = {"adalomo"}  # lomo-optim's AdaLomo allocates its state with .cuda()


@pytest.mark.parametrize("name", [n for n in PRESETS if n not in NEEDS_CUDA or torch.cuda.is_available()])
def test_preset_lowers_tiny_loss(name):
    method = parse_method(name)
    torch.manual_seed(0)
    batch = to_torch(next(synthetic_batches(get_config("tiny"), 4, 16, seed=0)))
    trainer = make_trainer(method, build_model("tiny"), lr=LR.get(name), total_steps=STEPS[method.grad_mode])
    before = _eval_loss(trainer, batch)
    for _ in range(STEPS[method.grad_mode]):
        assert torch.isfinite(torch.tensor(trainer.step(batch)))
    after = _eval_loss(trainer, batch)
    assert after < before - MIN_DECREASE[method.grad_mode], (before, after)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal; CUDA hosts train it above")
@pytest.mark.parametrize("name", sorted(NEEDS_CUDA))
def test_cuda_only_preset_says_so_on_cpu(name):
    with pytest.raises(MethodUnavailable, match="needs a CUDA"):
        make_trainer(name, build_model("tiny"))
