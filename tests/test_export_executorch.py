"""The ExecuTorch lowering's rewrites, its XNNPACK matmuls and the gradient hand-off, on small models (seconds)."""

from __future__ import annotations

import collections
import copy

import pytest
import torch

from edgebench.backends.executorch import TrainingProgram
from exporters.executorch import lower_training_step


def observe(monkeypatch, owner, name, value) -> None:
    """Puts a test's observer where upstream's `owner.name` was, registered as upstream's:
    exporters.upstream applies a replacement only over what it was read against."""
    from exporters import upstream

    before = upstream.target_of(owner, name)
    monkeypatch.setattr(owner, name, value)
    if before in upstream.REPLACEMENTS:
        after = upstream.target_of(owner, name)
        monkeypatch.setitem(upstream.REPLACEMENTS, after, upstream.Replacement(
            after, upstream.fingerprint(value), upstream.REPLACEMENTS[before].why))


class MLP(torch.nn.Module):
    """Two linear layers (with and without bias) and a loss: the joint graph's linear patterns."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 8, bias=False)

    def forward(self, x, labels):
        return torch.nn.functional.cross_entropy(self.down(torch.nn.functional.silu(self.up(x))), labels)


@pytest.fixture(scope="module")
def mlp_program(tmp_path_factory):
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    lowered = lower_training_step(model, inputs)
    path = tmp_path_factory.mktemp("mlp") / "model.pte"
    lowered.write(path)
    return lowered, path, reference, inputs


def _operator_counts(pte: bytes) -> collections.Counter:
    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(pte).program.execution_plan[0]
    return collections.Counter(plan.operators[i.instr_args.op_index].name for chain in plan.chains
                               for i in chain.instructions if hasattr(i.instr_args, "op_index"))


def _delegate_calls(pte: bytes) -> int:
    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(pte).program.execution_plan[0]
    return sum(hasattr(i.instr_args, "delegate_index") for chain in plan.chains for i in chain.instructions)


def test_linear_layers_run_without_weight_transposes(mlp_program):
    lowered, path, _, _ = mlp_program
    counts = _operator_counts(path.read_bytes())
    assert counts["aten::linear"] == 2  # both forwards take the weight as stored
    # What is left: one activation-sized transpose per weight gradient (g^T x), none of a weight.
    assert counts["aten::permute_copy"] == 2
    assert lowered.lowering["delegate"] == "none"
    assert lowered.lowering["rewrites"]["use_linear"] > 0


def test_program_gradients_are_the_arenas_and_match_eager(mlp_program):
    _, path, reference, inputs = mlp_program
    program = TrainingProgram(str(path))
    loss = program.forward_backward(inputs)
    first = {n: g.data_ptr() for n, g in program.grads.items()}
    expected = reference(*inputs)
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    eager = dict(reference.named_parameters())
    assert sorted(program.grads) == sorted(eager)
    for name, grad in program.grads.items():
        torch.testing.assert_close(grad, eager[name].grad, rtol=1e-4, atol=1e-6, msg=name)
    # SGD in place on the program's own weights, then a second step: it trains, and the
    # gradients come back in the same memory (the plan's), not in fresh copies.
    with torch.no_grad():
        for name, param in program.named_parameters().items():
            param.sub_(0.5 * program.grads[name])
    assert program.forward_backward(inputs) < loss
    assert {n: g.data_ptr() for n, g in program.grads.items()} == first


class TiedMLP(MLP):
    """An embedding tied to the output layer (as nanoVLM's decoder head), and a layer no loss
    reads."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(8, 32)
        self.down.weight = self.embed.weight
        self.unread = torch.nn.Linear(4, 4)

    def forward(self, x, labels):
        h = torch.nn.functional.silu(self.up(x)) + self.embed(labels)
        return torch.nn.functional.cross_entropy(self.down(h), labels)


def test_a_tied_parameter_trains_as_one_under_its_first_name(tmp_path):
    """Non-strict torch.export lifts the tied weight under both names: the program keeps one,
    under eager's name for it (`named_parameters`' first, `down.weight`), whose gradient sums
    both uses as eager's does, and drops the unread layer's weights (strict export never
    lifted them)."""
    torch.manual_seed(0)
    model = TiedMLP()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    lowered = lower_training_step(model, inputs, delegate="xnnpack")
    assert lowered.lowering["rewrites"]["parameter_placeholders_dropped"] == 3  # down.weight, unread's two
    lowered.write(tmp_path / "tied.pte")
    program = TrainingProgram(str(tmp_path / "tied.pte"))
    loss = program.forward_backward(inputs)
    reference(*inputs).backward()
    assert sorted(program.grads) == ["down.weight", "up.bias", "up.weight"]
    assert "embed.weight" not in dict(reference.named_parameters())
    assert loss == pytest.approx(reference(*inputs).item(), rel=1e-5)
    torch.testing.assert_close(program.grads["down.weight"], reference.embed.weight.grad, rtol=1e-4, atol=1e-6)


class PatchEmbed(torch.nn.Module):
    """A patch-embedding convolution (stride == kernel) and a head: the ViT's first layer."""

    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 16, 4, 4)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, images, labels):
        x = self.patch(images).flatten(2).transpose(1, 2).mean(1)
        return torch.nn.functional.cross_entropy(self.head(torch.nn.functional.silu(x)), labels)


def _side_by_side(path, reference, inputs, steps=3, lr=0.5):
    """SGD on the program's own weights and on eager's: losses and weights after `steps`."""
    program = TrainingProgram(str(path))
    eager = dict(reference.named_parameters())
    for _ in range(steps):
        loss = program.forward_backward(inputs)
        expected = reference(*inputs)
        reference.zero_grad()
        expected.backward()
        assert loss == pytest.approx(expected.item(), rel=1e-5)
        assert sorted(program.grads) == sorted(eager)
        with torch.no_grad():
            for name, param in program.named_parameters().items():
                torch.testing.assert_close(program.grads[name], eager[name].grad, rtol=1e-4, atol=1e-6, msg=name)
                param.sub_(lr * program.grads[name])
                eager[name].sub_(lr * eager[name].grad)
    for name, param in program.named_parameters().items():
        torch.testing.assert_close(param, eager[name].detach(), rtol=1e-4, atol=1e-6, msg=name)


def test_patch_convolution_runs_as_a_matmul_and_trains_like_eager(tmp_path):
    torch.manual_seed(0)
    model = PatchEmbed()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(2, 3, 16, 16), torch.tensor([1, 7]))
    lowered = lower_training_step(model, inputs)
    assert lowered.lowering["rewrites"]["patch_conv_as_linear"] == 1
    lowered.write(tmp_path / "model.pte")
    counts = _operator_counts((tmp_path / "model.pte").read_bytes())
    assert not [op for op in counts if "convolution" in op]
    assert counts["aten::linear"] == 2  # the patches' and the head's
    assert type(model.patch.forward).__name__ == "method"  # the module is given back as it was
    _side_by_side(tmp_path / "model.pte", reference, inputs)


def test_xnnpack_runs_the_matmuls_on_weights_given_as_inputs(tmp_path):
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    lowered = lower_training_step(model, inputs, delegate="xnnpack")
    assert lowered.delegated and lowered.lowering["delegate"] == "xnnpack"
    assert lowered.lowering["rewrites"]["xnnpack_partitions"] >= 1
    lowered.write(tmp_path / "model.pte")
    counts = _operator_counts((tmp_path / "model.pte").read_bytes())
    assert not {"aten::linear", "aten::mm", "aten::addmm"} & set(counts)  # all in the delegate
    # Every trainable weight is still the program's own (not a delegate constant): it trains.
    assert sorted(lowered.trainable_parameters) == sorted(n for n, _ in reference.named_parameters())
    _side_by_side(tmp_path / "model.pte", reference, inputs)


def test_xnnpack_runs_a_silus_elementwise_work_forward_and_backward(tmp_path):
    """The runtime's sigmoid took 0.42 s of nanoVLM-222M BitFit's 2.4 s step: with XNNPACK a
    SiLU and its gradient, `s * (1 + x * (1 - s))` (its `add.Scalar` as `add.Tensor`), run there,
    one rounding per operation as on the runtime's kernels."""
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    lowered = lower_training_step(model, inputs, delegate="xnnpack")
    assert lowered.lowering["rewrites"]["scalar_ops_as_tensor_ops"] >= 1
    lowered.write(tmp_path / "model.pte")
    counts = _operator_counts((tmp_path / "model.pte").read_bytes())
    assert not {"aten::sigmoid", "aten::mul", "aten::add", "aten::sub"} & set(counts), counts
    _side_by_side(tmp_path / "model.pte", reference, inputs)


