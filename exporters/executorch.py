"""Lowers one training step (model + loss) to an ExecuTorch `.pte` program.

Path (FIELD-NOTES.md, "ExecuTorch training"): strict torch.export of a module whose
forward returns the scalar loss -> the joint forward-backward graph -> graph rewrites
the runtime needs -> `to_edge` (optionally delegating to XNNPACK) -> `to_executorch`.
Parameters with `requires_grad=False` are frozen: the program returns no gradient for
them and keeps them as constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.export import ExportedProgram

# The pipeline stages, in order, for progress displays.
STAGES = ("torch.export", "joint graph", "rewrites", "to_edge", "to_executorch")


@dataclass
class LoweredProgram:
    """An exported training program, ready to be written to a `.pte` file."""

    buffer: bytes
    planned_memory_bytes: int
    trainable_parameters: list[str]
    frozen_parameters: list[str]
    delegated: bool


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


def split_addmm(gm: torch.fx.GraphModule) -> int:
    """`addmm(bias, x, w)` -> `mm(x, w) + bias`: the portable addmm kernel is slow, and the
    split lets XNNPACK take the matmul (0.90 s -> 0.63 s per step in FIELD-NOTES.md)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.target != torch.ops.aten.addmm.default:
            continue
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            continue  # scaled forms are rare; leave them to the addmm kernel
        bias, x, w = node.args[:3]
        with gm.graph.inserting_before(node):
            mm = gm.graph.call_function(torch.ops.aten.mm.default, (x, w))
            add = gm.graph.call_function(torch.ops.aten.add.Tensor, (mm, bias))
        mm.meta = dict(node.meta)
        add.meta = dict(node.meta)
        node.replace_all_uses_with(add)
        gm.graph.erase_node(node)
        count += 1
    return count


def _apply_rewrites(ep: ExportedProgram) -> None:
    gm = ep.graph_module
    if rewrite_empty_permuted(gm) + split_addmm(gm):
        gm.graph.lint()
        gm.recompile()


def _xnnpack_partitioner(trainable_convs: bool):
    """XNNPACK bakes a GEMM's weight into the delegate as a constant. Trainable conv
    weights therefore must stay out (they trained silently wrong, to NaN, in
    FIELD-NOTES.md); linear layers are `mm` on the joint graph and take weights as inputs."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import ConvolutionConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    configs = [c for c in ALL_PARTITIONER_CONFIGS if not (trainable_convs and c is ConvolutionConfig)]
    return XnnpackPartitioner(configs=configs)


def _check_no_captured_weights(edge_ep: ExportedProgram, trainable: list[str]) -> None:
    """A trainable weight the delegate captured would no longer be a program parameter:
    its updates would be lost. Refuse such a program instead of training wrong."""
    kept = set(edge_ep.graph_signature.parameters)
    lost = [name for name in trainable if name not in kept]
    if lost:
        raise RuntimeError(
            f"XNNPACK delegation captured trainable parameter(s) {lost[:5]}; export without "
            "the delegate (profile export.delegate: none) or freeze them"
        )


def planned_memory_bytes(program, method: str = "forward") -> int:
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
    on_stage: Callable[[str], None] = lambda stage: None,
) -> LoweredProgram:
    """Lowers `model(*example_inputs) -> scalar loss` with its backward pass.

    Trainable = parameters with requires_grad; shapes are fixed to the example's.
    `delegate`: None (portable kernels) or "xnnpack".
    """
    from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower
    from torch.export.experimental import _export_forward_backward

    if delegate not in (None, "xnnpack"):
        raise ValueError(f"unknown ExecuTorch delegate {delegate!r}; use 'xnnpack' or none")
    named = dict(model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    frozen = [n for n, p in named.items() if not p.requires_grad]
    if not trainable:
        raise ValueError("no trainable parameter: nothing to differentiate")

    model.eval()  # no dropout in a program we compare against eager
    on_stage("torch.export")
    ep = torch.export.export(model, example_inputs, strict=True)
    on_stage("joint graph")
    ep = _export_forward_backward(ep)
    on_stage("rewrites")
    _apply_rewrites(ep)
    on_stage("to_edge")
    config = EdgeCompileConfig(_check_ir_validity=False)
    if delegate == "xnnpack":
        convs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
        trainable_convs = any(named[f"{c}.weight"].requires_grad for c in convs)
        edge = to_edge_transform_and_lower(
            ep, partitioner=[_xnnpack_partitioner(trainable_convs)], compile_config=config
        )
        _check_no_captured_weights(edge.exported_program(), trainable)
    else:
        edge = to_edge(ep, compile_config=config)
    on_stage("to_executorch")
    et = edge.to_executorch()
    return LoweredProgram(
        buffer=et.buffer,
        planned_memory_bytes=planned_memory_bytes(et.executorch_program),
        trainable_parameters=trainable,
        frozen_parameters=frozen,
        delegated=delegate is not None,
    )


def lower_forward(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> LoweredProgram:
    """Lowers a forward-only loss program whose trainable parameters are extra inputs
    (after the batch, in `named_parameters` order), so a zeroth-order method (MeZO) can
    perturb and update them in place between calls without any backward pass."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    named = dict(model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    frozen = [n for n, p in named.items() if not p.requires_grad]
    model.eval()

    class LossOfParameters(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args):
            batch, values = args[: len(example_inputs)], args[len(example_inputs):]
            params = dict(zip(trainable, values))
            return torch.func.functional_call(self.inner, params, batch, strict=False)

    on_stage("torch.export")
    with torch.no_grad():
        values = tuple(named[n].detach() for n in trainable)
        ep = torch.export.export(LossOfParameters(), example_inputs + values, strict=True)
    on_stage("rewrites")
    _apply_rewrites(ep)
    on_stage("to_edge")
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    on_stage("to_executorch")
    # Inputs are used in place (not copied into the arena): the weights stay in Python.
    et = edge.to_executorch(
        ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False))
    )
    return LoweredProgram(
        buffer=et.buffer,
        planned_memory_bytes=planned_memory_bytes(et.executorch_program),
        trainable_parameters=trainable,
        frozen_parameters=frozen,
        delegated=False,
    )


__all__ = [
    "STAGES",
    "LoweredProgram",
    "lower_forward",
    "lower_training_step",
    "planned_memory_bytes",
    "planned_memory_bytes_of_file",
    "rewrite_empty_permuted",
    "split_addmm",
]
