"""Method knobs that change what is exported to ExecuTorch (host side).

accumN: the program takes one micro-batch (the backend calls it N times per step) and sums
its gradients itself (`sum_gradients`); ckpt:
recomputation written into the joint graph; bf16 / frozen bf16 / int8: the eager trainer's
own model changes (autocast, edgebench.methods.int8) traced into the program; LOMO and the
fused update: the update written into the program (`write_update`). Optimizers that run
between program calls live in edgebench.backends.et_optimizers. The manifest records how
each knob was lowered (`JointRewrite.lowering`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument

from edgebench.backends import et_optimizers
from edgebench.methods import optim
from edgebench.methods.bf16 import CHUNK
from edgebench.methods.optimizers import optimizer as descriptor
from edgebench.methods.optimizers import run_weight_decay

if TYPE_CHECKING:
    from torch.export import ExportedProgram, ExportGraphSignature
    from torch.fx import Graph, Node


def example_batch(method: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """The batch the program is traced with: accumN programs take one micro-batch of it."""
    return et_optimizers.first_micro_batch(batch, method.accumulation)


def program_knobs(method: Any, weight_decay: float | None) -> dict[str, Any]:
    """The knobs that shape a forward-backward program. An update that runs between program
    calls (sgd, adafactor, adamw-8bit, galore, ...) is not one, nor its weight decay: such
    methods share one program (exporters.pipeline). Accumulation is (the program sums its
    gradients over N calls); an update in the program is, with its weight decay (`write_update`)."""
    knobs = dict(method.knobs())
    if et_optimizers.update_in_program(method):
        knobs["weight_decay"] = run_weight_decay(method.optimizer, weight_decay)
    else:
        knobs.pop("optimizer")
        knobs.pop("fused_update")
    return knobs


class JointRewrite:
    """The method's change of the joint graph (`lower_training_step(joint_rewrite=...)`),
    and what the manifest records about every knob lowered here or in et_optimizers."""

    def __init__(self, method: Any, weight_decay: float | None, update_chunk: int = CHUNK) -> None:
        self.method = method
        self.weight_decay = run_weight_decay(method.optimizer, weight_decay)  # an update in the program's
        self.update_chunk = update_chunk  # elements of a bf16 weight stepped at once (write_update)
        self.counts: dict[str, int] = {}

    def prepare_model(self, model: torch.nn.Module) -> None:
        """The eager trainer's model-side knobs, so the program computes what eager does:
        frozen weights stored bf16 / frozen linears int8 (edgebench.methods.int8, dequantised
        in the program: its custom backward dequantises again instead of keeping a float copy),
        and the forward (with its backward) under bf16 autocast."""
        from edgebench.methods.subsets import store_frozen

        store_frozen(self.method, model)
        if self.method.precision == "bf16":
            inner = model.forward

            def forward(*args: Any, **kwargs: Any) -> Any:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return inner(*args, **kwargs)

            model.forward = forward

    def __call__(self, ep: ExportedProgram) -> None:
        if self.method.frozen_dtype == "int8":
            self.counts.update(recompute_dequantized(ep))
        if self.method.checkpointing:
            self.counts.update(recompute_blocks(ep))
        if et_optimizers.update_in_program(self.method):
            self.counts.update(write_update(ep, self.method.optimizer, self.method.rounding == "stochastic",
                                            self.weight_decay, self.update_chunk))
        if self.method.accumulation > 1:
            self.counts.update(sum_gradients(ep))

    def lowering(self) -> dict[str, str]:
        out = et_optimizers.lowering(self.method)
        if et_optimizers.update_in_program(self.method):
            wd = self.weight_decay
            decay = {"l2": f", L2 weight decay {wd:g} (g += wd * w, baked into the program)",
                     "decoupled": f", decoupled weight decay {wd:g} (w *= 1 - lr * wd)"}[
                descriptor(self.method.optimizer).decay] if wd else ""
            rule = {"lomo": f"LOMO (lomo-optim's fp32 Lomo: p += step * grad, one lr for all parameters{decay})",
                    "sgd": f"SGD (torch's single-tensor step{decay})",
                    "adam": f"Adam (torch's single-tensor step{decay}; moments are program state)",
                    "adamw": f"AdamW (torch's single-tensor step{decay}; moments are program state)",
                    }[self.method.optimizer]
            out["optimizer" if self.method.optimizer == "lomo" else "fused_update"] = (
                f"{rule}, written into the program (exporters.et_methods.write_update): each weight is "
                "updated in place (aten.copy_) right after the backward's last read of it and of its "
                f"gradient ({self.counts.get('updated_in_program', 0)} weights), so the gradient dies there "
                "and the memory planner reuses its space; no clip (as eager's hooks); the per-step "
                f"scalars are the program's last input `hyper` [{et_optimizers.HYPER_SIZE}] "
                "(edgebench.backends.et_optimizers.UpdatingProgram)")
            out["update"] = "inside the program, in place on its weights"
            out["gradients"] = "intermediate values of the program (none returned)"
            out["outputs"] = "loss, the trained weights (manifest trainable_parameters order), optimizer state"
        if self.method.checkpointing:
            out["checkpointing"] = (
                "recomputation written into the joint graph (exporters.et_methods.recompute_blocks): "
                "backward reads each transformer block's values from copies of its forward nodes, "
                f"kept values are the blocks' outputs only ({self.counts.get('recomputed_blocks', 0)} blocks, "
                f"{self.counts.get('recomputed_nodes', 0)} nodes recomputed); with XNNPACK, a block's recomputed "
                "matmuls are partitioned apart from every other node (exporters.xnnpack_lowering.partition_by_level)")
        if self.method.trained_dtype == "bf16":
            out["trained_dtype"] = (
                "trained weights stored bf16 in the program, no fp32 copy; each SGD step computed in fp32 "
                "and rounded into bf16 once, " + (
                    "stochastically (exporters.et_methods.stochastically_rounded, its noise from the "
                    "runtime's aten.rand)" if self.method.rounding == "stochastic" else "to nearest"))
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
                "frozen weights bf16 constants inside the .pte")
        return out


_BLOCK = re.compile(r"^(.*blocks\.\d+)\.")


def _block_labels(ep: ExportedProgram, forward: list[Node]) -> dict[Node, int]:
    """{forward node: index of its transformer block}. The joint graph is retraced and keeps
    no module paths, so a node belongs to the latest block (in forward order) whose
    parameters it depends on: block K's inside values depend on K's weights, its input
    (block K-1's output) only on earlier ones."""
    fqn = ep.graph_signature.inputs_to_parameters
    order: dict[str, int] = {}
    label: dict[Node, str] = {}
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


# node.meta["custom"] key of a recomputed copy's group (torch.fx copies meta["custom"] through
# every retrace, so it reaches the XNNPACK partitioner).
RECOMPUTED = "edgebench_recomputed"


def recomputation_group(node: Node) -> str | None:
    """The recomputation a node was copied for (a block, a dequantised weight), or None."""
    group: str | None = node.meta.get("custom", {}).get(RECOMPUTED)
    return group


def recompute_blocks(ep: ExportedProgram) -> dict[str, int]:
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

    def recomputable(node: Node) -> bool:
        return node in block and node not in kept

    read = {block[a] for n in nodes if n not in forward and n.op == "call_function"
            for a in n.all_input_nodes if recomputable(a)}
    count = _copy_into_backward(graph, forward, recomputable, lambda n: f"block {block[n]}")
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return {"recomputed_blocks": len(read), "recomputed_nodes": count}


def _copy_into_backward(graph: Graph, forward: set[Node], recomputable: Callable[[Node], bool],
                        group: Callable[[Node], str]) -> int:
    """Each backward read of a `recomputable` forward node becomes a read of a copy of it
    (and of its recomputable ancestors) made right before that read's first user. Each copy
    carries `group(original)` as its recomputation group (`recomputation_group`), which meta
    keeps through to_edge, so XNNPACK's partitions never join it to other nodes.
    Returns how many nodes were copied."""
    copies: dict[Node, Node] = {}

    def copy(node: Node, before: Node) -> Node:
        if not recomputable(node):
            return node
        if node not in copies:
            args = torch.fx.node.map_arg(node.args, lambda a: copy(a, before))
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: copy(a, before))
            # fx types a target Callable | str: a call_function node's (all recomputable ones) is the callable
            with graph.inserting_before(before):
                new = graph.call_function(node.target, args, kwargs)  # type: ignore[arg-type]
            new.meta = {**node.meta, "custom": {**node.meta.get("custom", {}), RECOMPUTED: group(node)}}
            copies[node] = new
        return copies[node]

    for node in list(graph.nodes):
        if node in forward or node.op != "call_function":
            continue
        for arg in [a for a in node.all_input_nodes if recomputable(a)]:
            node.replace_input_with(arg, copy(arg, node))
    return len(copies)


