"""The exported program a backend runs: find it, read its manifest, check the batch fits.

Torch-free and independent of the host-side `exporters` package (a device gets the
export directory and edgebench, nothing else). Manifest format: exporters/manifest.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from edgebench.backends.base import UnsupportedBackend
from edgebench.backends.support import unsupported_reason
from edgebench.errors import EdgebenchError

MANIFEST = "manifest.json"
# A batch's inputs, in the exported programs' order (ExecuTorch: these four, then MeZO's weights).
BATCH_INPUTS = ("input_ids", "images", "labels", "attention_mask")


class ProgramError(EdgebenchError, ValueError):
    """An exported program directory (a run's `program`, `--program`) that does not fit the run:
    another backend's or method's, damaged, or from an older edgebench; the message names the
    directory and how to export it again."""


def program_lr(lr: float | None, method: Any, manifest: dict[str, Any], *, fresh_weights: bool) -> float:
    """The run's backbone lr: `lr`, else eager's default for the method, the number of weights
    this program trains (MeZO's and forward gradients' lr shrinks with it) and whether the run
    starts from a config's fresh weights (RunSpec.fresh_weights)."""
    if lr is not None:
        return lr
    from edgebench.methods import optim  # imports no torch

    return optim.default_lr(method, manifest["model"]["trainable_elements"], fresh_weights=fresh_weights)


def open_program(spec: Any, backend: str, knobs: dict[str, Any] | None) -> tuple[Path, dict[str, Any]]:
    """(directory, manifest) of `spec.program`, after refusing an unsupported method.

    `knobs`: the spec's method knobs where the caller could parse them (parsing imports
    torch); None takes the manifest's, after checking the method text is the same.
    """
    if spec.packing:
        raise UnsupportedBackend(f"packing on {backend}: a packed batch holds a varying number of images and the "
                                 "exported program has fixed shapes; run packing on the eager backend")
    if knobs is not None:
        _refuse_unsupported(spec, backend, knobs)
    if not spec.program:
        raise ProgramError(
            f"RunSpec.program is not set: the {backend} backend runs an exported program. Export it "
            f"on the host (`edgebench export --backend {backend} "
            f"--model {spec.model} --method {spec.method} --out DIR`, or "
            "exporters.pipeline.export_for_spec(spec)) and set program to that directory"
        )
    directory = Path(spec.program).expanduser()
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no export manifest; is {directory} an `edgebench export` output?")
    manifest = _read_manifest(path)
    if manifest.get("backend") != backend:
        raise ProgramError(
            f"{directory} holds a {manifest.get('backend')} program, not {backend}; "
            f"export with --backend {backend}"
        )
    made_for = manifest["method"]
    same = (made_for["text"] == spec.method if knobs is None else
            all(made_for["knobs"].get(k) == knobs.get(k) for k in ("trainable", "grad_mode", "optimizer")))
    if not same:
        raise ProgramError(
            f"{directory} was exported for method {made_for['text']!r}, not {spec.method!r}; "
            "export it for this method"
        )
    if knobs is None:
        _refuse_unsupported(spec, backend, made_for["knobs"])
    parts = (knobs or made_for["knobs"]).get("accumulation", 1)
    summed = manifest.get("gradients_summed_in_program", 1)
    if manifest.get("program") == "forward-backward" and summed != parts:
        raise ProgramError(
            f"{directory}: its program sums gradients over {summed} call(s) itself, method {spec.method!r} "
            f"takes {parts} micro-batches (an export from an older edgebench sums none); export it again"
        )
    return directory, manifest


def _read_manifest(path: Path) -> dict[str, Any]:
    """manifest.json as an object with the fields a run reads (backend, method's text and knobs)."""
    fix = f"export the program again (`edgebench export --out {path.parent}`)"
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"{path}: not valid JSON ({exc}); {fix}") from None
    method = manifest.get("method") if isinstance(manifest, dict) else None
    if not (isinstance(manifest, dict) and isinstance(method, dict) and isinstance(method.get("text"), str)
            and isinstance(method.get("knobs"), dict)):
        raise ProgramError(f"{path}: not an `edgebench export` manifest (no method text and knobs); {fix}")
    return manifest


def _refuse_unsupported(spec: Any, backend: str, knobs: dict[str, Any]) -> None:
    reason = unsupported_reason(SimpleNamespace(**knobs), backend, spec.weight_decay)
    if reason:
        raise UnsupportedBackend(f"method {spec.method!r} on {backend}: {reason}")


def check_batch(manifest: dict[str, Any], batch: dict[str, Any], directory: Path) -> None:
    """Shapes are fixed at export: say which input differs and how to re-export."""
    expected = {i["name"]: i["shape"] for i in manifest["inputs"]}
    if "attention_mask" not in expected:
        raise ProgramError(f"{directory}: exported without the attention_mask input (an older edgebench), so "
                           "padded tokens would be attended to; export it again")
    for name in BATCH_INPUTS:
        if name == "labels" and manifest.get("backend") == "onnxruntime":
            continue  # ORT's labels are the shifted, flattened form (checked by ORT itself)
        if name not in batch:
            raise ValueError(f"the batch has no {name}: the program takes {', '.join(BATCH_INPUTS)}")
        got = list(batch[name].shape)
        if expected.get(name) != got:
            raise ProgramError(
                f"{directory}: {name} was exported as {expected.get(name)}, the batch is {got}; "
                "export again with this batch size / text length / image size"
            )


def write_trainable(path: Path, weights: dict[str, Any]) -> None:
    """A program's trainable weights (torch tensors or numpy arrays, float32) as a safetensors
    file, one array at a time, without torch: an exported program evaluates nothing itself, so
    the host evaluates these (edgebench.results.heldout)."""
    import numpy as np

    from edgebench.model.checkpoint import write_tensors_file

    arrays = {name: np.ascontiguousarray(value.detach().numpy() if hasattr(value, "detach") else value, dtype="<f4")
              for name, value in weights.items()}
    write_tensors_file(path, {name: ("F32", list(a.shape), a.nbytes) for name, a in arrays.items()},
                       lambda name: arrays[name].reshape(-1).view(np.uint8).data)