def test_a_matmul_over_xnnpacks_weight_limit_runs_on_the_runtimes_kernel(tmp_path, monkeypatch):
    """XNNPACK packs each input weight into a workspace that keeps the largest one's size: a
    weight over the limit stays on the runtime's linear and mm, in the training program (forward
    and input gradient) and the forward-only one alike."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    import exporters.executorch as et

    # Both weights are over it (2,048 and 1,024 bytes); the weight gradients' mm read activations (<= 768).
    monkeypatch.setattr(et, "XNNPACK_WEIGHT_LIMIT_BYTES", 1000)
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    lowered = et.lower_training_step(model, inputs, delegate="xnnpack")
    lowered.write(tmp_path / "model.pte")
    counts = _operator_counts((tmp_path / "model.pte").read_bytes())
    assert counts["aten::linear"] == 2 and counts["aten::mm"] == 1  # + down's input gradient
    partitions = lowered.lowering["rewrites"]["xnnpack_partitions"]
    assert _delegate_calls((tmp_path / "model.pte").read_bytes()) == partitions > 0
    _side_by_side(tmp_path / "model.pte", reference, inputs)

    # The forward-only program keeps the refused linear whole (not decomposed to permute + mm).
    forward = et.lower_forward(copy.deepcopy(reference), inputs, delegate="xnnpack")
    forward.write(tmp_path / "forward.pte")
    counts = _operator_counts((tmp_path / "forward.pte").read_bytes())
    assert counts["aten::linear"] == 2 and not {"aten::mm", "aten::permute_copy"} & set(counts)
    weights = tuple(p.detach() for p in reference.parameters())
    loss = _load_for_executorch(str(tmp_path / "forward.pte")).run_method("forward", inputs + weights)[0]
    assert loss.item() == pytest.approx(reference(*inputs).item(), rel=1e-6)


class GeluMLP(MLP):
    def __init__(self, approximate):
        super().__init__()
        self.approximate = approximate

    def forward(self, x, labels):
        hidden = torch.nn.functional.gelu(self.up(x), approximate=self.approximate)
        return torch.nn.functional.cross_entropy(self.down(hidden), labels)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_a_tanh_gelu_runs_in_xnnpack_as_eagers_formula(tmp_path, approximate):
    """The runtime's tanh GELU is ~16x eager's: with XNNPACK it becomes mul/add/tanh there. The
    erf GELU is left alone (XNNPACK's GELU would be it, but its partitioner takes no GELU)."""
    torch.manual_seed(0)
    model = GeluMLP(approximate)
    reference = copy.deepcopy(model)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    lowered = lower_training_step(model, inputs, delegate="xnnpack")
    assert lowered.lowering["rewrites"]["tanh_gelu_as_elementwise"] == (approximate == "tanh")
    lowered.write(tmp_path / "model.pte")
    counts = _operator_counts((tmp_path / "model.pte").read_bytes())
    if approximate == "tanh":  # the backward's GELU gradient runs its tanh in XNNPACK too
        assert "aten::gelu" not in counts and "aten::tanh" not in counts
    else:
        assert counts["aten::gelu"] == 1
    _side_by_side(tmp_path / "model.pte", reference, inputs)


class AutocastMLP(MLP):
    def forward(self, x, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return super().forward(x, labels)


class Int8AutocastMLP(AutocastMLP):
    """up frozen as int8 codes and scales (edgebench.methods.int8), dequantised to bf16 in forward."""

    def __init__(self):
        from edgebench.methods.int8 import Int8Linear

        super().__init__()
        self.up = Int8Linear(self.up)


def _held_and_casts(tmp_path, monkeypatch, model, inputs, rewrite="bf16_held_in_fp32"):
    """The program lowered with `rewrite` (default `bf16_held_in_fp32`) and without (for the
    default, bf16 values on the runtime's casts and bf16 kernels): for each, its lowering, the
    kernel calls on bf16 tensors, the losses and gradients of 3 SGD steps, and the kernel calls
    on int8 tensors."""
    import exporters.executorch as et

    runs = {}
    for variant in ("held", "casts"):
        if variant == "casts":
            monkeypatch.setattr(et, rewrite, lambda gm, *args, **kwargs: 0)
        lowered = et.lower_training_step(copy.deepcopy(model), inputs, delegate="xnnpack")
        path = tmp_path / f"{variant}.pte"
        lowered.write(path)
        program = TrainingProgram(str(path))
        losses, grads = [], []
        for _ in range(3):
            losses.append(program.forward_backward(inputs))
            grads.append({n: g.clone() for n, g in program.grads.items()})
            with torch.no_grad():
                for name, param in program.named_parameters().items():
                    param.sub_(0.5 * program.grads[name])
        pte = path.read_bytes()
        runs[variant] = lowered, _kernel_calls_on(pte, "BFLOAT16"), losses, grads, _kernel_calls_on(pte, "CHAR")
    return runs["held"], runs["casts"]


def _kernel_calls_on(pte: bytes, scalar_type: str) -> collections.Counter:
    """Kernel calls outside delegates that read or write a tensor of `scalar_type` (ExecuTorch's
    ScalarType name: BFLOAT16, CHAR for int8), by operator."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.scalar_type import ScalarType
    from executorch.exir.schema import Tensor

    plan = deserialize_pte_binary(pte).program.execution_plan[0]
    return collections.Counter(
        plan.operators[i.instr_args.op_index].name for chain in plan.chains for i in chain.instructions
        if hasattr(i.instr_args, "op_index") and any(
            isinstance(plan.values[a].val, Tensor) and plan.values[a].val.scalar_type == ScalarType[scalar_type]
            for a in i.instr_args.args))


def _bit_for_bit(held, casts) -> None:
    assert held[2] == casts[2] and held[2][-1] < held[2][0]  # bit for bit, and it trains
    for mine, theirs in zip(held[3], casts[3]):
        assert all(torch.equal(mine[n], theirs[n]) for n in theirs)


CAST = "dim_order_ops::_to_dim_order_copy"


def test_bf16_values_held_in_fp32_train_bit_for_bit_as_the_casts(tmp_path, monkeypatch):
    """Autocast's casts (weights into the matmuls, forward and backward; gradients out of them)
    become XNNPACK's rounding, and the bf16 bias add, SiLU and their gradients run in fp32 and
    round: the program trains bit for bit as the one on the runtime's casts and bf16 kernels,
    with no kernel call left on a bf16 tensor."""
    torch.manual_seed(0)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    held, casts = _held_and_casts(tmp_path, monkeypatch, AutocastMLP(), inputs)
    _bit_for_bit(held, casts)
    assert held[0].lowering["rewrites"]["bf16_held_in_fp32"] > 0
    assert not held[1] and casts[1][CAST] > 0, (held[1], casts[1])


def test_a_cast_over_xnnpacks_size_limit_still_rounds_in_xnnpack(tmp_path, monkeypatch):
    """A weight over XNNPACK's size limit for elementwise work (nanoVLM's tied embedding) is
    still rounded to bf16 there, not cast to bf16 and back on the runtime's kernels: no cast and
    no rounding's subtract left outside a delegate, bit for bit the casts' training."""
    import exporters.executorch as et

    monkeypatch.setattr(et, "XNNPACK_WEIGHT_LIMIT_BYTES", 1000)  # both weights (2,048 and 1,024 B) are over it
    torch.manual_seed(0)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    held, casts = _held_and_casts(tmp_path, monkeypatch, AutocastMLP(), inputs)
    _bit_for_bit(held, casts)
    assert not held[1] and casts[1][CAST] > 0, (held[1], casts[1])
    assert "aten::sub" not in _operator_counts((tmp_path / "held.pte").read_bytes())


class FrozenTiedEmbedding(torch.nn.Module):
    """A frozen bf16 embedding, looked up and tied to the output layer (nanoVLM's under QLoRA),
    around a trained linear under autocast."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(64, 16).to(torch.bfloat16).requires_grad_(False)
        self.up = torch.nn.Linear(16, 16)

    def forward(self, ids, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = torch.nn.functional.silu(self.up(self.embedding(ids)))
            logits = torch.nn.functional.linear(hidden, self.embedding.weight)
        return torch.nn.functional.cross_entropy(logits.float(), labels)


def test_a_large_frozen_bf16_weight_is_stored_in_fp32_not_widened_at_each_use(tmp_path, monkeypatch):
    """A frozen bf16 weight over XNNPACK's size limit, looked up and read by a matmul forward and
    backward, is stored in fp32 holding its bf16 values: no cast of it is left in the program,
    which trains bit for bit as the one that widens it at each use."""
    import exporters.executorch as et

    monkeypatch.setattr(et, "XNNPACK_WEIGHT_LIMIT_BYTES", 3000)  # the embedding's fp32 form (4,096 B) is over it
    torch.manual_seed(0)
    inputs = (torch.tensor([1, 5, 9, 60, 33, 2]), torch.tensor([0, 1, 2, 3, 4, 5]))
    stored, widened = _held_and_casts(tmp_path, monkeypatch, FrozenTiedEmbedding(), inputs,
                                      rewrite="large_frozen_weights_in_fp32")
    _bit_for_bit(stored, widened)
    assert stored[0].lowering["rewrites"]["large_frozen_weights_in_fp32"] == 1
    assert not stored[1] and widened[1][CAST] >= 2, (stored[1], widened[1])  # the two widenings and the lookup


class HalvedAutocastMLP(AutocastMLP):
    """AutocastMLP with its bf16 hidden values halved, then widened (into contiguous order, as
    nanoVLM's vision encoder does) and narrowed again."""

    def forward(self, x, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = torch.nn.functional.silu(self.up(x))
            hidden = (hidden * 0.5).to(torch.float32, memory_format=torch.contiguous_format).to(torch.bfloat16)
            return torch.nn.functional.cross_entropy(self.down(hidden), labels)


def test_a_value_holding_bf16_already_is_not_rounded_again(tmp_path, monkeypatch):
    """A bf16 value times a power of two, or widened and narrowed again (forward and backward),
    holds a bf16 value already: the halving and the round trip add no rounding to the program,
    which trains bit for bit as the casts' with no kernel call left on a bf16 tensor."""
    import exporters.executorch as et
    from exporters.bf16_in_fp32 import BF16_SPLIT, bf16_held_in_fp32

    roundings = []

    def counted(gm, is_large, **kwargs):
        count = bf16_held_in_fp32(gm, is_large, **kwargs)
        roundings.append(sum(n.target == torch.ops.aten.mul.Tensor and n.args[1] == BF16_SPLIT
                             for n in gm.graph.nodes))
        return count

    monkeypatch.setattr(et, "bf16_held_in_fp32", counted)
    torch.manual_seed(0)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    et.lower_training_step(AutocastMLP(), inputs, delegate="xnnpack")
    held, casts = _held_and_casts(tmp_path, monkeypatch, HalvedAutocastMLP(), inputs)
    _bit_for_bit(held, casts)
    assert roundings[0] == roundings[1] > 0, roundings
    assert not held[1] and casts[1][CAST] > 0, (held[1], casts[1])


def test_a_weights_rounding_does_not_live_from_the_forward_to_the_backward(monkeypatch):
    """Each use of a weight (forward matmul, backward input gradient) rounds it again, so no fp32
    copy of the rounded weight is planned from one to the other: with weights larger than the
    activations, the plan is smaller than the casts' (which keep a bf16 copy) by that copy."""
    import exporters.executorch as et

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU(), torch.nn.Linear(256, 256), torch.nn.SiLU(),
                                torch.nn.Linear(256, 8))  # the 256 x 256 weight: its input gradient reads it
    model.requires_grad_(True)
    inputs = (torch.randn(1, 64), torch.tensor([3]))

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = copy.deepcopy(model)

        def forward(self, x, labels):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.nn.functional.cross_entropy(self.mlp(x), labels)

    held = et.lower_training_step(Loss(), inputs, delegate="xnnpack").planned_memory_bytes
    monkeypatch.setattr(et, "bf16_held_in_fp32", lambda gm, is_large, **kwargs: 0)
    casts = et.lower_training_step(Loss(), inputs, delegate="xnnpack").planned_memory_bytes
    # the casts' program keeps the 256 x 256 weight's bf16 copy (2 bytes an element) for the
    # backward; this one keeps no copy of it at all (a shared rounding would keep 4 bytes an element)
    assert casts - held >= 256 * 256 * 2, (held, casts)


def test_eagers_bf16_kernels_compute_in_fp32_and_round_once():
    """The rule `bf16_held_in_fp32` writes for each operator it rounds: eager's bf16 CPU kernel
    gives the fp32 result rounded once to bf16 (a mean's sum is not rounded before the divide).
    Layer norm sums in another order: one element in 36,864 differs."""
    torch.manual_seed(0)
    x = torch.randn(64, 576).bfloat16()
    weight, bias = torch.randn(576).bfloat16(), torch.randn(576).bfloat16()
    F = torch.nn.functional
    y, positive = torch.randn(64, 576).bfloat16(), torch.rand(64, 576).bfloat16() + 0.5
    ops = {"add": lambda t: t + y.to(t.dtype), "mul": lambda t: t * y.to(t.dtype), "div": lambda t: t / 3.0,
           "mul.Scalar": lambda t: t * 0.044715, "pow": lambda t: t.pow(2),
           "rsqrt": lambda t: torch.rsqrt(positive.to(t.dtype)), "sigmoid": torch.sigmoid, "tanh": torch.tanh,
           "exp": torch.exp, "silu": F.silu, "gelu": lambda t: F.gelu(t, approximate="tanh"),
           "softmax": lambda t: torch.softmax(t, -1), "mean": lambda t: t.mean(-1), "sum": lambda t: t.sum(-1)}
    for name, op in ops.items():
        assert torch.equal(op(x), op(x.float()).bfloat16()), name
    norm = F.layer_norm(x, (576,), weight, bias)
    assert (norm != F.layer_norm(x.float(), (576,), weight.float(), bias.float()).bfloat16()).sum() <= 4


def test_a_value_of_weights_alone_is_computed_again_at_each_reader():
    """A weight's dequantisation read by the forward and by a checkpointed block's recomputation
    (far apart) is computed twice, the copy just before its reader and in its group; a small
    value of weights alone (the scales' rounding) and a value that also reads an activation
    are left alone."""
    from exporters.bf16_in_fp32 import _NEAR, _SHARED_BYTES, weight_values_at_each_use

    graph = torch.fx.Graph()
    codes, scale, x = graph.placeholder("b_codes"), graph.placeholder("b_scale"), graph.placeholder("x")
    aten = torch.ops.aten
    small = graph.call_function(aten.neg.default, (scale,))
    weight = graph.call_function(aten.mul.Tensor, (graph.call_function(
        aten._to_copy.default, (codes,), {"dtype": torch.float32}), small))
    forward = graph.call_function(aten.linear.default, (x, weight))
    activation = graph.call_function(aten.mul.Tensor, (forward, x))  # reads an activation: shared as it is
    far = activation
    for _ in range(_NEAR + 1):  # the block between the forward and its recomputation
        far = graph.call_function(aten.neg.default, (far,))
    recomputed = graph.call_function(aten.linear.default, (far, weight))
    recomputed.meta["custom"] = {"edgebench_recomputed": "block 0"}
    graph.output((graph.call_function(aten.add.Tensor, (recomputed, activation)),))
    for node in graph.nodes:
        node.meta["val"] = torch.empty(2, _SHARED_BYTES // 4)  # weight-sized (twice the shared limit)
    small.meta["val"] = torch.empty(_SHARED_BYTES // 4)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)

    assert weight_values_at_each_use(gm, {"b_codes", "b_scale"}) == 2  # the mul and the cast
    order = list(graph.nodes)
    first, second = forward.args[1], recomputed.args[1]
    assert first is weight and second is not weight and second.target == aten.mul.Tensor
    assert order.index(second) == order.index(recomputed) - 1 and order.index(second.args[0]) < order.index(second)
    assert second.args[0] is not weight.args[0] and second.args[0].args == (codes,) and second.args[1] is small
    assert second.meta["custom"] == second.args[0].meta["custom"] == {"edgebench_recomputed": "block 0"}
    assert len(activation.users) == 2
    gm.graph.lint()


def test_an_int8_weights_dequantisation_runs_in_xnnpack_bit_for_bit(tmp_path, monkeypatch):
    """codes -> bf16, times the bf16 scales, -> fp32 for the matmul: the bf16 product is exact in
    fp32, so the codes are widened straight to fp32 (by XNNPACK's convert) and XNNPACK
    multiplies and rounds."""
    torch.manual_seed(0)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    held, casts = _held_and_casts(tmp_path, monkeypatch, Int8AutocastMLP(), inputs)
    _bit_for_bit(held, casts)
    assert casts[1]["aten::mul"] > 0 and not held[1], (held[1], casts[1])  # e.g. the dequantisation's bf16 mul
    assert casts[4][CAST] > 0 and not held[4], (held[4], casts[4])
    assert held[0].lowering["rewrites"]["codes_widened_by_xnnpack"] > 0


def test_an_fp32_programs_int8_codes_are_widened_by_xnnpack_bit_for_bit(tmp_path, monkeypatch):
    """With no bf16 at all, an int8 weight's codes -> fp32 (the runtime's single-threaded cast)
    becomes XNNPACK's convert: the same values, no kernel call left on an int8 tensor."""
    from edgebench.methods.int8 import Int8Linear

    torch.manual_seed(0)
    model = MLP()
    model.up = Int8Linear(model.up)
    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    widened, casts = _held_and_casts(tmp_path, monkeypatch, model, inputs, rewrite="codes_widened_by_xnnpack")
    _bit_for_bit(widened, casts)
    assert widened[0].lowering["rewrites"]["codes_widened_by_xnnpack"] > 0
    assert casts[4][CAST] > 0 and not widened[4], (widened[4], casts[4])


class MaskedAttention(torch.nn.Module):
    """One causal attention under bf16 autocast, as nanoVLM's decoder masks it: -inf above the
    diagonal, the dtype's minimum added at padded keys."""

    def __init__(self, width=16):
        super().__init__()
        self.qkv, self.head = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, 10)

    def forward(self, x, keep, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = q @ k.transpose(1, 2) / 4.0
            positions = torch.arange(x.shape[1])
            scores = scores.masked_fill(positions.unsqueeze(0) > positions.unsqueeze(1), float("-inf"))
            scores = scores + (1.0 - keep[:, None, :].to(scores.dtype)) * torch.finfo(scores.dtype).min
            return torch.nn.functional.cross_entropy(self.head(torch.softmax(scores, dim=-1) @ v).flatten(0, 1),
                                                     labels)


def test_a_masked_attention_held_in_fp32_is_never_rounded_through_its_mask(tmp_path, monkeypatch):
    """The rounding overflows beyond |v| = 5.19e33: the mask's -inf and dtype minimum, and the
    scores they are added to, stay unrounded until the softmax bounds them; the program trains
    bit for bit as the one on the runtime's bf16 kernels."""
    torch.manual_seed(0)
    keep = torch.ones(2, 8, dtype=torch.long)
    keep[1, 6:] = 0
    inputs = (torch.randn(2, 8, 16), keep, torch.randint(0, 10, (16,)))
    held, casts = _held_and_casts(tmp_path, monkeypatch, MaskedAttention(), inputs)
    _bit_for_bit(held, casts)
    # left: the integer mask's cast to bf16 (not exact for every integer), and its widening
    assert held[1] == {CAST: 2} and casts[1]["aten::_softmax"] > 0, (held[1], casts[1])


def test_xnnpack_guard_refuses_a_delegate_that_captures_a_trainable_weight(monkeypatch):
    import exporters.executorch as et

    partitioner = et._xnnpack_partitioner
    monkeypatch.setattr(et, "_xnnpack_partitioner", lambda **kwargs: partitioner(dynamic_weights=False, **kwargs))
    with pytest.raises(RuntimeError, match="captured trainable parameter"):
        et.lower_training_step(MLP(), (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5])), delegate="xnnpack")


class Attention(torch.nn.Module):
    """Two pre-norm attention + MLP blocks: enough XNNPACK partitions (linear, bmm, permute,
    forward and backward) that cutting them out leaves the graph out of order. `autocast`: under
    bf16 autocast, with a tanh GELU (partitions of elementwise nodes too)."""

    def __init__(self, width=16, blocks=2, autocast=False):
        super().__init__()
        self.autocast = autocast
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "norm": torch.nn.LayerNorm(width), "qkv": torch.nn.Linear(width, 3 * width),
            "out": torch.nn.Linear(width, width), "up": torch.nn.Linear(width, 2 * width),
            "down": torch.nn.Linear(2 * width, width)}) for _ in range(blocks))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            for block in self.blocks:
                q, k, v = block["qkv"](block["norm"](x)).chunk(3, dim=-1)
                attention = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1)
                x = x + block["out"](attention @ v)
                hidden = block["up"](x)
                hidden = (torch.nn.functional.gelu(hidden, approximate="tanh") if self.autocast
                          else torch.nn.functional.silu(hidden))
                x = x + block["down"](hidden)
            return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels)


