"""Lowers one training step (model + loss) to an ExecuTorch `.pte` program.

Path: torch.export (non-strict) of a module whose forward returns the scalar loss -> the
joint forward-backward graph -> graph rewrites -> `to_edge` (optionally delegating to
XNNPACK) -> `to_executorch`. Parameters with `requires_grad=False` are frozen: the
program returns no gradient for them and keeps them as constants.

Linear layers stay `aten.linear` on the weights as stored (`use_linear`): the default
decomposition copies every weight transposed each step and keeps those copies alive from
forward to backward. Patch-embedding convolutions are exported as one matmul. With the
XNNPACK delegate the matmuls (and transposes) run in XNNPACK with every weight a runtime
input, so trainable weights stay the program's own; the rest runs on the runtime's kernels.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram

from edgebench.errors import EdgebenchError
from exporters.bf16_in_fp32 import (
    LARGE_ROUNDING,
    bf16_held_in_fp32,
    cast_dtypes,
    large_frozen_weights_in_fp32,
    weight_values_at_each_use,
)
from exporters.et_methods import IN_ORDER
from exporters.graph_code_on_demand import graph_code_on_demand
from exporters.greedy_memory_plan import memory_planning_pass
from exporters.idle_passes import skipping_idle_passes
from exporters.lookups_once import lookups_once
from exporters.plan_parts import planned_parts
from exporters.recorded_delegate_outputs import delegate_outputs_as_recorded
from exporters.serialise_in_place import serialised_in_place
from exporters.signature_lookups import signature_mappings_once_per_phase
from exporters.xnnpack_lowering import weight_names

if TYPE_CHECKING:
    from os import PathLike

    from torch.fx.node import Argument

# The pipeline stages, in order, for progress displays.
STAGES = ("torch.export", "joint graph", "rewrites", "to_edge", "to_executorch")


@dataclass
class LoweredProgram:
    """An exported training program, ready to be written to a `.pte` file."""

    program: Any  # executorch's ExecutorchProgramManager
    planned_memory_bytes: int
    trainable_parameters: list[str]
    frozen_parameters: list[str]
    delegated: bool
    lowering: dict[str, Any] = field(default_factory=dict)  # how it was lowered, for the manifest (JSON)
    planned_memory_parts: dict[str, Any] = field(default_factory=dict)  # exporters.plan_parts

    @property
    def buffer(self) -> bytes:
        """The whole `.pte` in memory (tests); `write` streams it instead."""
        return self.program.buffer  # type: ignore[no-any-return]  # executorch's program manager: untyped

    def write(self, path: str | PathLike[str]) -> None:
        """Writes the `.pte` piece by piece: no second in-memory copy of the weights."""
        with open(path, "wb") as handle:
            self.program.write_to_file(handle)


def _patches_as_linear(conv: torch.nn.Conv2d, images: torch.Tensor) -> torch.Tensor:
    """`conv(images)` for a patch embedding (stride == kernel, no padding) as one matmul:
    cut the image into patches by reshape and permute, then `linear` with the weight viewed
    as [out, in * kh * kw]. Same result as the convolution (same sums, another order)."""
    b, c, h, w = images.shape
    kh, kw = conv.kernel_size
    patches = images.reshape(b, c, h // kh, kh, w // kw, kw).permute(0, 2, 4, 1, 3, 5)
    patches = patches.reshape(b, (h // kh) * (w // kw), c * kh * kw)
    out = torch.nn.functional.linear(patches, conv.weight.reshape(conv.out_channels, -1), conv.bias)
    return out.transpose(1, 2).reshape(b, conv.out_channels, h // kh, w // kw)


def _is_patch_conv(module: torch.nn.Module) -> bool:
    return (type(module) is torch.nn.Conv2d and module.stride == module.kernel_size
            and module.padding == (0, 0) and module.dilation == (1, 1) and module.groups == 1
            and module.padding_mode == "zeros")


@contextlib.contextmanager
def patch_convs_as_linear(model: torch.nn.Module) -> Iterator[int]:
    """While exporting, patch-embedding convolutions run as patches @ weight (yields how many).

    The runtime's convolution kernels are slow at this shape (nanoVLM-222M: convolution and
    its backward ~4.9 s a step, eager < 0.1 s) while its matmuls are not. The parameters stay
    the Conv2d's own (same names and shapes), so checkpoints and eager are unchanged."""
    convs = [m for m in model.modules() if _is_patch_conv(m)]
    for conv in convs:
        conv.forward = lambda images, conv=conv: _patches_as_linear(conv, images)
    try:
        yield len(convs)
    finally:
        for conv in convs:
            del conv.forward


