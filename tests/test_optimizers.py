"""One descriptor per optimizer (edgebench/methods/optimizers.py): every term each table derives
from it exists and agrees, for every optimizer; a name without a descriptor is an error
everywhere a prediction or a schedule is made, never a silent default."""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import replace

import pytest
import torch

from edgebench.backends import et_optimizers
from edgebench.backends.numpy_updates import UPDATES as ORT_UPDATES
from edgebench.backends.support import EXPORT_OPTIMIZERS, unsupported_reason
from edgebench.errors import EdgebenchError
from edgebench.methods import knobs, memory, optim, steptime
from edgebench.methods.device_speed import REFERENCE
from edgebench.methods.knobs import Method, parse_method
from edgebench.methods.optimizers import (
    DECAYS,
    NANOVLM_LR_BACKBONE,
    OPTIMIZERS,
    PROGRAM_UPDATES,
    TRAINERS,
    UnknownOptimizer,
    decay_refusal,
    optimizer,
    run_weight_decay,
)
from edgebench.model.config import get_config
from edgebench.native.plan import native_reason

NAMES = list(OPTIMIZERS)
SHAPES = [("decoder.blocks.0.attn.q.weight", (64, 64)), ("decoder.blocks.0.norm.weight", (64,)),
          ("decoder.token_embedding.weight", (4096, 64)), ("MP.proj.weight", (64, 48))]


def test_the_parser_offers_exactly_the_described_optimizers():
    assert knobs.OPTIMIZERS == tuple(OPTIMIZERS)
    assert all(o.name == name for name, o in OPTIMIZERS.items())


@pytest.mark.parametrize("name", NAMES)
def test_every_term_of_an_optimizer_exists_and_agrees(name):
    o = optimizer(name)
    assert parse_method(name).optimizer == name  # a token of its own
    # building and training
    assert o.trainer in TRAINERS
    # weight decay: how the library applies it, or why none (refused wherever it is asked for)
    assert o.decay in DECAYS and bool(o.no_decay) == (o.decay == "") and o.weight_decay >= 0
    assert run_weight_decay(name, None) == o.weight_decay and run_weight_decay(name, 0.5) == 0.5
    assert (decay_refusal(name, 0.5) is None) == bool(o.decay) and decay_refusal(name, 0.0) is None
    if o.decay:
        assert all(unsupported_reason(parse_method(name), b, 0.5) == unsupported_reason(parse_method(name), b)
                   for b in ("eager", "executorch", "onnxruntime"))
    else:
        assert o.no_decay in unsupported_reason(parse_method(name), "eager", 0.5)
    assert math.isfinite(o.default_lr) and o.default_lr > 0
    assert o.fresh_lr is None or (math.isfinite(o.fresh_lr) and o.fresh_lr > 0)
    assert set(o.adapter_lr_for) <= set(knobs.TRAINABLE)
    if o.trainer in ("step", "in-backward"):
        module, _, cls = o.build.partition(":")
        assert module and cls, f"{name}: build must name module:Class"
        assert callable(getattr(importlib.import_module(module), cls))
    else:
        assert not o.build and not o.fusable
    # memory model: its state for any parameter, its library's baseline
    for param, shape in SHAPES:
        state = o.state_bytes(param, shape)
        assert isinstance(state, int) and state >= 0
    assert o.library == "" or o.library in memory.LIBRARY_BASELINE_BYTES_EST
    assert o.update_copies >= 0 and o.gradient_copies >= 1 and o.step_copies >= 0
    # step-time model
    assert o.update_passes > 0 and o.extra_forwards >= 0
    # exported backends and their update rules
    assert o.program_update in ("", *PROGRAM_UPDATES)
    if o.program_update == "adam":
        assert o.betas is not None and o.eps is not None
    assert o.onnxruntime == "" or o.onnxruntime in ORT_UPDATES  # the ORT backend applies it
    assert (name in EXPORT_OPTIMIZERS["executorch"]) == (not o.executorch_refusal)
    assert (name in EXPORT_OPTIMIZERS["onnxruntime"]) == bool(o.onnxruntime)
    if o.between_calls:
        assert o.trainer == "step" and not o.executorch_refusal and not o.native
        assert et_optimizers.BETWEEN_CALLS[name].startswith(o.between_calls[0])
    if o.native:
        assert not o.executorch_refusal and not o.between_calls
    method = parse_method(name)
    assert unsupported_reason(method, "executorch") == (o.executorch_refusal or None)
    assert (native_reason(method) is None) == o.native
    # the whole method through every model that uses it
    cfg = get_config("tiny")
    predicted = memory.predict(cfg, method, 2, 16)
    assert predicted["peak_bytes"] > 0 and predicted["optimizer_state_bytes"] >= 0
    assert steptime.relative_step_time(cfg, method, 2, 16, replace(REFERENCE, bf16_matmul_cost=1.0)) > 0
    assert optim.default_lr(method, 1000, fresh_weights=False) > 0
    assert optim.default_lr(method, 1000, fresh_weights=True) > 0


