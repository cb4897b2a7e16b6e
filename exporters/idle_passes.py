"""ExecuTorch's to_edge and to_executorch passes skipped where they have nothing to act on, and
whole-graph re-traces that only rename operators or refresh values done without one.

Most of `to_edge`'s and `to_executorch`'s own passes are ExportPasses: each re-traces the whole
graph through fake tensors, about 7.5 s a pass for nanoVLM-222M's SGD joint graph (and 15 s
for LegalizePortableDimOrderPass after delegation), whether or not it changes a node. Four of
them act on operators or values our programs never hold: NormalizeTransposePass (only
`aten.t`), ReplaceBrokenOpsWithFunctionalOpsPass (only view operators, and
ReplaceViewOpsWithViewCopyOpsPass has replaced every one before it runs), SymToTensorPass (only
symbolic sizes: shapes are fixed at export) and LegalizePortableDimOrderPass (only a mean, sum,
expand or pooling whose input is not in the default dim order). `skipping_idle_passes` runs
each of these only on a graph with something for it to act on, checked on the graph it is
given by the pass's own rule; elsewhere the graph passes through as it came, as their
re-trace would have left it. to_edge's operator-by-operator passes re-trace once together
(`_one_retrace_to_edge`). torch's ReplaceViewOpsWithViewCopyOpsPass re-traces the whole graph
to turn each view operator into its `_copy` form (16 s of nanoVLM-222M QLoRA's export): the
operators are swapped in place, and the one re-trace after it works every node's value out.
SpecPropPass re-traces the program "to ensure metadata is up to date" (18 s of QLoRA's)
before making each value's spec: after that re-trace every value is known (delegate calls'
recorded with them) and up to date but for one thing a spec carries, whether the value needs
grad, which the re-trace's autograd wrapper for a delegate call sets on all its floating
outputs when any input needs it. So SpecPropPass makes its specs on a copy of the graph with
those marks set as the re-trace sets them (and the operators reading a changed mark run again
on their inputs' fake values), and re-traces only a graph with a value unknown or an operator
that writes an input reading a changed mark. Its graph module generates its code when first
needed (as `exporters.graph_code_on_demand`'s do), not at each later pass's change. The
program is the same byte for byte (tests/test_export_executorch.py). Written for executorch
xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it only.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import operator
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from exporters.upstream import replaced

if TYPE_CHECKING:
    from torch.fx.passes.infra.pass_base import PassBase, PassResult


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


def _reduction_off_default_dim_order(pass_class: Any) -> Callable[[torch.fx.GraphModule], bool]:
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


def _only_with_work(pass_class: Any, has_work: Callable[[torch.fx.GraphModule], bool]
                    ) -> Callable[[Any, torch.fx.GraphModule], PassResult | None]:
    from torch.fx.passes.infra.pass_base import PassResult

    call: Callable[[Any, torch.fx.GraphModule], PassResult | None] = pass_class.call

    def call_if_work(self: Any, graph_module: torch.fx.GraphModule) -> PassResult | None:
        return call(self, graph_module) if has_work(graph_module) else PassResult(graph_module, False)

    return call_if_work


def _one_retrace_to_edge() -> AbstractContextManager[None]:
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

    def passes(config: Any) -> tuple[list[Any], list[Any]]:
        pre, post = original(config)
        kept = [p for p in pre if not isinstance(getattr(p, "__wrapped__", p), fused)]
        steps = (*fused, OpReplacePass) + (() if config._skip_dim_order else (MemoryFormatOpsPass,))
        return [*kept, type("ToEdgeInOneRetrace", steps, {})()], post

    class DoneInOneRetrace(PassBase):
        def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
            return PassResult(graph_module, False)

    return replaced(_program, _get_aten_to_edge_passes=passes, OpReplacePass=DoneInOneRetrace,
                     MemoryFormatOpsPass=DoneInOneRetrace)


def _view_copies_in_place() -> AbstractContextManager[None]:
    """torch's ReplaceViewOpsWithViewCopyOpsPass by its own mapping, node by node in place, in
    every graph module of the program (a higher-order operator's too, as its re-trace reaches).
    Patches executorch.exir.program._program for the `with`."""
    from executorch.exir.program import _program
    from torch._export.passes import replace_view_ops_with_view_copy_ops_pass as view_copies
    from torch.fx.passes.infra.pass_base import PassBase, PassResult

    class ViewCopiesInPlace(PassBase):
        def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
            modified = False
            for module in graph_module.modules():
                if not isinstance(module, torch.fx.GraphModule):
                    continue
                swapped = False
                for node in _calls(module):
                    if not isinstance(node.target, torch._ops.OpOverload):
                        continue
                    view_copy = (view_copies._NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS.get(node.target)
                                 or view_copies.get_view_copy_of_view_op(node.target._schema))
                    if view_copy is not None:
                        node.target, swapped = view_copy, True
                if swapped:
                    module.recompile()
                modified |= swapped
            return PassResult(graph_module, modified)

    return replaced(_program, ReplaceViewOpsWithViewCopyOpsPass=ViewCopiesInPlace)


def _value_as_retraced(node: torch.fx.Node) -> Any:
    """The operator run on its inputs' values in their fake mode, as a re-trace runs it; None
    where that cannot stand in for the re-trace (an operator that writes an input, or inputs
    with no fake mode)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode

    schema = getattr(node.target, "_schema", None)
    if schema is None or schema.is_mutable:
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    mode = detect_fake_mode(torch.utils._pytree.tree_leaves((args, kwargs)))
    if mode is None:
        return None
    with mode, enable_python_dispatcher():
        # fx types a target Callable | str: a call_function node's (all that reach here) is the callable
        return node.target(*args, **kwargs)  # type: ignore[operator]


def _values_as_retraced(graph: torch.fx.Graph) -> bool:
    """Each value marked as needing grad as a re-trace marks it, in order: a delegate call's
    outputs by torch's autograd wrapper for the call (every floating output when any tensor
    input needs grad, else none), and an operator that reads a value whose mark changed run
    again (`_value_as_retraced`). False where one cannot be run again."""
    from executorch.exir.delegate import executorch_call_delegate

    def needs_grad(value: object) -> bool:
        return isinstance(value, torch.Tensor) and value.requires_grad

    def marks(value: object) -> list[bool]:
        return [needs_grad(v) for v in torch.utils._pytree.tree_leaves(value)]

    def marked(value: object, needs: bool) -> object:
        if not isinstance(value, torch.Tensor) or needs_grad(value) == (
                needs and (value.is_floating_point() or value.is_complex())):
            return value
        return value.detach().requires_grad_(not value.requires_grad)

    changed: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is executorch_call_delegate:
            needs = any(needs_grad(v) for n in node.all_input_nodes
                        for v in torch.utils._pytree.tree_leaves(n.meta.get("val")))
            value = torch.utils._pytree.tree_map(functools.partial(marked, needs=needs), node.meta["val"])
        elif node.target is operator.getitem and node.args[0] in changed:
            value = node.args[0].meta["val"][node.args[1]]
        elif changed.intersection(node.all_input_nodes):
            value = _value_as_retraced(node)
            if value is None:
                return False
        else:
            continue
        if marks(value) != marks(node.meta["val"]):
            node.meta["val"] = value
            changed.add(node)
    return True


def _spec_prop_on_known_values() -> AbstractContextManager[None]:
    """SpecPropPass's re-trace (`ExportPass()(graph_module)`) as a copy of the graph, its values
    marked as the re-trace marks them (`_values_as_retraced`), where every placeholder's and
    operator's value is known; the re-trace elsewhere. Patches
    executorch.exir.passes.spec_prop_pass for the `with`."""
    from executorch.exir.passes import spec_prop_pass
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.passes.infra.pass_base import PassResult

    retrace: type[PassBase] = spec_prop_pass.ExportPass

    class CopyWhereValuesKnown:
        def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult | None:
            subgraphs = [m for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule)][1:]
            if subgraphs or any(n.op in ("placeholder", "call_function") and "val" not in n.meta
                                for n in graph_module.graph.nodes):
                return retrace()(graph_module)
            graph = copy.deepcopy(graph_module.graph)
            if not _values_as_retraced(graph):
                return retrace()(graph_module)
            return PassResult(_LazyGraphModule(graph_module, graph), True)  # code when needed

    return replaced(spec_prop_pass, ExportPass=CopyWhereValuesKnown)


@contextlib.contextmanager
def skipping_idle_passes() -> Iterator[None]:
    """While lowering (to_edge and to_executorch): the passes of `_idle_pass_rules` run only on a
    graph with something to act on, to_edge's operator-by-operator passes re-trace once, its
    view operators become `_copy` ones without a re-trace, and SpecPropPass re-traces only a
    graph whose values it cannot read from the graph as the re-trace would give them."""
    with contextlib.ExitStack() as stack:
        for pass_class, has_work in _idle_pass_rules().items():
            stack.enter_context(replaced(pass_class, call=_only_with_work(pass_class, has_work)))
        stack.enter_context(_one_retrace_to_edge())
        stack.enter_context(_view_copies_in_place())
        stack.enter_context(_spec_prop_on_known_values())
        yield