def _attention_program(path, autocast=False, **patches):
    """Lowers Attention to XNNPACK (optionally with exporters.xnnpack_lowering's patches
    replaced) and returns its `.pte` bytes and 3 SGD losses."""
    import contextlib

    import exporters.xnnpack_lowering as xl

    torch.manual_seed(0)
    inputs = (torch.randn(2, 8, 16), torch.randint(0, 10, (16,)))
    with contextlib.ExitStack() as stack:
        for name, replacement in patches.items():
            original = getattr(xl, name)
            setattr(xl, name, replacement)
            stack.callback(setattr, xl, name, original)
        lower_training_step(Attention(autocast=autocast), inputs, delegate="xnnpack").write(path)
    program, losses = TrainingProgram(str(path)), []
    for _ in range(3):
        losses.append(program.forward_backward(inputs))
        with torch.no_grad():
            for name, param in program.named_parameters().items():
                param.sub_(0.5 * program.grads[name])
    return path.read_bytes(), losses


@pytest.mark.large  # upstream's own, slow lowering beside ours (~30-70 s): CI's `-m 'arm64 or large'`
def test_fast_xnnpack_lowering_trains_like_executorchs_own(tmp_path, monkeypatch):
    import warnings

    from executorch.backends.xnnpack import xnnpack_preprocess
    from executorch.backends.xnnpack.partition.config import gemm_configs
    from executorch.exir import lowered_backend_module
    from executorch.exir.backend import backend_api

    import exporters.xnnpack_lowering as xl

    def patched():
        return (lowered_backend_module.insert_subgm,
                backend_api.create_submodule_from_nodes, backend_api._create_partitions_in_graph_module,
                backend_api._get_node_list_with_same_tag, backend_api.get_lowered_module_name,
                backend_api._maybe_duplicate_constant_nodes, backend_api.lower_all_submodules_to_backend,
                backend_api._insert_lowered_submodule, xnnpack_preprocess.XNNPACKPassManager,
                gemm_configs.get_source_partitions)

    originals = patched()
    assert xl.fast_lowering_problem() is None  # the pinned executorch is the one it was written for
    fast, fast_losses = _attention_program(tmp_path / "fast.pte")
    # The partitioning patch alone: the skipped passes change nothing in the program.
    unsorted, _ = _attention_program(tmp_path / "sorted_once.pte", fast_xnnpack_lowering=xl.linear_time_partitioning)
    # Another executorch release: ExecuTorch's own XnnpackPartitioner and lowering, no patch, a warning.
    monkeypatch.setattr(xl, "WRITTEN_FOR", "0.0.1")
    assert "written for executorch 0.0.1" in xl.fast_lowering_problem()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        own, own_losses = _attention_program(tmp_path / "own.pte")
    assert any("ExecuTorch's own XNNPACK partitioner" in str(w.message) for w in caught)
    assert fast_losses == own_losses  # same operators on the same tensors: bit for bit
    # The same matmuls delegated (none left to the runtime in either: below); the fast lowering
    # keeps the backward's nodes out of the forward's partitions (xnnpack_lowering.phase_group),
    # so it makes a few more delegate calls than ExecuTorch's own (measured 60 against 54).
    assert _delegate_calls(fast) >= _delegate_calls(own) > 2
    assert not {"aten::linear", "aten::mm", "aten::bmm"} & set(_operator_counts(own))
    assert fast_losses[-1] < fast_losses[0]
    assert unsorted == fast  # its partitions got only the passes with work (`_passes_with_work`)
    # Partitions of elementwise nodes too (a tanh GELU's, bf16 rounding): same bytes.
    fast_bf16, _ = _attention_program(tmp_path / "fast_bf16.pte", autocast=True)
    all_passes_bf16, _ = _attention_program(tmp_path / "bf16.pte", autocast=True,
                                            fast_xnnpack_lowering=xl.linear_time_partitioning)
    assert fast_bf16 == all_passes_bf16
    assert not {"aten::linear", "aten::mm", "aten::bmm"} & set(_operator_counts(fast))
    assert patched() == originals  # every patch is undone after the call


