"""The ONNX Runtime backend: the exported training artifacts step in ORT's training API.

No torch in this process (58 MB vs 285 MB RSS, FIELD-NOTES.md): `onnxruntime.training`'s
package `__init__` imports torch (ORTModule), and so does `import onnxruntime` (it probes
ORTModule), so `onnxruntime.training.api` is loaded with an empty stand-in for that
package and ORTModule marked absent. The optimizer (SGD or AdamW, global-norm clip) is the
artifacts' optimizer graph; the learning rate is constant per run (spec.lr or the method's
default recorded at export) for all parameters: one optimizer graph has one lr, and the
schedule lives in torch-importing code.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
import types
from typing import Any

import numpy as np

from edgebench.backends import UnsupportedBackend
from edgebench.backends.program import check_batch, open_program
from edgebench.backends.support import device_reason


def training_api():
    """`onnxruntime.training.api` without running `onnxruntime/training/__init__.py`."""
    if "onnxruntime.training.api" in sys.modules:
        return sys.modules["onnxruntime.training.api"]
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except ValueError:
        spec = None
    if spec is None or spec.submodule_search_locations is None:
        raise UnsupportedBackend(
            "onnxruntime is not installed: `pip install onnxruntime-training-cpu==1.19.2` "
            "(x86_64; never together with onnxruntime-training)"
        )
    package_dir = list(spec.submodule_search_locations)[0]
    if "onnxruntime.training" not in sys.modules:
        # Before `import onnxruntime`: its __init__ probes ORTModule (torch) too; a None entry
        # makes that probe an ImportError, which it handles as "no ORTModule".
        stand_in = types.ModuleType("onnxruntime.training")
        stand_in.__path__ = [f"{package_dir}/training"]
        sys.modules["onnxruntime.training"] = stand_in
        sys.modules.setdefault("onnxruntime.training.ortmodule", None)
    try:
        return importlib.import_module("onnxruntime.training.api")
    except ImportError as exc:
        raise UnsupportedBackend(
            f"onnxruntime has no training API here ({exc}): install onnxruntime-training-cpu==1.19.2, "
            "not the inference-only onnxruntime"
        ) from None


def shifted_labels(labels: np.ndarray) -> np.ndarray:
    """The artifacts' labels: position t predicts t+1, flattened (the exporter feeds them the same way)."""
    return np.ascontiguousarray(labels[:, 1:].reshape(-1), dtype=np.int64)


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self) -> None:
        self.state = self.module = self.optimizer = None

    def setup(self, spec: Any, example_batch: dict[str, Any]) -> None:
        reason = device_reason(self.name, platform.machine())
        if reason:
            raise UnsupportedBackend(reason)
        directory, manifest = open_program(spec, self.name, None)
        check_batch(manifest, example_batch, directory)
        api = training_api()
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
        options = onnxruntime.SessionOptions()
        if spec.threads:
            options.intra_op_num_threads = spec.threads
        self.state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
        self.module = api.Module(str(directory / "training_model.onnx"), self.state,
                                 str(directory / "eval_model.onnx"), device="cpu", session_options=options)
        self.optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), self.module)
        self.optimizer.set_learning_rate(manifest["default_lr"] if spec.lr is None else spec.lr)
        self.module.train()

    def step(self, batch: dict[str, Any]) -> float:
        loss = self.module(np.ascontiguousarray(batch["input_ids"], dtype=np.int64),
                           np.ascontiguousarray(batch["images"], dtype=np.float32),
                           shifted_labels(batch["labels"]))
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return float(loss)

    def named_parameters(self) -> dict[str, np.ndarray]:
        """The trainable weights, by torch name (for tests and checkpoints)."""
        params = self.state.parameters
        return {name: param.data for name, param in params if param.requires_grad}

    def close(self) -> None:
        self.state = self.module = self.optimizer = None