def one_placeholder_per_parameter(ep: ExportedProgram, names: list[str]) -> int:
    """Non-strict torch.export lifts a parameter once per name it has (nanoVLM ties its
    decoder's head to the token embedding) and traces every use through the last name; a
    parameter placeholder nothing reads would then get no gradient (the joint graph refuses
    it) or be written into the `.pte` unused. Each tied parameter keeps one placeholder, under
    its `named_parameters` name (`names`), with every use; placeholders of parameters nothing
    reads go (strict export never lifts those). Returns how many placeholders went."""
    from torch.export.graph_signature import InputKind

    signature = ep.graph_signature
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    specs = [s for s in signature.input_specs if s.kind == InputKind.PARAMETER]
    kept: dict[int, Any] = {}  # id of the parameter -> the spec that keeps its placeholder
    for spec in sorted(specs, key=lambda s: s.target not in names):
        kept.setdefault(id(ep.state_dict[spec.target]), spec)
    gone = 0
    for spec in specs:
        node, keeper = placeholders[spec.arg.name], kept[id(ep.state_dict[spec.target])]
        if keeper is not spec:
            node.replace_all_uses_with(placeholders[keeper.arg.name])
    for spec in specs:
        node = placeholders[spec.arg.name]
        if not node.users:
            ep.graph.erase_node(node)
            signature.input_specs.remove(spec)
            del ep.state_dict[spec.target]
            gone += 1
    return gone


