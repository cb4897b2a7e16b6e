"""What every backend shares: the refusal it raises, the interface it implements, and the
one table of backend names with what each needs on a device. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from edgebench.errors import EdgebenchError


class UnsupportedBackend(EdgebenchError):
    """This backend cannot run this method (or on this device); the message says why and what to do."""


class Backend(Protocol):
    """`step(batch, consume=True)`: the caller gives the batch away, and the backend may empty it
    once it holds what it needs (eager: the images once the forward pass is done with them)."""

    name: str

    def setup(self, spec: Any, example_batch: dict[str, Any]) -> None: ...

    def step(self, batch: dict[str, Any], consume: bool = False) -> float: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BackendInfo:
    """A backend: its implementation ("module:Class", imported only when built, so a device
    loads one runtime), whether its device process stays torch-free, and the CPU
    architectures its runtime has wheels for (None: every arch torch has)."""

    name: str
    implementation: str
    torch_free: bool = False
    arches: tuple[str, ...] | None = None
    package: str = ""  # the runtime's wheel, named when an arch has none
    elsewhere: str = ""  # what to do on another arch


BACKENDS: dict[str, BackendInfo] = {b.name: b for b in (
    BackendInfo("eager", "edgebench.backends.eager:EagerBackend"),
    BackendInfo("executorch", "edgebench.backends.executorch:ExecutorchBackend"),
    # onnxruntime-training-cpu 1.19.2 has Linux wheels for x86_64 only.
    BackendInfo("onnxruntime", "edgebench.backends.onnxruntime:OnnxRuntimeBackend", torch_free=True,
                arches=("x86_64",), package="onnxruntime-training",
                elsewhere="build ONNX Runtime from source with --enable_training_apis on the device "
                          "(https://onnxruntime.ai/docs/build/training.html), or use --backend executorch"),
)}
