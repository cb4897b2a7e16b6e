"""Model configurations by name, with nanoVLM's own field names.

The field names are nanoVLM's (huggingface/nanoVLM, models/config.py) so that a
nanoVLM `config.json` reads straight into `VLMConfig` and ours reads back into
nanoVLM. Only the architecture fields change the model; the string fields are kept
so a saved config says where the weights came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration that edgebench cannot build (the message names the field)."""


@dataclass
class VLMConfig:
    """nanoVLM's VLMConfig: vision encoder (vit_*), decoder (lm_*), projector (mp_*)."""

    vit_hidden_dim: int = 768
    vit_inter_dim: int = 3072
    vit_patch_size: int = 16
    vit_img_size: int = 224
    vit_n_heads: int = 12
    vit_dropout: float = 0.0
    vit_n_blocks: int = 12
    vit_ln_eps: float = 1e-6
    vit_cls_flag: bool = False
    vit_model_type: str = "google/siglip-base-patch16-224"

    lm_hidden_dim: int = 576
    lm_inter_dim: int = 1536
    lm_rms_eps: float = 1e-5
    lm_re_base: int = 100000
    lm_max_position_embeddings: int = 8192
    lm_vocab_size: int = 49152
    lm_n_heads: int = 9
    lm_n_kv_heads: int = 3
    lm_dropout: float = 0.0
    lm_n_blocks: int = 30
    lm_attn_scaling: float = 1.0
    lm_eos_token_id: int = 0
    lm_max_length: int = 79
    lm_use_tokens: bool = False
    lm_tie_weights: bool = True
    lm_model_type: str = "HuggingFaceTB/SmolLM2-135M"
    lm_tokenizer: str = "HuggingFaceTB/cosmo2-tokenizer"

    mp_pixel_shuffle_factor: int = 2
    mp_image_token_length: int = 49

    vlm_load_backbone_weights: bool = True
    vlm_checkpoint_path: str = "checkpoints"

    @property
    def n_image_tokens(self) -> int:
        """Image tokens one image contributes: patches per side, pixel-shuffled."""
        side = self.vit_img_size // self.vit_patch_size // self.mp_pixel_shuffle_factor
        return side * side

    def validate(self) -> "VLMConfig":
        """Raise ConfigError naming the first field that makes the model unbuildable."""
        checks = [
            (not self.vit_cls_flag, "vit_cls_flag", "a CLS token is not supported (nanoVLM uses none)"),
            (self.vit_img_size % self.vit_patch_size == 0, "vit_img_size",
             f"{self.vit_img_size} is not a multiple of vit_patch_size {self.vit_patch_size}"),
            ((self.vit_img_size // self.vit_patch_size) % self.mp_pixel_shuffle_factor == 0,
             "mp_pixel_shuffle_factor",
             f"{self.mp_pixel_shuffle_factor} does not divide the {self.vit_img_size // self.vit_patch_size} "
             "patches per side"),
            (self.vit_hidden_dim % self.vit_n_heads == 0, "vit_n_heads",
             f"{self.vit_n_heads} does not divide vit_hidden_dim {self.vit_hidden_dim}"),
            (self.lm_hidden_dim % self.lm_n_heads == 0, "lm_n_heads",
             f"{self.lm_n_heads} does not divide lm_hidden_dim {self.lm_hidden_dim}"),
            ((self.lm_hidden_dim // self.lm_n_heads) % 2 == 0, "lm_n_heads",
             "the decoder head dimension must be even for rotary embeddings"),
            (self.lm_n_heads % self.lm_n_kv_heads == 0, "lm_n_kv_heads",
             f"{self.lm_n_kv_heads} does not divide lm_n_heads {self.lm_n_heads}"),
            (self.mp_image_token_length == self.n_image_tokens, "mp_image_token_length",
             f"{self.mp_image_token_length} but the image gives {self.n_image_tokens} tokens "
             "(use with_image_size() to change the image size)"),
        ]
        for ok, field_name, why in checks:
            if not ok:
                raise ConfigError(f"VLMConfig.{field_name}: {why}")
        return self

    def with_image_size(self, image_size: int | None) -> "VLMConfig":
        """The same model for another square image size (None: unchanged).

        The position embeddings are sized by the image, so a checkpoint only loads at
        its own size; a freshly initialised model can take any multiple of
        patch size x pixel-shuffle factor.
        """
        if image_size is None or image_size == self.vit_img_size:
            return self
        side = image_size // self.vit_patch_size // self.mp_pixel_shuffle_factor
        return dataclasses.replace(self, vit_img_size=image_size, mp_image_token_length=side * side).validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parameter_count(cfg: VLMConfig) -> int:
    """Distinct parameters of the model `cfg` builds (tied embedding/head once), without torch.

    Arithmetic on the dimensions, so a device without torch can size a model; the
    tests check it against the built model on the meta device.
    """
    vh, vi, lh, li = cfg.vit_hidden_dim, cfg.vit_inter_dim, cfg.lm_hidden_dim, cfg.lm_inter_dim
    patches = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
    vit_block = 4 * vh + (vh * 3 * vh + 3 * vh) + (vh * vh + vh) + (vh * vi + vi) + (vi * vh + vh)
    vision = (3 * cfg.vit_patch_size**2 * vh + vh) + patches * vh + cfg.vit_n_blocks * vit_block + 2 * vh
    kv = lh // cfg.lm_n_heads * cfg.lm_n_kv_heads
    lm_block = 2 * lh + 2 * lh * lh + 2 * lh * kv + 3 * lh * li
    head = 0 if cfg.lm_tie_weights else cfg.lm_vocab_size * lh
    decoder = cfg.lm_vocab_size * lh + cfg.lm_n_blocks * lm_block + lh + head
    projector = vh * cfg.mp_pixel_shuffle_factor**2 * lh
    return vision + projector + decoder


# nanoVLM fields that do not change the modules or the weights' shapes (HEAD's image
# splitting, tokenizer extras, training paths). Reading a config ignores them.
IGNORED_NANOVLM_FIELDS = frozenset({
    "lm_base_vocab_size", "extra_token_amount",  # lm_vocab_size is their sum
    "lm_chat_template", "max_img_size", "resize_to_max_side_len", "vlm_extra_tokens",
    "hf_repo_name", "lm_attention_bias",
})


def config_from_dict(data: dict[str, Any], source: str = "config") -> VLMConfig:
    """A VLMConfig from a nanoVLM config dict (v0.1 or HEAD field set).

    Unknown text/flag fields are ignored; an unknown number is refused, because it may
    be a dimension this code does not build, and silently ignoring it would load a
    different model than the checkpoint's.
    """
    known = {f.name for f in dataclasses.fields(VLMConfig)}
    fields = {k: v for k, v in data.items() if k in known}
    if "lm_vocab_size" not in data and {"lm_base_vocab_size", "extra_token_amount"} <= set(data):
        fields["lm_vocab_size"] = data["lm_base_vocab_size"] + data["extra_token_amount"]
    if "mp_image_token_length" not in data:  # v0.1 has no such field: derive it
        fields["mp_image_token_length"] = dataclasses.replace(VLMConfig(), **fields).n_image_tokens
    unknown_numbers = sorted(
        k for k, v in data.items()
        if k not in known and k not in IGNORED_NANOVLM_FIELDS
        and isinstance(v, (int, float)) and not isinstance(v, bool)
    )
    if unknown_numbers:
        raise ConfigError(
            f"{source}: unknown numeric field(s) {unknown_numbers}; they may change the "
            "architecture, which edgebench's nanoVLM does not build. Remove them if they do not."
        )
    try:
        return VLMConfig(**fields).validate()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _tiny() -> VLMConfig:
    # Small enough to train in seconds on 2 cores, yet every part of the real model.
    return VLMConfig(
        vit_hidden_dim=96, vit_inter_dim=384, vit_patch_size=8, vit_img_size=64,
        vit_n_heads=4, vit_n_blocks=2, vit_model_type="edgebench/tiny",
        lm_hidden_dim=192, lm_inter_dim=512, lm_max_position_embeddings=1024,
        lm_vocab_size=512, lm_n_heads=6, lm_n_kv_heads=2, lm_n_blocks=4,
        lm_max_length=64, lm_model_type="edgebench/tiny", lm_tokenizer="edgebench/synthetic",
        mp_pixel_shuffle_factor=2, mp_image_token_length=16,
    )


def _nanovlm_222m() -> VLMConfig:
    # nanoVLM v0.1: SigLIP-B/16-224 + SmolLM2-135M (the dataclass defaults).
    return VLMConfig()


def _nanovlm_460m() -> VLMConfig:
    # nanoVLM HEAD: SigLIP2-B/16-512 + SmolLM2-360M, pixel shuffle 4 -> 64 tokens a tile.
    return VLMConfig(
        vit_img_size=512, vit_model_type="google/siglip2-base-patch16-512",
        lm_hidden_dim=960, lm_inter_dim=2560, lm_vocab_size=49152 + 66, lm_n_heads=15,
        lm_n_kv_heads=5, lm_n_blocks=32, lm_max_length=4096,
        lm_model_type="HuggingFaceTB/SmolLM2-360M-Instruct",
        lm_tokenizer="HuggingFaceTB/SmolLM2-360M-Instruct",
        mp_pixel_shuffle_factor=4, mp_image_token_length=64,
    )


_FACTORIES = {"tiny": _tiny, "nanovlm-222m": _nanovlm_222m, "nanovlm-460m": _nanovlm_460m}
CONFIG_NAMES = tuple(_FACTORIES)


def get_config(name: str) -> VLMConfig:
    """A fresh config by name (callers may change it freely)."""
    try:
        return _FACTORIES[name]().validate()
    except KeyError:
        raise ConfigError(f"unknown model config {name!r}; known: {', '.join(CONFIG_NAMES)}") from None
