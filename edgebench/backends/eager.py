"""The eager backend: the method's trainer stepping the torch model directly."""

from __future__ import annotations

from typing import Any

import torch

from edgebench.data.synthetic import to_torch
from edgebench.methods import make_trainer, parse_method
from edgebench.model import build_model


class EagerBackend:
    name = "eager"

    def __init__(self) -> None:
        self.trainer = None
        self.device = "cpu"

    def setup(self, spec: Any, example_batch: dict[str, Any]) -> None:
        if spec.accelerator == "cuda" and not torch.cuda.is_available():
            from edgebench.backends import UnsupportedBackend

            raise UnsupportedBackend(
                "--accelerator cuda asked for, but torch sees no CUDA device "
                f"(torch {torch.__version__}); run on a CUDA host or use --accelerator cpu"
            )
        self.device = spec.accelerator
        torch.manual_seed(spec.seed)
        model = build_model(spec.checkpoint or spec.model, image_size=spec.image_size).to(self.device)
        total = spec.warmup_steps + spec.steps
        self.trainer = make_trainer(parse_method(spec.method), model, lr=spec.lr, total_steps=total)

    def step(self, batch: dict[str, Any]) -> float:
        return self.trainer.step(to_torch(batch, device=self.device))

    def close(self) -> None:
        self.trainer = None