def rewrite_empty_permuted(gm: torch.fx.GraphModule) -> int:
    """`aten.empty_permuted` (SiLU's backward) has no ExecuTorch kernel: rebuild it as
    `empty` in physical order, then a `permute` back to the logical order (skipped when
    the layout is the identity). Returns how many nodes were rewritten."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.target != torch.ops.aten.empty_permuted.default:
            continue
        size, layout = node.args[0], list(node.args[1])
        with gm.graph.inserting_before(node):
            physical = [size[i] for i in layout]
            new = gm.graph.call_function(torch.ops.aten.empty.memory_format, (physical,), dict(node.kwargs))
            if layout != sorted(layout):
                inverse = [layout.index(i) for i in range(len(layout))]
                new = gm.graph.call_function(torch.ops.aten.permute.default, (new, inverse))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    return count


def _is_transpose(node: Argument) -> bool:  # fx types a permute's dims any Argument: they are a list
    return (isinstance(node, torch.fx.Node) and node.target == torch.ops.aten.permute.default
            and list(node.args[1]) == [1, 0])  # type: ignore[arg-type]


def use_linear(gm: torch.fx.GraphModule) -> int:
    """Drops the weight-sized transposed copies the joint graph makes for every linear layer.

    The default decomposition writes `y = x @ W^T` as `mm(x, permute(W))`, its input
    gradient as `mm(g, permute(permute(W)))` and its weight gradient as
    `permute(mm(permute(x), g))`; on ExecuTorch each permute is a copy (permute_copy), of
    the weight every step, and the forward's copy stays alive until the backward. Rewritten:
    `linear(x, W[, b])` (the runtime's linear.out takes W as stored), `mm(g, W)` and
    `mm(permute(g), x)` (an activation-sized copy instead of a weight-sized one).
    Returns how many nodes were rewritten. `aten.linear` must then be preserved by to_edge.
    """
    graph, count = gm.graph, 0
    new_args: tuple[Callable[..., Any], tuple[Any, ...]]  # a replacement node's (operator, arguments)
    for node in list(graph.nodes):
        target = node.target
        if target == torch.ops.aten.addmm.default and _is_transpose(node.args[2]):
            if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
                continue
            bias, x, wt = node.args[:3]
            if getattr(bias.meta.get("val"), "dim", lambda: 0)() != 1:
                continue  # linear's bias is one row; a full-matrix addmm stays as is
            new_args = (torch.ops.aten.linear.default, (x, wt.args[0], bias))
        elif target == torch.ops.aten.mm.default and _is_transpose(node.args[1]):
            new_args = (torch.ops.aten.linear.default, (node.args[0], node.args[1].args[0]))
        elif _is_transpose(node) and _is_transpose(node.args[0]):
            node.replace_all_uses_with(node.args[0].args[0])
            graph.erase_node(node)
            count += 1
            continue
        elif (_is_transpose(node) and node.args[0].target == torch.ops.aten.mm.default
              and _is_transpose(node.args[0].args[0]) and len(node.args[0].users) == 1):
            xt, g = node.args[0].args  # (x^T g)^T = g^T x
            with graph.inserting_before(node):
                gt = graph.call_function(torch.ops.aten.permute.default, (g, [1, 0]))
                gt.meta = {"val": g.meta["val"].t()} if "val" in g.meta else {}
            new_args = (torch.ops.aten.mm.default, (gt, xt.args[0]))
        else:
            continue
        with graph.inserting_before(node):
            new = graph.call_function(*new_args)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    graph.eliminate_dead_code()
    return count


_MATMULS = (torch.ops.aten.linear.default, torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.addmm.default)


def bf16_matmuls_in_fp32(gm: torch.fx.GraphModule) -> int:
    """Each bf16 matmul becomes `bf16(fp32(a) @ fp32(b))`: the rounding of eager's bf16 GEMM
    (bf16 operands, fp32 accumulation, a bf16 result), computed by XNNPACK's fp32 kernel.
    XNNPACK takes no bf16 matmul, and the pip runtime's own bf16 kernel is ~20x slower than its
    fp32 one (a 1x96x576 @ 576x1536 linear: 369 ms against 17 ms; eager's bf16 1.25 ms).
    The casts are exact (bf16 -> fp32) or eager's own rounding (the result). Returns the count."""
    graph, count = gm.graph, 0

    def cast(arg: torch.fx.Node, dtype: torch.dtype, before: torch.fx.Node) -> torch.fx.Node:
        with graph.inserting_before(before):
            new: torch.fx.Node = graph.call_function(torch.ops.aten._to_copy.default, (arg,), {"dtype": dtype})
        new.meta = {"val": arg.meta["val"].to(dtype), "custom": before.meta.get("custom", {})}  # + its group
        return new

    for node in list(graph.nodes):
        val = node.meta.get("val")
        if node.target not in _MATMULS or getattr(val, "dtype", None) != torch.bfloat16:
            continue
        args = tuple(cast(a, torch.float32, node) if isinstance(a, torch.fx.Node) else a for a in node.args)
        with graph.inserting_before(node):
            wide = graph.call_function(node.target, args, dict(node.kwargs))
        wide.meta = {**node.meta, "val": val.to(torch.float32)}
        with graph.inserting_after(wide):
            narrow = graph.call_function(torch.ops.aten._to_copy.default, (wide,), {"dtype": torch.bfloat16})
        narrow.meta = dict(node.meta)
        node.replace_all_uses_with(narrow)
        graph.erase_node(node)
        count += 1
    return count


def _node(graph: torch.fx.Graph, meta: dict[str, Any], target: Callable[..., Any], *args: Argument) -> torch.fx.Node:
    """A new `target(*args)` node carrying (a copy of) `meta`."""
    new = graph.call_function(target, args)
    new.meta = dict(meta)
    return new


def _scalar_forms() -> dict[torch._ops.OpOverload, torch._ops.OpOverload]:
    aten = torch.ops.aten
    return {aten.mul.Scalar: aten.mul.Tensor, aten.add.Scalar: aten.add.Tensor, aten.sub.Scalar: aten.sub.Tensor,
            aten.div.Scalar: aten.div.Tensor}


def scalar_ops_as_tensor_ops(gm: torch.fx.GraphModule) -> int:
    """`mul/add/sub/div.Scalar(x, c)` of an fp32 `x` become their `.Tensor` forms with the same
    scalar, which XNNPACK's partitioner takes (it takes no `.Scalar` op): the same one rounding
    per element. A SiLU's backward, `s * (1 + x * (1 - s))`, otherwise keeps an `add.Scalar` on
    the runtime's kernels, and the rest of its chain, computed from the forward's values alone,
    would run in the forward's delegate call and live until the backward. Returns the count."""
    graph, count, forms = gm.graph, 0, _scalar_forms()
    for node in list(graph.nodes):
        val = node.meta.get("val")
        if (node.target not in forms or getattr(val, "dtype", None) != torch.float32
                or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 2):
            continue
        with graph.inserting_before(node):
            new = _node(graph, node.meta, forms[node.target], *node.args)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    return count


def codes_widened_by_xnnpack(gm: torch.fx.GraphModule) -> int:
    """Each int8 -> fp32 cast (an int8 weight's codes, widened for its dequantisation) up to
    XNNPACK_WEIGHT_LIMIT_BYTES becomes a dequantisation with scale 1 and zero point 0, the same
    values, which XNNPACK runs as its multithreaded convert (its partitioner takes no cast).
    On the runtime's single-threaded cast, nanoVLM-222M QLoRA's codes (384M elements a step)
    took most of its casts' 0.75 s a step. Returns the count."""
    from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers quantized_decomposed)

    graph, count = gm.graph, 0
    for node in list(graph.nodes):
        if cast_dtypes(node) != (torch.int8, torch.float32) or _over_elementwise_limit(node.meta["val"]):
            continue
        with graph.inserting_before(node):
            new = _node(graph, node.meta, torch.ops.quantized_decomposed.dequantize_per_tensor.default,
                        node.args[0], 1.0, 0, -128, 127, torch.int8)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    return count


def tanh_gelu_as_elementwise(gm: torch.fx.GraphModule) -> int:
    """Each tanh-approximated GELU becomes eager's formula for it,
    `x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`, as mul/add/tanh nodes XNNPACK
    runs. XNNPACK's own GELU is the erf one, and the runtime's tanh GELU takes 68 ms on
    1x1024x3072 where eager's takes 4.2 ms (these ops in XNNPACK: 12 ms, within 1e-6).
    Returns the count."""
    graph, count = gm.graph, 0
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.target != aten.gelu.default or node.kwargs.get("approximate", "none") != "tanh":
            continue
        x = node.args[0]
        op = functools.partial(_node, graph, node.meta)  # every part: x's shape
        with graph.inserting_before(node):
            cube = op(aten.mul.Tensor, op(aten.mul.Tensor, x, x), x)
            inner = op(aten.mul.Tensor, op(aten.add.Tensor, x, op(aten.mul.Tensor, cube, 0.044715)),
                       math.sqrt(2 / math.pi))
            out = op(aten.mul.Tensor, op(aten.mul.Tensor, x, 0.5), op(aten.add.Tensor, op(aten.tanh.default, inner), 1))
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        count += 1
    return count


def _apply_rewrites(ep: ExportedProgram, delegate: str | None, bf16: str) -> dict[str, int]:
    """The joint graph's rewrites; returns how many nodes each one changed. `bf16`: one of
    exporters.manifest.BF16_MODES."""
    gm = ep.graph_module
    counts = {"empty_permuted": rewrite_empty_permuted(gm), "use_linear": use_linear(gm)}
    if delegate == "xnnpack":
        counts["bf16_matmuls_in_fp32"] = bf16_matmuls_in_fp32(gm)
        counts["bf16_held_in_fp32"] = bf16_held_in_fp32(gm, _over_elementwise_limit, round_values=bf16 == "rounded")
        counts["large_frozen_weights_in_fp32"] = large_frozen_weights_in_fp32(ep, _over_elementwise_limit)
        if counts["bf16_held_in_fp32"]:  # the fp32 forms it shares across the step (fp32 programs as they were)
            counts["weight_values_at_each_use"] = weight_values_at_each_use(gm, weight_names(ep.graph_signature))
        counts["codes_widened_by_xnnpack"] = codes_widened_by_xnnpack(gm)
        counts["tanh_gelu_as_elementwise"] = tanh_gelu_as_elementwise(gm)
        counts["scalar_ops_as_tensor_ops"] = scalar_ops_as_tensor_ops(gm)
    if any(counts.values()):
        gm.graph.lint()
        gm.recompile()
    return counts


def lowering_record(partitioner: str | None, rewrites: dict[str, int], update: str, bf16: str) -> dict[str, Any]:
    """The exact lowering, as the manifest and every run record it. `partitioner`: how the
    XNNPACK partitions were made, None without the delegate; `bf16`: how bf16 values were
    computed (exporters.manifest.BF16_MODES)."""
    return {
        "delegate": "xnnpack" if partitioner else "none",
        "kernels": (f"XNNPACK for linear/mm/bmm/permute (weights as inputs, packed each call; a weight over "
                    f"{XNNPACK_WEIGHT_LIMIT_BYTES >> 20} MiB on the runtime's kernel) and for fp32 "
                    f"mul/add/sub/div/neg/tanh/sigmoid/square up to that size, tanh GELU and bf16 rounding "
                    f"written in them (partitioned {partitioner}); "
                    if partitioner else "")
                   + "the runtime's registered CPU kernels for the rest",
        "matmuls": "aten.linear on stored weights, weight gradients as mm (no weight transposes)"
                   + ("; patch convolution as patches @ weight" if rewrites.get("patch_conv_as_linear") else "")
                   + ("; bf16 matmuls as bf16(fp32(a) @ fp32(b)) in XNNPACK's fp32 kernel (eager's bf16 "
                      "GEMM rounding; the runtime's bf16 kernel is ~20x slower)"
                      if rewrites.get("bf16_matmuls_in_fp32") else "")
                   + ("" if not rewrites.get("bf16_held_in_fp32") else
                      "; bf16 values held in fp32 and rounded to bf16 in fp32 arithmetic wherever eager's "
                      "bf16 kernels round (casts, arithmetic, int8 dequantisation), bit for bit the casts'"
                      if bf16 == "rounded" else
                      "; bf16 values computed in fp32 and never rounded (bf16 'fp32': not eager's values; "
                      "stored bf16 weights and int8 codes widened exactly)"),
        "weights": "inside the .pte (constant segment), updated in place by the runtime",
        "gradients": "program outputs in the static memory plan",
        "update": update,
        "memory_planning": "ExecuTorch MemoryPlanningPass (greedy algorithm suite)",
        "rewrites": rewrites,
    }


def _check_delegate(delegate: str | None) -> None:
    if delegate not in (None, "xnnpack"):
        raise ValueError(f"unknown ExecuTorch delegate {delegate!r}; use 'xnnpack' or none")


def _decompositions_keeping_linear() -> dict[torch._ops.OperatorBase, Callable[..., Any]]:
    """to_edge's own decomposition table (executorch 1.5.1), less linear's."""
    from executorch.exir.tracer import _default_decomposition_table

    table: dict[torch._ops.OperatorBase, Callable[..., Any]] = _default_decomposition_table()
    del table[torch.ops.aten.linear.default]
    return table


def _already_decomposed(ep: ExportedProgram) -> ExportedProgram:
    """The program is core ATen already (the joint graph by `_export_forward_backward`, the
    forward-only one by `lower_forward`), so to_edge's own `run_decompositions` would retrace
    the whole graph to change nothing (minutes and a copy of the graph at nanoVLM-222M size)
    or decompose a linear XNNPACK refused. Skip it for this program."""
    ep.run_decompositions = lambda *args, **kwargs: ep
    return ep


def _edge_config() -> Any:  # executorch's EdgeCompileConfig
    """`aten.linear` (use_linear) stays linear: the runtime's kernel and XNNPACK take it as is."""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_check_ir_validity=False, preserve_ops=[torch.ops.aten.linear.default])


