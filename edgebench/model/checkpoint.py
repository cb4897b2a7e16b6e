"""nanoVLM checkpoints: `config.json` + `model.safetensors`, read and written as nanoVLM does.

config.json holds exactly the fields of the nanoVLM revision the config follows (so
nanoVLM's own `VLMConfig(**json)` reads it); edgebench's own fields go to
`edgebench.json` beside it, which nanoVLM never opens.

nanoVLM stores the tied embedding/head tensor once, as `decoder.head.weight`, and
keeps `decoder.rotary_embd.inv_freq`. We accept the tied tensor under either name
and check every other key strictly, so a checkpoint that does not fit is refused
with the keys that differ instead of loading half a model. torch is imported only
where weights are touched, so `read_config` works in a torch-free device process.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from edgebench.errors import EdgebenchError
from edgebench.model.config import VLMConfig, config_from_dict

if TYPE_CHECKING:
    import torch

    from edgebench.model.vision_language_model import VisionLanguageModel

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
EDGEBENCH_FILE = "edgebench.json"
TIED_KEYS = ("decoder.head.weight", "decoder.token_embedding.weight")  # stored name first


class CheckpointError(EdgebenchError, ValueError):
    """A checkpoint that does not match the model (the message lists the keys)."""


def expected_keys(model: VisionLanguageModel) -> set[str]:
    """The keys a nanoVLM file of this model holds (the tied tensor once, as decoder.head.weight)."""
    keys = set(model.state_dict())
    if model.cfg.lm_tie_weights:
        keys.discard(TIED_KEYS[1])
    return keys


def _resolve(name_or_dir: str) -> Path:
    """A local folder as is; a hub id (owner/name) downloaded through huggingface_hub."""
    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        return path
    looks_like_hub_id = (
        name_or_dir.count("/") == 1 and not path.exists() and not name_or_dir.startswith((".", "/", "~"))
    )
    if not looks_like_hub_id:
        raise FileNotFoundError(f"{name_or_dir}: no such checkpoint folder (expected {CONFIG_FILE} + {WEIGHTS_FILE})")
    manual = (
        f"download {CONFIG_FILE} and {WEIGHTS_FILE} from https://huggingface.co/{name_or_dir} "
        "into a folder and pass that folder instead"
    )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"{name_or_dir}: huggingface_hub is not installed; {manual}") from None
    try:
        return Path(snapshot_download(repo_id=name_or_dir, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, EDGEBENCH_FILE]))
    except Exception as exc:  # network, auth, missing repo: all end the same way for the user
        raise CheckpointError(f"{name_or_dir}: download failed ({exc}); {manual}") from exc


def read_config(folder: str | Path) -> VLMConfig:
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (a nanoVLM checkpoint folder holds {CONFIG_FILE} + {WEIGHTS_FILE})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object of nanoVLM config fields")
    extra_path = Path(folder) / EDGEBENCH_FILE
    extra = None
    if extra_path.is_file():
        try:
            extra = json.loads(extra_path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{extra_path}: not valid JSON ({exc})") from exc
    return config_from_dict(data, source=str(path), edgebench=extra)


def _check_keys(model: VisionLanguageModel, shapes: dict[str, list[int]], source: str) -> None:
    """Refuse (naming the keys) unless the file's tensor names and shapes are exactly the model's
    (the tied tensor under either name)."""
    shapes = dict(shapes)
    if model.cfg.lm_tie_weights and TIED_KEYS[1] in shapes:
        shapes.setdefault(TIED_KEYS[0], shapes[TIED_KEYS[1]])
        del shapes[TIED_KEYS[1]]
    wanted = model.state_dict()
    expected = expected_keys(model)
    missing, unexpected = sorted(expected - set(shapes)), sorted(set(shapes) - expected)
    wrong_shape = sorted(f"{k} {shapes[k]} (model {list(wanted[k].shape)})"
                         for k in expected & set(shapes) if shapes[k] != list(wanted[k].shape))
    if missing or unexpected or wrong_shape:
        parts = [f"{label}: {', '.join(keys)}" for label, keys in
                 (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatch", wrong_shape)) if keys]
        raise CheckpointError(f"{source}: checkpoint does not match the model; " + "; ".join(parts))


FLOAT_DTYPES = ("F32", "BF16", "F16")  # safetensors' names of the dtypes nanoVLM's weights come in


def check_checkpoint(folder: str | Path) -> VLMConfig:
    """A checkpoint folder checked before any run, nothing loaded: config.json (every field, each
    in range), and model.safetensors present, whole (its header and length agree) and holding
    exactly the config's tensors (names and shapes, read from the header), each floating point.
    Returns the config."""

    from edgebench.model.layout import meta_layout
    from edgebench.model.vision_language_model import VisionLanguageModel

    cfg = read_config(folder)
    weights = Path(folder) / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing (a nanoVLM checkpoint folder holds {CONFIG_FILE} + {WEIGHTS_FILE}); "
                              "save or download the weights into the folder")
    if weights.stat().st_size == 0:
        raise CheckpointError(f"{weights}: empty (0 bytes); download or save the checkpoint again")
    _safetensors()
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as fh:
            shapes = {k: list(fh.get_slice(k).get_shape()) for k in fh.keys()}
            dtypes = {k: str(fh.get_slice(k).get_dtype()) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own error type for a truncated or foreign file
        raise CheckpointError(f"{weights}: damaged or not a safetensors file ({' '.join(str(exc).split())}); "
                              "download or save the checkpoint again") from None
    not_float = sorted(f"{k} ({d})" for k, d in dtypes.items() if d not in FLOAT_DTYPES)
    if not_float:
        raise CheckpointError(f"{weights}: {len(not_float)} tensors are not floating point, e.g. "
                              f"{', '.join(not_float[:3])}; a nanoVLM checkpoint holds F32, BF16 or F16 weights: "
                              "save or download it again")
    with meta_layout():
        _check_keys(VisionLanguageModel(cfg), shapes, str(weights))
    _check_finite(weights)
    return cfg


def _check_finite(weights: Path) -> None:
    """Every weight finite, read one tensor at a time (a diverged run's saved NaNs would train
    nothing and load with no complaint)."""
    import torch
    from safetensors import safe_open

    broken = []
    with safe_open(str(weights), framework="pt") as fh:
        for key in fh.keys():
            if not bool(torch.isfinite(fh.get_tensor(key)).all()):
                broken.append(key)
    if broken:
        raise CheckpointError(f"{weights}: {len(broken)} tensors hold NaN or infinite values, e.g. "
                              f"{', '.join(sorted(broken)[:3])}; a run that diverged saved them: use an earlier "
                              "checkpoint")


def load_state_dict_strict(model: VisionLanguageModel, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Put `tensors` into `model`; refuse (naming the keys) unless they match exactly."""
    import torch

    tensors = dict(tensors)
    if model.cfg.lm_tie_weights:
        head, embedding = TIED_KEYS
        if embedding in tensors:
            alias = tensors.pop(embedding)
            if head in tensors and not torch.equal(tensors[head], alias):
                raise CheckpointError(f"{source}: {head} and {embedding} differ but the config ties them")
            tensors.setdefault(head, alias)
    _check_keys(model, {k: list(v.shape) for k, v in tensors.items()}, source)
    if model.cfg.lm_tie_weights:
        tensors[TIED_KEYS[1]] = tensors[TIED_KEYS[0]]
    model.load_state_dict(tensors, strict=True, assign=True)
    model.decoder.tie_weights()  # assign=True gave the two names separate Parameters