def recompute_dequantized(ep: ExportedProgram) -> dict[str, int]:
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
    count = _copy_into_backward(graph, forward, lambda n: n in derived and n.op == "call_function",
                                lambda n: f"dequantized {n.name}")
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return {"dequantized_recomputed": count}


def _view_readers(node: Node) -> list[Node]:
    """Every node that reads `node`, directly or through views of it (use_linear later turns
    a read of a transpose into a read of the weight at that node's place)."""
    found: list[Node]
    found, todo = [], [node]
    while todo:
        for user in todo.pop().users:
            if user.op == "output":
                continue
            found.append(user)
            schema = getattr(user.target, "_schema", None)
            if schema and any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
                todo.append(user)
    return found


def write_update(ep: ExportedProgram, optimizer: str, stochastic: bool = False,
                 weight_decay: float = 0.0, chunk: int = CHUNK) -> dict[str, int]:
    """The optimizer's step written into the joint graph, in place on the weights.

    For each trainable weight, right after the backward's last read of it (and after its
    gradient): the update (torch.optim's single-tensor SGD/Adam/AdamW, or lomo-optim's Lomo)
    as elementwise ops, then `aten.copy_` of the result into the weight. The gradient is then
    no output: its last reader is the update, so the memory planner reuses its space for the
    rest of the backward. The weights (and Adam's moments, new zero-initialised buffers) are
    outputs and flagged `weight_has_gradient`, as ExecuTorch's weights_to_outputs_pass flags
    trained weights: planned for the whole program, initialised from the .pte, never shared.
    Their copy_ into placeholders is what ExecuTorch's planner aliases in place
    (`_alias_inplace_result_specs`). The scalars of the step come in as the last input `hyper`
    (edgebench.backends.et_optimizers.hyper_index). A bf16 weight's SGD step is computed in
    fp32 and rounded into bf16 once, to nearest or (`stochastic`) by `stochastically_rounded`.
    `weight_decay` acts as the optimizer's descriptor says: L2 (SGD, Adam) adds wd * w to the
    gradient, wd a constant of the program; decoupled (AdamW, Lomo) multiplies the weight by
    `hyper`'s decay first. Returns counts: weights updated, of them updated in parts (a tied
    weight) and in blocks of rows (`_bf16_sgd_ops`), gradients computed in blocks.
    """
    graph, sig = ep.graph_module.graph, ep.graph_signature
    out = graph.output_node()
    grads = {s.target: value for s, value in zip(sig.output_specs, out.args[0])
             if s.kind == OutputKind.GRADIENT_TO_PARAMETER}
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    weights = {fqn: placeholders[name] for name, fqn in sig.inputs_to_parameters.items() if fqn in grads}
    user_inputs = [placeholders[name] for name in sig.user_inputs]
    adam = descriptor(optimizer).program_update == "adam"
    with graph.inserting_after(user_inputs[-1]):
        hyper = graph.placeholder("hyper")
    fake = next(iter(weights.values())).meta["val"]
    hyper.meta["val"] = fake.new_empty((et_optimizers.HYPER_SIZE,), dtype=torch.float32)  # whatever the weights
    state_specs, state_nodes = [], []
    if adam:  # zeros, as torch.optim starts
        for kind in ("exp_avg", "exp_avg_sq"):
            for fqn, weight in weights.items():
                node, spec = _zero_state(ep, user_inputs[0], f"b_{kind}_{weight.name}", weight,
                                         f"optimizer.{kind}.{fqn}")
                state_specs.append(spec)
                state_nodes.append(node)
    input_specs = (_with_state(sig, state_specs)
                   + [InputSpec(InputKind.USER_INPUT, TensorArgument(hyper.name), None)])
    moments = dict(zip([(k, f) for k in ("exp_avg", "exp_avg_sq") for f in weights], state_nodes))
    order = {n: i for i, n in enumerate(graph.nodes)}
    scalar_val = fake.new_empty((), dtype=torch.float32)

    def op(target: Callable[..., Any], *args: Any, like: Node | None = None,
           value: tuple[list[int], torch.dtype] | None = None, **kwargs: Any) -> Node:
        """A node; its value is `like`'s, or of `value`'s (shape, dtype), else its operator's."""
        node: Node = graph.call_function(target, args, kwargs)
        if value is not None:
            node.meta["val"] = fake.new_empty(value[0], dtype=value[1])
        elif target is torch.ops.aten.select.int:
            node.meta["val"] = scalar_val
        elif target is torch.ops.aten._to_copy.default:
            node.meta["val"] = args[0].meta["val"].to(kwargs["dtype"])
        elif target is torch.ops.aten.slice.Tensor:  # (x, dim 0, start, end)
            node.meta["val"] = args[0].meta["val"].narrow(0, args[2], args[3] - args[2])
        elif target is torch.ops.aten.mm.default:
            node.meta["val"] = args[0].meta["val"].new_empty((args[0].meta["val"].shape[0],
                                                              args[1].meta["val"].shape[1]))
        else:
            node.meta["val"] = (args[0] if like is None else like).meta["val"]
        return node

    summed = []  # gradients now applied in their parts
    blocks: Counter[str] = Counter(updated_in_blocks=0, gradients_in_blocks=0)
    for fqn, weight in weights.items():
        weight.meta["val"] = weight.meta["val"].detach()  # updated in place: no autograd leaf
        weight.meta["weight_has_gradient"] = True
        if not isinstance(grads[fqn], torch.fx.Node):
            continue  # no gradient reaches it: nothing to update
        parts = [grads[fqn]]
        if not adam and weight.meta["val"].dtype == torch.bfloat16:
            parts = _summed_parts(grads[fqn])
            summed += [grads[fqn]] if len(parts) > 1 else []
            for part in parts:
                _mark_in_order(part)
        readers = _view_readers(weight)
        for i, part in enumerate(parts):
            last = max([part, *readers], key=order.__getitem__)
            with graph.inserting_before(last.next):
                state = (moments[("exp_avg", fqn)], moments[("exp_avg_sq", fqn)]) if adam else None
                # a tied weight's parts: the weight decays once, with its first part
                _update_ops(op, optimizer, weight, part, hyper, 1 if optim.is_projector(fqn) else 0, state,
                            stochastic, weight_decay if i == 0 else 0.0, chunk, blocks)
    loss = [v for s, v in zip(sig.output_specs, out.args[0]) if s.kind != OutputKind.GRADIENT_TO_PARAMETER]
    outputs = [*loss, *weights.values(), *state_nodes]
    output_specs = [s for s in sig.output_specs if s.kind != OutputKind.GRADIENT_TO_PARAMETER]
    output_specs += [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(n.name), None)
                     for n in [*weights.values(), *state_nodes]]
    _set_outputs(ep, outputs, input_specs, output_specs)
    for total in summed:
        graph.erase_node(total)
    graph.eliminate_dead_code()  # a gradient computed a block at a time: its whole matmul
    ep.graph_module.recompile()
    return {"updated_in_program": len(weights), "updated_in_parts": len(summed), **blocks}


