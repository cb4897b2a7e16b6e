"""XNNPACK delegation of a training program in time linear in the graph's size.

A joint forward-backward graph has several hundred XNNPACK partitions at nanoVLM-222M size
(each matmul chain between runtime-kernel operators). ExecuTorch 1.5.1 spends time and
memory superlinear in that size in three places, which kept the nanoVLM-222M export from
finishing (> 15 min, 6.6 GiB):

- Partitioning: XNNPACK's GEMM configs collect the whole graph's linear source partitions
  again for every matmul, and its GroupBasedPartitioner (and torch's CapabilityBasedPartitioner
  under it) build every node's transitive set of downstream nodes (quadratic memory and
  time), then try to merge every pair of partitions. `LevelPartitioner` collects the source
  partitions once and makes cycle-free partitions in one pass (`partition_by_level`).
- `create_submodule_from_nodes` re-sorts the whole graph (`legalize_graph`: a copy plus its
  Python code regenerated) after EACH partition is cut out. `linear_time_partitioning` cuts
  them all out unsorted and sorts once, in place. Per partition, ExecuTorch also scans every
  node for the partition's tag, prints the whole graph module (with every submodule cut out
  so far) into a debug line that is built even when not logged, and counts lowered-module
  names up from 0; at nanoVLM-222M size (1,577 partitions) these took about 18 s of a 236 s
  export. `linear_time_partitioning` indexes the tags once, prints a node count and names
  on from the last. Before cutting out, ExecuTorch walks the whole graph once per tag for
  placeholders of that tag; after, it walks the whole program once per delegate call for the
  largest debug handle (11.6 s). The first looks at the placeholders alone, the second keeps
  a count of the live handles (`debug_handles_counted`).
- XNNPACK's preprocess runs all its 17 graph passes on every partition (each retraces it;
  ~0.2 s a partition whatever its size). Most rewrite operators our partitions never hold
  (convolution, batch norm, upsampling, SDPA, concatenation, PReLU, quantisation, the
  activations an add or mul could absorb). `only_partition_passes` runs on each partition only
  those of the 4 that can act on the operators our partitioner takes (matmuls, transposes,
  fp32 elementwise ELEMENTWISE_OPS, int8 codes' widening) that find something to act on in
  it: most get none.

None changes what a delegate computes (the same operators on the same tensors); the tests
check the losses against ExecuTorch's own partitioner and lowering bit for bit
(tests/test_export_executorch.py).

The patches reach into ExecuTorch's private functions and pass names as of WRITTEN_FOR, through
the one registry of replacements (exporters.upstream: each target's fingerprint checked at use):
`fast_lowering_problem` says why they cannot be used with the installed executorch, and the
exporter then lowers with ExecuTorch's own partitioner (slow at 222M size, but right).
"""

from __future__ import annotations

import contextlib
import heapq
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from importlib import metadata
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from exporters.upstream import WRITTEN_FOR as UPSTREAM_RELEASES
from exporters.upstream import problem, replaced

if TYPE_CHECKING:
    from torch.export import ExportedProgram, ExportGraphSignature
    from torch.fx.passes.infra.partitioner import Partition
    from torch.fx.passes.utils.source_matcher_utils import SourcePartition

# The executorch release whose private functions and pass names the patches replace.
WRITTEN_FOR = dict(UPSTREAM_RELEASES)["executorch"]


def sort_in_place(graph: torch.fx.Graph) -> None:
    """Topological order by moving nodes (node identities kept, unlike torch's sorts which
    copy the graph): each node goes after its inputs, otherwise in its current order."""
    placed: set[torch.fx.Node] = set()
    order: list[torch.fx.Node] = []
    for root in list(graph.nodes):
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in placed:
                continue
            if expanded:
                placed.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((inp, False) for inp in reversed(node.all_input_nodes) if inp not in placed)
    prev = graph._root
    for node in order:
        if prev.next is not node:
            prev.append(node)
        prev = node


