"""A run request refused before any work starts: each rule raises click's BadParameter naming
the option and the fix (exit 2), so a typo never reaches a device. bench and deploy check their
run options here (fleet/options.py: run_options), deploy its --spec files (fleet/spec_file.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgebench.fleet.plan import axis_values, check_method, check_model

if TYPE_CHECKING:
    from edgebench.model.config import VLMConfig
    from edgebench.runner.spec import RunSpec


def check_run_shape(shape: dict[str, Any], methods: list[str]) -> None:
    """Every rule of a run's shape, the names before the files (a dataset is read last); a
    checkpoint folder given as --model and a --data folder are resolved in `shape` as they pass."""
    check_request(shape, methods)
    _model_and_data(shape)
    _check_image_budget(shape)
    _check_packing(shape)
    _check_shape(shape)


def check_request(shape: dict[str, Any], methods: list[str]) -> None:
    """A method is given, the model and methods named exist, and each method's micro-batches
    divide --batch-size (each of its values)."""
    from edgebench.methods.knobs import MethodError, parse_method

    if not methods:
        raise click.BadParameter("no method given; e.g. --methods adamw,sgd (`edgebench methods`)",
                                 param_hint="--methods")
    try:
        check_model(shape["model"])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from None
    for method in methods:
        try:
            check_method(method)
        except MethodError as exc:
            raise click.BadParameter(str(exc), param_hint="--methods") from None
        parts = parse_method(method).accumulation
        for size in axis_values(shape["batch_size"]):  # each of a sweep's batch sizes
            if size % parts:
                raise click.BadParameter(f"{method} splits each batch into {parts} micro-batches: give a --batch-size "
                                         f"that is a multiple of {parts} (got {size}), or run it alone",
                                         param_hint="--batch-size")


def _model_and_data(shape: dict[str, Any]) -> None:
    """A checkpoint folder given as --model becomes `checkpoint` (absolute, with the folder's name
    as the model label), checked whole (config.json, model.safetensors) without loading it."""
    model = Path(shape["model"]).expanduser()
    if model.is_dir():
        from edgebench.model.checkpoint import CheckpointError, check_checkpoint
        from edgebench.model.config import ConfigError

        try:
            check_checkpoint(str(model))
        except (FileNotFoundError, CheckpointError, ConfigError) as exc:
            raise click.BadParameter(str(exc), param_hint="--model") from None
        shape["checkpoint"], shape["model"] = str(model.resolve()), model.resolve().name
    elif "/" in shape["model"] or shape["model"].startswith((".", "~")):
        raise click.BadParameter(f"{shape['model']}: no such checkpoint folder (a nanoVLM checkpoint folder holds "
                                 "config.json + model.safetensors)", param_hint="--model")


def _model_config(shape: dict[str, Any]) -> VLMConfig:
    """The model config as the checkpoint (or the named config) declares it."""
    from edgebench.model.checkpoint import read_config
    from edgebench.model.config import get_config

    return read_config(shape["checkpoint"]) if shape.get("checkpoint") else get_config(shape["model"])


def _config(shape: dict[str, Any]) -> VLMConfig:
    """The model config the runs train (checkpoint or named), with the image budget applied."""
    from edgebench.model.config import ConfigError
    from edgebench.runner.worker import image_budget

    cfg = _model_config(shape)
    try:
        return image_budget(cfg, shape["max_image_size"])
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-image-size") from None


def _check_shape(shape: dict[str, Any]) -> None:
    """The sequence fits the model's positions, and a --data folder fits the model: its tokenizer
    found (--tokenizer, the folder's, the checkpoint's), every line, its text within --text-length,
    every image a readable image within the model's pixel limit."""
    cfg = _config(shape)
    positions = cfg.with_image_size(shape.get("image_size")).sequence_length(shape["text_length"])
    if positions > cfg.lm_max_position_embeddings:
        room = cfg.lm_max_position_embeddings - (positions - shape["text_length"])
        raise click.BadParameter(f"{shape['text_length']} text tokens plus the image make {positions:,} positions, "
                                 f"more than {shape['model']}'s lm_max_position_embeddings "
                                 f"{cfg.lm_max_position_embeddings:,}; use at most {max(room, 0):,}",
                                 param_hint="--text-length")
    if shape["tokenizer"] and not shape["data_dir"]:
        raise click.BadParameter("the synthetic task has its own words: --tokenizer goes with --data",
                                 param_hint="--tokenizer")
    if shape["data_dir"]:
        from edgebench.data.folder import DatasetError, FolderDataset
        from edgebench.fleet.assets import as_folder_dataset

        try:
            shape["data_dir"] = str(as_folder_dataset(Path(shape["data_dir"]).resolve()))
            data = FolderDataset(shape["data_dir"], shape["tokenizer"], checkpoint=shape.get("checkpoint"))
            data.check(cfg, shape["text_length"], shape["packing"])
        except DatasetError as exc:
            raise click.BadParameter(str(exc), param_hint="--data") from None
        if shape["tokenizer"]:  # the file itself, which deploy ships
            shape["tokenizer"] = str(data.tokenizer_path.resolve())


