"""Model configurations by name, with nanoVLM's own field names.

The field names are nanoVLM's (huggingface/nanoVLM, models/config.py) so that a
nanoVLM `config.json` reads straight into `VLMConfig`, and `to_nanovlm_dict()` writes
exactly the fields of the nanoVLM revision whose layout the config follows, so
nanoVLM's own `VLMConfig(**json)` accepts it. Two revisions matter:

- v0.1 (commit 6ba9082e): one image resized to vit_img_size, its tokens placed
  before the text.
- main (commit 4e0c0961): the image resized so its long side is max_img_size, cut
  into vit_img_size tiles plus a global view, each tile's tokens behind a row/column
  marker token, all placed where the chat template puts the image.

`image_splitting` (edgebench's own field, never written to config.json) picks main's
layout. Only the architecture fields change the modules; the string fields are kept
so a saved config says where the weights came from.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from edgebench.errors import EdgebenchError

# The nanoVLM revisions a config.json is written for: commit and VLMConfig's fields, in order.
NANOVLM_COMMITS = {"v0.1": "6ba9082e16f1fc8c21a1f8d0c54b26c9233c8771",
                   "main": "4e0c0961846135c2217f95e54cb4c2d66eb55e42"}
_VIT_FIELDS = ("vit_hidden_dim", "vit_inter_dim", "vit_patch_size", "vit_img_size", "vit_n_heads", "vit_dropout",
               "vit_n_blocks", "vit_ln_eps", "vit_cls_flag", "vit_model_type")
_LM_HEAD = ("lm_hidden_dim", "lm_inter_dim", "lm_rms_eps", "lm_re_base", "lm_max_position_embeddings")
_LM_TAIL = ("lm_n_heads", "lm_n_kv_heads", "lm_dropout", "lm_n_blocks", "lm_attn_scaling", "lm_max_length",
            "lm_use_tokens", "lm_tie_weights", "lm_model_type", "lm_tokenizer")
NANOVLM_FIELDS = {
    "v0.1": (*_VIT_FIELDS, *_LM_HEAD, "lm_vocab_size", *_LM_TAIL, "lm_eos_token_id", "mp_pixel_shuffle_factor",
             "vlm_load_backbone_weights", "vlm_checkpoint_path"),
    "main": (*_VIT_FIELDS, *_LM_HEAD, "lm_base_vocab_size", "extra_token_amount", "lm_vocab_size", *_LM_TAIL,
             "lm_chat_template", "mp_pixel_shuffle_factor", "mp_image_token_length", "max_img_size",
             "resize_to_max_side_len", "vlm_extra_tokens", "vlm_load_backbone_weights", "vlm_checkpoint_path",
             "hf_repo_name"),
}
# Fields edgebench keeps that no nanoVLM revision has (stored beside config.json, with the
# other fields the revision lacks).
EDGEBENCH_FIELDS = ("image_splitting",)

# main's extra tokens, in the order its tokenizer appends them after the base vocabulary:
# the image placeholder, the global-view marker, then row/column markers r1c1 .. r8c8.
IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN = "<|image|>", "<|global_image|>"
MAX_GRID_SIDE = 8
EXTRA_TOKENS = {"image_token": IMAGE_TOKEN, "global_image_token": GLOBAL_IMAGE_TOKEN,
                **{f"r{i}c{j}": f"<row_{i}_col_{j}>" for i in range(1, MAX_GRID_SIDE + 1)
                   for j in range(1, MAX_GRID_SIDE + 1)}}
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                   "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|im_start|>assistant\n' }}{% endif %}")


# Type and range of every field the model is built or trained from: (type, min, max or None).
# The maxima are far past any nanoVLM (typo guards: such a model fits no edge device).
_DIM, _COUNT = (int, 1, 1 << 16), (int, 1, 1 << 12)
FIELD_RANGES: dict[str, tuple[type, float, float | None]] = {
    "vit_hidden_dim": _DIM, "vit_inter_dim": _DIM, "vit_patch_size": (int, 1, 1 << 10), "vit_img_size": _DIM,
    "vit_n_heads": _COUNT, "vit_dropout": (float, 0.0, 1.0), "vit_n_blocks": _COUNT, "vit_ln_eps": (float, 0.0, 1.0),
    "vit_cls_flag": (bool, 0, None),
    "lm_hidden_dim": _DIM, "lm_inter_dim": _DIM, "lm_rms_eps": (float, 0.0, 1.0), "lm_re_base": (float, 0.0, None),
    "lm_max_position_embeddings": (int, 1, 1 << 24), "lm_vocab_size": (int, 1, 1 << 24),
    "extra_token_amount": (int, 0, 1 << 24), "lm_n_heads": _COUNT, "lm_n_kv_heads": _COUNT,
    "lm_dropout": (float, 0.0, 1.0), "lm_n_blocks": _COUNT, "lm_attn_scaling": (float, 0.0, None),
    "lm_eos_token_id": (int, 0, 1 << 24), "lm_max_length": (int, 1, 1 << 24), "lm_use_tokens": (bool, 0, None),
    "lm_tie_weights": (bool, 0, None), "mp_pixel_shuffle_factor": (int, 1, 1 << 8),
    "mp_image_token_length": (int, 1, 1 << 20), "max_img_size": _DIM, "resize_to_max_side_len": (bool, 0, None),
    "image_splitting": (bool, 0, None),
}
POSITIVE_FLOATS = frozenset({"vit_ln_eps", "lm_rms_eps", "lm_re_base", "lm_attn_scaling"})  # 0 is out too
# config.json fields that only say where weights came from (names, paths, templates): the only ones
# a file may leave out. Every other field of its revision must be there: none takes a default.
INFORMATIONAL_FIELDS = frozenset({"vit_model_type", "lm_model_type", "lm_tokenizer", "lm_chat_template",
                                  "vlm_extra_tokens", "vlm_load_backbone_weights", "vlm_checkpoint_path",
                                  "hf_repo_name"})


class ConfigError(EdgebenchError, ValueError):
    """A configuration that edgebench cannot build (the message names the field)."""


@dataclass
class VLMConfig:
    """nanoVLM's VLMConfig: vision encoder (vit_*), decoder (lm_*), projector (mp_*), image splitting."""

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
    extra_token_amount: int = 0  # main: the image/marker tokens at the end of lm_vocab_size
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
    lm_chat_template: str = CHATML_TEMPLATE

    mp_pixel_shuffle_factor: int = 2
    mp_image_token_length: int = 49

    max_img_size: int = 2048
    resize_to_max_side_len: bool = True
    image_splitting: bool = False  # edgebench's: main's tiles + markers instead of v0.1's one image first

    vlm_load_backbone_weights: bool = True
    vlm_checkpoint_path: str = "checkpoints"
    hf_repo_name: str = "nanoVLM"

    @property
    def n_image_tokens(self) -> int:
        """Image tokens one image contributes: patches per side, pixel-shuffled."""
        side = self.vit_img_size // self.vit_patch_size // self.mp_pixel_shuffle_factor
        return side * side

    @property
    def nanovlm_revision(self) -> str:
        """The nanoVLM revision whose image layout (and config.json fields) this config follows."""
        return "main" if self.image_splitting else "v0.1"

    @property
    def image_grid(self) -> tuple[int, int]:
        """Tiles (rows, columns) of a square image: main resizes its long side to max_img_size."""
        side = self.max_img_size // self.vit_img_size if self.image_splitting else 1
        return side, side

    @property
    def n_tiles(self) -> int:
        """Images the vision encoder sees per sample: the tiles plus a global view (one if 1x1)."""
        rows, cols = self.image_grid
        return 1 if rows * cols == 1 else 1 + rows * cols

    @property
    def image_positions(self) -> int:
        """Sequence positions one square image takes: its tokens, plus one marker per tile in main."""
        if not self.image_splitting:
            return self.n_image_tokens
        return self.n_tiles * (1 + self.n_image_tokens)

    def sequence_length(self, text_length: int) -> int:
        """Decoder positions of a sample with `text_length` text tokens and one square image."""
        return self.image_positions + text_length

    @property
    def image_token_id(self) -> int:
        """main's image placeholder: the first of the extra tokens after the base vocabulary."""
        return self.lm_vocab_size - self.extra_token_amount

    def marker_token_id(self, row: int, col: int) -> int:
        """The marker before tile (row, col), 1-based; (0, 0) is the global view's marker."""
        if (row, col) == (0, 0):
            return self.image_token_id + 1
        return self.image_token_id + 2 + (row - 1) * MAX_GRID_SIDE + (col - 1)

    def check_ranges(self) -> VLMConfig:
        """Raise ConfigError naming the first field of the wrong type or out of its range."""
        for name, (kind, low, high) in FIELD_RANGES.items():
            value = getattr(self, name)
            if kind is bool:
                if not isinstance(value, bool):
                    raise ConfigError(f"VLMConfig.{name}: {value!r} is not true or false")
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or (kind is int and not isinstance(value, int))
            ):
                raise ConfigError(
                    f"VLMConfig.{name}: {value!r} is not {'a whole number' if kind is int else 'a number'}"
                )
            if not (math.isfinite(value) and low <= value and (high is None or value <= high)) \
                    or (name in POSITIVE_FLOATS and value <= 0):
                bound = f"more than 0 and at most {high:g}" if name in POSITIVE_FLOATS and high else \
                    "more than 0" if name in POSITIVE_FLOATS else f"from {low:g} to {high:g}" if high is not None \
                    else f"at least {low:g}"
                raise ConfigError(f"VLMConfig.{name}: {value!r} is out of range; it must be {bound}")
        return self

    def validate(self) -> VLMConfig:
        """Raise ConfigError naming the first field that makes the model unbuildable."""
        self.check_ranges()
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
            (not self.image_splitting or self.extra_token_amount == len(EXTRA_TOKENS), "extra_token_amount",
             f"{self.extra_token_amount}, but image splitting needs nanoVLM's {len(EXTRA_TOKENS)} image and "
             "marker tokens"),
            (self.extra_token_amount < self.lm_vocab_size, "extra_token_amount",
             f"{self.extra_token_amount} leaves no base vocabulary in lm_vocab_size {self.lm_vocab_size}"),
            (not self.image_splitting or (self.max_img_size % self.vit_img_size == 0
                                          and self.max_img_size // self.vit_img_size <= MAX_GRID_SIDE),
             "max_img_size", f"{self.max_img_size} must be a multiple of vit_img_size {self.vit_img_size}, at most "
             f"{MAX_GRID_SIDE} tiles a side (there are markers up to r{MAX_GRID_SIDE}c{MAX_GRID_SIDE})"),
            (0.0 <= self.vit_dropout < 1.0 and 0.0 <= self.lm_dropout < 1.0, "lm_dropout",
             f"dropout must be in [0, 1): vit_dropout {self.vit_dropout}, lm_dropout {self.lm_dropout}"),
        ]
        for ok, field_name, why in checks:
            if not ok:
                raise ConfigError(f"VLMConfig.{field_name}: {why}")
        return self

    def with_image_size(self, image_size: int | None) -> VLMConfig:
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
        """Every field, edgebench's own included (for caching and run records)."""
        return dataclasses.asdict(self)

    def to_nanovlm_dict(self) -> dict[str, Any]:
        """Exactly the fields of nanoVLM's VLMConfig at `nanovlm_revision`, in its order."""
        values = {**self.to_dict(), "lm_base_vocab_size": self.image_token_id,
                  "vlm_extra_tokens": dict(EXTRA_TOKENS)}
        return {name: values[name] for name in NANOVLM_FIELDS[self.nanovlm_revision]}

    def edgebench_dict(self) -> dict[str, Any]:
        """The fields the revision's config.json lacks (saved beside it, so a round trip is exact)."""
        written = set(NANOVLM_FIELDS[self.nanovlm_revision])
        return {name: value for name, value in self.to_dict().items() if name not in written}


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