def partitions_form_no_cycle(graph: torch.fx.Graph, tags: Iterable[str]) -> bool:
    """Whether cutting out every partition (the nodes whose `delegation_tag` is in `tags`) leaves
    a graph without a cycle: one walk over the graph with each partition one vertex (Kahn's
    algorithm). When it does, no cut, in any order, closes a cycle (a cycle through a partition
    after some cuts is one after all of them), which torch's `validate_partition` looks for
    per partition by a walk over everything downstream of it."""
    vertex: dict[torch.fx.Node, int] = {}  # node -> its vertex: the partition's number, or a number of its own
    numbers = {tag: i for i, tag in enumerate(tags)}
    for node in graph.nodes:
        tag = node.meta.get("delegation_tag")
        vertex[node] = numbers[tag] if tag in numbers else len(numbers) + len(vertex)
    edges: dict[int, list[int]] = {}
    indegree: Counter[int] = Counter()
    for node, source in vertex.items():
        for user in node.users:
            target = vertex[user]
            if target != source:
                edges.setdefault(source, []).append(target)
                indegree[target] += 1
    vertices = set(vertex.values())
    ready = [v for v in vertices if not indegree[v]]
    left = len(vertices)
    while ready:
        left -= 1
        for target in edges.get(ready.pop(), ()):
            indegree[target] -= 1
            if not indegree[target]:
                ready.append(target)
    return left == 0


def _graph_module_of(nodes: Sequence[object]) -> SimpleNamespace:
    """What ExecuTorch's whole-graph walks read of a graph module (`.graph.nodes`), holding
    only `nodes`: the walks' own rules then run over just those."""
    return SimpleNamespace(graph=SimpleNamespace(nodes=nodes))


