"""view-by-view (issue 56): the vision encoder and projector over one image view at a time give
the all-at-once loss and gradients, keep less, and are refused where the export would not
follow them. On tiny in main's layout: 2x2 tiles + a global view, batch 2 (10 views)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgebench.backends.support import unsupported_reason
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import make_trainer, memory, parse_method
from edgebench.model.config import get_config
from edgebench.model.vision_language_model import VisionLanguageModel

CFG = dataclasses.replace(get_config("tiny"), image_splitting=True, max_img_size=128, extra_token_amount=66).validate()
BATCH = to_torch(next(synthetic_batches(CFG, 2, 32, 0)))


def _trainer(method: str):
    torch.manual_seed(0)
    return make_trainer(method, VisionLanguageModel(CFG))


def _loss_and_grads(method: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trainer = _trainer(method)
    loss = trainer.loss(BATCH)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_batch_has_several_views_per_image():
    assert BATCH["images"].shape[0] == 2 * CFG.n_tiles == 10


@pytest.mark.parametrize("method", ["sgd", "freeze-vision", "lora", "lora+ckpt", "bitfit"])
def test_same_loss_and_gradients(method):
    loss, grads = _loss_and_grads(method)
    view_loss, view_grads = _loss_and_grads(f"{method}+view-by-view")
    assert torch.allclose(view_loss, loss, rtol=1e-5)
    assert view_grads.keys() == grads.keys()
    assert any(n.startswith(("vision_encoder.", "MP.")) for n in grads)
    for name, grad in grads.items():
        assert grad is not None and view_grads[name] is not None, name
        assert torch.allclose(view_grads[name], grad, rtol=1e-5, atol=1e-7), name


def test_adamw_steps_alike():
    plain, views = _trainer("adamw"), _trainer("adamw+view-by-view")
    for _ in range(2):
        assert views.step(BATCH) == pytest.approx(plain.step(BATCH), rel=1e-5)
    for (name, p), q in zip(plain.model.named_parameters(), views.model.parameters()):
        assert torch.allclose(q, p, rtol=1e-5, atol=1e-6), name


def test_knob_reaches_the_model_and_is_off_by_default():
    assert _trainer("lora+view-by-view").model.view_by_view is True
    assert _trainer("lora").model.view_by_view is False
    assert VisionLanguageModel.view_by_view is False


def test_mezo_forward_without_grad_is_the_same():
    trainer, plain = _trainer("mezo-lora+view-by-view"), _trainer("mezo-lora")
    with torch.no_grad():
        assert torch.allclose(trainer.loss(BATCH), plain.loss(BATCH), rtol=1e-5)


def test_parses_combines_and_is_refused_on_exported_backends():
    method = parse_method("lora+view-by-view")
    assert method.view_by_view and method.trainable == "lora"
    assert parse_method("mezo-lora+frozen-int8+view-by-view").view_by_view
    assert not parse_method("lora").view_by_view
    assert unsupported_reason(method, "eager") is None
    for backend in ("executorch", "onnxruntime"):
        reason = unsupported_reason(method, backend)
        assert reason and "view-by-view" in reason and "--backend eager" in reason


def _saved_bytes(method: str) -> int:
    """Bytes of the tensors autograd keeps for backward (weights aside)."""
    trainer = _trainer(method)
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        trainer.loss(BATCH)
    weights = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    return sum(n for ptr, n in saved.items() if ptr not in weights)


@pytest.mark.parametrize("method", ["sgd", "freeze-vision", "mezo-lora+frozen-int8", "qlora4", "adamw-ckpt"])
def test_memory_model_predicts_less(method):
    for cfg in (CFG, get_config("nanovlm-460m")):
        plain, views = memory.predict(cfg, method, 2, 32), memory.predict(cfg, f"{method}+view-by-view", 2, 32)
        assert views["temporaries_bytes"] < plain["temporaries_bytes"], cfg
        assert views["peak_bytes"] <= plain["peak_bytes"], cfg
    assert memory.predict(CFG, "sgd+view-by-view", 2, 32)["activations_bytes"] < \
        memory.predict(CFG, "sgd", 2, 32)["activations_bytes"]


def test_trained_encoder_keeps_only_each_views_input_and_output():
    # What training the encoder adds to the saved tensors: its ten views' block activations all
    # at once; view by view, recomputed in backward, only the views' inputs and outputs.
    frozen = _saved_bytes("freeze-vision")
    assert _saved_bytes("freeze-vision+view-by-view") == frozen
    assert _saved_bytes("sgd+view-by-view") - frozen < 0.05 * (_saved_bytes("sgd") - frozen)


@pytest.mark.parametrize("method", ["mezo-lora+frozen-int4", "lora-decoder+frozen-int4", "lora-decoder+frozen-int8"])
def test_frozen_encoder_block_by_block_gives_the_same_loss_and_gradients(method):
    # Block by block (every view through a block in turn, the block's weights dequantised once)
    # computes what the encoder over all views at once does.
    if method.startswith("mezo"):
        with torch.no_grad():
            plain, views = _trainer(method).loss(BATCH), _trainer(f"{method}+view-by-view").loss(BATCH)
        assert torch.allclose(views, plain, rtol=1e-5)
        return
    loss, grads = _loss_and_grads(method)
    view_loss, view_grads = _loss_and_grads(f"{method}+view-by-view")
    assert torch.allclose(view_loss, loss, rtol=1e-5)
    assert view_grads.keys() == grads.keys() and grads
    for name, grad in grads.items():  # bf16 matmuls over 1 view or 10 round apart: within 1% in norm
        assert (view_grads[name] - grad).norm() <= 1e-2 * grad.norm(), name


def test_frozen_encoder_dequantises_each_layer_once_for_all_views(monkeypatch):
    from edgebench.methods.int4 import Int4Linear, unpack

    trainer = _trainer("mezo-lora+frozen-int4+view-by-view")
    encoder_layers = [m for m in trainer.model.vision_encoder.modules() if isinstance(m, Int4Linear)]
    calls: list[int] = []

    def counted(codes, scale, dtype):
        calls.append(codes.data_ptr())
        return unpack(codes, scale, dtype)

    monkeypatch.setattr(Int4Linear, "dequantize", staticmethod(counted))
    with torch.no_grad():
        trainer.loss(BATCH)
    encoder_codes = {layer.codes.data_ptr() for layer in encoder_layers}
    assert encoder_layers and BATCH["images"].shape[0] == 10
    assert sorted(c for c in calls if c in encoder_codes) == sorted(encoder_codes)  # once each, not per view
    assert all(layer.held is None and not layer.hold for layer in encoder_layers)  # dropped after the block


@pytest.mark.parametrize("method", ["fused-adamw+ckpt+view-by-view", "fused-adamw+ckpt"])
def test_an_update_inside_backward_steps_each_recomputed_vision_weight_once(method):
    """A vision block runs once per view: its recomputation must complete each weight's gradient
    once a step (edgebench.model.recompute's `shared`), not once per view (10 updates a step)."""
    trainer = _trainer(method)
    completed: dict[str, int] = {}
    for name, param in trainer.model.named_parameters():
        if param.requires_grad and ".blocks.0." in name:
            param.register_post_accumulate_grad_hook(
                lambda _p, name=name: completed.__setitem__(name, completed.get(name, 0) + 1))
    trainer.step(BATCH)
    assert any(name.startswith("vision_encoder.") for name in completed)
    assert set(completed.values()) == {1}, completed