# nanoVLM fields edgebench checks but does not store, and later fields that change no shape.
DERIVED_NANOVLM_FIELDS = frozenset({"lm_base_vocab_size", "vlm_extra_tokens", "lm_attention_bias"})


def config_from_dict(data: dict[str, Any], source: str = "config",
                     edgebench: dict[str, Any] | None = None) -> VLMConfig:
    """A VLMConfig from a nanoVLM config dict (v0.1 or main field set).

    `edgebench`: edgebench's own fields saved beside it; without them a main field set
    means main's image splitting. Unknown text/flag fields are ignored; an unknown number
    is refused, because it may be a dimension this code does not build, and silently
    ignoring it would load a different model than the checkpoint's.
    """
    known = {f.name for f in dataclasses.fields(VLMConfig)}
    is_main = "mp_image_token_length" in data or "max_img_size" in data
    given = set(data) | set(edgebench or {})
    derived = {"lm_vocab_size"} if {"lm_base_vocab_size", "extra_token_amount"} <= given else set()
    missing = [k for k in NANOVLM_FIELDS["main" if is_main else "v0.1"]
               if k not in given and k not in INFORMATIONAL_FIELDS and k not in derived | DERIVED_NANOVLM_FIELDS]
    if missing:
        raise ConfigError(f"{source}: missing field(s) {', '.join(missing)} (nanoVLM "
                          f"{'main' if is_main else 'v0.1'} writes every one); add them, e.g. from the config.json "
                          "of the checkpoint these weights came from")
    fields = {k: v for k, v in (edgebench or {}).items() if k in known}
    fields.update((k, v) for k, v in data.items() if k in known and k not in EDGEBENCH_FIELDS)
    fields["image_splitting"] = bool((edgebench or {}).get("image_splitting", is_main))
    if "lm_vocab_size" not in data and {"lm_base_vocab_size", "extra_token_amount"} <= set(data):
        fields["lm_vocab_size"] = data["lm_base_vocab_size"] + data["extra_token_amount"]
    if "mp_image_token_length" not in data:  # v0.1 has no such field: derive it
        try:
            fields["mp_image_token_length"] = dataclasses.replace(VLMConfig(), **fields).check_ranges().n_image_tokens
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    unknown_numbers = sorted(
        k for k, v in data.items()
        if k not in known and k not in DERIVED_NANOVLM_FIELDS
        and isinstance(v, (int, float)) and not isinstance(v, bool)
    )
    if unknown_numbers:
        raise ConfigError(
            f"{source}: unknown numeric field(s) {unknown_numbers}; they may change the "
            "architecture, which edgebench's nanoVLM does not build. Remove them if they do not."
        )
    try:
        cfg = VLMConfig(**fields).validate()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    if "lm_base_vocab_size" in data and data["lm_base_vocab_size"] != cfg.image_token_id:
        raise ConfigError(f"{source}: lm_base_vocab_size {data['lm_base_vocab_size']} + extra_token_amount "
                          f"{cfg.extra_token_amount} is not lm_vocab_size {cfg.lm_vocab_size}")
    if cfg.image_splitting and list(data.get("vlm_extra_tokens", EXTRA_TOKENS).values()) != list(EXTRA_TOKENS.values()):
        raise ConfigError(f"{source}: vlm_extra_tokens differ from nanoVLM's image, global and r1c1..r8c8 "
                          "tokens, which edgebench places by their position after the base vocabulary")
    return cfg


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