# Operators that only rearrange a gradient on its way to the update.
_REARRANGING = {torch.ops.aten.permute.default, torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
                torch.ops.aten.t.default, torch.ops.aten.transpose.int, torch.ops.aten.clone.default}


def _mark_in_order(grad: Node) -> None:
    """Marks a bf16 weight's gradient IN_ORDER back through its rearrangements to the node that
    computes it, so the rewrites after this one (exporters.bf16_in_fp32, bf16_matmuls_in_fp32)
    carry the mark to its rounding: an embedding-sized gradient is then neither rounded to bf16
    (the update widens it again) nor handed to XNNPACK, whose workspace would keep three fp32
    copies of it (222m: 324 MiB)."""
    node: Any = grad
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        node.meta["custom"] = {**node.meta.get("custom", {}), IN_ORDER: True}
        if node.target not in _REARRANGING:
            break
        node = node.args[0]


def _summed_parts(grad: Node) -> list[Node]:
    """A tied weight's gradient, the sum of its uses' (222m's embedding: the LM head's and the
    lookup's), as those two parts; else [grad]. SGD steps by each part as soon as it is made
    (after the weight's last read): w - lr (a + b) is (w - lr a) - lr b, and no third
    vocabulary-sized tensor (their sum) is ever held, nor the head's part until the lookup's."""
    if (grad.target is not torch.ops.aten.add.Tensor or len(grad.args) != 2 or grad.kwargs
            or any(user.op != "output" for user in grad.users)):
        return [grad]
    parts = [a for a in grad.args if isinstance(a, torch.fx.Node) and a.meta["val"].shape == grad.meta["val"].shape]
    return parts if len(parts) == 2 else [grad]