def test_every_exported_backend_has_its_method_reasons_and_optimizers():
    from edgebench.backends.base import BACKENDS
    from edgebench.backends.support import _METHOD_REASONS

    exported = set(BACKENDS) - {"eager"}
    assert set(_METHOD_REASONS) == set(EXPORT_OPTIMIZERS) == exported
    assert {b for o in OPTIMIZERS.values() for b in o.exported_backends} == exported


def test_build_optimizer_passes_the_descriptors_constants():
    def built(name, weight_decay=None):
        return optim.build_optimizer(name, [{"params": [torch.zeros(4, requires_grad=True)], "lr": 0.1}],
                                     run_weight_decay(name, weight_decay)).defaults

    assert built("sgd-momentum")["momentum"] == optimizer("sgd-momentum").momentum == 0.9
    assert built("sgd")["momentum"] == 0
    adamw = built("adamw")
    assert adamw["weight_decay"] == optimizer("adamw").weight_decay == 0.01
    assert adamw["betas"] == optimizer("adamw").betas and adamw["eps"] == optimizer("adamw").eps
    assert built("adam")["weight_decay"] == 0
    assert built("adamw-8bit")["weight_decay"] == optimizer("adamw-8bit").weight_decay == 0.01  # torchao's own
    assert built("adamw", 0.0)["weight_decay"] == 0 and built("sgd", 0.5)["weight_decay"] == 0.5


def test_the_native_plan_carries_the_methods_own_constants():
    from edgebench.backends.program import BATCH_INPUTS
    from edgebench.native.plan import _lines
    from edgebench.runner.spec import RunSpec

    manifest = {"inputs": [{"name": n, "dtype": "int64", "shape": [1, 4]} for n in BATCH_INPUTS],
                "trainable_parameters": [], "model": {"trainable_elements": 222_081_600}}  # nanovlm-222m's

    def plan(method: str, weight_decay: float | None = None) -> dict[str, str]:
        spec = RunSpec(model="tiny", method=method, backend="executorch", run_id="x", weight_decay=weight_decay)
        return dict(line.split(" ", 1) for line in _lines(spec, parse_method(method), manifest, 1))

    assert float(plan("sgd-momentum")["momentum"]) == optimizer("sgd-momentum").momentum
    adamw = plan("adamw")
    assert tuple(map(float, adamw["betas"].split())) == optimizer("adamw").betas
    assert float(adamw["eps"]) == optimizer("adamw").eps
    assert adamw["weight_decay"] == f"{optimizer('adamw').weight_decay!r} decoupled"
    assert plan("adam")["weight_decay"] == "0.0 l2"
    assert plan("sgd-momentum", 0.5)["weight_decay"] == "0.5 l2" and plan("adamw", 0)["weight_decay"] == "0 decoupled"
    assert float(plan("mezo")["group_lr"].split()[0]) == optim.default_lr(parse_method("mezo"), 222_081_600,
                                                                                fresh_weights=True)  # eager's