def _safetensors() -> types.ModuleType:
    try:
        import safetensors.torch
    except ImportError:
        raise CheckpointError("reading/writing nanoVLM checkpoints needs the safetensors package: "
                              "pip install safetensors") from None
    return safetensors.torch


def from_pretrained(name_or_dir: str | Path) -> VisionLanguageModel:
    """Load a nanoVLM checkpoint folder (or hub id) with strict key checking."""

    from edgebench.model.layout import meta_layout
    from edgebench.model.vision_language_model import VisionLanguageModel

    load_file = _safetensors().load_file

    folder = _resolve(str(name_or_dir))
    cfg = check_checkpoint(folder)  # refused whole before anything is read: a config or a file that does not fit
    weights = folder / WEIGHTS_FILE
    with meta_layout():  # no throwaway random weights: the file's tensors are assigned
        model = VisionLanguageModel(cfg)
    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # safetensors raises its own error type for a truncated or foreign file
        raise CheckpointError(f"{weights}: damaged or not a safetensors file ({exc}); download or save the "
                              "checkpoint again") from exc
    load_state_dict_strict(model, tensors, source=str(weights))
    return model


def save_pretrained(model: VisionLanguageModel, folder: str | Path) -> Path:
    """Write config.json + model.safetensors in nanoVLM's layout (tied tensor once), and edgebench.json."""
    return save_tensors(model.cfg, model.state_dict(), folder)


