"""Backends execute one training step: eagerly in torch, or through an exported program.

`BACKENDS` (in `base.py`) is the one table of backend names; `create(spec)` builds the
backend named by `spec.backend`, importing only that one. Each backend takes numpy
batches, so the ONNX Runtime path never needs torch on the device.
"""

from __future__ import annotations

from typing import Any

from edgebench.backends.base import BACKENDS, Backend, BackendInfo, UnsupportedBackend

__all__ = ["BACKENDS", "Backend", "BackendInfo", "UnsupportedBackend", "create"]


def create(spec: Any) -> Backend:
    """Returns the backend for `spec.backend`, not yet set up."""
    cls: type[Backend]
    if spec.backend == "eager":
        from edgebench.backends.eager import EagerBackend as cls
    elif spec.backend == "executorch":
        from edgebench.backends.executorch import ExecutorchBackend as cls
    elif spec.backend == "onnxruntime":
        from edgebench.backends.onnxruntime import OnnxRuntimeBackend as cls
    else:
        raise UnsupportedBackend(f"unknown backend {spec.backend!r}; choose one of {', '.join(BACKENDS)}")
    return cls()
