"""edgebench.model.recompute: the same gradients as no recomputation, without torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from edgebench.model.recompute import recomputed


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("input_grad", [True, False])
def test_gradients_equal_those_without_recomputation(input_grad):
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 6))
    x = torch.randn(3, 6, requires_grad=input_grad)
    block(x).square().sum().backward()
    plain, plain_x = _grads(block), x.grad
    block.zero_grad(set_to_none=True)
    x.grad = None
    recomputed(block, x, trains=True).square().sum().backward()
    assert len(_grads(block)) == 4
    for a, b in zip(plain, _grads(block), strict=True):
        torch.testing.assert_close(a, b)
    assert (x.grad is None) == (plain_x is None)
    if input_grad:
        torch.testing.assert_close(x.grad, plain_x)


def test_a_frozen_segment_with_no_gradient_coming_in_builds_no_graph():
    block = nn.Linear(4, 4).requires_grad_(False)
    out = recomputed(block, torch.randn(2, 4), trains=False)
    assert not out.requires_grad


def test_each_parameters_gradient_completes_once_per_segment_unless_shared():
    """A post-accumulate hook (an update inside backward) fires once per reentrant segment: a
    parameter used by three segments is stepped three times unless the call says `shared`."""
    layer = nn.Linear(4, 4)
    fired = []
    layer.weight.register_post_accumulate_grad_hook(lambda p: fired.append(p.grad.clone()))
    x = torch.randn(2, 4, requires_grad=True)
    sum(recomputed(layer, x[:, :], trains=True, shared=True).sum() for _ in range(3)).backward()
    assert len(fired) == 1
    fired.clear()
    sum(recomputed(layer, x[:, :], trains=True).sum() for _ in range(3)).backward()
    assert len(fired) == 3


def test_recomputation_imports_no_torch_dynamo():
    """torch's checkpoint is wrapped by torch._disable_dynamo and its non-reentrant form reads
    torch._dynamo's config; recomputed() must stay clear of both (+69 MiB RSS in the worker)."""
    code = (
        "import sys, torch\n"
        "from torch import nn\n"
        "from edgebench.model.recompute import recomputed\n"
        "block = nn.Linear(4, 4)\n"
        "recomputed(block, torch.randn(2, 4), trains=True).sum().backward()\n"
        "assert block.weight.grad is not None\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
