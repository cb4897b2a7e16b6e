"""Which method runs on which backend, and which backend runs on which device.

Torch-free (the ONNX Runtime device process imports it). `unsupported_reason(...)` is the
one source of truth: the exporters refuse early with it, the backends refuse at setup
with it, and `edgebench methods` shows it as the method x backend matrix.
"""

from __future__ import annotations

import platform
from typing import Any

from edgebench.backends.base import BACKENDS
from edgebench.methods.optimizers import OPTIMIZERS, decay_refusal, optimizer

BACKEND_NAMES = tuple(BACKENDS)

# Optimizers each exported backend applies, from their descriptors (methods/optimizers.py).
# ExecuTorch: SGD in the runtime, the update written into the program (LOMO, fused), the others
# over the program's parameters between its calls; ONNX Runtime: SGD, Adam and AdamW in numpy
# between training-graph calls, in place on its parameter buffers (backends.numpy_updates).
EXPORT_OPTIMIZERS = {backend: tuple(name for name, o in OPTIMIZERS.items() if backend in o.exported_backends)
                     for backend in BACKEND_NAMES if backend != "eager"}


def _knob(method: Any, name: str, default: Any) -> Any:
    return getattr(method, name, default)


def _eager_only_knobs(method: Any) -> str | None:
    """The lowest-memory knobs of edgebench.methods (int4 frozen weights, chunked cross-entropy,
    the vision encoder view by view, torch's fused attention, LoRA on the decoder alone) and
    pruning exist in eager torch only. (bf16 trained weights take SGD fused into the step, which
    ExecuTorch programs write in; ONNX Runtime's reason refuses bf16.)"""
    if _knob(method, "frozen_dtype", "fp32") == "int4":
        return "frozen-int4"
    if _knob(method, "chunked_loss", False):
        return "chunked-ce"
    if _knob(method, "view_by_view", False):
        return "view-by-view"
    if _knob(method, "flash_attention", False):
        return "flash-attn"
    if _knob(method, "trainable", "all") == "lora-decoder":
        return "lora-decoder"
    if _knob(method, "prune", ""):
        return "pruning (its masks between the backward and the step)"
    return None


def unsupported_reason(method: Any, backend: str, weight_decay: float | None = None) -> str | None:
    """Why `method` (a methods.Method) cannot run on `backend` with `weight_decay`
    (RunSpec.weight_decay), with what to do; None if it can. Every runtime applies weight decay
    as the optimizer's descriptor says (L2 or decoupled); one that has none refuses it everywhere."""
    if backend not in BACKEND_NAMES:
        return f"unknown backend {backend!r}; choose one of {', '.join(BACKEND_NAMES)}"
    if backend == "eager":
        return decay_refusal(_knob(method, "optimizer", "adamw"), weight_decay)
    eager_only = _eager_only_knobs(method)
    if eager_only:
        return f"{eager_only} runs in eager torch only (not lowered to {backend} programs); use --backend eager"
    return _METHOD_REASONS[backend](method) or decay_refusal(_knob(method, "optimizer", "adamw"), weight_decay)


def _executorch_reason(method: Any) -> str | None:
    """ExecuTorch: the joint forward-backward program (or a forward-only one for MeZO), with
    the update inside it (LOMO, fused) or between calls (edgebench.backends.et_optimizers)."""
    grad_mode = _knob(method, "grad_mode", "backprop")
    if grad_mode == "forward-mode":
        return ("a forward-mode program does not lower: strict torch.export refuses torch.func.jvp "
                "(\"Unsupported functorch tracing attempt\"); the non-strict export fails its retrace "
                "(run_decompositions, which to_edge needs: \"Cannot access storage of TensorWrapper\" "
                "on the lifted rotary constants); use --backend eager")
    return optimizer(_knob(method, "optimizer", "adamw")).executorch_refusal or None


def _onnxruntime_reason(method: Any) -> str | None:
    """ONNX Runtime 1.19's training API: artifacts from generate_artifacts (training graph,
    eval graph, checkpoint; the update in numpy between calls), any trainable subset (LoRA written into
    the graph by exporters.lora), MeZO on the eval graph. Everything else is refused here."""
    grad_mode = _knob(method, "grad_mode", "backprop")
    if grad_mode == "forward-mode":
        return "forward-mode gradients need torch.func (jvp) at run time; use --backend eager"
    name = _knob(method, "optimizer", "adamw")
    if not optimizer(name).onnxruntime:
        where = "--backend executorch or eager" if name in EXPORT_OPTIMIZERS["executorch"] else "--backend eager"
        return (f"optimizer {name} is not available on onnxruntime (its training API has SGD and "
                f"AdamW: {', '.join(EXPORT_OPTIMIZERS['onnxruntime'])}); use {where}")
    if _knob(method, "checkpointing", False):
        return ("ONNX Runtime 1.19's recompute (MemoryOptimizer, session option "
                "optimization.memory_optimizer_config) finds the forward/backward boundary by ORTModule's "
                "YieldOp; training artifacts have none (\"No boundary op found. Skip memory optimization.\"), "
                "so nothing is recomputed; use --backend eager")
    if _knob(method, "accumulation", 1) != 1:
        return ("gradient accumulation is not built for onnxruntime yet (its gradient buffers can add up "
                "over calls, but the backend does not split batches); use --backend eager")
    if _knob(method, "precision", "fp32") != "fp32" or _knob(method, "frozen_dtype", "fp32") != "fp32":
        return ("onnxruntime training artifacts are float32 only (the CPU gradient and optimizer kernels "
                "are fp32); use --backend eager for bf16 / int8")
    if _knob(method, "fused_update", False):
        return ("a fused update-in-backward has no place in ORT's training API (gradients land in "
                "buffers the update reads after the call); use --backend eager")
    return None


# Each exported backend's reason a method cannot run on it (every backend of BACKENDS but eager).
_METHOD_REASONS = {"executorch": _executorch_reason, "onnxruntime": _onnxruntime_reason}


def device_reason(backend: str, arch: str | None = None, backends: list[str] | None = None,
                  device: str = "this device") -> str | None:
    """Why `device` (its arch and the profile's backend list) cannot run `backend`; None if it can."""
    arch = arch or platform.machine()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch)
    info = BACKENDS.get(backend)
    if info is None:
        return f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}"
    if info.arches is not None and arch not in info.arches:
        return (f"{device} is {arch}: {info.package} has no {arch} wheel (PyPI publishes no Linux {arch} "
                f"wheel of it); {info.elsewhere}")
    if backends is not None and backend not in backends:
        return (f"{device}'s profile lists backends {', '.join(backends)}, not {backend}; "
                "add it to the profile's `backends` if the device has the runtime")
    return None


def support_matrix(methods: dict[str, Any]) -> dict[str, dict[str, str | None]]:
    """{method name: {backend: None (runs) or the reason it does not}} for display."""
    return {name: {b: unsupported_reason(m, b) for b in BACKEND_NAMES} for name, m in methods.items()}
