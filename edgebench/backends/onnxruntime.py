"""The ONNX Runtime backend: the exported training artifacts step in ORT's training API.

No torch in this process (58 MB vs 285 MB RSS, measured on tiny): `onnxruntime.training`'s
package `__init__` imports torch (ORTModule), and so does `import onnxruntime` (it probes
ORTModule), so `onnxruntime.training.api` is loaded with an empty stand-in for that
package and ORTModule marked absent.

Memory (nanovlm-222m, SGD, batch 1; `bench/ort_memory.py` prints it phase by phase): only
the training graph is loaded (no eval graph when nothing evaluates); ORT's CPU arena and
memory pattern are off (with them the step peaked ~60 MiB higher: 2,428 vs 2,366 MiB) and
malloc's mmap threshold is pinned (`return_freed_blocks`, -94 MiB); the weights are read
from the artifacts' safetensors file straight into ORT's buffers (`load_weights`), where
ORT's own checkpoint load held the file and the weights at once. MeZO runs the eval graph
in an InferenceSession fed numpy arrays of the weights, perturbed in place.

The update is the methods' recipe, as eager's BackpropTrainer applies it (issue 29): after
each training-graph call, `numpy_updates.RecipeUpdate` clips ORT's gradient buffers at the
global norm, takes each parameter's lr from nanoVLM's groups and the warmup + cosine schedule
(edgebench.methods.optim's own functions) and writes SGD's, Adam's or AdamW's update in
place into ORT's parameter buffers (Adam's moments are numpy arrays). There is no optimizer
graph: ORT's has one lr for every parameter (nanoVLM's projector trains at 100x the
backbones' lr under Adam), and its SGD optimizer would add a moment per weight it never
reads (+881 MiB on nanovlm-222m). MeZO's lr follows the same schedule.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgebench.backends.base import UnsupportedBackend
from edgebench.backends.numpy_updates import NumpyMeZO, RecipeUpdate
from edgebench.backends.program import ProgramError, check_batch, open_program, program_lr
from edgebench.backends.support import device_reason
from edgebench.methods import parse_method
from edgebench.methods.optimizers import run_weight_decay

# The artifacts' files it reads (exporters.onnxruntime writes them): the checkpoint without
# values (generate_artifacts' name for it), and the values.
NOMINAL_CHECKPOINT = "nominal_checkpoint"
PARAMETERS = "parameters.safetensors"
# SessionOptions the backend sets (recorded in each export's manifest as the lowering).
SESSION_OPTIONS = {"enable_cpu_mem_arena": False, "enable_mem_pattern": False}
# glibc malloc: blocks from this size up are mmapped and handed back when freed.
MMAP_THRESHOLD = 64 << 10
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def training_api() -> types.ModuleType:
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
        sys.modules.setdefault("onnxruntime.training.ortmodule", None)  # type: ignore[arg-type]  # typeshed: no None
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


def return_freed_blocks() -> bool:
    """Pin glibc's mmap threshold at MMAP_THRESHOLD, so every freed activation or gradient
    temporary from 64 KiB up goes back to the OS at once. By default the threshold grows
    (up to 32 MiB) as mmapped blocks are freed, and later frees stay in the heap, in pieces:
    ORT's step peaked 94 MiB higher on nanovlm-222m that way (measured). False off glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    return bool(mallopt and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def session_options(threads: int | None = None) -> Any:
    """The SessionOptions every ORT session here gets (SESSION_OPTIONS, quiet logs, threads)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    for key, value in SESSION_OPTIONS.items():
        setattr(options, key, value)
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return options


def read_parameters(path: Path, buffers: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A safetensors file's tensors, each read straight into `buffers[name]` (ORT's own) or,
    without `buffers`, a new array: no copy of the file in memory (safetensors' own loader maps
    the whole file, whose pages then count in the process's peak). The format: an 8-byte
    little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, the data."""
    out = {}
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        try:
            header = json.loads(file.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
        if not isinstance(header, dict):
            raise ProgramError(f"{path}: not a safetensors file (its header is no JSON object); export it again")
        header.pop("__metadata__", None)
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            shape = tuple(entry["shape"])
            target = np.empty(shape, np.float32) if buffers is None else buffers[name]
            if entry["dtype"] != "F32" or target.shape != shape or target.dtype != np.float32 \
                    or not target.flags.c_contiguous:
                raise ProgramError(f"{path}: {name} is {entry['dtype']} {list(shape)}; its buffer is "
                                   f"{target.dtype} {list(target.shape)} (the artifacts hold contiguous F32 "
                                   "weights); export it again")
            start, end = entry["data_offsets"]
            file.seek(8 + length + start)
            if file.readinto(target.data.cast("B")) != end - start:
                raise ProgramError(f"{path}: {name} is cut short (the file ends early; export it again)")
            out[name] = target
    missing = sorted(set(buffers or ()) - set(out))
    if missing:
        raise ProgramError(f"{path} lacks {len(missing)} weight(s) the program has, e.g. {missing[:3]}; "
                           "export it again")
    return out


def load_weights(module: Any, state: Any, path: Path) -> None:
    """Gives a Module made from a nominal checkpoint its weights without a second copy of them.
    ORT allocates the parameters and gradient buffers when it copies from one flat buffer of
    every weight; that buffer is zeros never written (calloc'd pages that read as the kernel's
    zero page, not the process's memory); then each weight is read from the file into ORT's
    own buffer."""
    from onnxruntime.capi.onnxruntime_inference_collection import OrtValue

    zeros = np.zeros(module.get_parameters_size(trainable_only=False), dtype=np.float32)
    module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(zeros)._ortvalue, trainable_only=False)
    del zeros
    read_parameters(path, {name: param.data for name, param in state.parameters})