def _zero_state(ep: ExportedProgram, before: Node, name: str, like: Node, target: str) -> tuple[Node, InputSpec]:
    """A buffer the program keeps across calls, shaped like node `like`, placed before node
    `before`: zeros in the .pte, planned for the whole program and never shared (the flags
    ExecuTorch's weights_to_outputs_pass gives trained weights). Returns (node, its spec)."""
    with ep.graph_module.graph.inserting_before(before):
        node = ep.graph_module.graph.placeholder(name)
    node.meta["val"] = torch.empty_like(like.meta["val"]).detach()
    node.meta["et_init_buffer"] = True
    node.meta["weight_has_gradient"] = True
    ep.state_dict[target] = torch.zeros(like.meta["val"].shape)
    return node, InputSpec(InputKind.BUFFER, TensorArgument(node.name), target, True)


def _with_state(sig: ExportGraphSignature, state_specs: list[InputSpec]) -> list[InputSpec]:
    """The signature's input specs with new state buffers placed before the user inputs."""
    first_user = next(i for i, s in enumerate(sig.input_specs) if s.kind == InputKind.USER_INPUT)
    return sig.input_specs[:first_user] + state_specs + sig.input_specs[first_user:]


def _set_outputs(ep: ExportedProgram, outputs: list[Any], input_specs: list[InputSpec],
                 output_specs: list[OutputSpec]) -> None:
    """The rewritten graph's outputs and signature, then the graph checked and recompiled."""
    graph, sig = ep.graph_module.graph, ep.graph_signature
    out = graph.output_node()
    new_out = graph.output(tuple(outputs))
    out.replace_all_uses_with(new_out)
    graph.erase_node(out)
    sig.input_specs[:] = input_specs
    sig.output_specs[:] = output_specs
    graph.lint()
    ep.graph_module.recompile()