def test_a_partitions_call_goes_where_torchs_insert_subgm_puts_it():
    """linear_time_partitioning places a partition's call after its last output as torch's walk
    back from the graph's end does: the same graph, for a partition with three outputs."""
    import contextlib

    from executorch.exir import lowered_backend_module
    from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

    import exporters.xnnpack_lowering as xl

    class Branches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.linear(x)
            return y.relu() + y.sigmoid(), y * 2

    graphs = []
    for patched in (contextlib.nullcontext, xl.linear_time_partitioning):
        gm = torch.fx.symbolic_trace(Branches())
        part = [n for n in gm.graph.nodes if n.op == "call_module" or n.target in ("relu", "sigmoid")]
        sub_gm, inputs, outputs = fuse_as_graphmodule(gm, part, "fused")
        with patched():
            lowered_backend_module.insert_subgm(gm, sub_gm, inputs, outputs)
        graphs.append([n.format_node() for n in gm.graph.nodes])
    assert len(outputs) == 3
    assert graphs[1] == graphs[0]


def test_partitions_form_no_cycle_exactly_when_torch_cuts_them_all_out():
    """The one check over all partitions agrees with torch cutting them out one by one (its
    `validate_partition` before each cut) on random graphs and partitions, both outcomes seen."""
    import operator
    import random

    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    from exporters.xnnpack_lowering import partitions_form_no_cycle

    rng = random.Random(7)
    outcomes = []
    for _ in range(200):
        graph = torch.fx.Graph()
        nodes = [graph.placeholder(f"x{i}") for i in range(3)]
        for _ in range(rng.randint(4, 25)):
            nodes.append(graph.call_function(operator.add, tuple(rng.sample(nodes, 2))))
        graph.output(nodes[-1])
        tags = [f"tag{i}" for i in range(rng.randint(1, 4))]
        for node in nodes[3:]:
            if rng.random() < 0.5:
                node.meta["delegation_tag"] = rng.choice(tags)
        gm = torch.fx.GraphModule(torch.nn.Module(), graph)
        expected = partitions_form_no_cycle(gm.graph, dict.fromkeys(tags))
        partitions = [{n: None for n in nodes if n.meta.get("delegation_tag") == tag} for tag in tags]
        try:
            fuse_by_partitions(gm, [p for p in partitions if p])
            cut = True
        except AssertionError as error:
            assert "dependency cycles" in str(error)
            cut = False
        assert expected == cut
        outcomes.append(cut)
    assert 20 < sum(outcomes) < 180