# XNNPACK packs each runtime-input weight into its workspace before the GEMM, and the workspace
# keeps the size of the largest it ever packed: nanoVLM-222M's lm_head (49,152 x 576 fp32) alone
# adds 112 MiB of RSS (one linear, 1x16x576 input: XNNPACK 30.5 ms and +112 MiB, the runtime's
# kernel 48.5 ms and +5 MiB). Matmuls whose weight is larger than this run on the runtime's kernel.
XNNPACK_WEIGHT_LIMIT_BYTES = 16 << 20


def _narrowed(config: Any, accepts: Callable[[Any, torch.fx.Node], bool]) -> Any:
    """`config` (a partitioner config of XNNPACK's) that also requires `accepts(config, node)`."""

    class Narrowed(config):  # type: ignore[misc]  # XNNPACK's config classes are upstream's, untyped
        def check_constraints(self, node: torch.fx.Node, ep: ExportedProgram) -> bool:
            return accepts(self, node) and super().check_constraints(node, ep)

    Narrowed.__name__ = config.__name__
    return Narrowed


def _within_weight_limit(config: Any, node: torch.fx.Node) -> bool:
    """A GEMM whose weight operand is at most XNNPACK_WEIGHT_LIMIT_BYTES."""
    from executorch.backends.xnnpack.utils.utils import get_input_node

    weight = get_input_node(node, config.weight_idx).meta.get("val")
    return weight is None or weight.numel() * weight.element_size() <= XNNPACK_WEIGHT_LIMIT_BYTES