@contextlib.contextmanager
def linear_time_partitioning() -> Iterator[None]:
    """While lowering: cut partitions out without re-sorting the whole graph each time, then
    sort it once. Four more whole-graph walks per partition go: the nodes of a partition's tag
    are looked up in an index of the graph's tags made once per graph (ExecuTorch scans every
    node for each tag, then checks the tag's nodes: its checks still run), the debug line that
    prints the whole graph module per partition prints its node count, a lowered module's name
    is the next free `lowered_module_{i}` counted on from the last (ExecuTorch counts up from 0
    each time), and constants shared between partitions are looked for among the placeholders
    alone (`_maybe_duplicate_constant_nodes` acts on no other node, but walks them all per tag),
    a partition's call goes after its last output found by the nodes' order (torch.fx keeps
    a sort key per node), where torch's `insert_subgm` walked back from the graph's end, and
    the partitions are checked for cycles once, together (`partitions_form_no_cycle`), where
    torch walked everything downstream of each.
    Patches executorch.exir.backend.backend_api and exir.lowered_backend_module (pinned 1.5.1)
    for the duration of the `with` only, and restores them."""
    from executorch.exir import lowered_backend_module
    from executorch.exir.backend import backend_api
    from torch.fx.passes.utils import fuser_utils

    # upstream's functions, typed as they are annotated there
    original_create: Callable[..., tuple[torch.fx.GraphModule, torch.fx.Node]] = backend_api.create_submodule_from_nodes
    original_partitions: Callable[..., dict[str, list[torch.fx.Node]]] = backend_api._create_partitions_in_graph_module
    original_same_tag: Callable[..., list[torch.fx.Node]] = backend_api._get_node_list_with_same_tag
    original_duplicate: Callable[[ExportedProgram, str], None] = backend_api._maybe_duplicate_constant_nodes
    original_insert: Callable[..., torch.fx.GraphModule] = lowered_backend_module.insert_subgm
    # graph -> {tag: its nodes in graph order}, while its partitions are cut out
    tag_index: dict[torch.fx.Graph, dict[str, list[torch.fx.Node]]] = {}
    next_name: dict[torch.nn.Module, int] = {}  # root module -> the first `lowered_module_{i}` index not yet tried

    def create_unsorted(gm: torch.fx.GraphModule, node_list: list[torch.fx.Node], tag: str,
                        skip_legalize_graph: bool = False) -> tuple[torch.fx.GraphModule, torch.fx.Node]:
        return original_create(gm, node_list, tag, skip_legalize_graph=True)

    # partition_result: ExecuTorch's PartitionResult
    def partitions_then_sort(gm: torch.fx.GraphModule, partition_result: Any, *args: Any,
                             **kwargs: Any) -> dict[str, list[torch.fx.Node]]:
        index: dict[str, list[torch.fx.Node]] = {}
        for node in gm.graph.nodes:
            index.setdefault(node.meta.get("delegation_tag", ""), []).append(node)
        tag_index[gm.graph] = index
        checked_once = (replaced(fuser_utils, validate_partition=lambda nodes: True)
                        if partitions_form_no_cycle(gm.graph, partition_result.partition_tags)
                        else contextlib.nullcontext())  # torch's check then finds the cycle, as before
        try:
            with replaced(type(gm), __str__=lambda self: f"<GraphModule of {len(self.graph.nodes)} nodes>"), \
                    checked_once:
                created = original_partitions(gm, partition_result, *args, **kwargs)
        finally:
            del tag_index[gm.graph]
        sort_in_place(gm.graph)
        gm.graph.lint()
        gm.recompile()
        return created

    def same_tag_indexed(gm: torch.fx.GraphModule, tag: str, owning_program: ExportedProgram) -> list[torch.fx.Node]:
        index = tag_index.get(gm.graph)
        if index is None:
            return original_same_tag(gm, tag, owning_program)
        nodes = [n for n in index.get(tag, ()) if not n._erased]
        return original_same_tag(_graph_module_of(nodes), tag, owning_program)

    def duplicate_constants_if_tagged(tagged_program: ExportedProgram, tag: str) -> None:
        placeholders = tagged_program.graph.find_nodes(op="placeholder")
        if any(node.meta.get("delegation_tag", "") == tag for node in placeholders):
            original_duplicate(tagged_program, tag)

    def next_lowered_name(root: torch.nn.Module, lowered_module: torch.nn.Module) -> str:
        i = next_name.get(root, 0)
        while hasattr(root, f"lowered_module_{i}"):
            i += 1
        next_name[root] = i + 1
        root.add_module(f"lowered_module_{i}", lowered_module)
        return f"lowered_module_{i}"

    def insert_after_last_output(gm: torch.fx.GraphModule, sub_gm: torch.fx.GraphModule,
                                 orig_inputs: tuple[torch.fx.Node, ...], orig_outputs: tuple[torch.fx.Node, ...],
                                 insertion_point: torch.fx.Node | None = None) -> torch.fx.GraphModule:
        if insertion_point is None and orig_outputs:
            insertion_point = max(orig_outputs)  # torch.fx nodes order as they stand in the graph
        return original_insert(gm, sub_gm, orig_inputs, orig_outputs, insertion_point)

    with replaced(backend_api, create_submodule_from_nodes=create_unsorted,
                   _create_partitions_in_graph_module=partitions_then_sort,
                   _get_node_list_with_same_tag=same_tag_indexed, get_lowered_module_name=next_lowered_name,
                   _maybe_duplicate_constant_nodes=duplicate_constants_if_tagged), \
            replaced(lowered_backend_module, insert_subgm=insert_after_last_output):
        yield


class _LiveDebugHandles:
    """The debug handles of a graph's live nodes, counted, with the largest at hand: built in
    one walk, told of each erased node (the graph module's erase hook) and each handle added."""

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        self.count = Counter(node.meta.get("debug_handle", 0) for node in graph_module.graph.nodes)
        self.heap = [-handle for handle in self.count]
        heapq.heapify(self.heap)

    def erased(self, node: torch.fx.Node) -> None:
        self.count[node.meta.get("debug_handle", 0)] -= 1

    def add(self, handle: int) -> None:
        self.count[handle] += 1
        heapq.heappush(self.heap, -handle)

    def largest(self) -> int:
        while self.heap and self.count[-self.heap[0]] <= 0:
            heapq.heappop(self.heap)
        return -self.heap[0] if self.heap else 0


class _LargestHandleOnly:
    """A program as ExecuTorch's `generate_debug_handle` reads it (the largest debug handle among
    its graph's nodes, plus one): its graph shows one node holding `largest`. Every other
    attribute is the program's own."""

    def __init__(self, program: ExportedProgram, largest: int) -> None:
        self.graph_module = _graph_module_of([SimpleNamespace(meta={"debug_handle": largest})])
        self._program = program

    def __getattr__(self, name: str) -> Any:
        return getattr(self._program, name)


