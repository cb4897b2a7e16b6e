"""The vision encoder: a SigLIP-style ViT (patch convolution, learned positions, pre-LN blocks).

Names follow nanoVLM's models/vision_transformer.py, so its checkpoints load strictly.
Attention is explicit matmul + softmax (lowers to ExecuTorch and ONNX alike), or torch's fused
kernel where eager training sets `flash_attention`; dropout modules exist only where
vit_dropout > 0, at nanoVLM's places.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch
import torch.nn as nn
import torch.nn.functional as F

from edgebench.model.config import VLMConfig


def dropout(p: float) -> nn.Module:
    """nn.Dropout where configured; identity otherwise (nothing extra in exported graphs)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def dropout_p(module: nn.Module, training: bool) -> float:
    """The probability a `dropout(p)` module drops with now, for a fused attention kernel."""
    return module.p if isinstance(module, nn.Dropout) and training else 0.0


class ViTPatchEmbeddings(nn.Module):
    """Non-overlapping patches by a strided convolution, plus learned positions (no CLS)."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.num_patches = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
        self.conv = nn.Conv2d(3, cfg.vit_hidden_dim, kernel_size=cfg.vit_patch_size, stride=cfg.vit_patch_size)
        self.position_embedding = nn.Parameter(torch.rand(1, self.num_patches, cfg.vit_hidden_dim))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.conv(images).flatten(2).transpose(1, 2)  # [B, patches, hidden]
        return x + self.position_embedding


class ViTMultiHeadAttention(nn.Module):
    # Eager training may set this (edgebench.methods' flash-attn): torch's scaled_dot_product_attention,
    # whose CPU kernel works through the scores in blocks and never holds [heads, T, T] at once.
    flash_attention = False

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.n_heads = cfg.vit_n_heads
        self.head_dim = cfg.vit_hidden_dim // cfg.vit_n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv_proj = nn.Linear(cfg.vit_hidden_dim, 3 * cfg.vit_hidden_dim, bias=True)
        self.out_proj = nn.Linear(cfg.vit_hidden_dim, cfg.vit_hidden_dim, bias=True)
        self.attn_dropout = dropout(cfg.vit_dropout)
        self.resid_dropout = dropout(cfg.vit_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            for t in self.qkv_proj(x).split(C, dim=2)
        )
        if self.flash_attention:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p(self.attn_dropout, self.training))
        else:
            weights = self.attn_dropout(F.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1))
            y = torch.matmul(weights, v)
        return self.resid_dropout(self.out_proj(y.transpose(1, 2).reshape(B, T, C)))


class ViTMLP(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.vit_hidden_dim, cfg.vit_inter_dim)
        self.fc2 = nn.Linear(cfg.vit_inter_dim, cfg.vit_hidden_dim)
        self.dropout = dropout(cfg.vit_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(F.gelu(self.fc1(x), approximate="tanh")))


class ViTBlock(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.vit_hidden_dim, eps=cfg.vit_ln_eps)
        self.attn = ViTMultiHeadAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.vit_hidden_dim, eps=cfg.vit_ln_eps)
        self.mlp = ViTMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.patch_embedding = ViTPatchEmbeddings(cfg)
        self.dropout = dropout(cfg.vit_dropout)
        self.blocks = nn.ModuleList([ViTBlock(cfg) for _ in range(cfg.vit_n_blocks)])
        self.layer_norm = nn.LayerNorm(cfg.vit_hidden_dim, eps=cfg.vit_ln_eps)
        self.apply(_init_weights)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.patch_embedding(images))
        for block in self.blocks:
            x = block(x)
        return self.layer_norm(x)

    def views_block_by_block(self, images: torch.Tensor,
                             block_scope: Callable[[nn.Module], AbstractContextManager[object]],
                             ) -> Iterator[torch.Tensor]:
        """forward() of each view [1, 3, S, S] of `images`, taken block-major: every view passes a
        block before the next block starts, inside `block_scope(block)` (where a frozen block may
        hold its dequantised weights for all the views). Only one view's temporaries exist at
        once, beside every view's hidden state (17 views of 1,024 x 768: 51 MiB in fp32)."""
        views = [self.dropout(self.patch_embedding(view)) for view in torch.split(images, 1)]
        for block in self.blocks:
            with block_scope(block):
                for i, view in enumerate(views):
                    views[i] = block(view)  # the view's previous state goes now
        views.reverse()
        while views:  # each view's state goes as its output is taken
            yield self.layer_norm(views.pop())


def _init_weights(module: nn.Module) -> None:
    # nanoVLM's initialisation (position embeddings stay torch.rand, as there).
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