def _fp32_within_weight_limit(config: Any, node: torch.fx.Node) -> bool:
    """An elementwise node over fp32 tensors of at most XNNPACK_WEIGHT_LIMIT_BYTES each
    (XNNPACK keeps a partition's temporaries in its workspace, which keeps the largest size),
    or a rounding marked LARGE_ROUNDING; never a bf16 weight's update (et_methods.IN_ORDER)."""
    if node.meta.get("custom", {}).get(IN_ORDER):
        return False
    values = [node.meta.get("val"), *(i.meta.get("val") for i in node.all_input_nodes)]
    return all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 and (
        not _over_elementwise_limit(v) or node.meta.get("custom", {}).get(LARGE_ROUNDING)) for v in values)


def _over_elementwise_limit(val: torch.Tensor) -> bool:
    """An fp32 form of `val` (its elements, 4 bytes each) over XNNPACK_WEIGHT_LIMIT_BYTES."""
    return val.numel() * 4 > XNNPACK_WEIGHT_LIMIT_BYTES


def _xnnpack_partitioner(dynamic_weights: bool = True, fast: bool = True) -> Any:
    """XNNPACK for the matmuls (linear, mm, bmm; weights up to XNNPACK_WEIGHT_LIMIT_BYTES) and
    fp32 elementwise mul/add/sub/div/neg/tanh/sigmoid/square on tensors up to that size (the
    runtime's kernels run one single-threaded pass each; its sigmoid took 0.42 s of nanoVLM-222M
    BitFit's 2.4 s step) and the int8 codes' widening (`codes_widened_by_xnnpack`), every
    weight a runtime input (`force_non_static_weights_for_f32_linear`): XNNPACK would otherwise
    bake a GEMM's weight into the delegate as a constant, and a trainable weight baked in
    silently stops training (it trained to NaN with the patch convolution inside). `fast`:
    partitioned in linear time (exporters.xnnpack_lowering), else by ExecuTorch's own
    XnnpackPartitioner. `dynamic_weights=False`: tests only."""
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig, MMConfig
    from executorch.backends.xnnpack.partition.config.generic_node_configs import (
        AddConfig,
        BMMConfig,
        DeQuantizedPerTensorConfig,
        DivConfig,
        MulConfig,
        NegConfig,
        PermuteConfig,
        PowConfig,
        SigmoidConfig,
        SubConfig,
        TanhConfig,
    )
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from exporters.xnnpack_lowering import level_partitioner

    make = level_partitioner if fast else (lambda configs, **kwargs: XnnpackPartitioner(configs=configs, **kwargs))
    return make([*(_narrowed(c, _within_weight_limit) for c in (LinearConfig, MMConfig)), BMMConfig, PermuteConfig,
                 *(_narrowed(c, _fp32_within_weight_limit) for c in (
                     MulConfig, AddConfig, SubConfig, DivConfig, NegConfig, TanhConfig, SigmoidConfig, PowConfig)),
                 DeQuantizedPerTensorConfig],
                force_non_static_weights_for_f32_linear=dynamic_weights)