def test_convert_to_linear_runs_only_where_a_matmul_is_a_linears():
    """`_matmul_to_convert`: an mm over a transposed weight, or a matmul of a linear layer's
    source partition, is work for XNNPACK's ConvertToLinearPass; a backward's mm is not."""
    from executorch.exir.dialects._ops import ops as exir_ops

    from exporters.xnnpack_lowering import _matmul_to_convert

    aten = exir_ops.edge.aten

    def graph_of(weight_transposed: bool, source=None) -> torch.fx.Graph:
        graph = torch.fx.Graph()
        x, w = graph.placeholder("x"), graph.placeholder("w")
        weight = graph.call_function(aten.permute_copy.default, (w, [1, 0])) if weight_transposed else w
        mm = graph.call_function(aten.mm.default, (x, weight))
        if source is not None:
            mm.meta["source_fn_stack"] = [("linear", source)]
        graph.output(mm)
        return graph

    assert _matmul_to_convert(graph_of(True))
    assert _matmul_to_convert(graph_of(False, source=torch.nn.functional.linear))
    assert not _matmul_to_convert(graph_of(False))
    assert not _matmul_to_convert(graph_of(False, source=torch.matmul))


def test_a_renamed_xnnpack_pass_turns_the_fast_lowering_off(monkeypatch):
    import exporters.xnnpack_lowering as xl

    monkeypatch.setattr(xl, "PARTITION_PASSES", (*xl.PARTITION_PASSES, "ConvertToLinearPassRenamed"))
    assert "lack ConvertToLinearPassRenamed" in xl.fast_lowering_problem()


@pytest.mark.parametrize("delegate, autocast, update", [("xnnpack", False, None), ("xnnpack", True, None),
                                                       (None, False, None), ("xnnpack", False, "adamw")])
def test_lowering_speedups_leave_the_program_byte_for_byte(monkeypatch, delegate, autocast, update):
    """exporters.idle_passes (passes skipped where idle, to_edge's re-traces as one),
    exporters.signature_lookups (signature mappings built once per phase),
    exporters.greedy_memory_plan, exporters.lookups_once, exporters.serialise_in_place and tracing without stack traces
    change not one byte of the
    program: fp32 and bf16, XNNPACK and the runtime's kernels, and an AdamW written into the
    program (its moments are mutable buffers, which memory planning and emission look up)."""
    import contextlib

    from executorch.exir.passes import MemoryPlanningPass

    import exporters.executorch as et
    from exporters.et_methods import write_update

    torch.manual_seed(0)
    inputs = (torch.randn(2, 8, 16), torch.randint(0, 10, (16,)))
    model = Attention(autocast=autocast)
    rewrite = (lambda ep: write_update(ep, update)) if update else None
    fast = et.lower_training_step(model, inputs, delegate=delegate, joint_rewrite=rewrite).buffer
    monkeypatch.setattr(et, "skipping_idle_passes", contextlib.nullcontext)
    monkeypatch.setattr(et, "signature_mappings_once_per_phase", contextlib.nullcontext)
    monkeypatch.setattr(et, "_without_stack_traces", contextlib.nullcontext)
    monkeypatch.setattr(et, "delegate_outputs_as_recorded", contextlib.nullcontext)
    monkeypatch.setattr(et, "graph_code_on_demand", contextlib.nullcontext)
    monkeypatch.setattr(et, "memory_planning_pass", MemoryPlanningPass)  # ExecuTorch's own algorithm
    monkeypatch.setattr(et, "lookups_once", contextlib.nullcontext)
    monkeypatch.setattr(et, "serialised_in_place", contextlib.nullcontext)
    assert et.lower_training_step(model, inputs, delegate=delegate, joint_rewrite=rewrite).buffer == fast


def test_lowering_retraces_the_whole_graph_once(monkeypatch):
    """exporters.idle_passes: to_edge's one re-trace is the only one of the whole graph. torch's
    view-to-copy re-trace is a swap in place, no other pass (ReplaceBrokenOpsWithFunctionalOpsPass
    would) re-traces for the views it left, and SpecPropPass (its plain ExportPass) makes its
    specs from the values that re-trace left."""
    from executorch.exir.pass_base import _ExportPassBase
    from torch._export.pass_base import _ExportPassBaseDeprecatedDoNotUse

    import exporters.executorch as et

    retraced = []
    for base in (_ExportPassBase, _ExportPassBaseDeprecatedDoNotUse):
        def recorded(self, graph_module, call=base.call):
            retraced.append(type(self).__name__)
            return call(self, graph_module)

        observe(monkeypatch, base, "call", recorded)
    torch.manual_seed(0)
    et.lower_training_step(Attention(), (torch.randn(2, 8, 16), torch.randint(0, 10, (16,))), delegate="xnnpack")
    assert "ToEdgeInOneRetrace" in retraced
    retraced_besides = {"ReplaceViewOpsWithViewCopyOpsPass", "ReplaceBrokenOpsWithFunctionalOpsPass", "ExportPass"}
    assert not retraced_besides & set(retraced)


@pytest.mark.large  # upstream's own, slow lowering beside ours (~30-70 s): CI's `-m 'arm64 or large'`
def test_spec_propagation_without_its_retrace_gives_the_same_micro_program(monkeypatch):
    """exporters.idle_passes: SpecPropPass's specs from the values to_edge's re-trace left, marked
    as needing grad as its re-trace marks them, are the re-trace's byte for byte, and no re-trace
    runs for them. micro's QLoRA has both kinds of changed marks: delegate outputs (a delegate
    whose input needs grad, its recorded outputs not) and the operators that read them."""
    import contextlib

    from executorch.exir.passes import spec_prop_pass

    import exporters.executorch as et
    from edgebench.backends.program import BATCH_INPUTS
    from edgebench.data.synthetic import to_torch
    from exporters import et_methods, idle_passes
    from exporters.lora import write_lora_into_model
    from exporters.manifest import ExportRequest
    from exporters.pipeline import build_training_model

    model, method, batch = build_training_model(ExportRequest(model="micro", method="qlora", text_length=16))
    write_lora_into_model(model)
    rewrite = et_methods.JointRewrite(method, None)
    rewrite.prepare_model(model)
    example = tuple(to_torch(batch)[k] for k in BATCH_INPUTS)
    retraces = []
    retrace = spec_prop_pass.ExportPass
    observe(monkeypatch, spec_prop_pass, "ExportPass", lambda: retraces.append(1) or retrace())
    fast = et.lower_training_step(model, example, delegate="xnnpack", joint_rewrite=rewrite).buffer
    assert retraces == []
    monkeypatch.setattr(idle_passes, "_spec_prop_on_known_values", contextlib.nullcontext)
    assert et.lower_training_step(model, example, delegate="xnnpack", joint_rewrite=rewrite).buffer == fast
    assert retraces == [1]


def test_values_are_marked_as_a_retrace_marks_them():
    """A delegate call whose input needs grad gives floating outputs that need it (torch's
    autograd wrapper in a re-trace), integer ones that do not; an operator reading a changed
    mark runs again on its inputs' fake values; one that writes an input refuses (only a
    re-trace knows what it does to that input's value)."""
    import operator

    from executorch.exir.delegate import executorch_call_delegate
    from torch._subclasses.fake_tensor import FakeTensorMode

    from exporters.idle_passes import _values_as_retraced

    mode = FakeTensorMode()

    def graph_with(reader):
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        x.meta["val"] = mode.from_tensor(torch.zeros(2, requires_grad=True))
        call = graph.call_function(executorch_call_delegate, (graph.get_attr("lowered"), x))
        call.meta["val"] = [mode.from_tensor(torch.zeros(2)), mode.from_tensor(torch.zeros(2, dtype=torch.int64))]
        items = [graph.call_function(operator.getitem, (call, i)) for i in range(2)]
        for item, value in zip(items, call.meta["val"]):
            item.meta["val"] = value
        read = graph.call_function(reader, (items[0],)) if reader else None
        if read is not None:
            read.meta["val"] = items[0].meta["val"]
        graph.output((read or items[0], items[1]))
        return graph, items, read

    graph, (floating, integer), _ = graph_with(None)
    assert _values_as_retraced(graph)
    assert floating.meta["val"].requires_grad and not integer.meta["val"].requires_grad
    assert _values_as_retraced(graph)  # marked as the re-trace marks them: nothing to change
    graph, _, read = graph_with(torch.ops.aten.neg.default)
    assert _values_as_retraced(graph) and read.meta["val"].requires_grad
    graph, _, _ = graph_with(torch.ops.aten.abs_.default)
    assert not _values_as_retraced(graph)