def test_a_descriptor_without_a_cost_or_a_learning_rate_cannot_be_written():
    required = {f.name for f in dataclasses.fields(type(optimizer("sgd")))
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert {"name", "default_lr", "fresh_lr", "state_bytes", "update_passes"} <= required


def test_an_unknown_optimizer_is_an_error_everywhere_not_a_default():
    with pytest.raises(UnknownOptimizer, match="unknown optimizer 'rmsprop'; choose one of sgd"):
        optimizer("rmsprop")
    assert issubclass(UnknownOptimizer, EdgebenchError)
    stranger = Method(optimizer="rmsprop")  # a Method built around the parser
    cfg = get_config("tiny")
    for predict in (lambda: memory.predict(cfg, stranger, 1, 16),
                    lambda: steptime.step_seconds(cfg, stranger, 1, 16, REFERENCE),
                    lambda: optim.default_lr(stranger, 1, fresh_weights=False),
                    lambda: optim.build_optimizer("rmsprop", [], 0.0),
                    lambda: unsupported_reason(stranger, "onnxruntime"), lambda: native_reason(stranger)):
        with pytest.raises(UnknownOptimizer):
            predict()
    with pytest.raises(knobs.MethodError, match="unknown method part 'rmsprop'"):
        parse_method("rmsprop")


@pytest.mark.parametrize("checkpoint", [None, "/checkpoints/nanoVLM-222M"])
@pytest.mark.parametrize("preset", ["mezo", "mezo-lora", "lomo-sr", "adamw", "bitfit", "sgd"])
def test_the_exported_runtimes_take_eagers_default_lr_at_nanovlm_222m_size(preset, checkpoint):
    """ExecuTorch (pybind and native) and ONNX Runtime resolve the default lr from the program's
    trained-weight count and the run's start (a checkpoint or fresh weights) as eager does: MeZO's
    shrinks for 222m's 222M weights. Unscaled, an ExecuTorch MeZO run took 222m's loss
    10.84 -> 81.8 in three steps while eager's stayed ~11."""
    from edgebench.backends.program import program_lr
    from edgebench.methods import make_trainer
    from edgebench.methods.trainer import build_model_for
    from edgebench.runner.spec import RunSpec

    method = parse_method(preset)
    spec = RunSpec(model="nanovlm-222m", method=preset, checkpoint=checkpoint)
    with torch.device("meta"):  # shapes only: no 222m weights in memory
        trainer = make_trainer(method, build_model_for(method, "nanovlm-222m"), total_steps=4,
                               fresh_weights=spec.fresh_weights)
    trained = {"model": {"trainable_elements": sum(p.numel() for p in trainer.params)}}
    assert program_lr(None, method, trained, fresh_weights=spec.fresh_weights) == trainer.lr
    assert program_lr(3e-4, method, trained, fresh_weights=spec.fresh_weights) == 3e-4
    if preset == "mezo":
        assert trainer.lr < optim.GRAD_MODE_LR["zeroth-order"] / 50  # 222M weights: ~1/55 of the base lr


@pytest.mark.parametrize("preset,fresh,tuned", [
    ("sgd", 0.15, 5e-2), ("adamw", 1.5e-3, NANOVLM_LR_BACKBONE), ("bitfit", 1.0, optim.ADAPTER_LR),
    ("lora", 3e-3, optim.ADAPTER_LR), ("lomo-sr", 3e-2, optim.BF16_TRAINED_LR), ("mezo", 3e-4, 1e-3),
    ("mezo-lora", 1e-3, 1e-3)])
def test_an_eager_run_from_fresh_weights_and_one_from_a_checkpoint_start_at_their_own_lr(preset, fresh, tuned,
                                                                                         tmp_path):
    """Fresh weights take the lr bench/learning.py picked on tiny (mezo-lora's pick was the
    checkpoint's); a checkpoint, the recipe's. tiny trains fewer than REFERENCE_PARAMS weights,
    so MeZO's lr is not scaled down."""
    from edgebench.backends import create
    from edgebench.data.synthetic import synthetic_batches
    from edgebench.model import build_model, get_config
    from edgebench.model.checkpoint import save_pretrained
    from edgebench.runner.spec import RunSpec

    checkpoint = str(save_pretrained(build_model("tiny"), tmp_path / "tiny"))
    batch = next(synthetic_batches(get_config("tiny"), 1, 16, 0))
    for spec, lr in ((RunSpec(model="tiny", method=preset, text_length=16), fresh),
                     (RunSpec(model="tiny", method=preset, text_length=16, checkpoint=checkpoint), tuned)):
        backend = create(spec)
        backend.setup(spec, batch)
        assert backend.trainer.lr == lr, spec.checkpoint


@pytest.mark.parametrize("summed_norm", [0.4, 40.0])  # a quarter under the clip (0.1), and over it (10)
def test_program_update_divides_an_accumulated_sum_by_its_micro_batches(summed_norm):
    """accumN's program returns each gradient summed over N micro-batches; the update divides by N
    in the clip's pass (eager divides each micro-batch's loss by N), so SGD moves a weight by
    lr * min(sum / N, clipped). Over the clip the 1/N changes nothing, which is why the parity
    tests on `micro` (clipped every step) cannot see it."""
    from edgebench.backends.executorch import ProgramUpdate

    weight = torch.zeros(4)
    update = ProgramUpdate("sgd", lr=0.5, total_steps=10, weight_decay=0.0)
    update.step({"decoder.w": weight}, {"decoder.w": torch.tensor([summed_norm, 0.0, 0.0, 0.0])}, parts=4)
    expected = -0.5 * optim.lr_factor(0, 10) * min(summed_norm / 4, optim.MAX_GRAD_NORM)
    assert float(weight[0]) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("method", ["mezo", "forward-grad"])
def test_estimated_gradient_steps_take_sgds_l2_decay(method):
    """MeZO and forward gradients step by SGD on their estimate: with L2, every weight also moves
    by -lr * wd * w (MeZO's code), the estimate being the same (same seed, same weights)."""
    from edgebench.data.synthetic import synthetic_batches, to_torch
    from edgebench.methods import make_trainer
    from edgebench.methods.trainer import build_model_for
    from edgebench.model import get_config

    batch = to_torch(next(iter(synthetic_batches(get_config("tiny"), 1, 16, 0))))
    moved = {}
    for weight_decay in (0.0, 0.5):
        torch.manual_seed(0)
        trainer = make_trainer(method, build_model_for(method, "tiny"), lr=1e-3, weight_decay=weight_decay,
                               total_steps=1)
        before = [p.detach().clone() for p in trainer.params]
        trainer.step(dict(batch))
        moved[weight_decay] = [p.detach() - b for p, b in zip(trainer.params, before)]
    lr = 1e-3 * optim.lr_factor(0, 1)
    for plain, decayed, start in zip(moved[0.0], moved[0.5], before):
        torch.testing.assert_close(decayed - plain, -lr * 0.5 * start, rtol=1e-3, atol=1e-7)


def test_bf16_sgd_step_takes_torch_sgds_l2_decay():
    from edgebench.methods.bf16 import sgd_update_

    w, g = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64)
    reference = w.clone().requires_grad_()
    reference.grad = g.clone()
    torch.optim.SGD([reference], lr=0.1, weight_decay=0.5).step()
    mine = w.clone()
    sgd_update_(mine, g, 0.1, None, 0.5)  # fp32 weights: no rounding
    torch.testing.assert_close(mine, reference.detach())
    assert not torch.allclose(mine, w - 0.1 * g)  # the decay is in play


def test_a_program_with_its_update_baked_in_refuses_another_weight_decay():
    from edgebench.backends.et_optimizers import program_weight_decay
    from edgebench.backends.program import ProgramError

    fused, manifest = parse_method("fused-adamw"), {"weight_decay": 0.5}
    assert program_weight_decay(0.5, fused, manifest, "prog") == 0.5
    with pytest.raises(ProgramError, match=r"prog: its update \(written into the program\) decays weights by 0.5, "
                                           r"the run asks 0.01; export it again with --weight-decay 0.01"):
        program_weight_decay(None, fused, manifest, "prog")
    assert program_weight_decay(None, fused, {}, "prog") == 0.01  # an older export baked the default
    assert program_weight_decay(0.3, parse_method("adamw"), manifest, "prog") == 0.3  # applied between calls
