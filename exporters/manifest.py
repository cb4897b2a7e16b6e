"""What an export was made from and what it holds, and the content-keyed export cache.

Every export directory holds `manifest.json`: the request (model, method, backend,
shapes, delegate, dtype, seed, profile), the program's inputs and shapes, trainable
parameter names, planned memory (ExecuTorch), each file's size and sha256, and the
library versions. The cache key hashes the request, the library versions and the
source of the code that shapes the program, so the same request is exported once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from edgebench.backends.base import BACKENDS
from edgebench.errors import EdgebenchError
from exporters.import_closure import import_closure

MANIFEST = "manifest.json"
FORMAT = "edgebench-export/1"
# The runtimes an export can be made for, spelt as everywhere else (RunSpec.backend).
EXPORT_BACKENDS = tuple(name for name in BACKENDS if name != "eager")
DELEGATES = ("xnnpack",)
# How the XNNPACK lowering computes a method's bf16 values: "rounded", eager's values (fp32
# arithmetic rounded to bf16 wherever eager's bf16 kernels round); "fp32", computed in fp32 and
# never rounded: faster, its own variant, its losses off eager's by bf16's rounding.
BF16_MODES = ("rounded", "fp32")
_LIBRARIES = ("torch", "executorch", "onnx", "onnxruntime-training-cpu", "numpy", "edgebench")
# Where every export starts: the cache key hashes these modules' import closure (computed).
EXPORT_ENTRY = ("exporters.pipeline",)


class ManifestError(EdgebenchError, ValueError):
    """An export request with a field no export takes, or an export directory whose manifest
    this edgebench cannot read; the message names the field or file and the fix."""


@dataclass(frozen=True)
class ExportRequest:
    """One export: what to lower, for which runtime and shapes.

    `backend`: "executorch" or "onnxruntime".
    `delegate`: "xnnpack" or None (ExecuTorch only). `bf16`: one of BF16_MODES (ExecuTorch
    with XNNPACK only). `seed` fixes the fresh weights (torch.manual_seed before build_model,
    as the eager backend does). `weight_decay`: RunSpec.weight_decay (None: the optimizer's
    default); only an update written into the program bakes it in (exporters.et_methods).
    """

    model: str = "tiny"
    method: str = "sgd"
    backend: str = "executorch"
    batch_size: int = 1
    image_size: int | None = None
    text_length: int = 32
    delegate: str | None = None
    bf16: str = "rounded"
    dtype: str = "float32"
    seed: int = 0
    profile: str | None = None
    weight_decay: float | None = None

    def __post_init__(self) -> None:
        backend = self.backend
        if backend not in EXPORT_BACKENDS:
            raise ManifestError(f"export backend {self.backend!r}: use one of {', '.join(EXPORT_BACKENDS)}")
        if self.delegate in ("none", ""):
            object.__setattr__(self, "delegate", None)
        if self.delegate is not None and self.delegate not in DELEGATES:
            raise ManifestError(f"delegate {self.delegate!r}: use one of {', '.join(DELEGATES)} or none")
        if backend == "onnxruntime" and self.delegate is not None:
            object.__setattr__(self, "delegate", None)  # ORT's CPU provider has no delegate knob
        if self.bf16 not in BF16_MODES:
            raise ManifestError(f"bf16 {self.bf16!r}: use one of {', '.join(BF16_MODES)}")
        if backend == "onnxruntime":
            object.__setattr__(self, "bf16", "rounded")  # ORT runs no bf16 method
        if self.bf16 == "fp32" and self.delegate is None:
            raise ManifestError("bf16 'fp32' is a choice of the XNNPACK lowering (without it, bf16 values run on "
                                "the runtime's bf16 kernels): use delegate xnnpack (`edgebench export --delegate "
                                "xnnpack`), or bf16 'rounded'")
        if self.batch_size < 1 or self.text_length < 2:
            raise ManifestError(f"batch_size {self.batch_size}, text_length {self.text_length}: batch_size must be "
                                ">= 1 and text_length >= 2 (the loss predicts the next token)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExportRequest:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    def key(self) -> str:
        """sha256 of everything that determines the exported files."""
        content = {
            "format": FORMAT,
            "request": self.to_dict(),
            "versions": library_versions(),
            "source": _running_source(),
            "checkpoint": checkpoint_fingerprint(self.model),
        }
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@functools.cache
def _running_source() -> str:
    """This checkout's fingerprint, read once: a process runs the code it started with."""
    return source_fingerprint(_repo_root())


def source_fingerprint(root: Path) -> str:
    """sha256 over the project's .py files an export runs (the import closure of
    EXPORT_ENTRY under `root`): editing any of them re-exports."""
    digest = hashlib.sha256()
    for path in import_closure(root, EXPORT_ENTRY):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def checkpoint_fingerprint(model: str) -> str | None:
    """For a checkpoint folder: sha256 over its config and weights files; None for a config name."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.is_file():
            digest.update(file.name.encode())
            digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def describe_files(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "sha256"}} for the files an export wrote."""
    return {n: {"bytes": (directory / n).stat().st_size, "sha256": sha256_file(directory / n)} for n in names}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, directory / MANIFEST)


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of an export directory; a clear error when there is none."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no export manifest here; make one with `edgebench export --device ... --out {directory}`"
        )
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc}); export it again (`edgebench export --out "
                            f"{directory}`)") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ManifestError(f"{path}: format {found!r}, this edgebench reads {FORMAT!r}; export it again "
                            f"(`edgebench export --out {directory}`)")
    return manifest


def altered_files(directory: Path, key: str) -> list[str] | None:
    """None when `directory` does not hold the export `key` (no manifest, another export);
    else the listed files whose content is not what was written (sha256 recorded in the
    manifest when the export wrote them): [] when every file is intact. A truncated, 0-byte
    or edited program is found here, whatever its size."""
    try:
        manifest = read_manifest(directory)
    except (FileNotFoundError, ValueError, json.JSONDecodeError):
        return None
    if manifest.get("key") != key:
        return None
    return [name for name, info in manifest["files"].items()
            if not (directory / name).is_file() or sha256_file(directory / name) != info["sha256"]]


def cache_root() -> Path:
    """`$EDGEBENCH_EXPORT_CACHE`, else ~/.cache/edgebench/exports."""
    env = os.environ.get("EDGEBENCH_EXPORT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edgebench" / "exports"


def materialize(source: Path, target: Path) -> None:
    """Copies an export's files into `target`, each replacing what is there (unlinked first, so
    a file that was a hard link into the cache is never written through): a user's copy never
    shares storage with the cache, so editing it never edits the cache."""
    target.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(source)
    for name in list(manifest["files"]) + [MANIFEST]:
        dest = target / name
        dest.unlink(missing_ok=True)
        shutil.copyfile(source / name, dest)


def link_or_copy(source: Path, dest: Path) -> None:
    """A hard link (no second copy of a ~1 GB program), a copy across file systems; only between
    the cache's own folders (never into a user's folder: `materialize`)."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


__all__ = [
    "DELEGATES",
    "ExportRequest",
    "MANIFEST",
    "ManifestError",
    "EXPORT_BACKENDS",
    "cache_root",
    "link_or_copy",
    "altered_files",
    "describe_files",
    "library_versions",
    "materialize",
    "read_manifest",
    "sha256_file",
    "write_manifest",
]
