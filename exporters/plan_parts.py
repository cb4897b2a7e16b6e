"""What fills an ExecuTorch program's planned arena at its fullest moment.

The arena (the manifest's `planned_memory_bytes`) is one figure; whether a program can shrink
to a device depends on what it holds. The memory plan gives every planned tensor an offset and
a lifetime (first and last instruction that use it); at the instruction where the bytes alive
together peak, each live tensor is counted under what it is: the trained weights, the
optimizer's state (both kept for the whole program), the batch, values the forward made (at a
peak inside the backward: those it still needs), values of the backward (gradients among
them), and gradients returned as outputs (a joint program's, alive to its end). What the arena
holds beyond the peak's live bytes is the plan's packing. An XNNPACK delegate's temporaries
are its own, outside the plan.
"""

from __future__ import annotations

from typing import Any

import torch

# The parts, in the order a table shows them.
PARTS = ("trained_weights", "optimizer_state", "other_buffers", "batch", "forward_values",
         "backward_values", "gradients_returned")


def _planned(spec: Any) -> bool:
    """A tensor in the arena: placed by the plan in a non-constant buffer, not sharing another's storage."""
    return (spec is not None and getattr(spec, "mem_id", None) is not None and spec.mem_id >= 1
            and spec.mem_offset is not None and getattr(spec, "storage_base", None) is None
            and spec.lifetime[0] is not None)


def _specs(node: torch.fx.Node) -> list[Any]:
    """The planned tensors `node` makes; none for a view (ExecuTorch's memory.view shares its base's)."""
    from executorch.exir import memory

    if node.target is memory.view:
        return []
    spec = node.meta.get("spec")
    if isinstance(spec, (list, tuple)):
        return [s for s in spec if _planned(s)]
    return [spec] if _planned(spec) else []


def _output_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    args = graph.output_node().args[0]
    return [a for a in (args if isinstance(args, (list, tuple)) else [args]) if isinstance(a, torch.fx.Node)]


def planned_parts(exported: Any, arena_bytes: int) -> dict[str, Any]:
    """The live bytes of each part at the plan's peak instruction, for a planned ExportedProgram
    (`ExecutorchProgramManager.exported_program()`): `{<part>_bytes, live_at_peak_bytes,
    packing_bytes (arena less the live bytes), peak_instruction, instructions, arena_bytes}`."""
    graph, sig = exported.graph_module.graph, exported.graph_signature
    parameters, buffers = sig.inputs_to_parameters, sig.inputs_to_buffers
    outputs = _output_nodes(graph)
    output_specs = {id(s) for node in outputs[1:] for s in _specs(node)}
    nodes = list(graph.nodes)
    loss_at = nodes.index(outputs[0]) if outputs else len(nodes)
    tensors: dict[int, tuple[Any, str]] = {}  # id(spec) -> (spec, part), the first node holding it
    for at, node in enumerate(nodes):
        for spec in _specs(node):
            if id(spec) in tensors:
                continue
            if node.op == "placeholder":
                if node.name in parameters:
                    part = "trained_weights"
                elif node.name in buffers:
                    part = "optimizer_state" if buffers[node.name].startswith("optimizer.") else "other_buffers"
                else:
                    part = "batch"
            elif at <= loss_at:
                part = "forward_values"
            else:
                part = "gradients_returned" if id(spec) in output_specs else "backward_values"
            tensors[id(spec)] = (spec, part)
    steps = len(nodes)
    change = [0] * (steps + 1)  # bytes alive, as differences from one instruction to the next
    for spec, _ in tensors.values():
        first, last = spec.lifetime
        change[first] += spec.allocated_memory
        change[min(last, steps - 1) + 1] -= spec.allocated_memory
    alive, peak, peak_at = 0, -1, 0
    for at in range(steps):
        alive += change[at]
        if alive > peak:
            peak, peak_at = alive, at
    parts = dict.fromkeys(PARTS, 0)
    for spec, part in tensors.values():
        first, last = spec.lifetime
        if first <= peak_at <= last:
            parts[part] += spec.allocated_memory
    return {**{f"{k}_bytes": v for k, v in parts.items()}, "live_at_peak_bytes": max(peak, 0),
            "packing_bytes": arena_bytes - max(peak, 0), "peak_instruction": peak_at,
            "instructions": steps, "loss_instruction": loss_at, "arena_bytes": arena_bytes}
