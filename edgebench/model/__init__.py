"""nanoVLM for edgebench: configs by name, the model, nanoVLM checkpoints.

Importing the package (or `edgebench.model.config`) does not import torch, so a
torch-free device process (the ONNX Runtime backend) can still read configs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgebench.model.config import CONFIG_NAMES, VLMConfig, get_config

if TYPE_CHECKING:
    from edgebench.model.vision_language_model import VisionLanguageModel

__all__ = ["CONFIG_NAMES", "VLMConfig", "build_model", "get_config", "starts_fresh"]


def starts_fresh(name_or_dir: str) -> bool:
    """`build_model(name_or_dir)` makes random weights (a config name), not a checkpoint's: the
    default lrs differ (methods.optim.default_lr)."""
    return name_or_dir in CONFIG_NAMES


def build_model(name_or_dir: str, image_size: int | None = None) -> VisionLanguageModel:
    """A model by config name (fresh weights, torch's global RNG) or from a checkpoint.

    `name_or_dir`: one of CONFIG_NAMES, a nanoVLM folder (config.json +
    model.safetensors) or a hub id. `image_size` (None: the config's own) re-sizes a
    fresh model; a checkpoint must be used at its own size.
    """
    if name_or_dir in CONFIG_NAMES:
        from edgebench.model.vision_language_model import VisionLanguageModel

        return VisionLanguageModel(get_config(name_or_dir).with_image_size(image_size))
    from edgebench.model.checkpoint import CheckpointError, from_pretrained

    model = from_pretrained(name_or_dir)
    if image_size is not None and image_size != model.cfg.vit_img_size:
        raise CheckpointError(
            f"{name_or_dir}: the checkpoint's images are {model.cfg.vit_img_size} px "
            f"(its position embeddings are sized for them), not {image_size}; leave out the image size "
            f"(--image-size) or give {model.cfg.vit_img_size}"
        )
    return model