def debug_handles_counted() -> AbstractContextManager[None]:
    """While lowering: a delegate call's debug handle (the largest among the program's live nodes,
    plus one) comes from a count of the live handles instead of a walk over the whole program per
    delegate call (ExecuTorch's `_insert_lowered_submodule`; 11.6 s of nanoVLM-222M SGD's export,
    1,577 calls). The count is made once per `lower_all_submodules_to_backend` and kept by the
    graph module's erase hook; the same handles result. Patches executorch.exir.backend.backend_api
    (pinned 1.5.1) for the `with` only."""
    from executorch.exir.backend import backend_api

    original_lower_all: Callable[..., None] = backend_api.lower_all_submodules_to_backend
    original_insert: Callable[..., None] = backend_api._insert_lowered_submodule
    # id(owning program) -> its _LiveDebugHandles, while its delegates are inserted
    live: dict[int, _LiveDebugHandles] = {}

    def lower_all_counted(backend_id: str, method_to_submodules_nodes: dict[str, list[torch.fx.Node]],
                          method_to_tagged_edge_program: dict[str, ExportedProgram]) -> None:
        programs = list(method_to_tagged_edge_program.values())
        for program in programs:
            live[id(program)] = _LiveDebugHandles(program.graph_module)
            program.graph_module._register_erase_node_hook(live[id(program)].erased)
        try:
            return original_lower_all(backend_id, method_to_submodules_nodes, method_to_tagged_edge_program)
        finally:
            for program in programs:
                program.graph_module._unregister_erase_node_hook(live.pop(id(program)).erased)

    def insert_counted(submodule_program: ExportedProgram, owning_program: ExportedProgram, *args: Any) -> None:
        handles = live.get(id(owning_program))
        if handles is None:
            return original_insert(submodule_program, owning_program, *args)
        largest = handles.largest()
        original_insert(submodule_program, _LargestHandleOnly(owning_program, largest), *args)
        handles.add(largest + 1)  # the delegate call's own

    return replaced(backend_api, lower_all_submodules_to_backend=lower_all_counted,
                     _insert_lowered_submodule=insert_counted)


# The operators `exporters.executorch._xnnpack_partitioner` partitions: matmuls, transposes,
# fp32 elementwise nodes (pow: squares only, PowConfig's own rule) and int8 codes' widening
# (`exporters.executorch.codes_widened_by_xnnpack`: a dequantisation alone, which only
# PropagateCustomMetaPass, a pass over node meta, acts on).
ELEMENTWISE_OPS = frozenset({"mul.Tensor", "add.Tensor", "sub.Tensor", "div.Tensor", "neg.default", "tanh.default",
                             "sigmoid.default", "pow.Tensor_Scalar"})
PARTITION_OPS = frozenset({"linear.default", "mm.default", "bmm.default", "permute_copy.default",
                           "dequantize_per_tensor.default"}) | ELEMENTWISE_OPS

# XNNPACK's passes (executorch 1.5.1 XNNPACKPassManager) that can change a partition made of
# PARTITION_OPS. The others match only operators it cannot hold: the clone, dim-order and copy
# passes act on clone/dim-order/`_to_copy` nodes alone, FuseActivationPass fuses only a ReLU,
# hardtanh or clamp. Each pass re-traces the whole partition through fake tensors even where it
# changes nothing (most of a partition's lowering time), so a partition gets only those with
# something to act on (`_passes_with_work`).
PARTITION_PASSES = ("ConvertToLinearPass", "ConstPropPass", "ChannelsLastTaggedReshapePass",
                    "RemoveRedundantCopyPass")