def test_each_partition_signature_is_built_from_its_own_specs(monkeypatch):
    """exporters.signature_lookups: while partitions are cut out, ExecuTorch's per-partition
    signature sees only the specs its partition's placeholders and call's users name (the byte
    for byte test above checks the program is the same), not every spec of the program."""
    from executorch.exir import lowered_backend_module

    import exporters.executorch as et

    seen = []
    build = lowered_backend_module._get_new_signature

    def recorded(program, gm, call_module_node, *args):
        seen.append((len(program.graph_signature.input_specs), len(program.graph_signature.output_specs),
                     sum(n.op == "placeholder" for n in gm.graph.nodes) + len(call_module_node.users)))
        return build(program, gm, call_module_node, *args)

    observe(monkeypatch, lowered_backend_module, "_get_new_signature", recorded)
    torch.manual_seed(0)
    lowered = et.lower_training_step(Attention(), (torch.randn(2, 8, 16), torch.randint(0, 10, (16,))),
                                     delegate="xnnpack")
    assert len(seen) > 10 and len(lowered.trainable_parameters) > 10
    assert all(inputs + outputs <= named for inputs, outputs, named in seen)
    assert any(inputs for inputs, _, _ in seen)  # a partition reading a weight gets that weight's spec


def test_spec_index_names_specs_in_the_signatures_order_across_renames():
    from torch.export.graph_signature import (
        ExportGraphSignature,
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )

    from exporters.signature_lookups import SpecIndex

    inputs = [InputSpec(InputKind.PARAMETER, TensorArgument(f"p{i}"), f"w{i}") for i in range(4)]
    outputs = [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(name), None) for name in ("a", "b", "a")]
    signature = ExportGraphSignature(input_specs=inputs, output_specs=outputs)
    index = SpecIndex(signature)
    assert index.named(["p3", "p1", "x"]).input_specs == [inputs[1], inputs[3]]
    assert index.named(["a"]).output_specs == [outputs[0], outputs[2]]
    signature.replace_all_uses("b", "getitem")  # what cutting a partition out does to its outputs
    index.renamed("b")
    assert index.named(["getitem"]).output_specs == [outputs[1]] and index.named(["b"]).output_specs == []


def test_lookups_once_give_executorchs_dim_order_computing_each_stride_once(monkeypatch):
    """exporters.lookups_once: ExecuTorch's dim order for every stride (ties kept in order, a
    zero stride refused as before), computed once per integer stride, and only inside the `with`."""
    from executorch.exir import tensor, tensor_layout

    from exporters.lookups_once import lookups_once

    computed = tensor.dim_order_from_stride
    strides = [(6, 3, 1), (1, 2, 6), (4, 3, 1, 1), (3, 1, 3, 3), (1,), (), (8, 1, 2)]
    calls = []
    observe(monkeypatch, tensor, "dim_order_from_stride", lambda stride: calls.append(stride) or computed(stride))
    with lookups_once():
        assert tensor_layout.dim_order_from_stride is tensor.dim_order_from_stride
        once = [tensor.dim_order_from_stride(list(s)) for s in strides + strides]
        with pytest.raises(RuntimeError, match="0 in strides"):
            tensor.dim_order_from_stride((2, 0))
    assert once == [computed(s) for s in strides + strides]
    assert len(calls) == len(strides) + 1
    assert tensor_layout.dim_order_from_stride is computed


def test_lookups_once_serialise_xnnpack_graphs_as_before_asking_each_class_once(monkeypatch):
    """exporters.lookups_once: ExecuTorch's dataclass JSON (what flatc reads for each XNNPACK
    partition, Union fields tagged with their type) is the same, each class's hints asked once."""
    import json
    import typing

    from executorch.backends.xnnpack.serialization import xnnpack_graph_schema as schema
    from executorch.exir._serialize._dataclass import _DataclassEncoder

    from exporters.lookups_once import lookups_once

    def node(i):
        return schema.XNode(xnode_union=schema.XNNAdd(input1_id=i, input2_id=i + 1, output_id=i + 2, flags=0),
                            debug_handle=i)

    graph = [node(i) for i in range(5)]
    asked = typing.get_type_hints
    classes = []
    monkeypatch.setattr(typing, "get_type_hints", lambda cls, *a, **k: classes.append(cls) or asked(cls, *a, **k))
    with lookups_once():
        once = json.dumps(graph, cls=_DataclassEncoder)
    assert sorted(c.__name__ for c in classes) == ["XNNAdd", "XNode"]
    assert once == json.dumps(graph, cls=_DataclassEncoder)
    assert '"xnode_union_type": "XNNAdd"' in once


def test_serialised_in_place_writes_the_same_program_without_copying_it(monkeypatch):
    """exporters.serialise_in_place: the serialiser works on the emitted program itself (the
    segments it places are recorded in it, where a copy's were), the bytes and planned memory
    as from a copy."""
    import contextlib

    import exporters.executorch as et

    inputs = (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))
    torch.manual_seed(0)
    in_place = et.lower_training_step(MLP(), inputs)
    monkeypatch.setattr(et, "serialised_in_place", contextlib.nullcontext)
    torch.manual_seed(0)
    copied = et.lower_training_step(MLP(), inputs)
    assert in_place.program.executorch_program.segments  # the weights' segment, placed in it
    assert copied.program.executorch_program.segments == []  # placed in the copy
    assert in_place.buffer == copied.buffer
    assert in_place.planned_memory_bytes == copied.planned_memory_bytes > 0


def test_delegate_outputs_as_recorded_are_what_running_the_delegate_gives(monkeypatch):
    """exporters.recorded_delegate_outputs: every delegate call of a lowered training program,
    on fake tensors, gives the outputs running its program gives (container, shapes, strides,
    dtypes, requires_grad), without running it; on real tensors the program runs."""
    import importlib

    from executorch.exir.delegate import executorch_call_delegate
    from torch._guards import detect_fake_mode
    from torch.export.experimental import _export_forward_backward

    import exporters.executorch as et
    from exporters.recorded_delegate_outputs import _KERNELS, delegate_outputs_as_recorded, recorded_outputs

    torch.manual_seed(0)
    model, inputs = Attention(), (torch.randn(2, 8, 16), torch.randint(0, 10, (16,)))
    joint = _export_forward_backward(torch.export.export(model, inputs))
    program = et._lower_to_xnnpack(et._already_decomposed(joint), et._edge_config())[0].exported_program()
    calls = [(getattr(program.graph_module, n.args[0].target), tuple(arg.meta["val"] for arg in n.args[1:]))
             for n in program.graph.nodes if getattr(n.target, "__name__", "") == "executorch_call_delegate"]
    assert len(calls) > 2

    def outputs_of_every_call():
        described = []
        for lowered_module, fakes in calls:
            with detect_fake_mode(fakes):
                outputs = executorch_call_delegate(lowered_module, *fakes)
            described.append((type(outputs), [(t.shape, t.stride(), t.dtype, t.requires_grad) for t in outputs]))
        return described

    kernels = importlib.import_module(_KERNELS)
    run, ran = kernels.call_delegate_cpu, []
    observe(monkeypatch, kernels, "call_delegate_cpu", lambda *args: ran.append(args) or run(*args))
    as_run = outputs_of_every_call()
    assert len(ran) == len(calls)
    with delegate_outputs_as_recorded():
        assert outputs_of_every_call() == as_run
    assert len(ran) == len(calls)  # not run again
    lowered_module, fakes = calls[0]
    assert recorded_outputs(lowered_module, tuple(torch.zeros(f.shape, dtype=f.dtype) for f in fakes)) is None


@pytest.mark.parametrize("autocast, adapter_dtype", [(False, torch.float32), (True, torch.float32),
                                                    (False, torch.bfloat16)])
