"""The VLM: vision encoder -> projector -> image embeddings in the decoder's sequence.

Names follow nanoVLM's models/vision_language_model.py (`vision_encoder`, `MP`,
`decoder`). Where the image goes follows the config's nanoVLM revision:

- v0.1 layout: one image [B, 3, S, S]; its tokens come before `input_ids`.
- main layout (`image_splitting`): tiles of every sample, concatenated [N, 3, S, S];
  their tokens replace the image placeholder ids in `input_ids`, in order (row-major
  over the batch, as nanoVLM fills them). The replacement is a gather, so it exports.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from edgebench.model.config import VLMConfig
from edgebench.model.language_model import LanguageModel, LanguageModelGroupedQueryAttention
from edgebench.model.loss import chunked_cross_entropy
from edgebench.model.modality_projector import ModalityProjector
from edgebench.model.recompute import recomputed, trains
from edgebench.model.vision_transformer import ViT, ViTMultiHeadAttention


def _as_it_is(block: nn.Module) -> AbstractContextManager[object]:
    return nullcontext()


class VisionLanguageModel(nn.Module):
    """forward(input_ids [B,T] long, images [N,3,S,S] float, labels [B,T] long, attention_mask=None) -> loss.

    The loss is cross-entropy where position t predicts token t+1 of `input_ids`
    (labels -100 ignored; the model shifts labels itself). `attention_mask` [B, T]
    (1 token, 0 padding) is optional: without it nothing is masked but the future.
    """

    # Eager training may set this (edgebench.methods' chunked-ce): the loss then never holds
    # [T, vocab] logits (edgebench.model.loss); exported programs keep the plain loss.
    chunked_loss = False
    # Eager training may set this too (edgebench.methods' view-by-view): the vision encoder and
    # projector then run one view at a time, so their temporaries are one view's, not all 17.
    view_by_view = False

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg.validate()
        # Hidden-state positions before input_ids (v0.1 puts the image there; main, none).
        self.n_image_tokens = 0 if cfg.image_splitting else cfg.n_image_tokens
        self.vision_encoder = ViT(cfg)
        self.decoder = LanguageModel(cfg)
        self.MP = ModalityProjector(cfg)
        # view-by-view's scope a frozen encoder block runs every view in (edgebench.methods sets one
        # that dequantises a block's int8/int4 weights once for all the views)
        self.frozen_block_scope: Callable[[nn.Module], AbstractContextManager[object]] = _as_it_is

    def _embed(self, input_ids: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        expected = (3, self.cfg.vit_img_size, self.cfg.vit_img_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"images must be [N, {', '.join(map(str, expected))}], got {list(images.shape)}")
        image_embd = self._encode_views(images) if self.view_by_view else self._encode(images)
        token_embd = self.decoder.token_embedding(input_ids)
        if not self.cfg.image_splitting:
            return torch.cat((image_embd, token_embd), dim=1)
        B, T, D = token_embd.shape
        is_image = (input_ids == self.cfg.image_token_id).reshape(-1)
        # The k-th placeholder (row-major) takes the k-th image token.
        index = (torch.cumsum(is_image.to(torch.int64), dim=0) - 1).clamp(min=0)
        placed = image_embd.reshape(-1, D).index_select(0, index).to(token_embd.dtype)
        return torch.where(is_image.unsqueeze(-1), placed, token_embd.reshape(B * T, D)).view(B, T, D)

    def _encode_views(self, images: torch.Tensor) -> torch.Tensor:
        """Encoder + projector one view at a time. A trained encoder is recomputed view by view in
        backward (checkpoint), keeping only each view's input and output instead of every view's
        activations. A frozen (or gradient-free) one keeps nothing for backward: it runs block by
        block, every view through a block in turn inside `frozen_block_scope`, so a frozen int4
        layer dequantises once for all 17 views while only one view's temporaries exist
        (nanovlm-460m at main's images: 4 views at once peaked 206 MiB above the loaded model)."""
        if torch.is_grad_enabled() and trains(self.vision_encoder):
            return torch.cat([recomputed(self._encode, view, trains=True, shared=True)  # every view uses the encoder
                              for view in torch.split(images, 1)])
        views = self.vision_encoder.views_block_by_block(images, self.frozen_block_scope)
        with self.frozen_block_scope(self.MP):  # its frozen layers too (a LoRA on them trains as ever)
            return torch.cat([self.MP(view) for view in views])

    def _encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.MP(self.vision_encoder(images))

    def hidden_states(self, input_ids: torch.Tensor, images: torch.Tensor,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, n_image_tokens + T, lm_hidden_dim] after the decoder's final norm."""
        if attention_mask is not None and self.n_image_tokens:
            image_mask = attention_mask.new_ones(attention_mask.size(0), self.n_image_tokens)
            attention_mask = torch.cat((image_mask, attention_mask), dim=1)
        return self.decoder(self._embed(input_ids, images), attention_mask)

    def logits(self, input_ids: torch.Tensor, images: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, n_image_tokens + T, vocab]."""
        return self.decoder.head(self.hidden_states(input_ids, images, attention_mask))

    def forward(self, input_ids: torch.Tensor, images: torch.Tensor, labels: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden_states(input_ids, images, attention_mask)
        # Positions of input_ids that have a next token (the head skips v0.1's image prefix).
        if self.chunked_loss:
            return chunked_cross_entropy(h[:, self.n_image_tokens : -1], self.decoder.head, labels[:, 1:])
        logits = self.decoder.head(h[:, self.n_image_tokens : -1])
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
        )


def set_flash_attention(model: nn.Module, on: bool) -> None:
    """Every attention of `model` (wrapped or not) through torch's fused kernel, or the explicit
    matmul + softmax that exported programs keep (edgebench.methods' flash-attn)."""
    for module in model.modules():
        if isinstance(module, (ViTMultiHeadAttention, LanguageModelGroupedQueryAttention)):
            module.flash_attention = on