def _matmul_to_convert(graph: torch.fx.Graph) -> bool:
    """Whether XNNPACK's ConvertToLinearPass has a matmul here to turn into a linear: one its
    source matching places in a linear layer's partition, or an mm whose weight is a transpose
    (its addmm/mm rewrite; PARTITION_OPS hold no addmm). Its third rewrite needs a view copy or
    a dynamic quantisation's dequantisation (`.tensor`), which no partition of PARTITION_OPS
    holds. The backward's matmuls are neither (nanoVLM-222M: the pass re-traced every
    partition holding one, 7 s, to change nothing)."""
    from executorch.backends.xnnpack._passes.convert_to_linear import ConvertToLinearPass
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

    sources = get_source_partitions(graph, ConvertToLinearPass.linear_modules)
    if any(n.target in ConvertToLinearPass.targets for found in sources.values() for partition in found
           for n in partition.nodes):
        return True
    aten = exir_ops.edge.aten
    transposes = (aten.t_copy.default, aten.permute_copy.default)
    return any(isinstance(n.args[1], torch.fx.Node) and n.args[1].target in transposes
               for n in graph.find_nodes(op="call_function", target=aten.mm.default))


def _passes_with_work(ep: ExportedProgram) -> tuple[str, ...] | None:
    """The PARTITION_PASSES with something to act on in this partition, or None (all of
    XNNPACK's passes) where it holds an operator outside PARTITION_OPS. ConstPropPass where an
    operator's inputs are all constants (`get_attr` tensors or other such operators: the
    retrace gives every placeholder, lifted weights and constants included, a fake value it
    never folds); ConvertToLinearPass where a matmul is a linear's (`_matmul_to_convert`); the layout pass, and the
    copy pass that folds the copies it inserts, only where a 4-D value is channels-last (none
    of PARTITION_OPS needs NHWC, so on row-major values the layout pass only tags them
    row-major, which the serializer assumes untagged). Most partitions get none."""
    from executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass import ChannelsLastTaggedReshapePass
    from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

    nodes = ep.graph_module.graph.nodes
    ops = {format_target_name(getattr(n.target, "__name__", "")) for n in nodes if n.op == "call_function"}
    if not ops <= PARTITION_OPS:
        return None
    constant: set[torch.fx.Node] = set()
    for n in nodes:
        if n.op == "get_attr" or (n.op == "call_function" and all(i in constant for i in n.all_input_nodes)):
            constant.add(n)
    kept = ["ConstPropPass"] if any(n.op == "call_function" for n in constant) else []
    if "mm.default" in ops and _matmul_to_convert(ep.graph_module.graph):
        kept.append("ConvertToLinearPass")
    values = (n.meta.get("val") for n in nodes)
    if any(isinstance(v, torch.Tensor) and v.dim() == 4 and ChannelsLastTaggedReshapePass._is_nhwc_tensor(v)
           for v in values):
        kept += ["ChannelsLastTaggedReshapePass", "RemoveRedundantCopyPass"]
    return tuple(kept)


def only_partition_passes() -> AbstractContextManager[None]:
    """While lowering: XNNPACK's preprocess runs on a partition of PARTITION_OPS only the passes
    `_passes_with_work` keeps (all of them on any other). Patches
    executorch.backends.xnnpack.xnnpack_preprocess (pinned 1.5.1) for the `with` only."""
    from executorch.backends.xnnpack import xnnpack_preprocess

    original = xnnpack_preprocess.XNNPACKPassManager

    # ExecuTorch's XNNPACKPassManager: untyped
    def manager(ep: ExportedProgram, passes: list[Any] | None = None) -> Any:
        chosen = original(ep, passes)
        kept = _passes_with_work(ep) if passes is None else None
        if kept is not None:
            chosen.passes = [p for p in chosen.passes if p.__name__ in kept]
        return chosen

    return replaced(xnnpack_preprocess, XNNPACKPassManager=manager)


def weight_names(signature: ExportGraphSignature) -> frozenset[str]:
    """The names of a program's placeholders that hold its parameters and buffers."""
    return frozenset(signature.inputs_to_parameters) | frozenset(signature.inputs_to_buffers)


def computed_from_weights(graph: torch.fx.Graph, weights: Collection[str],
                          counts: Callable[[torch.fx.Node], bool] = lambda node: True) -> set[torch.fx.Node]:
    """The call nodes computed from the placeholders named in `weights` alone (with no input
    at all too), each `counts(node)` admits: a weight's rounding, an int8 weight's
    dequantisation, a transpose of either."""
    found: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "call_function" and counts(node) and all(
                i.name in weights if i.op == "placeholder" else i in found for i in node.all_input_nodes):
            found.add(node)
    return found


