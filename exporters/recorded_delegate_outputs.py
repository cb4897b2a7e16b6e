"""A delegate call's outputs in a fake-tensor re-trace, read from its program, not run.

to_executorch's SpecPropPass re-traces the program through fake tensors to learn every value's
shape. torch's fake kernel for a delegate call (`call_delegate_cpu`, reached by its module
name) unlifts the delegate's program into a new module and runs it operator by operator, only to
learn the shapes, strides and dtypes of its outputs: 21.6 s of nanoVLM-222M SGD's
`to_executorch` (1,577 delegates), half of it the unlifting. The delegate's program records
those outputs (its output node's values), so `delegate_outputs_as_recorded` makes fresh fake
tensors like them in the re-trace's fake mode, in the container the unlifted module would return
(the program's output spec). Where it cannot (real tensors, a program that also writes a buffer,
an output with no recorded tensor), the program runs as before. The specs are made from these
values, so the program is the same byte for byte (tests/test_export_executorch.py). Written for
torch 2.13 and executorch xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it
only.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from exporters.upstream import replaced

# torch's module of the delegate call's kernels (its package exports an operator by this name).
_KERNELS = "torch._higher_order_ops.executorch_call_delegate"


def recorded_outputs(lowered_module: Any, args: tuple[Any, ...]) -> Any:
    """Fresh fake tensors like the outputs the delegate's program records, in `args`' fake mode,
    in the container its unlifted module returns; None where they cannot stand in.

    `lowered_module` is ExecuTorch's LoweredBackendModule, `args` and the result pytrees: Any."""
    from torch._guards import detect_fake_mode
    from torch.export.graph_signature import OutputKind

    program = lowered_module.original_module
    mode = detect_fake_mode(args)
    out_spec = program.call_spec.out_spec
    if mode is None or out_spec is None or any(
            spec.kind != OutputKind.USER_OUTPUT for spec in program.graph_signature.output_specs):
        return None
    outputs = program.graph.output_node().args[0]
    values: list[Any] = [getattr(node, "meta", {}).get("val") for node in outputs]
    if not all(isinstance(value, torch.Tensor) for value in values):
        return None
    with mode:
        fresh = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device) for v in values]
    return torch.utils._pytree.tree_unflatten(fresh, out_spec)


@contextmanager
def delegate_outputs_as_recorded() -> Iterator[None]:
    """While lowering: a delegate call on fake tensors gives `recorded_outputs`."""
    kernels = importlib.import_module(_KERNELS)
    run = kernels.call_delegate_cpu

    def as_recorded(lowered_module: Any, *args: Any) -> Any:
        recorded = recorded_outputs(lowered_module, args)
        return run(lowered_module, *args) if recorded is None else recorded

    with replaced(kernels, call_delegate_cpu=as_recorded):
        yield