def sum_gradients(ep: ExportedProgram) -> dict[str, int]:
    """accumN's gradient sums written into the joint graph: each gradient, right after the
    backward computes it, is added into a buffer of the program's own (`sum += grad`,
    aten.copy_ into the buffer), and that buffer is returned in its place. The gradient then
    dies there and the memory planner reuses its space, where summing outside the program kept
    a second copy of every gradient (the plan's, overwritten by the next call, and the sums).
    The buffers are planned for the whole program and start as zeros from the .pte, like
    write_update's moments; the runtime divides the sums by N (eager's loss/N) in the clip's
    pass and zeroes them after each update (edgebench.backends.et_optimizers.AccumulatingStep).
    Returns counts: gradients summed.
    """
    graph, sig = ep.graph_module.graph, ep.graph_signature
    outputs = list(graph.output_node().args[0])
    weight_names = {fqn: name for name, fqn in sig.inputs_to_parameters.items()}
    first_input = next(n for n in graph.nodes if n.op == "placeholder" and n.name == sig.user_inputs[0])
    state_specs, output_specs = [], list(sig.output_specs)

    def op(target: Callable[..., Any], *args: Any) -> Node:
        node: Node = graph.call_function(target, args)
        node.meta["val"] = args[0].meta["val"]
        return node

    for i, (spec, grad) in enumerate(zip(sig.output_specs, outputs)):
        if spec.kind != OutputKind.GRADIENT_TO_PARAMETER or not isinstance(grad, torch.fx.Node):
            continue
        total, state = _zero_state(ep, first_input, f"b_grad_sum_{weight_names[spec.target]}", grad,
                                   f"accumulation.sum.{spec.target}")
        state_specs.append(state)
        with graph.inserting_before(grad.next):  # in order, right after the gradient
            op(torch.ops.aten.copy_.default, total, op(torch.ops.aten.add.Tensor, total, grad))
        outputs[i] = total
        output_specs[i] = OutputSpec(OutputKind.GRADIENT_TO_PARAMETER, TensorArgument(total.name), spec.target)
    _set_outputs(ep, outputs, _with_state(sig, state_specs), output_specs)
    return {"gradients_summed_in_program": len(state_specs)}