def partition_by_level(graph: torch.fx.Graph, matched: Collection[torch.fx.Node],
                       group: Callable[[torch.fx.Node], str | None] = lambda node: None,
                       weights: Collection[str] = frozenset(),
                       elementwise: Callable[[torch.fx.Node], bool] = lambda node: False) -> list[list[torch.fx.Node]]:
    """Groups the `matched` nodes (those XNNPACK takes) into cycle-free partitions in one
    pass: a matched node's level is the highest among its inputs, plus one for an input
    outside `matched` or in another `group`; other nodes carry the highest level of their
    inputs (0 for none). Each (level, group) is one partition. Along every edge the level
    never drops and it rises on entering a partition from outside, so no path leaves a
    partition and comes back. `group`: a recomputation's nodes must stay apart from the
    forward's, or their delegate call would run with the forward and keep what the
    recomputation frees. `graph` must be in topological order.

    Then, last node first, a node computed from `weights` alone (the names of the placeholders
    that hold parameters and buffers; a weight's bf16 rounding or dequantisation,
    exporters.bf16_in_fp32), or a matched node that is
    `elementwise`, whose users are all matched and of its group takes the lowest of their
    levels: it runs as late as its readers. A weight's rounding joins the matmul that reads it,
    instead of every weight's rounding running in one delegate call near the start with all its
    results alive; a backward's elementwise chain over the forward's values alone (a SiLU's or
    GELU's gradient, `s * (1 + x * (1 - s))`) joins the backward call that reads it, instead of
    the forward's, where its results would live until the backward. No level drops along an
    edge."""
    level: dict[torch.fx.Node, int] = {}
    from_weights = computed_from_weights(graph, weights)
    for node in graph.nodes:
        inputs = node.all_input_nodes
        if node in matched:
            mine = group(node)
            level[node] = max((level[i] + (i not in matched or group(i) != mine) for i in inputs), default=1)
        else:
            level[node] = max((level[i] for i in inputs), default=0)
    for node in reversed(graph.nodes):
        users = node.users
        sinks = node in from_weights or (node in matched and elementwise(node))
        if sinks and users and all(u in matched and group(u) == group(node) for u in users):
            level[node] = min(level[u] for u in users)
    groups: dict[tuple[int, str], list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node in matched:
            groups.setdefault((level[node], str(group(node))), []).append(node)
    return [groups[k] for k in sorted(groups)]


def _source_partitions_once() -> AbstractContextManager[None]:
    """XNNPACK's GEMM configs look up the whole graph's linear source partitions again for
    every matmul they check (quadratic); while matching, the graph does not change, so look
    them up once per graph. Patches executorch's gemm_configs (pinned 1.5.1) for the `with`."""
    from executorch.backends.xnnpack.partition.config import gemm_configs

    original: Callable[..., dict[Any, list[SourcePartition]]]  # torch's get_source_partitions
    cache: dict[tuple[int, tuple[Any, ...], Callable[[torch.fx.Node], bool] | None], dict[Any, list[SourcePartition]]]
    original, cache = gemm_configs.get_source_partitions, {}

    def once(graph: torch.fx.Graph, wanted_sources: list[Any], filter_fn: Callable[[torch.fx.Node], bool] | None = None
             ) -> dict[Any, list[SourcePartition]]:
        key = (id(graph), tuple(wanted_sources), filter_fn)
        if key not in cache:
            cache[key] = original(graph, wanted_sources, filter_fn)
        return cache[key]

    return replaced(gemm_configs, get_source_partitions=once)


def phase_group(graph: torch.fx.Graph) -> Callable[[torch.fx.Node], str | None]:
    """A node's partition group in a training program: its recomputation's
    (exporters.et_methods.recomputation_group) or its block of a weight's gradient's
    (exporters.et_methods.UPDATE_BLOCK), else "backward" for a node after the loss (the
    program's first output), else None. A backward node that reads values of the forward alone
    has a forward node's level: joined to that node's partition, the call ran in the forward
    and every value it made lived until the backward (nanoVLM-222M's checkpointed bf16 SGD kept
    each ViT and decoder block's attention values, 217 MiB, through it)."""
    from exporters.et_methods import UPDATE_BLOCK, recomputation_group

    outputs = graph.output_node().args[0]
    loss = outputs[0] if isinstance(outputs, (list, tuple)) and outputs else outputs
    nodes = list(graph.nodes)
    backward = set(nodes[nodes.index(loss) + 1:]) if isinstance(loss, torch.fx.Node) else set()

    def group(node: torch.fx.Node) -> str | None:
        block: str | None = node.meta.get("custom", {}).get(UPDATE_BLOCK)
        return recomputation_group(node) or block or ("backward" if node in backward else None)

    return group


def level_partitioner(configs: list[Any], **kwargs: Any) -> Any:
    """An XnnpackPartitioner (same configs and options) that partitions with
    `partition_by_level`. Falls back to XNNPACK's own partitioning when a config matches
    more than one operator together (a pattern to keep whole: not our matmul configs)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name
    from torch.fx.passes.infra.partitioner import Partition

    # XNNPACK's partitioner class is upstream's, untyped
    class LevelPartitioner(XnnpackPartitioner):  # type: ignore[misc]
        def generate_partitions(self, ep: ExportedProgram) -> list[Partition]:
            with _source_partitions_once():
                matches = self.get_matched_nodes_from_configs(ep)
            if any(sum(n.op == "call_function" for n in match) > 1 for match in matches):
                return super().generate_partitions(ep)  # type: ignore[no-any-return]  # upstream's, untyped
            owner = {n: match for match in matches for n in match if n.op == "call_function"}
            partitions: list[Partition] = []
            graph = ep.graph_module.graph
            signature = ep.graph_signature
            weights = weight_names(signature)
            elementwise = {n for n in owner if format_target_name(n.target.__name__) in ELEMENTWISE_OPS}
            for i, nodes in enumerate(partition_by_level(graph, set(owner), phase_group(graph), weights,
                                                         elementwise.__contains__)):
                members = {m: None for n in nodes for m in owner[n]}  # + a match's constants
                partitions.append(Partition(id=i, nodes=members))
            return partitions

    return LevelPartitioner(configs=configs, **kwargs)


def installed_executorch() -> str | None:
    """The installed executorch release, or None."""
    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return None


def fast_lowering_problem() -> str | None:
    """Why the patches cannot be trusted with the installed executorch (another release than
    WRITTEN_FOR, a patched function or a pass gone or renamed), or None."""
    installed = installed_executorch()
    if installed is None:
        return "executorch is not installed"
    if installed != WRITTEN_FOR:
        return f"edgebench's fast XNNPACK lowering was written for executorch {WRITTEN_FOR}, found {installed}"
    from executorch.backends.xnnpack import xnnpack_preprocess
    from executorch.backends.xnnpack.partition.config import gemm_configs
    from executorch.exir import lowered_backend_module
    from executorch.exir.backend import backend_api
    from torch.fx.passes.utils import fuser_utils

    for owner, name in ((backend_api, "create_submodule_from_nodes"),
                        (backend_api, "_create_partitions_in_graph_module"),
                        (backend_api, "_get_node_list_with_same_tag"), (backend_api, "get_lowered_module_name"),
                        (backend_api, "lower_all_submodules_to_backend"), (backend_api, "_insert_lowered_submodule"),
                        (backend_api, "_maybe_duplicate_constant_nodes"), (lowered_backend_module, "insert_subgm"),
                        (fuser_utils, "validate_partition"),
                        (xnnpack_preprocess, "XNNPACKPassManager"), (gemm_configs, "get_source_partitions")):
        changed = problem(owner, name)  # exporters.upstream's registry: there, and as it was read
        if changed:
            return f"executorch {installed}: {changed}"
    passes = {p.__name__ for p in xnnpack_preprocess.XNNPACKPassManager(None).passes}
    missing = sorted(set(PARTITION_PASSES) - passes)
    if missing:
        return f"executorch {installed}'s XNNPACK passes lack {', '.join(missing)}"
    return None


@contextlib.contextmanager
def fast_xnnpack_lowering() -> Iterator[None]:
    """The lowering patches, for one `to_edge_transform_and_lower` call (the partitioner of
    `level_partitioner` brings one more, `_source_partitions_once`)."""
    with linear_time_partitioning(), debug_handles_counted(), only_partition_passes():
        yield