def _lower_to_xnnpack(ep: ExportedProgram, config: Any) -> tuple[Any, str]:
    """`to_edge_transform_and_lower` with XNNPACK; edgebench's linear-time lowering where the
    installed executorch is the one it was written for, else ExecuTorch's own (with a warning).
    Returns the edge program and which partitioner made it."""
    from executorch.exir import to_edge_transform_and_lower

    from exporters.xnnpack_lowering import WRITTEN_FOR, fast_lowering_problem, fast_xnnpack_lowering

    problem = fast_lowering_problem()
    if problem:
        warnings.warn(
            f"{problem}: lowering with ExecuTorch's own XNNPACK partitioner instead (slower, more "
            f"memory: minutes at nanoVLM-222M size); pin executorch=={WRITTEN_FOR} for the fast one",
            stacklevel=2,
        )
    with contextlib.nullcontext() if problem else fast_xnnpack_lowering():
        edge = to_edge_transform_and_lower(ep, partitioner=[_xnnpack_partitioner(fast=not problem)],
                                           compile_config=config)
    return edge, ("by ExecuTorch's own XnnpackPartitioner (" + problem + ")" if problem
                  else "by level in one pass, exporters/xnnpack_lowering.py")


def _without_stack_traces() -> AbstractContextManager[None]:
    """While torch traces the program: no Python stack trace captured for each node
    (`torch.fx.config.do_not_emit_stack_traces`). No `.pte` carries them (the same bytes,
    tests/test_export_executorch.py), and capturing one per node, then writing them into every
    regenerated graph module's code, took a quarter of nanoVLM-222M SGD's joint graph (61-67 s
    against 47-49 s, alternating in one process). Process-wide: the export runs in a process of its own."""
    import torch.fx.config

    from exporters.upstream import replaced

    return replaced(torch.fx.config, do_not_emit_stack_traces=True)


@contextlib.contextmanager
def _executorch_stages_patched() -> Iterator[None]:
    """to_edge and to_executorch without ExecuTorch's idle re-traces (exporters.idle_passes),
    repeated signature look-ups (exporters.signature_lookups), delegates run only for their
    outputs' shapes (exporters.recorded_delegate_outputs), graph code generated at every
    change (exporters.graph_code_on_demand), look-ups worked out per use (exporters.lookups_once)
    and a deep copy of the program to serialise it (exporters.serialise_in_place): the same
    program, sooner. Off,
    ExecuTorch's stages as they are, with any release but the one they were read for."""
    from exporters.xnnpack_lowering import WRITTEN_FOR, installed_executorch

    if installed_executorch() != WRITTEN_FOR:
        yield
        return
    with skipping_idle_passes(), signature_mappings_once_per_phase(), delegate_outputs_as_recorded(), \
            graph_code_on_demand(), lookups_once(), \
            serialised_in_place():
        yield


class DelegateRefused(EdgebenchError, RuntimeError):
    """The XNNPACK delegate, asked for by --delegate or the profile's export.xnnpack, lowered this
    method's program so that it would train wrong; the message says to export without it."""