def stochastically_rounded(op: Callable[..., Any], value: Any, uniform: Any) -> Any:
    """`value` (fp32) rounded to one of the two bf16 values around it: the nearest one, or the
    other with probability equal to the nearest one's distance over their spacing, so that the
    mean is `value` (Zamirai et al. 2020); edgebench.methods.bf16 does the same with integer
    noise on the bits, which the runtime has no view for. The spacing is 2^(floor(log2|v|) - 7),
    at least 2^-126: kernels may flush a subnormal spacing to zero, and 0 / 0 (a weight at 0)
    would be NaN; below 2^-119 the neighbours are rounded coarser. `uniform` in [0, 1) draws the choice:
    floor(p - u + 1) is 1 with probability p. `op(target, *args)` makes a graph node, or
    computes the value when called eagerly (tests). The result holds a bf16 value in fp32."""
    aten = torch.ops.aten
    exponent = op(aten.clamp.default, op(aten.floor.default, op(aten.log2.default, op(aten.abs.default, value))), -119)
    spacing = op(aten.pow.Scalar, 2.0, op(aten.sub.Scalar, exponent, 7), like=value)
    nearest = op(aten._to_copy.default, op(aten._to_copy.default, value, dtype=torch.bfloat16), dtype=torch.float32)
    off = op(aten.sub.Tensor, value, nearest)
    other = op(aten.div.Tensor, op(aten.abs.default, off), spacing)  # the other's probability, <= 1/2
    chosen = op(aten.floor.default, op(aten.add.Scalar, op(aten.sub.Tensor, other, uniform), 1.0))
    step = op(aten.mul.Tensor, op(aten.sign.default, off), op(aten.mul.Tensor, spacing, chosen))
    return op(aten.add.Tensor, nearest, step)


# node.meta["custom"] key of a bf16 weight's update: XNNPACK leaves these nodes to the runtime's
# kernels (exporters.executorch._fp32_within_weight_limit), which run them one after another in
# the graph's order. XNNPACK partitions by level would run the same step of every block (and of
# every weight updated there) in one call, keeping all their fp32 temporaries at once.
IN_ORDER = "edgebench_update_in_order"


# node.meta["custom"] key of a block of a weight's gradient computed apart
# (`_bf16_sgd_ops`): XNNPACK partitions by it (exporters.xnnpack_lowering.phase_group), so each
# block's matmul runs in its own call, just before its update, instead of all in one.
UPDATE_BLOCK = "edgebench_update_block"

_SWAPS = {torch.ops.aten.t.default, torch.ops.aten.transpose.int, torch.ops.aten.permute.default}