def _check_image_budget(shape: dict[str, Any]) -> None:
    """--max-image-size fits the model: it tiles images, and the size is a multiple of its tile."""
    if shape["max_image_size"] is None:
        return
    cfg = _model_config(shape)
    if not cfg.image_splitting:
        raise click.BadParameter(f"{shape['model']} puts one {cfg.vit_img_size}-px image before the text (nanoVLM "
                                 "v0.1): it has no image budget; drop --max-image-size", param_hint="--max-image-size")
    _config(shape)


def _check_packing(shape: dict[str, Any]) -> None:
    """--packing needs main's layout (images inside the text) and the eager backend."""
    if not shape["packing"]:
        return
    if shape["backend"] != "eager":
        raise click.BadParameter(f"a packed batch holds a varying number of images, and a {shape['backend']} "
                                 "program has fixed shapes: use --backend eager or drop --packing",
                                 param_hint="--packing")
    if not _config(shape).image_splitting:
        raise click.BadParameter(f"{shape['model']} puts one image before each row (nanoVLM v0.1), so rows cannot "
                                 "hold several samples: drop --packing or use a main-layout model (nanovlm-460m)",
                                 param_hint="--packing")


def check_evaluation(shape: dict[str, Any]) -> None:
    """--target names a figure the run can evaluate; an accuracy target needs short answers (the
    synthetic task's, or a dataset's of at most SHORT_ANSWER_TOKENS tokens each)."""
    from edgebench.figures.learning import SHORT_ANSWER_TOKENS, TargetError, parse_target

    if not shape["target"]:
        return
    try:
        metric, _ = parse_target(shape["target"])
    except TargetError as exc:
        raise click.BadParameter(str(exc), param_hint="--target") from None
    if metric == "accuracy" and shape["data_dir"]:
        from edgebench.data.folder import FolderDataset

        data = FolderDataset(shape["data_dir"], shape["tokenizer"], checkpoint=shape.get("checkpoint"))
        longest = data.longest_answer_tokens()
        if longest > SHORT_ANSWER_TOKENS:
            raise click.BadParameter(f"{shape['data_dir']}: answers up to {longest} tokens long; exact-match "
                                     f"accuracy needs short answers (at most {SHORT_ANSWER_TOKENS} tokens): "
                                     "use --target loss=VALUE", param_hint="--target")


def check_program(program: str | None, backend: str) -> None:
    """--program names a folder `edgebench export` wrote, for the backend asked for."""
    if not program:
        return
    if backend == "eager":
        raise click.BadParameter("--program is an exported program: give --backend executorch or onnxruntime "
                                 "with it (eager runs torch and exports nothing)", param_hint="--program")
    try:
        manifest = json.loads((Path(program) / "manifest.json").read_text())
    except (OSError, ValueError):
        raise click.BadParameter(f"{program}: no readable manifest.json, so not a folder `edgebench export` "
                                 "wrote; export one (`edgebench export --backend ...`) or leave --program out",
                                 param_hint="--program") from None
    if isinstance(manifest, dict) and manifest.get("backend") not in (None, backend):
        raise click.BadParameter(f"{program}: a {manifest['backend']} program, and --backend is {backend}",
                                 param_hint="--program")


def check_program_fits(spec: RunSpec) -> None:
    """A run's --program (or its spec's) is an export of its method, by this edgebench's format,
    before anything ships: else the run would only fail on the device."""
    from edgebench.backends.program import ProgramError, open_program
    from edgebench.methods import parse_method

    if spec.program and spec.backend != "eager":
        try:
            open_program(spec, spec.backend, parse_method(spec.method).knobs())  # as the run will open it
        except (ProgramError, FileNotFoundError) as exc:
            raise click.BadParameter(str(exc), param_hint="--program") from None


def check_save(save: str | None, backend: str) -> None:
    """Before any run: --save names a folder this user can create files in (made if missing),
    and the backend has weights to save."""
    if not save:
        return
    if backend != "eager":
        raise click.BadParameter(f"an exported {backend} program keeps its weights inside its runtime, so there is "
                                 "nothing to save from it yet: use --backend eager with --save", param_hint="--save")
    try:
        Path(save).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=save):  # the one test that holds for root, /proc and read-only mounts
            pass
    except OSError as exc:
        raise click.BadParameter(f"{save}: not a folder edgebench can write trained weights into "
                                 f"({exc.strerror}); pass a folder of yours, e.g. --save ./weights",
                                 param_hint="--save") from None
