"""ExecuTorch's to_edge and to_executorch passes skipped where they have nothing to act on.

Most of `to_edge`'s and `to_executorch`'s own passes are ExportPasses: each re-traces the whole
graph through fake tensors, about 7.5 s a pass for nanoVLM-222M's SGD joint graph (and 15 s
for LegalizePortableDimOrderPass after delegation), whether or not it changes a node. Four of
them act on operators or values our programs never hold: NormalizeTransposePass (only
`aten.t`), ReplaceBrokenOpsWithFunctionalOpsPass (only view operators, and
ReplaceViewOpsWithViewCopyOpsPass has replaced every one before it runs), SymToTensorPass (only
symbolic sizes: shapes are fixed at export) and LegalizePortableDimOrderPass (only a mean, sum,
expand or pooling whose input is not in the default dim order). `skipping_idle_passes` runs
each of these only on a graph with something for it to act on, checked on the graph it is
given by the pass's own rule; elsewhere the graph passes through as it came. A re-trace that
changes nothing changes nothing the next pass's re-trace would not redo (each stage ends with
one: OpReplacePass in to_edge, SpecPropPass in to_executorch), so the program is the same
byte for byte (tests/test_export_executorch.py). Written for executorch
xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from exporters.xnnpack_lowering import _replaced


def _calls(gm: torch.fx.GraphModule) -> Iterator[torch.fx.Node]:
    return (n for n in gm.graph.nodes if n.op == "call_function")


def _has_transpose(gm: torch.fx.GraphModule) -> bool:
    return any(n.target == torch.ops.aten.t.default for n in _calls(gm))


def _has_view_op(gm: torch.fx.GraphModule) -> bool:
    return any(getattr(n.target, "is_view", False) for n in _calls(gm))


def _has_symbolic_value(gm: torch.fx.GraphModule) -> bool:
    symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)
    for node in gm.graph.nodes:
        if "val" not in node.meta and node.op != "output":
            return True  # unknown: let the pass look
        for value in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(value, symbolic) or (isinstance(value, torch.Tensor)
                                               and any(isinstance(d, torch.SymInt) for d in value.shape)):
                return True
    return False


def _reduction_off_default_dim_order(pass_class) -> Callable[[torch.fx.GraphModule], bool]:
    def check(gm: torch.fx.GraphModule) -> bool:
        for node in _calls(gm):
            if node.target not in pass_class._target_ops:
                continue
            first = node.args[0] if node.args else None
            value = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor) or tuple(value.dim_order()) != tuple(range(value.dim())):
                return True
        return False

    return check


def _idle_pass_rules() -> dict[type, Callable[[torch.fx.GraphModule], bool]]:
    """{pass class: whether a graph holds something it acts on}."""
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import ReplaceBrokenOpsWithFunctionalOpsPass
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass

    return {NormalizeTransposePass: _has_transpose, ReplaceBrokenOpsWithFunctionalOpsPass: _has_view_op,
            SymToTensorPass: _has_symbolic_value,
            LegalizePortableDimOrderPass: _reduction_off_default_dim_order(LegalizePortableDimOrderPass)}


def _only_with_work(pass_class, has_work: Callable[[torch.fx.GraphModule], bool]):
    from torch.fx.passes.infra.pass_base import PassResult

    call = pass_class.call

    def call_if_work(self, graph_module: torch.fx.GraphModule):
        return call(self, graph_module) if has_work(graph_module) else PassResult(graph_module, False)

    return call_if_work


def _one_retrace_to_edge():
    """to_edge's four re-traces that act operator by operator (ScalarToTensorPass,
    RemoveMixedTypeOperators, OpReplacePass, MemoryFormatOpsPass, in that order) as one: a pass
    whose `call_operator` is theirs in turn, each handing its operator to the next, so each
    operator goes through the four in ExecuTorch's order, and an operator one of them adds
    (RemoveMixedTypeOperators' casts) goes through all four, as it would through the passes
    after it (the ones before never act on a cast). The graph walks between them (RemoveNoopPass
    and the others: identity `to`/`slice_copy`/`_to_copy`, empty tensors, quantisation pairs)
    run before it: none acts on what the four change. Patches executorch.exir.program._program
    (pinned 1.5.1) for the `with`."""
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.replace_aten_with_edge_pass import OpReplacePass
    from executorch.exir.passes.scalar_to_tensor_pass import ScalarToTensorPass
    from executorch.exir.program import _program
    from torch.fx.passes.infra.pass_base import PassBase, PassResult

    original = _program._get_aten_to_edge_passes
    fused = (ScalarToTensorPass, RemoveMixedTypeOperators)

    def passes(config):
        pre, post = original(config)
        kept = [p for p in pre if not isinstance(getattr(p, "__wrapped__", p), fused)]
        steps = (*fused, OpReplacePass) + (() if config._skip_dim_order else (MemoryFormatOpsPass,))
        return [*kept, type("ToEdgeInOneRetrace", steps, {})()], post

    class DoneInOneRetrace(PassBase):
        def call(self, graph_module):
            return PassResult(graph_module, False)

    return _replaced(_program, _get_aten_to_edge_passes=passes, OpReplacePass=DoneInOneRetrace,
                     MemoryFormatOpsPass=DoneInOneRetrace)


@contextlib.contextmanager
def skipping_idle_passes() -> Iterator[None]:
    """While lowering (to_edge and to_executorch): the passes of `_idle_pass_rules` run only on a
    graph with something to act on, and to_edge's operator-by-operator passes re-trace once."""
    with contextlib.ExitStack() as stack:
        for pass_class, has_work in _idle_pass_rules().items():
            stack.enter_context(_replaced(pass_class, call=_only_with_work(pass_class, has_work)))
        stack.enter_context(_one_retrace_to_edge())
        yield