def _feeds(batch: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """The graphs' inputs in order: input_ids, images, attention_mask, labels."""
    return (np.ascontiguousarray(batch["input_ids"], dtype=np.int64),
            np.ascontiguousarray(batch["images"], dtype=np.float32),
            np.ascontiguousarray(batch["attention_mask"], dtype=np.int64),
            shifted_labels(batch["labels"]))


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self) -> None:
        self.state: Any = None  # ORT's CheckpointState
        self.module: Any = None  # ORT's training api.Module
        self.update: RecipeUpdate | None = None
        self.mezo: NumpyMeZO | None = None
        self.forward: ForwardLoss | None = None
        self.trained: dict[str, np.ndarray] = {}  # the weights the method trains, by name (ONNX's = torch's)

    def setup(self, spec: Any, example_batch: dict[str, Any],
              on_phase: Callable[[str], None] = lambda phase: None) -> None:
        """Opens the program and its weights; `on_phase(name)` after each part (bench/ort_memory.py
        reads the process's memory there)."""
        reason = device_reason(self.name, platform.machine())
        if reason:
            raise UnsupportedBackend(reason)
        directory, manifest = open_program(spec, self.name, None)
        check_batch(manifest, example_batch, directory)
        # eager's default, as every runtime's (before the heap is trimmed: it imports the model configs)
        method = parse_method(spec.method)
        lr = program_lr(spec.lr, method, manifest, fresh_weights=spec.fresh_weights)
        weight_decay = run_weight_decay(method.optimizer, spec.weight_decay)
        api = training_api()
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
        return_freed_blocks()
        options = session_options(spec.threads)
        on_phase("onnxruntime imported")
        total = spec.warmup_steps + spec.steps  # the schedule's length, as eager's
        if manifest["program"] == "forward-only":
            weights = read_parameters(directory / PARAMETERS)
            on_phase("weights")
            self.forward = ForwardLoss(directory / "eval_model.onnx", weights, options)
            self.trained = {name: weights[name] for name in manifest["trainable_parameters"]}
            self.mezo = NumpyMeZO(list(self.trained.values()), lr, spec.seed, total,
                                  threads=spec.threads or os.cpu_count() or 1, weight_decay=weight_decay)
            on_phase("eval session (no gradients)")
            return
        self.state = api.CheckpointState.load_checkpoint(str(directory / NOMINAL_CHECKPOINT))
        self.module = api.Module(str(directory / "training_model.onnx"), self.state, None,
                                 device="cpu", session_options=options)
        self.module.train()
        on_phase("training session")
        load_weights(self.module, self.state, directory / PARAMETERS)
        on_phase("weights + gradient buffers")
        params = self.state.parameters
        self.trained = {n: p.data for n, p in params if p.requires_grad}
        self.update = RecipeUpdate(method.optimizer,
                                   lambda: [(n, p.data, p.grad) for n, p in params if p.requires_grad], lr, total,
                                   weight_decay)

    def step(self, batch: dict[str, Any], consume: bool = False) -> float:  # the session reads its inputs whole
        if self.mezo is not None:
            feeds, forward = _feeds(batch), self.forward
            assert forward is not None  # set up with the MeZO program
            return self.mezo.step(lambda: forward(feeds))
        loss = float(self.module(*_feeds(batch)))
        assert self.update is not None, "setup() first"
        self.update.step()
        self.module.lazy_reset_grad()
        return loss

    def named_parameters(self) -> dict[str, np.ndarray]:
        """The trained weights, by torch name (the buffers the runtime reads; for tests and checkpoints)."""
        return dict(self.trained)

    def close(self) -> None:
        self.state = self.module = self.update = self.mezo = self.forward = None
        self.trained = {}


class ForwardLoss:
    """The eval graph (loss; weights as inputs) in an InferenceSession fed the weights' own
    numpy buffers, which MeZO perturbs in place: no training session, no gradient buffers."""

    def __init__(self, path: str | Path, weights: dict[str, np.ndarray], options: Any) -> None:
        import onnxruntime
        from onnxruntime.capi.onnxruntime_inference_collection import OrtValue

        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.weights = {name: OrtValue.ortvalue_from_numpy(array) for name, array in weights.items()}
        self.inputs = [i.name for i in self.session.get_inputs()][:4]  # _feeds' four, then the weights
        self.loss_name = self.session.get_outputs()[0].name
        self.wrap = OrtValue.ortvalue_from_numpy

    def __call__(self, feeds: tuple[np.ndarray, ...]) -> float:
        values = dict(self.weights)
        values.update((name, self.wrap(array)) for name, array in zip(self.inputs, feeds))
        return float(self.session.run_with_ort_values([self.loss_name], values)[0].numpy())
