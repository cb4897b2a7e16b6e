"""Backends execute one training step: eagerly in torch, or through an exported program.

`BACKENDS` (in `base.py`) is the one table of backends; `create(spec)` builds the backend
named by `spec.backend`, importing only its implementation. Each backend takes numpy
batches, so the ONNX Runtime path never needs torch on the device.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgebench.backends.base import BACKENDS, Backend, BackendInfo, UnsupportedBackend

__all__ = ["BACKENDS", "Backend", "BackendInfo", "UnsupportedBackend", "create"]


def create(spec: Any) -> Backend:
    """Returns the backend for `spec.backend`, not yet set up."""
    info = BACKENDS.get(spec.backend)
    if info is None:
        raise UnsupportedBackend(f"unknown backend {spec.backend!r}; choose one of {', '.join(BACKENDS)}")
    module, cls = info.implementation.split(":")
    backend: Backend = getattr(importlib.import_module(module), cls)()
    return backend