def _matmul_of(grad: Node) -> tuple[Node, Node] | None:
    """(a, b) where the 2-D gradient `grad` is `a @ b` seen through transposes that cancel out
    (a linear's weight gradient: its output gradient's transpose times its input), else None."""
    node: Any = grad
    swaps = 0
    while getattr(node, "target", None) in _SWAPS and len(node.meta["val"].shape) == 2:
        swaps += node.target is not torch.ops.aten.permute.default or list(node.args[1]) == [1, 0]
        node = node.args[0]
    if getattr(node, "target", None) is torch.ops.aten.mm.default and swaps % 2 == 0:
        return node.args[0], node.args[1]
    return None


def _lookup_of(grad: Node) -> tuple[Node, Node, torch.dtype | None] | None:
    """(ids, values, dtype) where `grad` is an embedding's gradient as the joint graph writes it:
    the rows `values` summed into a zero table at `ids` (index_put with accumulate), cast to
    `dtype` (None: not cast), else None."""
    node: Any = grad
    dtype = None
    if node.target is torch.ops.aten._to_copy.default and set(node.kwargs) == {"dtype"}:
        node, dtype = node.args[0], node.kwargs["dtype"]
    if not (getattr(node, "target", None) is torch.ops.aten.index_put.default and len(node.args) == 4
            and node.args[3] is True and len(node.args[1]) == 1):
        return None
    table: Any = node.args[0]
    if not (getattr(table, "target", None) is torch.ops.aten.full.default and table.args[1] == 0
            and len(table.args[0]) == 2):
        return None
    return node.args[1][0], node.args[2], dtype


def _lookup_rows(op: Callable[..., Node], ids: Node, values: Node, dtype: torch.dtype | None, start: int,
                 end: int) -> Node:
    """Rows [start, end) of an embedding's gradient (`_lookup_of`): `values` summed at ids in the
    block into a zero table of the block's rows and one more, where every other id goes."""
    aten = torch.ops.aten
    rows, shape = end - start, list(ids.meta["val"].shape)
    flags, codes = (shape, torch.bool), (shape, torch.int64)
    inside = op(aten.logical_and.default, op(aten.ge.Scalar, ids, start, value=flags),
                op(aten.lt.Scalar, ids, end, value=flags), value=flags)
    local = op(aten.where.self, inside, op(aten.sub.Scalar, ids, start, value=codes),
               op(aten.full.default, shape, rows, dtype=torch.int64, value=codes), value=codes)
    kind = values.meta["val"].dtype
    table = ([rows + 1, values.meta["val"].shape[-1]], kind)
    summed = op(aten.index_put.default, op(aten.full.default, table[0], 0.0, dtype=kind, value=table), [local],
                values, True, value=table)
    block = op(aten.slice.Tensor, summed, 0, 0, rows)
    return block if dtype is None else op(aten._to_copy.default, block, dtype=dtype)