def test_lora_written_into_the_model_lowers_to_peft_s_program(autocast, adapter_dtype):
    """exporters.lora.LoRALinear (what the ExecuTorch export traces, sooner than peft's layer)
    lowers to the program peft's layer lowers to, byte for byte: fp32, under bf16 autocast, and
    with adapters in another dtype than their input (peft's casts)."""
    import copy

    from peft import LoraConfig, inject_adapter_in_model

    from exporters.lora import write_lora_into_model

    torch.manual_seed(0)
    inputs = (torch.randn(2, 8, 16), torch.randint(0, 10, (16,)))
    peft_model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["qkv", "up"]),
                                         Attention(autocast=autocast))
    for name, param in peft_model.named_parameters():
        param.requires_grad = ".lora_" in name
        if ".lora_" in name:
            param.data = param.data.to(adapter_dtype)
    written = copy.deepcopy(peft_model)
    assert write_lora_into_model(written) == 4
    programs = [lower_training_step(m, inputs, delegate="xnnpack").buffer
                for m in (peft_model, written)]
    assert programs[0] == programs[1]


def test_graph_code_on_demand_generates_a_graph_modules_code_when_first_called():
    """exporters.graph_code_on_demand: inside the `with`, an exported program's graph module,
    and a subgraph lifted as a module (each partition cut out), have no code yet and generate it
    when called (the right result); outside, torch's as before."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.passes.utils.common import lift_subgraph_as_module

    from exporters.graph_code_on_demand import graph_code_on_demand

    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    traced = torch.fx.symbolic_trace(model)
    with graph_code_on_demand():
        program = torch.export.export(model, (x,))
        lifted, _ = lift_subgraph_as_module(traced, traced.graph)
        for module in (program.graph_module, lifted):
            assert isinstance(module, _LazyGraphModule) and module._needs_recompile()
    assert torch.equal(program.module()(x), model(x)) and torch.equal(lifted(x), model(x))
    assert not isinstance(torch.export.export(model, (x,)).graph_module, _LazyGraphModule)
    assert not isinstance(lift_subgraph_as_module(traced, traced.graph)[0], _LazyGraphModule)


def test_constants_shared_between_partitions_are_duplicated_as_executorch_does():
    """linear_time_partitioning looks for a tag's constants among the placeholders alone: a
    buffer two partitions read is copied for the other partition as by ExecuTorch's own walk."""
    from executorch.exir.backend import backend_api, utils

    import exporters.xnnpack_lowering as xl

    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.randn(4, 4))

        def forward(self, x):
            return x @ self.w, (x + 1) @ self.w

    def duplicated(duplicate, tag):
        program = torch.export.export(Shared(), (torch.randn(2, 4),))
        placeholder = program.graph.find_nodes(op="placeholder")[0]
        placeholder.meta["delegation_tag"] = "a"
        for node, node_tag in zip([n for n in program.graph.nodes if n.target == torch.ops.aten.mm.default], "ab"):
            node.meta["delegation_tag"] = node_tag
        duplicate(program, tag)
        return [(n.name, n.meta.get("delegation_tag")) for n in program.graph.find_nodes(op="placeholder")]

    with xl.linear_time_partitioning():
        looked_up = {tag: duplicated(backend_api._maybe_duplicate_constant_nodes, tag) for tag in "ab"}
    walked = {tag: duplicated(utils._maybe_duplicate_constant_nodes, tag) for tag in "ab"}
    assert looked_up == walked
    assert len(walked["a"]) == len(walked["b"]) + 1  # the buffer copied for tag b's reader


def test_counted_debug_handles_are_executorchs_own(monkeypatch):
    """exporters.xnnpack_lowering.debug_handles_counted gives each delegate call the debug handle
    ExecuTorch's walk over the whole program gives it (the largest live one, plus one)."""
    import contextlib

    import exporters.executorch as et
    import exporters.xnnpack_lowering as xl

    torch.manual_seed(0)
    model, inputs = Attention(), (torch.randn(2, 8, 16), torch.randint(0, 10, (16,)))

    def delegate_handles():
        edge, _ = et._lower_to_xnnpack(torch.export.export(model, inputs), et._edge_config())
        return [n.meta["debug_handle"] for n in edge.exported_program().graph.nodes
                if getattr(n.target, "__name__", "") == "executorch_call_delegate"]

    counted = delegate_handles()
    monkeypatch.setattr(xl, "debug_handles_counted", contextlib.nullcontext)
    assert len(counted) > 2
    assert counted == delegate_handles()


def test_signature_mappings_are_built_once_inside_a_phase_only(monkeypatch):
    """exporters.signature_lookups: inside a read-only phase a mapping is built once and served
    again; outside one torch builds it at each access; afterwards torch's property is back."""
    from types import SimpleNamespace

    from torch.export.graph_signature import ExportGraphSignature

    from exporters import signature_lookups, upstream

    signature = torch.export.export(MLP(), (torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 5]))).graph_signature
    original = vars(ExportGraphSignature)["inputs_to_buffers"]

    def read_twice():
        return [(getattr(signature, name), getattr(signature, name)) for name in signature_lookups.MAPPINGS]

    def rename_an_input_between_reads():
        before = signature.inputs_to_parameters, signature.inputs_to_buffers
        parameter = next(iter(before[0]))
        signature.replace_all_uses(parameter, "renamed")
        return before, (signature.inputs_to_parameters, signature.inputs_to_buffers), parameter

    phase = SimpleNamespace(read_twice=read_twice, rename_an_input_between_reads=rename_an_input_between_reads)
    for name, function in vars(phase).items():  # this test's phases, registered as upstream's are
        target = upstream.target_of(phase, name)
        monkeypatch.setitem(upstream.REPLACEMENTS, target,
                            upstream.Replacement(target, upstream.fingerprint(function), "this test's phase"))
    monkeypatch.setattr(signature_lookups, "_phases", lambda: [
        (phase, "read_twice", signature_lookups.MAPPINGS),
        (phase, "rename_an_input_between_reads", signature_lookups.INPUT_MAPPINGS)])
    with signature_lookups.signature_mappings_once_per_phase():
        inside, outside = phase.read_twice(), read_twice()
        (parameters, buffers), (renamed_parameters, same_buffers), parameter = phase.rename_an_input_between_reads()
    assert all(a is b for a, b in inside)
    assert all(a is not b and a == b for a, b in outside)
    assert [a for a, _ in inside] == [a for a, _ in outside]  # built outside a phase, as torch does
    # a rename drops the mappings that held the old name, only those
    assert parameter in parameters and "renamed" in renamed_parameters and parameter not in renamed_parameters
    assert same_buffers is buffers
    assert vars(ExportGraphSignature)["inputs_to_buffers"] is original


def test_greedy_same_plan_is_executorchs_greedy_plan(monkeypatch):
    """exporters.greedy_memory_plan: the same memory ids, objects and offsets for every tensor
    and the same buffer sizes as ExecuTorch's greedy, over tensors of three dtypes whose
    lifetimes meet and miss each other, in two memory ids, some of them views of another's
    storage; and the memory planning pass runs it through ExecuTorch's public option (its own
    greedy with another executorch release)."""
    import copy
    import random
    from types import SimpleNamespace

    from executorch.exir import memory_planning as plan
    from executorch.exir.tensor import TensorSpec

    from exporters import greedy_memory_plan
    from exporters.greedy_memory_plan import greedy_same_plan

    rng = random.Random(0)
    specs = []
    for _ in range(600):
        spec = TensorSpec(rng.choice([torch.float32, torch.bfloat16, torch.int64]),
                          torch.Size([rng.choice([1, 3, 64]), rng.randint(1, 300)]))
        first = rng.randint(0, 300)
        spec.lifetime = [first, first + rng.choice([0, 1, 5, 50, 300])]
        spec.mem_id = rng.choice([None, None, 2])
        specs.append(spec)
    for view, base in zip(specs[:30], specs[30:60]):
        if base.nbytes() >= view.nbytes():
            view.storage_base, view.mem_id, view.lifetime = base, base.mem_id, list(base.lifetime)

    def planned(algorithm, group):
        result = algorithm(16, group, SimpleNamespace(), None, 0)
        return result.bufsizes, [vars(result.spec_dict[spec]) for spec in group]

    ours = planned(greedy_same_plan, copy.deepcopy(specs))
    assert ours == planned(plan.greedy, specs)
    assert len({allocation["mem_obj_id"] for allocation in ours[1]}) > 10  # objects shared, not one each

    # reached through ExecuTorch's public option, with the release it was read from only
    planning = greedy_memory_plan.memory_planning_pass(alloc_graph_input=False)
    assert planning.memory_planning_algo.algo_list == [greedy_same_plan] and not planning.alloc_graph_input
    assert planning.memory_planning_algo(16, copy.deepcopy(specs), SimpleNamespace(), None, 0) == ours[0]
    monkeypatch.setattr(greedy_memory_plan, "installed_executorch", lambda: "0.0")
    assert greedy_memory_plan.memory_planning_pass().memory_planning_algo.algo_list == [plan.greedy]


