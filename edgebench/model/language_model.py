"""The decoder: a SmolLM2-style (Llama) language model over embeddings.

Names follow nanoVLM's models/language_model.py, so its checkpoints load strictly.
Written to lower to ExecuTorch (torch.export strict) and ONNX: attention is explicit
matmul + softmax with a causal mask built from `arange`, rotary embeddings are
real-valued (rotate-half), and no Python branch depends on tensor values. Padding is
masked as nanoVLM does it: `attention_mask` [B, T] (1 attend, 0 pad) adds the dtype's
minimum to padded keys, so a row of padding stays finite.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from edgebench.model.config import ConfigError, VLMConfig
from edgebench.model.vision_transformer import dropout, dropout_p


class RMSNorm(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(cfg.lm_hidden_dim))
        self.eps = cfg.lm_rms_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions 0..T-1 (real arithmetic; `inv_freq` is saved, as in nanoVLM).

    nanoVLM rescales frequencies past lm_max_position_embeddings; training sequences
    here never get there (T is checked against it), so the branch is left out.
    """

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        dim = cfg.lm_hidden_dim // cfg.lm_n_heads
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", 1.0 / (cfg.lm_re_base ** (torch.arange(0, dim, 2).float() / dim)))
        self.attention_scaling = cfg.lm_attn_scaling

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(seq_len, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        freqs = positions.unsqueeze(1) * self.inv_freq.unsqueeze(0)  # [T, dim/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [T, dim]
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LanguageModelGroupedQueryAttention(nn.Module):
    """Causal attention where groups of query heads share one key/value head."""

    flash_attention = False  # as ViTMultiHeadAttention's: set by edgebench.methods' flash-attn

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.n_heads = cfg.lm_n_heads
        self.n_kv_heads = cfg.lm_n_kv_heads
        self.head_dim = cfg.lm_hidden_dim // cfg.lm_n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(cfg.lm_hidden_dim, cfg.lm_hidden_dim, bias=False)
        self.k_proj = nn.Linear(cfg.lm_hidden_dim, self.head_dim * self.n_kv_heads, bias=False)
        self.v_proj = nn.Linear(cfg.lm_hidden_dim, self.head_dim * self.n_kv_heads, bias=False)
        self.out_proj = nn.Linear(cfg.lm_hidden_dim, cfg.lm_hidden_dim, bias=False)
        self.attn_dropout = dropout(cfg.lm_dropout)
        self.resid_dropout = dropout(cfg.lm_dropout)

    def _expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        # repeat_interleave over heads, as expand + reshape (exports to every runtime).
        B, H, T, D = t.shape
        groups = self.n_heads // self.n_kv_heads
        return t.unsqueeze(2).expand(B, H, groups, T, D).reshape(B, H * groups, T, D)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        positions = torch.arange(T, device=x.device)
        future = positions.unsqueeze(0) > positions.unsqueeze(1)  # [T, T], True above the diagonal
        if self.flash_attention:
            mask = self._mask(future, attention_mask, q.dtype)
            y = F.scaled_dot_product_attention(q, self._expand_kv(k), self._expand_kv(v), mask,
                                               dropout_p(self.attn_dropout, self.training), is_causal=mask is None)
        else:
            scores = torch.matmul(q, self._expand_kv(k).transpose(-2, -1)) * self.scale
            scores = scores.masked_fill(future, float("-inf"))
            if attention_mask is not None:  # padded keys get the dtype's minimum, as in nanoVLM
                pad = 1.0 - attention_mask[:, None, None, :].to(scores.dtype)
                scores = scores + pad * torch.finfo(scores.dtype).min
            y = torch.matmul(self.attn_dropout(F.softmax(scores, dim=-1)), self._expand_kv(v))
        return self.resid_dropout(self.out_proj(y.transpose(1, 2).reshape(B, T, C)))

    @staticmethod
    def _mask(future: torch.Tensor, attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        """The explicit path's masking as one additive [B, 1, T, T] mask (None: causal only, which
        the fused kernel applies itself): -inf on the future, the dtype's minimum on padded keys.
        Eager only (the flash path is never exported), so it may look at the values: without
        padding no mask is made, and none is kept for backward in every block."""
        if attention_mask is None or bool(attention_mask.all()):
            return None
        pad = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        return pad.masked_fill(future, float("-inf"))


class LanguageModelMLP(nn.Module):
    """SiLU-gated MLP."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.lm_hidden_dim, cfg.lm_inter_dim, bias=False)
        self.up_proj = nn.Linear(cfg.lm_hidden_dim, cfg.lm_inter_dim, bias=False)
        self.down_proj = nn.Linear(cfg.lm_inter_dim, cfg.lm_hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LanguageModelBlock(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.mlp = LanguageModelMLP(cfg)
        self.attn = LanguageModelGroupedQueryAttention(cfg)
        self.norm1 = RMSNorm(cfg)
        self.norm2 = RMSNorm(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, attention_mask)
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    """Decoder over embeddings; `head` shares `token_embedding`'s weight when tied.

    Tied before initialising, as nanoVLM does: the shared tensor ends with the head's
    draw, so the same seed gives nanoVLM's weights.
    """

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.lm_tie_weights = cfg.lm_tie_weights
        self.max_positions = cfg.lm_max_position_embeddings
        self.token_embedding = nn.Embedding(cfg.lm_vocab_size, cfg.lm_hidden_dim)
        self.rotary_embd = RotaryEmbedding(cfg)
        self.blocks = nn.ModuleList([LanguageModelBlock(cfg) for _ in range(cfg.lm_n_blocks)])
        self.norm = RMSNorm(cfg)
        self.head = nn.Linear(cfg.lm_hidden_dim, cfg.lm_vocab_size, bias=False)
        self.tie_weights()
        self.apply(_init_weights)

    def tie_weights(self) -> None:
        """Share the embedding with the head (again after loading weights with assign=True)."""
        if self.lm_tie_weights:
            self.head.weight = self.token_embedding.weight

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, hidden] embeddings (and optional [B, T] padding mask) -> [B, T, hidden] after the final norm."""
        if x.size(1) > self.max_positions:
            raise ConfigError(f"a sequence of {x.size(1)} positions (the text and the image tokens) exceeds the "
                              f"model's lm_max_position_embeddings {self.max_positions}; use a shorter --text-length "
                              "(or a smaller image)")
        cos, sin = self.rotary_embd(x.size(1))
        for block in self.blocks:
            x = block(x, cos, sin, attention_mask)
        return self.norm(x)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)
