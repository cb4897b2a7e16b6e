"""The eager backend: the method's trainer stepping the torch model directly."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from edgebench.backends.base import UnsupportedBackend
from edgebench.data.synthetic import to_torch
from edgebench.methods import MethodUnavailable, make_trainer, parse_method
from edgebench.methods.subsets import release_freed_memory
from edgebench.methods.trainer import build_model_for

if TYPE_CHECKING:
    from edgebench.methods.trainer import Trainer


class EagerBackend:
    name = "eager"

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.device = "cpu"

    def setup(self, spec: Any, example_batch: dict[str, Any]) -> None:
        if spec.accelerator == "cuda" and not torch.cuda.is_available():
            raise UnsupportedBackend(
                "--accelerator cuda asked for, but torch sees no CUDA device "
                f"(torch {torch.__version__}); run on a CUDA host or use --accelerator cpu"
            )
        self.device = spec.accelerator
        torch.manual_seed(spec.seed)
        method = parse_method(spec.method)
        # Built the way the method stores weights (bf16 when frozen weights are bf16/int8),
        # so loading never peaks above training.
        model = build_model_for(method, spec.checkpoint or spec.model, image_size=spec.image_size)
        total = spec.warmup_steps + spec.steps
        try:
            self.trainer = make_trainer(method, model.to(self.device), lr=spec.lr, weight_decay=spec.weight_decay,
                                        total_steps=total, fresh_weights=spec.fresh_weights)
        except MethodUnavailable as exc:
            raise UnsupportedBackend(str(exc)) from exc

    def step(self, batch: dict[str, Any], consume: bool = False) -> float:
        assert self.trainer is not None, "setup() first"
        tensors = to_torch(batch, device=self.device)  # on the CPU, the arrays' own memory
        if consume:
            batch.clear()  # the tensors are then the only hold on the images
        loss = self.trainer.step(tensors, consume)
        if self.trainer.method.view_by_view:  # the lowest-memory runs: the step's freed heap pages
            release_freed_memory()  # go back to the OS before the next step's peak, not into its holes
        return loss

    def evaluate(self, batch: dict[str, Any]) -> dict[str, float]:
        """Raw counts of one held-out batch (edgebench.methods.evaluate), with the method's autocast."""
        from edgebench.methods.evaluate import evaluate_batch

        assert self.trainer is not None, "setup() first"
        return evaluate_batch(self.trainer.model, to_torch(batch, device=self.device), self.trainer.autocast())

    def save(self, folder: str | Path) -> None:
        """The trained weights as a nanoVLM checkpoint (and peft adapter), edgebench.methods.saving."""
        from edgebench.methods.saving import save_trained

        assert self.trainer is not None, "setup() first"
        save_trained(self.trainer.model, folder)

    def close(self) -> None:
        self.trainer = None
