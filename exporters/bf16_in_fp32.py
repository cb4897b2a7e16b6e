"""bf16 values held in fp32, each rounded to bf16 where eager's bf16 kernel rounds it.

Eager's bf16 CPU kernels widen their operands to fp32, compute in fp32 and round the result
to bf16. The runtime's bf16 kernels are single-threaded passes that XNNPACK cannot take (it
has no bf16), and every autocast boundary is a cast on them: nanoVLM-222M QLoRA's step spent
1.56 of 3.94 s in 9,130 casts and 1.05 s more in bf16 mul/add/permute. Here every bf16 value
the step computes is an fp32 tensor holding that bf16 value: casts to bf16 become the
rounding, casts from bf16 vanish, arithmetic runs in fp32 followed by the rounding, and
operators that only move values (views, permutes, cat, where) move them as they are. The
rounding, `t = v * 65537; t - (t - v)` (Veltkamp's splitting), is the cast's round-to-
nearest-even bit for bit for every normal |v| below 5.19e33; beyond it, it overflows to NaN, so
what derives from a scalar that large (the attention mask's -inf, the dtype minimum added at
padded keys) stays unrounded until a softmax bounds it.

Left in bf16: the program's bf16 inputs (stored weights: each use widens it, exactly) and
whatever operator has no rule here (its fp32 operands narrowed back, exactly, and its result
widened).

Unrounded (`round_values=False`, the export's bf16 "fp32" mode), the same rewrite computes every
bf16 value in fp32 and drops the roundings: nanoVLM-222M QLoRA's ~9,200 a step, a multiply
and two subtracts each. The losses then leave eager's by bf16's rounding (its own variant).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Set
from typing import TYPE_CHECKING

import torch

from exporters.et_methods import IN_ORDER
from exporters.xnnpack_lowering import computed_from_weights

if TYPE_CHECKING:
    from torch.fx.node import Argument, Target

aten = torch.ops.aten

# Veltkamp's splitting constant for fp32's 24-bit significand and bf16's 8: 2**16 + 1.
BF16_SPLIT = 65537.0

# The rounding overflows to NaN from here (|v| * BF16_SPLIT beyond fp32's largest).
_ROUNDING_LIMIT = 5.19e33
# Operators whose result is bounded whatever their operands (a mask's -inf or dtype minimum).
_BOUNDED = {aten._softmax.default, aten.sigmoid.default, aten.tanh.default}

# The `custom` meta key marking the rounding of a cast over XNNPACK's size limit for
# elementwise work (nanoVLM's tied embedding, rounded for the lm_head three times a step):
# XNNPACK takes it anyway: the runtime's single-threaded casts took 0.39 s of nanoVLM-222M
# adamw-bf16's step; XNNPACK's workspace keeping embedding-sized temporaries added 282 MiB of
# peak RSS (0.99x eager's).
LARGE_ROUNDING = "edgebench_large_rounding"

# Readers of a value of weights alone within this many nodes of it share it.
_NEAR = 32
# A value of weights alone up to this size (a scale's or a norm weight's rounding, a LoRA
# matrix's) is shared by all its readers: alive, it costs less than the nodes computing it
# again (nanoVLM-222M lora+ckpt+frozen-int8: 2,105 of 3,273 copies).
_SHARED_BYTES = 64 << 10

# Operators that only move or select values: the fp32 form holds the same bf16 values.
_MOVES = {aten.view.default, aten._unsafe_view.default, aten.permute.default, aten.unsqueeze.default,
          aten.squeeze.dims, aten.squeeze.dim, aten.expand.default, aten.alias.default, aten.clone.default,
          aten.cat.default, aten.slice.Tensor, aten.split_with_sizes.default, aten.split.Tensor,
          aten.select.int, aten.where.self, aten.slice_scatter.default, aten.t.default,
          aten.transpose.int, aten.neg.default, aten.index.Tensor}
# Operators eager computes in fp32 and rounds once (its bf16 CPU kernels' opmath).
_ROUNDED = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.add.Scalar,
            aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar, aten.pow.Tensor_Scalar, aten.rsqrt.default,
            aten.sqrt.default, aten.sigmoid.default, aten.tanh.default, aten.exp.default, aten.mean.dim,
            aten.sum.dim_IntList, aten._softmax.default, aten._log_softmax.default, aten.gelu.default,
            aten.silu.default, aten.native_layer_norm.default, aten.reciprocal.default}
_MULTIPLE_OUTPUTS = {aten.native_layer_norm.default}
# Operators that scale their first operand by their second: by a power of two, exactly.
_SCALED = {aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar}
# Operators making a tensor of a given dtype: made in fp32 with their value rounded.
_MADE = {aten.full.default, aten.full_like.default, aten.scalar_tensor.default, aten.empty.memory_format,
         aten.zeros_like.default, aten.ones_like.default, aten.zeros.default, aten.ones.default}


def _dtypes(val: object) -> list[torch.dtype]:
    values = val if isinstance(val, (tuple, list)) else [val]
    return [v.dtype for v in values if isinstance(v, torch.Tensor)]


def _is_bf16(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and torch.bfloat16 in _dtypes(node.meta.get("val"))


def _fp32_values() -> Callable[[object], object]:
    """`val` (a fake tensor, or a tuple of them) with fp32 for bf16: one fake tensor per shape
    and stride, made once (a fake tensor's `.to` dispatches through the fake mode: 3.8 s for
    nanoVLM-222M's 20,000 bf16 values, made anew). The values only stand for shapes and dtypes
    until to_edge's re-trace makes every node's own."""
    made: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}

    def as_fp32(val: object) -> object:
        if isinstance(val, (tuple, list)):
            return type(val)(as_fp32(v) for v in val)
        if not isinstance(val, torch.Tensor) or val.dtype != torch.bfloat16:
            return val
        key = (tuple(val.shape), val.stride())
        if key not in made:
            made[key] = val.to(torch.float32)
        return made[key]

    return as_fp32


def _power_of_two(x: object) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x != 0 and math.frexp(abs(x))[0] == 0.5


def _bf16_value(x: Argument) -> Argument:
    """A Python scalar as bf16 holds it."""
    return torch.tensor(x, dtype=torch.bfloat16).item() if isinstance(x, float) else x


def cast_dtypes(node: torch.fx.Node) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(source, target) dtypes of an `_to_copy` that only casts, else (None, None). A copy of a
    contiguous source into contiguous order only casts too (`.float()` in nanoVLM's vision
    encoder, 47 a step, left a round trip through bf16 on the runtime's casts)."""
    if node.target != aten._to_copy.default or set(node.kwargs) - {"dtype", "device", "layout", "memory_format"} \
            or node.kwargs.get("layout", torch.strided) != torch.strided:
        return None, None
    source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    order = node.kwargs.get("memory_format", torch.preserve_format)
    if order != torch.preserve_format and not (order == torch.contiguous_format and source is not None
                                                and source.is_contiguous()):
        return None, None
    # fx types a keyword argument as any Argument: `_to_copy`'s dtype is a torch.dtype or None
    return getattr(source, "dtype", None), node.kwargs.get("dtype")  # type: ignore[return-value]


def _huge_scalar(node: torch.fx.Node) -> bool:
    """A Python scalar argument the rounding cannot take (-inf, a dtype's minimum)."""
    scalars = [*node.args, *node.kwargs.values()]
    scalars += [x for a in scalars if isinstance(a, (list, tuple)) for x in a]
    return any(isinstance(a, float) and not abs(a) < _ROUNDING_LIMIT for a in scalars)


def bf16_held_in_fp32(gm: torch.fx.GraphModule, is_large: Callable[[torch.Tensor], bool],
                      round_values: bool = True) -> int:
    """Rewrites `gm` so its computed bf16 values are fp32 tensors holding them (module
    docstring). `is_large(val)`: a value over XNNPACK's size limit for elementwise work:
    arithmetic on one stays in bf16, a cast of one rounds marked LARGE_ROUNDING.
    `round_values` False: no value is rounded (fp32 compute). Returns how many bf16 nodes now
    compute in fp32."""
    graph, _as_fp32 = gm.graph, _fp32_values()
    wide: dict[torch.fx.Node, torch.fx.Node] = {}  # bf16 node -> its fp32 form
    # Nodes that may hold values the rounding cannot take (a mask's -inf or dtype minimum, and
    # what adds it, until a softmax bounds them): never rounded, as the casts keep -inf.
    unbounded: set[torch.fx.Node] = set()
    rounded_items: set[torch.fx.Node] = set()  # fp32 forms of multi-output operators, rounded at getitem

    def new(target: Target, args: Iterable[Argument], kwargs: Mapping[str, Argument], like: torch.fx.Node,
            val: object, whole_meta: bool = False) -> torch.fx.Node:
        """A node with `like`'s meta (`whole_meta`: the operator's own form) or its group only."""
        # fx types a target Callable | str: here an operator (aten's, or a call_function node's own)
        node = graph.call_function(target, tuple(args), dict(kwargs))  # type: ignore[arg-type]
        node.meta = {**like.meta, "val": val} if whole_meta else {"val": val, "custom": like.meta.get("custom", {})}
        return node

    rounded: set[torch.fx.Node] = set()  # the roundings' results

    @functools.cache
    def holds_bf16(value: torch.fx.Node) -> bool:
        """Whether fp32 `value` holds a bf16 value already, so rounding it changes nothing: a
        rounding's result, a widened bf16 value or int8 code, a move of such values, or one
        times or over a power of two (exact; a subnormal result, which the rounding leaves as
        it is, aside)."""
        source, target = cast_dtypes(value)
        if value in rounded or (target == torch.float32 and source in (torch.bfloat16, torch.int8, torch.uint8)):
            return True
        if value.target in _MOVES:
            fp32_operands = [a for a in value.all_input_nodes if _dtypes(a.meta.get("val")) == [torch.float32]]
            return bool(fp32_operands) and all(holds_bf16(a) for a in fp32_operands)
        # fx types an operand as any Argument: a scaling's first operand is a tensor, so a node
        return value.target in _SCALED and _power_of_two(value.args[1]) and holds_bf16(value.args[0])  # type: ignore[arg-type]

    def rounding(value: torch.fx.Node, like: torch.fx.Node, large: bool = False) -> torch.fx.Node:
        """`value` rounded to bf16; `large`: marked LARGE_ROUNDING for XNNPACK to take anyway.
        A large gradient that only feeds a bf16 weight's update (et_methods.IN_ORDER) stays
        unrounded: the update widens it again, and its rounding would hold three fp32 copies."""
        if not round_values or holds_bf16(value) or (large and like.meta.get("custom", {}).get(IN_ORDER)):
            return value
        val = value.meta["val"]
        scaled = new(aten.mul.Tensor, (value, BF16_SPLIT), {}, like, val)
        error = new(aten.sub.Tensor, (scaled, value), {}, like, val)
        result = new(aten.sub.Tensor, (scaled, error), {}, like, val)
        if large:
            for node in (scaled, error, result):
                node.meta["custom"] = {**node.meta["custom"], LARGE_ROUNDING: True}
        rounded.add(result)
        return result

    def widened(arg: Argument, user: torch.fx.Node) -> Argument:
        """An operand of a rewritten `user` in its fp32 form."""
        if not isinstance(arg, torch.fx.Node) or not _is_bf16(arg):
            return arg
        if arg in wide:
            return wide[arg]
        return new(aten._to_copy.default, (arg,), {"dtype": torch.float32}, user, _as_fp32(arg.meta["val"]))

    def narrowed(arg: torch.fx.Node, like: torch.fx.Node) -> torch.fx.Node:
        """`arg` as bf16 again, its fp32 form narrowed (exact), for an operator kept in bf16."""
        if arg not in wide:
            return arg
        return new(aten._to_copy.default, (wide[arg],), {"dtype": torch.bfloat16}, like, arg.meta["val"])

    def operands(node: torch.fx.Node) -> tuple[tuple[Argument, ...], dict[str, Argument]]:
        return (torch.fx.node.map_arg(node.args, lambda a: widened(a, node)),
                torch.fx.node.map_arg(node.kwargs, lambda a: widened(a, node)))

    def fp32_form(node: torch.fx.Node, source: torch.dtype | None, target: torch.dtype | None) -> torch.fx.Node | None:
        """`node`'s fp32 form (inserted before it), or None to keep it in bf16; `source` and
        `target`: its dtypes if it is a cast."""
        val = node.meta.get("val")
        if val is None:
            return None
        if target == torch.bfloat16 and source == torch.float32:
            # fx types an operand as any Argument: a cast's first operand is a tensor, so a node
            return node.args[0] if node in unbounded else rounding(node.args[0], node, large=is_large(val))  # type: ignore[return-value, arg-type]
        if target == torch.bfloat16 and source in (torch.int8, torch.uint8):  # codes: exact in bf16 and fp32
            return new(aten._to_copy.default, node.args, {"dtype": torch.float32}, node, _as_fp32(val))
        if target is not None or not _is_bf16(node):
            return None
        if node.target is operator.getitem and node.args[0] in wide:  # fx types it any Argument: here a node
            form = new(node.target, (wide[node.args[0]], *node.args[1:]), {}, node, _as_fp32(val), True)  # type: ignore[index]
            return rounding(form, node) if node.args[0] in rounded_items else form
        if node.target in _MOVES and all(a in wide for a in node.all_input_nodes if _is_bf16(a)):
            return new(node.target, *operands(node), node, _as_fp32(val), True)
        if node.target in _ROUNDED and not is_large(val if isinstance(val, torch.Tensor) else val[0]):
            form = new(node.target, *operands(node), node, _as_fp32(val), True)
            if node in unbounded:
                return form
            if not isinstance(val, torch.Tensor):
                rounded_items.add(form)
                return form
            return rounding(form, node)
        if node.target in _MADE and node.kwargs.get("dtype") in (None, torch.bfloat16):
            args, kwargs = operands(node)
            return new(node.target, [_bf16_value(a) for a in args], {**kwargs, "dtype": torch.float32}, node,
                       _as_fp32(val), True)
        return None

    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target not in _BOUNDED and (_huge_scalar(node) or any(a in unbounded for a in node.all_input_nodes)):
            unbounded.add(node)
        if not _is_bf16(node) and not any(a in wide for a in node.all_input_nodes):
            continue
        source, target = cast_dtypes(node)
        with graph.inserting_before(node):
            if source == torch.bfloat16 and target == torch.float32 and node.args[0] in wide:
                node.replace_all_uses_with(widened(node.args[0], node))  # the value it holds already
                graph.erase_node(node)
                continue
            if node.target in _ROUNDED and not _is_bf16(node) and node.target not in _MULTIPLE_OUTPUTS:
                node.args, node.kwargs = operands(node)  # bf16 operands promoted to fp32 by the operator
                continue
            form = fp32_form(node, source, target)
            if form is None:  # the operator as it is, on its operands narrowed back (exact)
                narrow = functools.partial(narrowed, like=node)
                node.args, node.kwargs = torch.fx.node.map_arg(node.args, narrow), torch.fx.node.map_arg(
                    node.kwargs, narrow)
        if form is None:
            if isinstance(node.meta.get("val"), torch.Tensor) and _is_bf16(node):
                with graph.inserting_after(node):
                    wide[node] = new(aten._to_copy.default, (node,), {"dtype": torch.float32}, node,
                                     _as_fp32(node.meta["val"]))
            continue
        wide[node] = form
        if node in unbounded:
            unbounded.add(form)
        count += 1
    output = graph.output_node()
    with graph.inserting_before(output):
        output.args = torch.fx.node.map_arg(output.args, lambda arg: narrowed(arg, like=arg))
    for node in reversed(wide):  # the bf16 originals nothing reads now
        if not node.users:
            graph.erase_node(node)
    return count


def large_frozen_weights_in_fp32(ep: torch.export.ExportedProgram, is_large: Callable[[torch.Tensor], bool]) -> int:
    """Each frozen bf16 weight over XNNPACK's size limit (`is_large`: nanoVLM's tied embedding
    under QLoRA) that is only widened (the lm_head forward, its input gradient) or looked up
    in is stored in fp32 holding its bf16 values. Each widening ran on the runtime's single-
    threaded cast, into a planned weight-sized fp32 copy: nanoVLM-222M QLoRA's two took most of
    the casts' 0.146 s of a 1.23 s step. Stored so, the weight costs 2 bytes an element more and
    no copy is made. Returns the weights stored so."""
    signature, graph = ep.graph_signature, ep.graph
    gradient = torch.export.graph_signature.OutputKind.GRADIENT_TO_PARAMETER
    trained = {spec.target for spec in signature.output_specs if spec.kind == gradient}
    names = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}

    def widening(node: torch.fx.Node) -> bool:
        return cast_dtypes(node) == (torch.bfloat16, torch.float32)

    count = 0
    for node in list(graph.nodes):
        val = node.meta.get("val")
        if node.op != "placeholder" or node.name not in names or names[node.name] in trained \
                or not isinstance(val, torch.Tensor) or val.dtype != torch.bfloat16 or not is_large(val):
            continue
        lookups = [u for u in node.users if u.target == aten.embedding.default and u.args[0] is node]
        if not all(widening(u) or u in lookups for u in node.users) or not all(
                widening(w) for lookup in lookups for w in lookup.users):
            continue
        for value in (node, *lookups):
            value.meta["val"] = value.meta["val"].to(torch.float32)
            for user in [u for u in value.users if widening(u)]:
                user.replace_all_uses_with(value)
                graph.erase_node(user)
        store = ep.state_dict if names[node.name] in ep.state_dict else ep.constants
        weight = store[names[node.name]]
        wide = weight.detach().to(torch.float32)
        store[names[node.name]] = torch.nn.Parameter(wide, False) if isinstance(weight, torch.nn.Parameter) else wide
        count += 1
    return count


