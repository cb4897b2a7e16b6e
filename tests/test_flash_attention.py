"""flash-attn (issue 56): attention through torch's fused kernel gives the explicit matmul +
softmax's loss and gradients (padding masked alike), keeps no [heads, T, T] scores, and is
refused where it cannot follow. On tiny in main's layout: 2x2 tiles + a global view, batch 2."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgebench.backends.support import unsupported_reason
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import MethodError, make_trainer, memory, parse_method
from edgebench.model.config import get_config
from edgebench.model.language_model import LanguageModelGroupedQueryAttention
from edgebench.model.vision_language_model import VisionLanguageModel
from edgebench.model.vision_transformer import ViTMultiHeadAttention

CFG = dataclasses.replace(get_config("tiny"), image_splitting=True, max_img_size=128, extra_token_amount=66).validate()
BATCH = to_torch(next(synthetic_batches(CFG, 2, 32, 0)))


def _trainer(method: str):
    torch.manual_seed(0)
    return make_trainer(method, VisionLanguageModel(CFG))


def _loss_and_grads(method: str, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trainer = _trainer(method)
    loss = trainer.loss(batch)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in trainer.model.named_parameters() if p.requires_grad}


def _padded(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch with its second sample's last 5 positions padding (attention_mask 0)."""
    mask = torch.ones_like(batch["input_ids"])
    mask[1, -5:] = 0
    return {**batch, "attention_mask": mask}


@pytest.mark.parametrize("method, padded", [("sgd", False), ("sgd", True), ("sgd+bf16", True)])
def test_same_loss_and_gradients(method, padded):
    batch = _padded(BATCH) if padded else BATCH
    loss, grads = _loss_and_grads(method, batch)
    flash_loss, flash_grads = _loss_and_grads(f"{method}+flash-attn", batch)
    bf16 = parse_method(method).precision == "bf16"  # the kernel sums in another order: bf16 shows it
    assert torch.allclose(flash_loss, loss, rtol=2e-3 if bf16 else 1e-5)
    assert flash_grads.keys() == grads.keys()
    assert any(n.startswith("vision_encoder.") for n in grads) and any(n.startswith("decoder.") for n in grads)
    for name, grad in grads.items():
        scale = grad.abs().max().item()
        assert (flash_grads[name] - grad).abs().max().item() <= (0.1 if bf16 else 1e-4) * scale + 1e-7, name


def test_the_knob_reaches_every_attention_and_is_off_by_default():
    def flags(method: str) -> set[bool]:
        return {m.flash_attention for m in _trainer(method).model.modules()
                if isinstance(m, (ViTMultiHeadAttention, LanguageModelGroupedQueryAttention))}

    assert flags("lora+flash-attn") == {True}
    assert flags("lora") == {False}
    assert not ViTMultiHeadAttention.flash_attention and not LanguageModelGroupedQueryAttention.flash_attention


def test_keeps_no_scores_for_backward():
    # The explicit path keeps each block's softmax ([B, heads, T, T]); the kernel a log-sum-exp a row.
    def saved_scores(method: str) -> int:
        trainer, shapes = _trainer(method), []

        def keep(t: torch.Tensor) -> torch.Tensor:
            shapes.append(t.shape)
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            trainer.loss(BATCH)
        heads = {CFG.lm_n_heads, CFG.vit_n_heads}  # not the images [N, 3, S, S] nor a padding mask
        return sum(1 for s in shapes if len(s) == 4 and s[1] in heads and s[-1] == s[-2])

    assert saved_scores("sgd") >= CFG.lm_n_blocks + CFG.vit_n_blocks
    assert saved_scores("sgd+flash-attn") == 0


def test_parses_combines_and_is_refused_where_it_cannot_follow():
    method = parse_method("qlora4+view-by-view+flash-attn")
    assert method.flash_attention and method.view_by_view and method.frozen_dtype == "int4"
    assert not parse_method("lora").flash_attention
    assert unsupported_reason(method, "eager") is None
    for backend in ("executorch", "onnxruntime"):
        reason = unsupported_reason(parse_method("lora+flash-attn"), backend)
        assert reason and "flash-attn" in reason and "--backend eager" in reason
    with pytest.raises(MethodError, match="forward-mode"):
        parse_method("forward-grad+flash-attn")


@pytest.mark.parametrize("method", ["sgd", "qlora4+view-by-view", "mezo-lora+frozen-int4+view-by-view+chunked-ce"])
def test_memory_model_predicts_less(method):
    for cfg in (CFG, get_config("nanovlm-460m")):
        plain, flash = memory.predict(cfg, method, 2, 32), memory.predict(cfg, f"{method}+flash-attn", 2, 32)
        assert flash["temporaries_bytes"] < plain["temporaries_bytes"], cfg
        assert flash["activations_bytes"] <= plain["activations_bytes"], cfg
        assert flash["peak_bytes"] <= plain["peak_bytes"], cfg
