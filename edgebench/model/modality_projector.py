"""The modality projector: pixel shuffle (merge factor x factor neighbouring patches), then a linear map.

Names follow nanoVLM's models/modality_projector.py (`MP.proj`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from edgebench.model.config import VLMConfig


class ModalityProjector(nn.Module):
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