def save_tensors(cfg: VLMConfig, tensors: Mapping[str, torch.Tensor | Callable[[], torch.Tensor]],
                 folder: str | Path) -> Path:
    """`save_pretrained` for tensors under the model's names, each given as a tensor or as a
    function that makes it (a trained model's merged weights: made one at a time, so the save
    holds one layer's copy, not the model's). Refused, naming the keys, unless they are exactly
    the config's model's; every tensor is stored in that model's dtype (fp32)."""

    from edgebench.model.layout import meta_layout
    from edgebench.model.vision_language_model import VisionLanguageModel

    with meta_layout():  # names, shapes and dtypes only
        model = VisionLanguageModel(cfg)
    layout = {k: v for k, v in model.state_dict().items() if k in expected_keys(model)}
    missing, unexpected = sorted(set(layout) - set(tensors)), sorted(set(tensors) - set(TIED_KEYS) - set(layout))
    if missing or unexpected:
        raise CheckpointError(f"{folder}: cannot save a nanoVLM checkpoint: missing keys {missing[:5]}, "
                              f"unexpected keys {unexpected[:5]}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(cfg.to_nanovlm_dict(), indent=4) + "\n")
    (folder / EDGEBENCH_FILE).write_text(json.dumps(cfg.edgebench_dict(), indent=4) + "\n")
    def tensor(key: str) -> torch.Tensor:
        value = tensors[key]
        return value() if callable(value) else value

    write_safetensors(folder / WEIGHTS_FILE, layout, tensor)
    return folder


def write_safetensors(path: Path, layout: dict[str, torch.Tensor], make: Callable[[str], torch.Tensor]) -> None:
    """torch tensors as a safetensors file, one at a time (write_tensors_file): `layout` gives each
    name's shape and dtype (meta tensors), `make(name)` the values."""
    import torch

    dtypes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
              torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}

    def raw(name: str) -> memoryview:
        meta = layout[name]
        tensor = make(name).detach().to("cpu", meta.dtype).contiguous()
        if tensor.shape != meta.shape:
            raise CheckpointError(f"{path}: {name} has shape {list(tensor.shape)}, the model {list(meta.shape)}")
        return tensor.reshape(-1).view(torch.uint8).numpy().data

    write_tensors_file(path, {name: (dtypes[meta.dtype], list(meta.shape), meta.numel() * meta.element_size())
                              for name, meta in layout.items()}, raw)


def write_tensors_file(path: Path, layout: dict[str, tuple[str, list[int], int]],
                       raw: Callable[[str], memoryview]) -> None:
    """The safetensors format (8-byte header length, JSON header, raw little-endian data),
    written one tensor at a time (`safetensors.save_file` needs every tensor in memory at once)
    and without torch (a device's torch-free runtime writes its weights so too). `layout` gives
    each name's (dtype as safetensors names it, shape, bytes), `raw(name)` its bytes."""
    header, offset = {}, 0
    for name, (dtype, shape, size) in layout.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    partial = path.with_name(path.name + ".partial")  # renamed when whole: never a truncated `path`
    try:
        with open(partial, "wb") as fh:
            fh.write(len(text).to_bytes(8, "little") + text)
            for name in layout:
                fh.write(raw(name))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)
    except BaseException:  # a full disk, a bad tensor, a kill: no partial file is left to look saved
        partial.unlink(missing_ok=True)
        raise
