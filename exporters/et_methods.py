"""Method knobs that change what is exported to ExecuTorch (host side).

accumN: the program takes one micro-batch (the backend calls it N times per step); ckpt:
recomputation written into the joint graph; bf16 / frozen bf16 / int8: the eager trainer's
own model changes (autocast, edgebench.methods.int8) traced into the program. Optimizers
that run between program calls live in edgebench.backends.et_optimizers. The manifest
records how each knob was lowered (`JointRewrite.lowering`).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from edgebench.backends import et_optimizers


def example_batch(method: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """The batch the program is traced with: accumN programs take one micro-batch of it."""
    return et_optimizers.first_micro_batch(batch, method.accumulation)


class JointRewrite:
    """The method's change of the joint graph (`lower_training_step(joint_rewrite=...)`),
    and what the manifest records about every knob lowered here or in et_optimizers."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.counts: dict[str, int] = {}

    @property
    def strict(self) -> bool:
        """Strict torch.export drops autocast's casts around the frozen bf16 patch conv
        ("Input type (float) and bias type (c10::BFloat16) should be the same"); the
        non-strict export traces autocast as eager runs it."""
        return self.method.frozen_dtype == "fp32"

    def prepare_model(self, model) -> None:
        """The eager trainer's model-side knobs, so the program computes what eager does:
        frozen weights stored bf16 / frozen linears int8 (edgebench.methods.int8, dequantised
        in the program: its custom backward dequantises again instead of keeping a float copy),
        and the forward (with its backward) under bf16 autocast."""
        from edgebench.methods.subsets import store_frozen

        store_frozen(self.method, model)
        if self.method.precision == "bf16":
            inner = model.forward

            def forward(*args, **kwargs):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return inner(*args, **kwargs)

            model.forward = forward

    def __call__(self, ep) -> None:
        if self.method.frozen_dtype == "int8":
            self.counts.update(recompute_dequantized(ep))
        if self.method.checkpointing:
            self.counts.update(recompute_blocks(ep))

    def lowering(self) -> dict[str, str]:
        out = et_optimizers.lowering(self.method)
        if self.method.checkpointing:
            out["checkpointing"] = (
                "recomputation written into the joint graph (exporters.et_methods.recompute_blocks): "
                "backward reads each transformer block's values from copies of its forward nodes, "
                f"kept values are the blocks' outputs only ({self.counts.get('recomputed_blocks', 0)} blocks, "
                f"{self.counts.get('recomputed_nodes', 0)} nodes recomputed)")
        if self.method.precision == "bf16":
            out["precision"] = ("forward traced under torch.autocast(cpu, bfloat16): the program's "
                                "matmuls run in bf16 with the runtime's bf16 kernels, weights and "
                                "gradients of trainable parameters stay fp32")
        if self.method.frozen_dtype != "fp32":
            out["frozen_dtype"] = (
                "frozen linears as int8 codes + fp32 per-row scales (edgebench.methods.int8), "
                "dequantised in forward and again in backward (exporters.et_methods.recompute_dequantized: "
                f"{self.counts.get('dequantized_recomputed', 0)} nodes), so no float copy stays alive "
                "between them; other frozen weights bf16; all "
                "inside the .pte as constants" if self.method.frozen_dtype == "int8" else
                "frozen weights bf16 constants inside the .pte") + "; non-strict torch.export"
        return out


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

    def recomputable(node) -> bool:
        return node in block and node not in kept

    read = {block[a] for n in nodes if n not in forward and n.op == "call_function"
            for a in n.all_input_nodes if recomputable(a)}
    count = _copy_into_backward(graph, forward, recomputable)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return {"recomputed_blocks": len(read), "recomputed_nodes": count}


def _copy_into_backward(graph, forward: set, recomputable) -> int:
    """Each backward read of a `recomputable` forward node becomes a read of a copy of it
    (and of its recomputable ancestors) made right before that read's first user.
    Returns how many nodes were copied."""
    copies: dict = {}

    def copy(node, before):
        if not recomputable(node):
            return node
        if node not in copies:
            args = torch.fx.node.map_arg(node.args, lambda a: copy(a, before))
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: copy(a, before))
            with graph.inserting_before(before):
                new = graph.call_function(node.target, args, kwargs)
            new.meta = dict(node.meta)
            copies[node] = new
        return copies[node]

    for node in list(graph.nodes):
        if node in forward or node.op != "call_function":
            continue
        for arg in [a for a in node.all_input_nodes if recomputable(a)]:
            node.replace_input_with(arg, copy(arg, node))
    return len(copies)


def recompute_dequantized(ep) -> dict[str, int]:
    """Frozen int8 linears: the backward dequantises the codes again (as eager's Int8Linear
    backward does) instead of reading the float weight kept since the forward.

    Without this the joint graph differentiates the forward's dequantisation and keeps every
    dequantised weight alive until its backward matmul: a bf16 copy of all frozen linears in
    the memory plan. Values computed from buffers alone (int8 codes, scales) are recomputed."""
    gm, graph = ep.graph_module, ep.graph_module.graph
    nodes = list(graph.nodes)
    loss = nodes[-1].args[0][0]
    forward = set(nodes[: nodes.index(loss) + 1])
    buffers = set(ep.graph_signature.inputs_to_buffers)
    derived = {n for n in nodes if n.op == "placeholder" and n.name in buffers}
    for node in nodes:
        if node in forward and node.op == "call_function" and node.all_input_nodes and \
                all(a in derived for a in node.all_input_nodes):
            derived.add(node)
    count = _copy_into_backward(graph, forward, lambda n: n in derived and n.op == "call_function")
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return {"dequantized_recomputed": count}