def _micro() -> VLMConfig:
    # tiny's widths at half its depth (1 vision block, 2 decoder blocks): still every part
    # of the real model, and an ExecuTorch export takes half tiny's time (the lowering's time
    # grows with the number of blocks: measured 20 s vs 38 s). The tests of exported programs use it.
    return dataclasses.replace(_tiny(), vit_n_blocks=1, lm_n_blocks=2,
                               vit_model_type="edgebench/micro", lm_model_type="edgebench/micro")


def _nanovlm_222m() -> VLMConfig:
    # nanoVLM v0.1: SigLIP-B/16-224 + SmolLM2-135M (the dataclass defaults).
    return VLMConfig()


def _nanovlm_460m() -> VLMConfig:
    # nanoVLM main: SigLIP2-B/16-512 + SmolLM2-360M, pixel shuffle 4 -> 64 tokens a tile; images
    # split into up to 4x4 tiles of 512 px plus a global view, as main trains.
    return VLMConfig(
        vit_img_size=512, vit_model_type="google/siglip2-base-patch16-512",
        lm_hidden_dim=960, lm_inter_dim=2560, lm_vocab_size=49152 + 66, extra_token_amount=66, lm_n_heads=15,
        lm_n_kv_heads=5, lm_n_blocks=32, lm_max_length=4096,
        lm_model_type="HuggingFaceTB/SmolLM2-360M-Instruct",
        lm_tokenizer="HuggingFaceTB/SmolLM2-360M-Instruct",
        mp_pixel_shuffle_factor=4, mp_image_token_length=64,
        max_img_size=2048, resize_to_max_side_len=True, image_splitting=True,
    )


_FACTORIES = {"tiny": _tiny, "micro": _micro, "nanovlm-222m": _nanovlm_222m, "nanovlm-460m": _nanovlm_460m}
CONFIG_NAMES = tuple(_FACTORIES)


def get_config(name: str) -> VLMConfig:
    """A fresh config by name (callers may change it freely)."""
    try:
        return _FACTORIES[name]().validate()
    except KeyError:
        raise ConfigError(f"unknown model config {name!r}; known: {', '.join(CONFIG_NAMES)}") from None