def _check_no_captured_weights(edge_ep: ExportedProgram, trainable: list[str]) -> None:
    """A trainable weight the delegate captured would no longer be a program parameter:
    its updates would be lost. Refuse such a program instead of training wrong."""
    kept = set(edge_ep.graph_signature.parameters)
    lost = [name for name in trainable if name not in kept]
    if lost:
        raise DelegateRefused(
            f"XNNPACK delegation captured trainable parameter(s) {lost[:5]}; export without "
            "the delegate (--delegate none, or the profile's export.xnnpack: false) or freeze them"
        )


# The in-place writes of an update into a weight (exporters.et_methods.write_update): the whole
# weight (copy_) or a block of its rows (index_put_).
_IN_PLACE_WRITE = re.compile(r"\b(copy_|index_put_)\.")


def updates_before_reads(graph: torch.fx.Graph) -> list[str]:
    """Weights an in-place update (`copy_` or `index_put_` into a placeholder, exporters.et_methods.write_update)
    overwrites before a later node still reads them. Partitioning moves reads into delegate
    calls placed where the partition's last input is ready: one placed after a weight's update
    would read the updated weight. A weight updated in parts (et_methods._summed_parts) is read
    between its updates by the later update's own nodes (marked et_methods.IN_ORDER) only.
    Empty when every read comes first."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    updates: dict[torch.fx.Node, list[int]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and _IN_PLACE_WRITE.search(str(node.target)) and node.args[0].op == "placeholder":
            updates.setdefault(node.args[0], []).append(order[node])
    late = []
    for weight, at in updates.items():
        first, last = min(at), max(at)
        if any(order[user] > last or (order[user] > first and not user.meta.get("custom", {}).get(IN_ORDER))
               for user in weight.users if user.op != "output" and order[user] not in at):
            late.append(weight.name)
    return late


def _check_updates_follow_reads(edge_ep: ExportedProgram) -> None:
    late = updates_before_reads(edge_ep.graph)
    if late:
        raise DelegateRefused(
            f"XNNPACK partitioning moved reads of {late[:5]} after their in-program update; export "
            "without the delegate (--delegate none, or the profile's export.xnnpack: false)")


def planned_memory_bytes(program: Any, method: str = "forward") -> int:  # executorch's Program
    """Bytes of the static memory plan of `method` (the arena the runtime allocates for
    activations, gradients and temporaries). Buffer 0 is reserved for constants."""
    for plan in program.execution_plan:
        if plan.name == method:
            return int(sum(plan.non_const_buffer_sizes[1:]))
    raise KeyError(f"no execution plan named {method!r}")


def planned_memory_bytes_of_file(pte: bytes, method: str = "forward") -> int:
    """The same figure, read back from a serialised `.pte` (what the runtime loads)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    return planned_memory_bytes(deserialize_pte_binary(pte).program, method)


def lower_training_step(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    delegate: str | None = None,
    bf16: str = "rounded",
    on_stage: Callable[[str], None] = lambda stage: None,
    joint_rewrite: Callable[[ExportedProgram], None] | None = None,
) -> LoweredProgram:
    """Lowers `model(*example_inputs) -> scalar loss` with its backward pass.

    Trainable = parameters with requires_grad; shapes are fixed to the example's.
    `delegate`: None (portable kernels) or "xnnpack"; `bf16`: how XNNPACK programs compute
    bf16 values (exporters.manifest.BF16_MODES). `joint_rewrite`: a method's change of
    the joint graph (exporters.et_methods, e.g. recomputation), before the rewrites here.
    torch.export traces non-strict (the model's Python run on fake tensors): strict export
    (dynamo) drops autocast's casts around frozen bf16 weights, and at nanoVLM-222M size took
    25 s against 5 s for LoRA-ckpt's model (13.7 against 3.8 s for SGD's), for the same operators.
    """
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from torch.export.experimental import _export_forward_backward

    _check_delegate(delegate)
    named = dict(model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    frozen = [n for n, p in named.items() if not p.requires_grad]
    if not trainable:
        raise ValueError("no trainable parameter: nothing to differentiate")

    model.eval()  # no dropout in a program we compare against eager
    on_stage("torch.export")
    with _without_stack_traces():
        with patch_convs_as_linear(model) as patch_convs:
            ep = torch.export.export(model, example_inputs, strict=False)
        untied = one_placeholder_per_parameter(ep, list(named))
        trainable = [n for n in trainable if n in ep.state_dict]  # what the loss reads
        frozen = [n for n in frozen if n in ep.state_dict]
        on_stage("joint graph")
        ep = _export_forward_backward(ep)
    on_stage("rewrites")
    if joint_rewrite is not None:
        joint_rewrite(ep)
    rewrites = {"patch_conv_as_linear": patch_convs, "parameter_placeholders_dropped": untied,
                **_apply_rewrites(ep, delegate, bf16)}
    on_stage("to_edge")
    config = _edge_config()
    partitioner = None
    with _executorch_stages_patched():
        if delegate == "xnnpack":
            edge, partitioner = _lower_to_xnnpack(_already_decomposed(ep), config)
            _check_no_captured_weights(edge.exported_program(), trainable)
            _check_updates_follow_reads(edge.exported_program())
            rewrites["xnnpack_partitions"] = sum(
                1 for n in edge.exported_program().graph.nodes if n.op == "call_function"
                and getattr(n.target, "__name__", "") == "executorch_call_delegate")
        else:
            edge = to_edge(_already_decomposed(ep), compile_config=config)
        del ep
        on_stage("to_executorch")
        et = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=memory_planning_pass()))
        del edge
    arena = planned_memory_bytes(et.executorch_program)
    return LoweredProgram(
        program=et,
        planned_memory_bytes=arena,
        planned_memory_parts=planned_parts(et.exported_program(), arena),
        trainable_parameters=trainable,
        frozen_parameters=frozen,
        delegated=delegate is not None,
        lowering=lowering_record(partitioner, rewrites, "outside the program, over its parameters in place", bf16),
    )