def test_idle_pass_rules_see_the_work_their_passes_do():
    """Each skipped pass still runs where its own rule finds work: `aten.t`, a view operator,
    a symbolic size, a reduction whose input is not in the default dim order."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
        ReplaceBrokenOpsWithFunctionalOpsPass,
    )
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass

    from exporters import idle_passes

    rules = idle_passes._idle_pass_rules()

    def graph_of(target, value):
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        x.meta["val"] = value
        y = graph.call_function(target, (x, [1]) if "dim" in str(target) else (x,))
        y.meta["val"] = value
        graph.output(y)
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    square, aten = torch.zeros(2, 2), torch.ops.aten
    assert rules[NormalizeTransposePass](graph_of(aten.t.default, square))
    assert not rules[NormalizeTransposePass](graph_of(aten.permute_copy.default, square))
    assert rules[ReplaceBrokenOpsWithFunctionalOpsPass](graph_of(aten.alias.default, square))
    assert not rules[ReplaceBrokenOpsWithFunctionalOpsPass](graph_of(aten.alias_copy.default, square))
    channels_last = torch.zeros(1, 2, 3, 3).to(memory_format=torch.channels_last)
    legalize = rules[LegalizePortableDimOrderPass]
    assert legalize(graph_of(exir_ops.edge.aten.sum.dim_IntList, channels_last))
    assert not legalize(graph_of(exir_ops.edge.aten.sum.dim_IntList, channels_last.contiguous()))
    assert not legalize(graph_of(exir_ops.edge.aten.relu.default, channels_last))  # not one of its operators

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    x = torch.zeros(4, 3)
    static = torch.export.export(Double(), (x,)).graph_module
    dynamic = torch.export.export(Double(), (x,), dynamic_shapes=({0: torch.export.Dim("n")},)).graph_module
    assert not rules[SymToTensorPass](static)
    assert rules[SymToTensorPass](dynamic)
    with idle_passes.skipping_idle_passes():
        assert "call" in vars(NormalizeTransposePass)
    assert "call" not in vars(NormalizeTransposePass)  # ExportPass's own again


def test_sort_in_place_orders_inputs_first_and_keeps_the_nodes():
    from exporters.xnnpack_lowering import sort_in_place

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.neg, (x,))
    b = graph.call_function(torch.exp, (a,))
    graph.output(b)
    a.prepend(b)  # b before its input a, as a partition cut out without a re-sort leaves it
    with pytest.raises(RuntimeError):
        graph.lint()
    before = set(graph.nodes)
    sort_in_place(graph)
    assert list(graph.nodes)[:3] == [x, a, b] and set(graph.nodes) == before
    graph.lint()


def test_a_recomputation_is_never_partitioned_with_the_forward():
    """A forward matmul and the copy of it a recomputation reads share a level (both read the
    same kept input); the group keeps them in separate partitions, and what the copy feeds
    (matched, same group) stays with it, so no partition waits on another one's output."""
    from exporters.et_methods import RECOMPUTED, recomputation_group
    from exporters.xnnpack_lowering import partition_by_level

    graph = torch.fx.Graph()
    x, w = graph.call_function(torch.relu, (graph.placeholder("x"),)), graph.placeholder("w")
    forward = graph.call_function(torch.mm, (x, w))
    kept = graph.call_function(torch.relu, (forward,))
    copy = graph.call_function(torch.mm, (x, w))  # recomputed for the backward
    copy.meta["custom"] = {RECOMPUTED: "block 0"}
    copied_next = graph.call_function(torch.mm, (copy, w))
    copied_next.meta["custom"] = {RECOMPUTED: "block 0"}
    backward = graph.call_function(torch.mm, (kept, copied_next))
    graph.output(backward)
    matched = {forward, copy, copied_next, backward}
    assert partition_by_level(graph, matched) == [[forward, copy, copied_next], [backward]]  # joined
    parts = partition_by_level(graph, matched, recomputation_group)
    assert sorted(map(len, parts)) == [1, 1, 2] and [copy, copied_next] in parts
    assert [forward] in parts and [backward] in parts


def test_a_weights_rounding_joins_the_matmul_that_reads_it():
    """A bf16 rounding computed from a weight alone (level 1) is partitioned with its matmul, not
    with every other weight's in one delegate call at the start that keeps all of them alive."""
    from exporters.xnnpack_lowering import partition_by_level

    graph = torch.fx.Graph()
    x = graph.call_function(torch.relu, (graph.placeholder("x"),))
    w0, w1, w2 = graph.placeholder("w0"), graph.placeholder("w1"), graph.placeholder("w2")
    earlier = graph.call_function(torch.mm, (x, w0))  # level 1
    between = graph.call_function(torch.relu, (earlier,))
    rounded1 = graph.call_function(torch.mul, (w1, 65537.0))  # level 1 by its inputs
    first = graph.call_function(torch.mm, (between, rounded1))  # level 2
    hidden = graph.call_function(torch.relu, (first,))
    rounded2 = graph.call_function(torch.mul, (w2, 65537.0))
    other = graph.call_function(torch.neg, (rounded2,))  # rounded2 also read outside XNNPACK
    second = graph.call_function(torch.mm, (hidden, rounded2))  # level 3
    graph.output((second, other))
    parts = partition_by_level(graph, {earlier, rounded1, first, rounded2, second},
                               weights=frozenset({"w0", "w1", "w2"}))
    # rounded1 joins first; rounded2 stays at level 1 (neg reads it), with the earlier matmul.
    assert parts == [[earlier, rounded2], [rounded1, first], [second]]


def test_a_backwards_elementwise_chain_over_forward_values_joins_the_backward():
    """A gradient's elementwise chain computed from forward values alone (a SiLU's `sigmoid(f)`,
    then `s * f`) has the forward's level by its inputs; it runs with the backward node that
    reads it, not in the forward's call, whose outputs would live until the backward."""
    from exporters.xnnpack_lowering import partition_by_level

    graph = torch.fx.Graph()
    x, w = graph.call_function(torch.relu, (graph.placeholder("x"),)), graph.placeholder("w")
    forward = graph.call_function(torch.mm, (x, w))  # level 1
    gradient = graph.call_function(torch.relu, (graph.call_function(torch.relu, (forward,)),))  # the backward
    sigmoid = graph.call_function(torch.sigmoid, (forward,))  # level 1 by its input
    product = graph.call_function(torch.mul, (sigmoid, forward))
    backward = graph.call_function(torch.mul, (gradient, product))  # level 2
    graph.output(backward)
    matched = {forward, sigmoid, product, backward}
    assert partition_by_level(graph, matched) == [[forward, sigmoid, product], [backward]]
    elementwise = {sigmoid, product, backward}
    assert partition_by_level(graph, matched, elementwise=elementwise.__contains__) == [
        [forward], [sigmoid, product, backward]]


def test_a_read_placed_after_an_in_program_update_is_found():
    """A delegate call that reads a weight after its copy_ would train on the updated weight:
    the lowering refuses such a program (exporters.executorch.updates_before_reads)."""
    from exporters.executorch import updates_before_reads

    graph = torch.fx.Graph()
    weight, x = graph.placeholder("weight"), graph.placeholder("x")
    forward = graph.call_function(torch.ops.aten.mm.default, (x, weight))
    new = graph.call_function(torch.ops.aten.add.Tensor, (weight, forward))
    backward = graph.call_function(torch.ops.aten.mm.default, (forward, weight))
    update = graph.call_function(torch.ops.aten.copy_.default, (weight, new))
    graph.output((backward, weight))
    assert updates_before_reads(graph) == []
    update.append(backward)  # the backward's read now runs after the update
    graph.lint()
    assert updates_before_reads(graph) == ["weight"]


def test_profile_flag_needs_the_executorch_backend():
    from click.testing import CliRunner

    from edgebench.cli import cli

    out = CliRunner().invoke(cli, ["export", "--backend", "onnxruntime", "--profile", "1"])
    assert out.exit_code == 2
    assert "--profile" in out.output and "executorch" in out.output


def test_a_backward_node_never_joins_a_forward_partition():
    """A backward node reading forward values alone (a transpose of a saved value) has a forward
    node's level; `phase_group` gives the nodes after the loss their own group, so the forward's
    call does not compute it and keep its result to the backward."""
    from exporters.xnnpack_lowering import partition_by_level, phase_group

    graph = torch.fx.Graph()
    x, w = graph.call_function(torch.relu, (graph.placeholder("x"),)), graph.placeholder("w")
    forward = graph.call_function(torch.mm, (x, w))  # level 1
    loss = graph.call_function(torch.sum, (forward,))
    saved_t = graph.call_function(torch.t, (x,))  # the backward's, level 1 by its input
    backward = graph.call_function(torch.mm, (saved_t, forward))
    graph.output((loss, backward))
    matched = {forward, saved_t, backward}
    assert any(forward in p and saved_t in p for p in partition_by_level(graph, matched))  # joined without it
    parts = partition_by_level(graph, matched, phase_group(graph))
    assert [forward] in parts and all(forward not in p or len(p) == 1 for p in parts)
    assert any(saved_t in p for p in parts if forward not in p)
