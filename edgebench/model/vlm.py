"""nanoVLM: SigLIP-style vision encoder, pixel-shuffle projector, SmolLM2-style decoder.

Module and parameter names follow huggingface/nanoVLM (models/vision_transformer.py,
language_model.py, modality_projector.py, vision_language_model.py) so its
checkpoints load with strict key checking. The forward pass is written to lower to
ExecuTorch (torch.export strict) and ONNX (TorchScript exporter): attention is
explicit matmul + softmax with a causal mask built from `arange`, rotary embeddings
are real-valued (rotate-half), no Python branch depends on tensor values, and
dropout is left out (nanoVLM trains with dropout 0).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from edgebench.model.config import VLMConfig


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """softmax(q k^T * scale) v over [B, heads, T, head_dim]; causal hides later keys."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        positions = torch.arange(q.size(-2), device=q.device)
        future = positions.unsqueeze(0) > positions.unsqueeze(1)  # [T, T], True above the diagonal
        scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(F.softmax(scores, dim=-1), v)


# ---------------------------------------------------------------- vision encoder (ViT)


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
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.n_heads = cfg.vit_n_heads
        self.head_dim = cfg.vit_hidden_dim // cfg.vit_n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv_proj = nn.Linear(cfg.vit_hidden_dim, 3 * cfg.vit_hidden_dim, bias=True)
        self.out_proj = nn.Linear(cfg.vit_hidden_dim, cfg.vit_hidden_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            for t in self.qkv_proj(x).split(C, dim=2)
        )
        y = _attention(q, k, v, self.scale, causal=False)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class ViTMLP(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.vit_hidden_dim, cfg.vit_inter_dim)
        self.fc2 = nn.Linear(cfg.vit_inter_dim, cfg.vit_hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


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
        self.blocks = nn.ModuleList([ViTBlock(cfg) for _ in range(cfg.vit_n_blocks)])
        self.layer_norm = nn.LayerNorm(cfg.vit_hidden_dim, eps=cfg.vit_ln_eps)
        self.apply(_init_vit)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(images)
        for block in self.blocks:
            x = block(x)
        return self.layer_norm(x)


def _init_vit(module: nn.Module) -> None:
    # nanoVLM's initialisation (position embeddings stay torch.rand, as there).
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# ---------------------------------------------------------------- modality projector


class ModalityProjector(nn.Module):
    """Pixel shuffle (merge factor x factor neighbouring patches) then a linear map."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.scale_factor = cfg.mp_pixel_shuffle_factor
        self.side = cfg.vit_img_size // cfg.vit_patch_size
        self.proj = nn.Linear(cfg.vit_hidden_dim * self.scale_factor**2, cfg.lm_hidden_dim, bias=False)
        nn.init.normal_(self.proj.weight, mean=0.0, std=0.02)

    def pixel_shuffle(self, x: torch.Tensor) -> torch.Tensor:
        B, _, C = x.shape
        s, out = self.scale_factor, self.side // self.scale_factor
        x = x.reshape(B, out, s, out, s, C).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(B, out * out, C * s * s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.pixel_shuffle(x))


# ---------------------------------------------------------------- language decoder


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

    def _expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        # repeat_interleave over heads, as expand + reshape (exports to every runtime).
        B, H, T, D = t.shape
        groups = self.n_heads // self.n_kv_heads
        return t.unsqueeze(2).expand(B, H, groups, T, D).reshape(B, H * groups, T, D)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = _attention(q, self._expand_kv(k), self._expand_kv(v), self.scale, causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    """Decoder over embeddings; `head` shares `token_embedding`'s weight when tied."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.lm_tie_weights = cfg.lm_tie_weights
        self.max_positions = cfg.lm_max_position_embeddings
        self.token_embedding = nn.Embedding(cfg.lm_vocab_size, cfg.lm_hidden_dim)
        self.rotary_embd = RotaryEmbedding(cfg)
        self.blocks = nn.ModuleList([LanguageModelBlock(cfg) for _ in range(cfg.lm_n_blocks)])
        self.norm = RMSNorm(cfg)
        self.head = nn.Linear(cfg.lm_hidden_dim, cfg.lm_vocab_size, bias=False)
        self.apply(_init_lm)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the head (again after loading weights with assign=True)."""
        if self.lm_tie_weights:
            self.head.weight = self.token_embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, hidden] embeddings -> [B, T, hidden] normalised hidden states."""
        if x.size(1) > self.max_positions:
            raise ValueError(f"sequence of {x.size(1)} exceeds lm_max_position_embeddings {self.max_positions}")
        cos, sin = self.rotary_embd(x.size(1))
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)


def _init_lm(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)


# ---------------------------------------------------------------- the VLM


class VisionLanguageModel(nn.Module):
    """Image tokens, then text tokens, through the decoder.

    forward(input_ids [B,T] long, images [B,3,H,W] float, labels [B,T] long) -> scalar
    loss: cross-entropy where text position t predicts token t+1, labels -100 ignored.
    """

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg.validate()
        self.n_image_tokens = cfg.n_image_tokens
        self.vision_encoder = ViT(cfg)
        self.decoder = LanguageModel(cfg)
        self.MP = ModalityProjector(cfg)

    def hidden_states(self, input_ids: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """[B, n_image_tokens + T, lm_hidden_dim] after the decoder's final norm."""
        expected = (3, self.cfg.vit_img_size, self.cfg.vit_img_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(f"images must be [B, {', '.join(map(str, expected))}], got {list(images.shape)}")
        image_embd = self.MP(self.vision_encoder(images))
        token_embd = self.decoder.token_embedding(input_ids)
        return self.decoder(torch.cat((image_embd, token_embd), dim=1))

    def logits(self, input_ids: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """[B, n_image_tokens + T, vocab]."""
        return self.decoder.head(self.hidden_states(input_ids, images))

    def forward(self, input_ids: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.hidden_states(input_ids, images)
        # Only text positions that have a next token: the head never runs on image tokens.
        text_h = h[:, self.n_image_tokens : -1]
        logits = self.decoder.head(text_h)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
        )