def lower_forward(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    delegate: str | None = None,
    bf16: str = "rounded",
    on_stage: Callable[[str], None] = lambda stage: None,
) -> LoweredProgram:
    """Lowers a forward-only loss program whose trainable parameters are extra inputs
    (after the batch, in `named_parameters` order), so a zeroth-order method (MeZO) can
    perturb and update them in place between calls without any backward pass.
    `delegate` "xnnpack": its matmuls run in XNNPACK, weights passed in as the training
    program's are (a trained weight is a runtime input, so no delegate can keep a stale copy);
    `bf16` as for lower_training_step."""
    from executorch.exir import ExecutorchBackendConfig, to_edge

    _check_delegate(delegate)
    named = dict(model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    frozen = [n for n, p in named.items() if not p.requires_grad]
    model.eval()

    class LossOfParameters(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args: torch.Tensor) -> Any:
            batch, values = args[: len(example_inputs)], args[len(example_inputs):]
            params = dict(zip(trainable, values))
            return torch.func.functional_call(self.inner, params, batch, strict=False)

    on_stage("torch.export")
    with _without_stack_traces():
        with torch.no_grad(), patch_convs_as_linear(model) as patch_convs:
            values = tuple(named[n].detach() for n in trainable)
            ep = torch.export.export(LossOfParameters(), example_inputs + values, strict=False)
        untied = one_placeholder_per_parameter(ep, [f"inner.{n}" for n in named])
        frozen = [n for n in frozen if f"inner.{n}" in ep.state_dict]  # what the loss reads
        # Core ATen, linear kept whole, before the rewrites: they see every matmul (autocast regions
        # of a non-strict export are inlined here), and a linear XNNPACK refuses stays one linear.
        ep = _already_decomposed(ep.run_decompositions(_decompositions_keeping_linear()))
    on_stage("rewrites")
    rewrites = {"patch_conv_as_linear": patch_convs, "parameter_placeholders_dropped": untied,
                **_apply_rewrites(ep, delegate, bf16)}
    on_stage("to_edge")
    partitioner = None
    with _executorch_stages_patched():
        if delegate == "xnnpack":
            edge, partitioner = _lower_to_xnnpack(ep, _edge_config())
        else:
            edge = to_edge(ep, compile_config=_edge_config())
        on_stage("to_executorch")
        # Inputs are used in place (not copied into the arena): the weights stay in Python.
        et = edge.to_executorch(
            ExecutorchBackendConfig(memory_planning_pass=memory_planning_pass(alloc_graph_input=False))
        )
    arena = planned_memory_bytes(et.executorch_program)
    return LoweredProgram(
        program=et,
        planned_memory_bytes=arena,
        planned_memory_parts=planned_parts(et.exported_program(), arena),
        trainable_parameters=trainable,
        frozen_parameters=frozen,
        delegated=partitioner is not None,
        lowering={**lowering_record(partitioner, rewrites, "MeZO outside the program, on the weight inputs", bf16),
                  "weights": "program inputs (trainable_init.pt), frozen ones inside the .pte"},
    )


__all__ = [
    "STAGES",
    "LoweredProgram",
    "lower_forward",
    "lower_training_step",
    "lowering_record",
    "planned_memory_bytes",
    "planned_memory_bytes_of_file",
    "rewrite_empty_permuted",
    "use_linear",
]