def weight_values_at_each_use(gm: torch.fx.GraphModule, weights: Set[str]) -> int:
    """Each value computed from the program's weights alone (`weights`: the names of the
    placeholders holding parameters and buffers) and read far from where it is computed (over
    _NEAR nodes on) is computed again just before its far readers: a weight's bf16 rounding,
    an int8 weight's dequantisation. Shared, it would live from the forward to the backward (or
    to a checkpointed block's recomputation) in fp32, a weight-sized copy per layer; computed
    again, it lives a matmul long. Values up to _SHARED_BYTES stay shared. Readers within
    _NEAR nodes of each other share one copy, which runs with the first of them (its
    recomputation group). Returns the copies made."""
    graph, count = gm.graph, 0
    from_weights = computed_from_weights(graph, weights, lambda node: bool(
        node.all_input_nodes and isinstance(node.meta.get("val"), torch.Tensor)
        and isinstance(node.target, torch._ops.OpOverload) and not node.target._schema.is_mutable))
    order = {n: i for i, n in enumerate(graph.nodes)}  # a copy gets its reader's place
    for node in reversed(list(graph.nodes)):  # readers first: a copy's inputs are copied in their turn
        if node not in from_weights or node.meta["val"].nbytes <= _SHARED_BYTES:
            continue
        start, copy = order[node], node
        for user in sorted((u for u in node.users if u.op != "output"), key=order.__getitem__):
            if order[user] - start > _NEAR:
                with graph.inserting_before(user):
                    copy = graph.node_copy(node)
                copy.meta["custom"] = user.meta.get("custom", {})
                start = order[copy] = order[user]
                count += 1
            if copy is not node:
                user.replace_input_with(node, copy)
    return count