def _bf16_sgd_ops(make: Callable[..., Node], weight: Node, grad: Node, step: Node, stochastic: bool,
                  l2: float, chunk: int, counts: Counter[str]) -> None:
    """edgebench.methods.bf16's step on a bf16 weight: w + step * (g + l2 * w) in fp32, rounded
    into bf16. A weight over `chunk` elements (edgebench.methods.bf16.CHUNK) is stepped a block of rows at a
    time, each block written into the weight as it is made (aten.index_put_), so the fp32
    temporaries of the largest weight (222m's tied embedding: 108 MiB each) stay a few MiB; a
    gradient that is a matmul (a linear's weight gradient, the LM head's among them) is computed
    a block of rows at a time too, just before its block's step, so the whole gradient is never
    held. Every node of the step is marked IN_ORDER. `counts`: weights stepped in blocks,
    gradients computed in blocks."""
    aten = torch.ops.aten

    def op(target: Callable[..., Any], *args: Any, **kwargs: Any) -> Node:
        node = make(target, *args, **kwargs)
        node.meta["custom"] = {**node.meta.get("custom", {}), IN_ORDER: True}
        return node

    def stepped(w: Node, g: Node) -> Node:
        w32, g32 = (op(aten._to_copy.default, t, dtype=torch.float32) for t in (w, g))
        if l2:
            g32 = op(aten.add.Tensor, g32, op(aten.mul.Scalar, w32, l2))
        value = op(aten.add.Tensor, w32, op(aten.mul.Tensor, g32, step))
        if stochastic:
            uniform = op(aten.rand.default, list(value.meta["val"].shape), dtype=torch.float32, like=value)
            value = stochastically_rounded(op, value, uniform)
        return op(aten._to_copy.default, value, dtype=torch.bfloat16)

    shape = weight.meta["val"].shape
    rows = shape[0] if shape else 1
    block = max(1, chunk // max(1, weight.meta["val"].numel() // max(1, rows)))
    if block >= rows:
        op(aten.copy_.default, weight, stepped(weight, grad))
        return
    product, lookup = _matmul_of(grad), _lookup_of(grad)
    counts["updated_in_blocks"] += 1
    counts["gradients_in_blocks"] += product is not None or lookup is not None
    for start in range(0, rows, block):
        end = min(start + block, rows)
        if product is not None:  # this block's rows of a @ b: its own matmul, partitioned alone
            g = make(aten.mm.default, make(aten.slice.Tensor, product[0], 0, start, end), product[1])
            g.meta["custom"] = {**g.meta.get("custom", {}), UPDATE_BLOCK: f"{weight.name} rows {start}"}
        elif lookup is not None:
            g = _lookup_rows(op, *lookup, start, end)
        else:
            g = op(aten.slice.Tensor, grad, 0, start, end)
        piece = stepped(op(aten.slice.Tensor, weight, 0, start, end), g)
        rows_index = op(aten.arange.start_step, start, end, 1, dtype=torch.int64,
                        value=([end - start], torch.int64))
        op(aten.index_put_.default, weight, [rows_index], piece)


def _update_ops(op: Callable[..., Node], optimizer: str, weight: Node, grad: Node, hyper: Node, group: int,
                state: tuple[Node, Node] | None, stochastic: bool, weight_decay: float, chunk: int,
                counts: Counter[str]) -> None:
    """One weight's step as graph nodes (`op(target, *args)` adds one), ending in its writes into
    the weight; `weight_decay` as write_update says (0: none)."""
    aten = torch.ops.aten

    def scalar(what: str) -> Node:
        return op(aten.select.int, hyper, 0, et_optimizers.hyper_index(group, what))

    opt = descriptor(optimizer)
    l2 = weight_decay if opt.decay == "l2" else 0.0
    step = scalar("step")
    if state is None and weight.meta["val"].dtype == torch.bfloat16:
        _bf16_sgd_ops(op, weight, grad, step, stochastic, l2, chunk, counts)
        return
    if l2:  # torch's grad = grad.add(param, alpha=weight_decay)
        grad = op(aten.add.Tensor, grad, op(aten.mul.Scalar, weight, l2))
    # decoupled: param.mul_(1 - lr * weight_decay) first
    base = op(aten.mul.Tensor, weight, scalar("decay")) if weight_decay and opt.decay == "decoupled" else weight
    if state is None:  # p += step * g (torch's p.add_(g, alpha=-lr))
        op(aten.copy_.default, weight, op(aten.add.Tensor, base, op(aten.mul.Tensor, grad, step)))
        return
    assert opt.betas is not None  # an Adam's descriptor (state given) has its betas
    beta1, beta2 = opt.betas
    m, v = state
    # m.lerp_(g, 1 - beta1); v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    m_new = op(aten.add.Tensor, m, op(aten.mul.Scalar, op(aten.sub.Tensor, grad, m), 1 - beta1))
    op(aten.copy_.default, m, m_new)
    v_new = op(aten.add.Tensor, op(aten.mul.Scalar, v, beta2),
               op(aten.mul.Tensor, op(aten.mul.Scalar, grad, 1 - beta2), grad))
    op(aten.copy_.default, v, v_new)
    # p.addcdiv_(m, sqrt(v) / sqrt(1 - beta2^t) + eps, value=-lr / (1 - beta1^t))
    denom = op(aten.add.Scalar, op(aten.div.Tensor, op(aten.sqrt.default, v_new),
                                   scalar("bias_correction2_sqrt")), opt.eps)
    update = op(aten.mul.Tensor, op(aten.div.Tensor, m_new, denom), step)
    op(aten.copy_.default, weight, op(aten.add.Tensor, base, update))
