"""A function's activations recomputed in backward, without importing torch._dynamo.

torch.utils.checkpoint is wrapped by torch._disable_dynamo, and its non-reentrant form reads
torch._dynamo's config and recomputes under torch._disable_dynamo: the first call imports
torch._dynamo and sympy, +69 MiB RSS in the runner worker (nanovlm-460m's LoRA on a 1 GiB board,
where that decides whether it fits). The reentrant form, called past that wrapper, imports
neither and recomputes the same operations.

The reentrant form runs each recomputed segment's backward as an autograd pass of its own, so a
parameter's gradient is complete (and its post-accumulate hook fires) once per segment. Where a
trainable parameter is used by several segments (an encoder recomputed view by view, a trained
head over chunks of the loss) an update inside backward would step it once per segment: those
pass `shared=True` and keep torch's non-reentrant form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

# torch._disable_dynamo wraps with functools.wraps, which keeps the function it wraps here
# (tests/test_recompute.py holds torch to it: the reentrant form imports no torch._dynamo)
_UNWRAPPED_CHECKPOINT = getattr(checkpoint, "__wrapped__", checkpoint)


def trains(module: object) -> bool:
    """Whether `module` holds a parameter that needs a gradient (a plain function holds none)."""
    return isinstance(module, torch.nn.Module) and any(p.requires_grad for p in module.parameters())


def recomputed(fn: Callable[..., Any], *args: Any, trains: bool, shared: bool = False) -> Any:
    """`fn(*args)`, keeping only its inputs for backward, which runs it again.

    `trains`: `fn` uses a parameter that needs a gradient. `shared`: such a parameter is also
    used outside this call (see the module's docstring)."""
    gradient_in = any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args)
    if not torch.is_grad_enabled() or not (gradient_in or trains):
        return fn(*args)  # nothing in it needs a gradient: no graph, nothing kept
    if shared:
        return checkpoint(fn, *args, use_reentrant=False)
    if not gradient_in:
        # The reentrant form joins the graph through its inputs only; nothing before them has a
        # gradient to receive, so one of them stands as a leaf that asks for one.
        first = next(i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor) and arg.is_floating_point())
        args = (*args[:first], args[first].detach().requires_grad_(), *args[first + 1:])
    return _UNWRAPPED_CHECKPOINT(fn, *args, use_reentrant=True)
