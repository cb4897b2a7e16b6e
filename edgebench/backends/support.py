"""Which method runs on which backend, and which backend runs on which device.

Torch-free (the ONNX Runtime device process imports it). `unsupported_reason(...)` is the
one source of truth: the exporters refuse early with it, the backends refuse at setup
with it, and `edgebench methods` shows it as the method x backend matrix.
"""

from __future__ import annotations

import platform
from typing import Any

from edgebench.backends.base import BACKENDS

BACKEND_NAMES = tuple(BACKENDS)

# Optimizers each exported backend applies (ExecuTorch: SGD in the runtime, the others
# with torch.optim over the program's parameters; ONNX Runtime: SGD in place on its
# parameter buffers, Adam/AdamW as its AdamW optimizer graph, Adam = AdamW without decay).
EXPORT_OPTIMIZERS = {
    "executorch": ("sgd", "sgd-momentum", "adam", "adamw", "adafactor", "lomo", "adamw-8bit", "adamw-4bit",
                   "galore"),
    "onnxruntime": ("sgd", "adam", "adamw"),
}


def _knob(method: Any, name: str, default: Any) -> Any:
    return getattr(method, name, default)


def _eager_only_knobs(method: Any) -> str | None:
    """The lowest-memory knobs of edgebench.methods (int4 frozen weights, bf16 trained weights
    with their in-backward rounding, chunked cross-entropy) exist in eager torch only."""
    if _knob(method, "frozen_dtype", "fp32") == "int4":
        return "frozen-int4"
    if _knob(method, "trained_dtype", "fp32") != "fp32":
        return "bf16-weights"
    if _knob(method, "chunked_loss", False):
        return "chunked-ce"
    return None


def unsupported_reason(method: Any, backend: str) -> str | None:
    """Why `method` (a methods.Method) cannot run on `backend`, with what to do; None if it can."""
    if backend == "eager":
        return None
    if backend not in BACKEND_NAMES:
        return f"unknown backend {backend!r}; choose one of {', '.join(BACKEND_NAMES)}"
    eager_only = _eager_only_knobs(method)
    if eager_only:
        return f"{eager_only} runs in eager torch only (not lowered to {backend} programs); use --backend eager"
    if backend == "onnxruntime":
        return _onnxruntime_reason(method)
    if backend == "executorch":
        return _executorch_reason(method)
    other = "onnxruntime" if backend == "executorch" else "executorch"
    grad_mode = _knob(method, "grad_mode", "backprop")
    if grad_mode == "zeroth-order":
        return None  # a forward-only program plus in-place perturbation
    if grad_mode != "backprop":
        return f"{grad_mode} gradients need torch.func (jvp) at run time; use --backend eager"
    optimizer = _knob(method, "optimizer", "adamw")
    if optimizer not in EXPORT_OPTIMIZERS[backend]:
        alternatives = [b for b, opts in EXPORT_OPTIMIZERS.items() if optimizer in opts]
        where = f"--backend {alternatives[0]} or eager" if alternatives else "--backend eager"
        return (f"optimizer {optimizer} is not available on {backend} "
                f"(it has {', '.join(EXPORT_OPTIMIZERS[backend])}); use {where}")
    if _knob(method, "checkpointing", False):
        return (f"activation checkpointing has no meaning in a lowered {backend} program (its memory "
                "is planned at export); use --backend eager")
    if _knob(method, "accumulation", 1) != 1:
        return f"gradient accumulation is not built for {backend}; use --backend eager"
    if _knob(method, "precision", "fp32") != "fp32" or _knob(method, "frozen_dtype", "fp32") != "fp32":
        return f"{backend} programs are exported in float32 only; use --backend eager for bf16 / int8"
    if _knob(method, "fused_update", False):
        return f"fused update-in-backward needs torch's autograd hooks; use --backend eager (or {other} without it)"
    return None


# Optimizers ExecuTorch refuses, with why. The others run in the program (LOMO, fused) or
# between its calls in the runtime process over the gradients it returns (adafactor, torchao's
# low-bit AdamW, GaLore: edgebench.backends.executorch.ProgramUpdate).
_EXECUTORCH_REFUSED = {
    "adalomo": ("lomo-optim's AdaLomo allocates its state with .cuda() (eager refuses it on CPU too); "
                "use lomo or adafactor"),
    "cg": ("conjugate gradient's Armijo line search evaluates the loss a data-dependent number of times "
           "per step at trial points; use --backend eager"),
}


def _executorch_reason(method: Any) -> str | None:
    """ExecuTorch: the joint forward-backward program (or a forward-only one for MeZO), with
    the update inside it (LOMO, fused) or between calls (edgebench.backends.et_optimizers)."""
    grad_mode = _knob(method, "grad_mode", "backprop")
    if grad_mode == "forward-mode":
        return ("a forward-mode program does not lower: strict torch.export refuses torch.func.jvp "
                "(\"Unsupported functorch tracing attempt\"); the non-strict export fails its retrace "
                "(run_decompositions, which to_edge needs: \"Cannot access storage of TensorWrapper\" "
                "on the lifted rotary constants); use --backend eager")
    optimizer = _knob(method, "optimizer", "adamw")
    if optimizer in _EXECUTORCH_REFUSED:
        return _EXECUTORCH_REFUSED[optimizer]
    return None


def _onnxruntime_reason(method: Any) -> str | None:
    """ONNX Runtime 1.19's training API: artifacts from generate_artifacts (training graph,
    eval graph, checkpoint, AdamW optimizer graph), any trainable subset (LoRA written into
    the graph by exporters.lora), MeZO on the eval graph. Everything else is refused here."""
    grad_mode = _knob(method, "grad_mode", "backprop")
    if grad_mode == "forward-mode":
        return "forward-mode gradients need torch.func (jvp) at run time; use --backend eager"
    optimizer = _knob(method, "optimizer", "adamw")
    if optimizer not in EXPORT_OPTIMIZERS["onnxruntime"]:
        where = "--backend executorch or eager" if optimizer in EXPORT_OPTIMIZERS["executorch"] else "--backend eager"
        return (f"optimizer {optimizer} is not available on onnxruntime (its training API has SGD and "
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
                "buffers the optimizer graph reads afterwards); use --backend eager")
    return None


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
