"""Held-out evaluation of the model being trained: one forward pass without gradients per
batch, counted raw (summed loss over answer tokens, answer tokens, samples, samples whose
every answer token is the model's argmax). A whole answer predicted token by token under
teacher forcing is exactly what greedy decoding produces, so the count is greedy decoding's
exact match, made in one pass. edgebench.figures.learning turns the counts into figures."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from edgebench.model.loss import IGNORE_INDEX
from edgebench.model.vision_language_model import VisionLanguageModel


def language_model(model: nn.Module) -> VisionLanguageModel:
    """The VisionLanguageModel inside whatever wraps it (peft adapters, checkpointing)."""
    found = next((m for m in model.modules() if isinstance(m, VisionLanguageModel)), None)
    if found is None:
        raise TypeError(f"{type(model).__name__} holds no VisionLanguageModel to evaluate")
    return found


@torch.no_grad()
def evaluate_batch(model: nn.Module, batch: dict[str, torch.Tensor],
                   autocast: contextlib.AbstractContextManager[Any] | None = None) -> dict[str, float]:
    """Raw counts of one held-out batch; the model is left in the mode it was in."""
    vlm = language_model(model)
    was_training = model.training
    model.eval()
    try:
        with autocast or contextlib.nullcontext():
            logits = vlm.logits(batch["input_ids"], batch["images"], batch.get("attention_mask"))
    finally:
        model.train(was_training)
    logits = logits[:, vlm.n_image_tokens : -1].float()  # position t predicts token t + 1
    labels = batch["labels"][:, 1:]
    answer = labels != IGNORE_INDEX
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE_INDEX,
                               reduction="sum")
    right = (logits.argmax(-1) == labels) | ~answer
    has_answer = answer.any(dim=1)
    return {"samples": int(has_answer.sum()), "tokens": int(answer.sum()), "loss_sum": float(loss_sum),
            "correct": int((right.all(dim=1) & has_answer).sum())}
