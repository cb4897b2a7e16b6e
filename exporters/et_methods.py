"""Method knobs that change what is exported to ExecuTorch (host side).

The program a method needs differs from the plain one only in its example batch (accumN:
one micro-batch; the backend calls the program N times per step) — the optimizers that run
between calls live in edgebench.backends.et_optimizers. `lowering(method)` is what the
manifest records for these knobs.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from edgebench.backends import et_optimizers


def example_batch(method: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """The batch the program is traced with: accumN programs take one micro-batch of it."""
    return et_optimizers.first_micro_batch(batch, method.accumulation)


def lowering(method: Any) -> dict[str, str]:
    """{knob: how it was lowered} for the method's non-default knobs handled outside the graph."""
    return et_optimizers.lowering(method)


_BLOCK = re.compile(r"^(.*blocks\.\d+)\.")


def _block_labels(ep, forward: list) -> dict:
    """{forward node: index of its transformer block}. The joint graph is retraced and keeps
    no module paths, so a node belongs to the latest block (in forward order) whose
    parameters it depends on: block K's inside values depend on K's weights, its input
    (block K-1's output) only on earlier ones."""
    fqn = ep.graph_signature.inputs_to_parameters
    order: dict[str, int] = {}
    label: dict = {}
    for node in forward:
        if node.op == "placeholder":
            match = _BLOCK.match(fqn.get(node.name, ""))
            if match:
                label[node] = match.group(1)
            continue
        names = [label[a] for a in node.all_input_nodes if a in label]
        for name in names:
            order.setdefault(name, len(order))
        if names:
            label[node] = max(names, key=order.__getitem__)
    return {n: order[b] for n, b in label.items() if n.op == "call_function"}


def recompute_blocks(ep) -> dict[str, int]:
    """Activation checkpointing inside the joint graph: backward recomputes each transformer
    block's forward from the block's input instead of reading values kept since the forward.

    torch.utils.checkpoint does not survive strict torch.export (its
    tag_activation_checkpoint op fails with KeyError '_checkpoint_context_fn' in torch 2.13),
    and the joint graph is one program with no partitioner, so the recomputation is written
    into the graph: every forward value of a block that the backward reads (other than the
    block's outputs, which are the checkpoints) is replaced by a copy of the forward nodes
    that compute it, placed right before the block's first backward use. The originals then
    die inside the forward, and the memory planner reuses their space.
    Returns counts: blocks, recomputed nodes.
    """
    gm = ep.graph_module
    graph = gm.graph
    nodes = list(graph.nodes)
    loss = nodes[-1].args[0][0]
    forward_nodes = nodes[: nodes.index(loss) + 1]
    forward = set(forward_nodes)
    block = _block_labels(ep, forward_nodes)
    # A block's outputs: its nodes read by forward nodes outside it (the checkpoints kept).
    kept = {n for n, b in block.items()
            if n is loss or any(u in forward and block.get(u) != b for u in n.users)}
    copies: dict = {}
    done_blocks: set[int] = set()

    def copy(node, before):
        if node not in block or node in kept:
            return node
        if node not in copies:
            args = torch.fx.node.map_arg(node.args, lambda a: copy(a, before))
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: copy(a, before))
            with graph.inserting_before(before):
                new = graph.call_function(node.target, args, kwargs)
            new.meta = dict(node.meta)
            copies[node] = new
        return copies[node]

    for node in nodes:
        if node in forward or node.op != "call_function":
            continue
        for arg in [a for a in node.all_input_nodes if a in block and a not in kept]:
            done_blocks.add(block[arg])
            node.replace_input_with(arg, copy(arg, node))
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return {"recomputed_blocks": len(done_blocks), "recomputed_nodes": len(copies)}
