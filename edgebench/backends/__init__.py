"""Backends execute one training step: eagerly in torch, or through an exported program.

`create(spec)` picks the backend named by `spec.backend`. Each backend takes numpy
batches, so the ONNX Runtime path never needs torch on the device.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol


class UnsupportedBackend(Exception):
    """This backend cannot run this method (or on this device); the message says why and what to do."""


class Backend(Protocol):
    name: str

    def setup(self, spec: Any, example_batch: dict[str, Any]) -> None: ...

    def step(self, batch: dict[str, Any]) -> float: ...

    def close(self) -> None: ...


# backend name -> "module:Class"; modules are imported only when asked for.
BACKENDS = {
    "eager": "edgebench.backends.eager:EagerBackend",
    "executorch": "edgebench.backends.executorch:ExecutorchBackend",
    "onnxruntime": "edgebench.backends.onnxruntime:OnnxRuntimeBackend",
}

# Backends that never import torch in the device process.
TORCH_FREE = {"onnxruntime"}


def create(spec: Any) -> Backend:
    """Returns the backend for `spec.backend`, not yet set up."""
    target = BACKENDS.get(spec.backend)
    if target is None:
        raise UnsupportedBackend(
            f"unknown backend {spec.backend!r}; choose one of {', '.join(sorted(BACKENDS))}"
        )
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)()
