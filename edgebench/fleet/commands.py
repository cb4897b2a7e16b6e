"""`edgebench bench`, `deploy`, `collect`, `status`: starting runs on devices (this host included) and
bringing them back; `edgebench devices calibrate`: a device's rates, measured by what the fleet ships
and runs there (fleet/calibrate.py)."""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgebench.backends import BACKENDS
from edgebench.cli_types import SEED, FiniteNonNegative, FinitePositive, FiniteRange
from edgebench.figures.learning import DEFAULT_EVAL_EVERY
from edgebench.fleet.plan import (
    check_method,
    check_model,
    make_specs,
    parse_duration,
    rerun_summary,
)
from edgebench.fleet.progress import plain_progress
from edgebench.results import STORE_DEFAULT_HELP, default_store, runs_dir_for, store_for
from edgebench.runner.spec import MAX_DURATION_S, MAX_STEPS, MAX_THREADS, WEIGHTS_DIR, RunSpec
from edgebench.terminal import VALUE_CHARS, console, wrapped
from edgebench.untrusted import printable

if TYPE_CHECKING:
    from edgebench.devices.inventory import MeasuredSpeed
    from edgebench.fleet.bench import BenchSweep
    from edgebench.fleet.deploy import Deployment
    from edgebench.model.config import VLMConfig


def _echo_err(message: str) -> None:
    click.echo(printable(message), err=True)


def _echo(message: str, err: bool = False, **style: Any) -> None:
    """A line that may quote what a device said (a status, an error): printable only."""
    click.secho(printable(message), err=err, **style)


def _said(value: Any) -> str:
    """What a device reported (a sweep id, a run's status), as a line shows it: printable, cut short."""
    return printable(value, newlines=False, limit=VALUE_CHARS)


def _device_names(given: tuple[str, ...], with_local: bool) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The devices named, or every good inventory device; bad entries come back as errors."""
    from edgebench.devices.inventory import InventoryError, get_device, scan_devices

    if given:
        for name in given:  # refused before any device is asked
            try:
                get_device(name)
            except InventoryError as exc:
                raise click.BadParameter(str(exc), param_hint="--device") from None
        return list(dict.fromkeys(given)), {}
    try:
        found, problems = scan_devices()
    except InventoryError as exc:
        raise click.ClickException(str(exc)) from None
    for name, why in problems.items():
        _echo_err(f"{name}: skipped: {why}")
    names = [d.name for d in found if with_local or d.name != "local"]
    return names, {name: {"error": why} for name, why in problems.items()}


BACKEND_CHOICE = click.Choice(list(BACKENDS))
STEPS = click.IntRange(1, MAX_STEPS)
MAX_RERUNS = 100  # --rerun-disturbed: extra runs a sweep may add
WARMUP_STEPS = click.IntRange(0, MAX_STEPS)
THREADS = click.IntRange(1, MAX_THREADS)


def _check_request(shape: dict[str, Any], methods: list[str]) -> None:
    """Refuses a typo before any work starts (one line naming the option and the fix, exit 2)."""
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
        if shape["batch_size"] % parts:
            raise click.BadParameter(f"{method} splits each batch into {parts} micro-batches: give a --batch-size "
                                     f"that is a multiple of {parts} (got {shape['batch_size']}), or run it alone",
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


def _config(shape: dict[str, Any]) -> VLMConfig:
    """The model config the runs train (checkpoint or named), with the image budget applied."""
    from edgebench.model.checkpoint import read_config
    from edgebench.model.config import ConfigError, get_config
    from edgebench.runner.worker import image_budget

    cfg = read_config(shape["checkpoint"]) if shape.get("checkpoint") else get_config(shape["model"])
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
    from edgebench.model.checkpoint import read_config
    from edgebench.model.config import get_config

    cfg = read_config(shape["checkpoint"]) if shape.get("checkpoint") else get_config(shape["model"])
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


def _check_evaluation(shape: dict[str, Any]) -> None:
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


# The user's own model, data, learning rate and weight decay: one definition for every command
# that takes them (bench, deploy, export).
MODEL_OPTION = click.option("--model", default="tiny", show_default=True,
                            help="Model config (see `edgebench models`) or a nanoVLM checkpoint folder "
                                 "(config.json + model.safetensors) to fine-tune.")
DATA_OPTION = click.option("--data", "data_dir", default=None, type=click.Path(exists=True, file_okay=False),
                           help="A dataset folder to train on: images and one JSONL of {image, question, answer} "
                                "lines, or a Hugging Face dataset as nanoVLM reads it (save_to_disk folder or "
                                "parquet files with the_cauldron's images/texts columns). Default: the synthetic "
                                "task.")
TOKENIZER_OPTION = click.option("--tokenizer", default=None, type=click.Path(exists=True),
                                help="The model's tokenizer.json for --data (the file, or a folder holding it). "
                                     "Default: the dataset folder's, else the one beside --model's config.json "
                                     "(where Hugging Face saves it).")
LR_OPTION = click.option("--lr", default=None, type=FinitePositive(),
                         help="Backbone learning rate (default: the method's own: the recipe's for a checkpoint, "
                              "the lr measured to learn soonest for a config's fresh weights).")
WEIGHT_DECAY_OPTION = click.option(
    "--weight-decay", default=None, type=FiniteNonNegative(),
    help="Weight decay, as torch's optimizers apply it: L2 (added to the gradient) for SGD, SGD-momentum, Adam "
         "and the estimated-gradient methods, decoupled (w *= 1 - lr*wd) for the AdamW family, LOMO and "
         "Adafactor (default: the optimizer's own: AdamW's 0.01, else 0; cg refuses any but 0).")


RERUN_OPTION = click.option("--rerun-disturbed", default=0, show_default=True, type=click.IntRange(0, MAX_RERUNS),
                            metavar="N",
                            help="Run a configuration again when its run was disturbed (other processes took >10% of "
                                 "the CPU), at most N extra runs in all (deploy: per device, on devices with Python); "
                                 "the disturbed run stays in the store beside its re-run.")
SAVE_OPTION = click.option("--save", "save", default=None, type=click.Path(file_okay=False),
                           help="Keep each run's trained weights after its last step in SAVE/<run_id>/: a nanoVLM "
                                "checkpoint (config.json + model.safetensors; `edgebench models --load`, `--model`), "
                                "and for LoRA methods the adapter in peft's format beside it (eager backend; deploy: "
                                "`collect` brings them back).")


def _check_program(program: str | None, backend: str) -> None:
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


def _check_program_fits(spec: RunSpec) -> None:
    """A run's --program (or its spec's) is an export of its method, by this edgebench's format,
    before anything ships: else the run would only fail on the device."""
    from edgebench.backends.program import ProgramError, open_program
    from edgebench.methods import parse_method

    if spec.program and spec.backend != "eager":
        try:
            open_program(spec, spec.backend, parse_method(spec.method).knobs())  # as the run will open it
        except (ProgramError, FileNotFoundError) as exc:
            raise click.BadParameter(str(exc), param_hint="--program") from None


def _check_save(save: str | None, backend: str) -> None:
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


def run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The run-shape options every command that starts runs takes (bench, deploy), so the
    two can never drift apart. They arrive as one `shape` dict of RunSpec fields plus
    `methods` (each method --repeats times), `runs_dir` and `as_json`."""
    options = [
        MODEL_OPTION,
        DATA_OPTION,
        TOKENIZER_OPTION,
        LR_OPTION,
        WEIGHT_DECAY_OPTION,
        click.option(
            "--repeats",
            default=1,
            show_default=True,
            type=click.IntRange(min=1),
            help="Run each method N times (interleaved); reports give each figure's median, min-max and n.",
        ),
        click.option(
            "--methods",
            default="adamw,sgd",
            show_default=True,
            help="Comma-separated presets or combinations (see `edgebench methods`).",
        ),
        click.option(
            "--backend",
            default="eager",
            show_default=True,
            type=BACKEND_CHOICE,
            help="eager runs torch; executorch and onnxruntime run a program exported for the "
            "device's profile first (cached).",
        ),
        click.option(
            "--runtime",
            default="auto",
            show_default=True,
            type=click.Choice(("auto", "native", "python")),
            help="ExecuTorch only: which worker trains. native: the C++ worker built against ExecuTorch's "
            "runtime, with no Python or torch in the process (what an app on the device pays); "
            "python: ExecuTorch's Python runtime under torch; auto: native where it is built for the "
            "device's arch and runs the method, else python.",
        ),
        click.option("--steps", default=5, show_default=True, type=STEPS, help="Measured steps."),
        click.option("--warmup", default=1, show_default=True, type=WARMUP_STEPS, help="Warmup steps."),
        click.option("--duration", default=None, help="Run for a time instead of --steps, e.g. 90s or 10m."),
        click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1)),
        click.option("--text-length", default=32, show_default=True, type=click.IntRange(min=2)),
        click.option(
            "--max-image-size",
            default=None,
            type=click.IntRange(min=1),
            help="Image budget of models that tile images (nanovlm-460m): the long side images are "
            "resized to before tiling; 512 = one view of 64 tokens instead of 17 (default: the "
            "config's own, 2048).",
        ),
        click.option(
            "--packing",
            is_flag=True,
            help="Pack several samples into each row, each after a masked separator, as the current "
            "nanoVLM trains (main-layout models, eager backend); default: one left-padded sample "
            "per row with its attention mask.",
        ),
        click.option(
            "--eval-every",
            default=None,
            type=click.IntRange(1, MAX_STEPS),
            help="Evaluate on held-out data (never trained on) before the first step, every N steps "
            f"and after the last: held-out loss and exact-match answer accuracy (default with --target: every "
            f"{DEFAULT_EVAL_EVERY}). Evaluation time is kept apart from step times. An exported program "
            "(executorch, onnxruntime; Python runtime) saves its weights there and the host evaluates them.",
        ),
        click.option(
            "--eval-samples", default=32, show_default=True, type=click.IntRange(min=1),
            help="Held-out samples each evaluation reads.",
        ),
        click.option(
            "--eval-fraction", default=0.1, show_default=True,
            type=FiniteRange(0, 1, min_open=True, max_open=True),
            help="With --data: the share of the dataset held out for evaluation (seed-fixed; training never sees it).",
        ),
        click.option(
            "--target",
            default=None,
            help="Stop a run once its held-out figure reaches this, e.g. accuracy=0.9 or loss=2.0; "
            "--steps/--duration are the cap. Records the steps, seconds and joules it took, or that the "
            "cap came first. An exported program's run, evaluated by the host afterwards, runs to its cap.",
        ),
        click.option(
            "--threads", default=None, type=THREADS, help="torch threads (default: torch's own)."
        ),
        click.option("--accelerator", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"])),
        click.option(
            "--sample-hz",
            default=20.0,
            show_default=True,
            type=FiniteRange(1, 100),
            help="Telemetry sampling rate.",
        ),
        click.option(
            "--timeout", "timeout_s", default=None, type=FinitePositive(), help="Wall-clock limit per run, seconds."
        ),
        click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the fresh weights and the data."),
        click.option(
            "--runs-dir",
            default=None,
            type=click.Path(file_okay=False),
            help="Local folder for run directories, clock probes and deployment records (its store inside it). "
                 "Default: beside your store, so `edgebench report` finds every run from any folder.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts."),
        click.option(
            "--force",
            is_flag=True,
            help="Run even where the memory model predicts a run does not fit what a run may take on the "
            "device: its RAM less its OS at idle, the supervisor and a margin (meta.json records that it was "
            "forced).",
        ),
    ]
    shape_fields = (
        "model",
        "data_dir",
        "tokenizer",
        "lr",
        "weight_decay",
        "backend",
        "runtime",
        "batch_size",
        "text_length",
        "max_image_size",
        "packing",
        "threads",
        "accelerator",
        "sample_hz",
        "timeout_s",
        "seed",
        "eval_every",
        "eval_samples",
        "eval_fraction",
        "target",
    )

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        shape = {name: kwargs.pop(name) for name in shape_fields}
        shape["steps"], shape["warmup_steps"] = kwargs.pop("steps"), kwargs.pop("warmup")
        duration = kwargs.pop("duration")
        if duration is not None and click.get_current_context().get_parameter_source("steps") is \
                click.core.ParameterSource.COMMANDLINE:
            raise click.BadParameter("give --steps or --duration, not both (--duration runs for a time, --steps for "
                                     "a count of steps)", param_hint="--duration")
        try:
            shape["duration_s"] = parse_duration(duration) if duration else None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--duration") from None
        methods = [m.strip() for m in kwargs.pop("methods").split(",") if m.strip()]
        _check_request(shape, methods)
        _model_and_data(shape)
        _check_image_budget(shape)
        _check_packing(shape)
        _check_shape(shape)
        _check_evaluation(shape)
        return command(shape=shape, methods=methods * kwargs.pop("repeats"), **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


@click.command()
@click.option("--device", default="local", show_default=True,
              help="Where to run. `local` is this host; remote devices go through `edgebench deploy`.")
@run_options
@click.option("--store", default=None, type=click.Path(dir_okay=False),
              help=f"Results store to ingest into (default: RUNS_DIR/edgebench.duckdb with --runs-dir, else "
                   f"{STORE_DEFAULT_HELP}); see `edgebench report`.")
@RERUN_OPTION
@SAVE_OPTION
def bench(device: str, shape: dict[str, Any], methods: list[str], runs_dir: str | None, as_json: bool,
          store: str | None, rerun_disturbed: int, save: str | None, force: bool) -> None:
    """Benchmark fine-tuning methods on this host: `deploy` to the local device, in the foreground.

    Each method runs in a fresh process so its memory is its own, sampled while it runs;
    a run that OOMs, diverges or fails is recorded with its status and the sweep goes on;
    a method the backend cannot run is recorded `unsupported`. Exit 1 when no run ended `ok`.
    A run the memory model predicts does not fit what a run may take on this host (its RAM less
    what it holds now, the supervisor and a margin) is refused before anything starts, with
    methods that fit; --force runs it anyway.
    Each run leaves a run directory under --runs-dir and is ingested into the store.
    With --repeats N the table gives each figure as the median of the N runs with
    [min-max] and n; a run that other processes disturbed (they took >10% of the CPU)
    is flagged "!" (--rerun-disturbed N runs it again, N extra runs at most). Fine-tune
    your own model on your own data with --model CHECKPOINT_DIR --data DATASET_DIR --lr 1e-4
    --save DIR (README: "Your model, your data"). Piped, it prints one line per stage and step.
    docs/figures.md defines every figure.
    """
    from edgebench.fleet.bench import bench_on_host
    from edgebench.fleet.progress import RunBars

    if device != "local":
        raise click.UsageError(
            f"bench runs on this host only (--device local); for device {device!r} use "
            f"`edgebench deploy --device {device}` and then `edgebench collect`")
    _check_save(save, shape["backend"])
    store_path, runs = store_for(store, runs_dir), runs_dir_for(runs_dir)
    sweep = bench_on_host(methods, shape, runs, store_path, save=save, force=force, rerun_disturbed=rerun_disturbed,
                          display=RunBars(quiet=as_json), log=_echo_err)
    if sweep.interrupted:
        click.echo(f"interrupted by {sweep.interrupted}: {len(sweep.results)} of {len(sweep.specs)} runs recorded and "
                   f"ingested into {store_path}; the rest did not start", err=True)
        raise SystemExit(130)
    if as_json:
        click.echo(json.dumps(sweep.results, indent=2, default=str))
    else:
        _show_bench(sweep, f"{shape['model']} on {device}, batch {shape['batch_size']}, {shape['backend']}",
                    rerun_disturbed, runs, store_path)
    _bench_exit(sweep.results, device, shape["backend"])


def _show_bench(sweep: BenchSweep, title: str, rerun_disturbed: int, runs: Path, store_path: Path) -> None:
    """bench's table, what --rerun-disturbed and --save did, and where the runs and the store are."""
    from edgebench.report.tables import render_bench_results

    render_bench_results(sweep.results, title)
    if rerun_disturbed:
        click.echo(wrapped(rerun_summary(sweep.results, sweep.reruns, rerun_disturbed), console().width))
    for r in sweep.results:
        if r.get("saved_to"):
            click.echo(f"{r['method']}: trained weights saved to {r['saved_to']}")
    see = "edgebench report" if store_path == default_store() else f"edgebench report --store {store_path}"
    # wrapped at spaces: the command and its path stay whole (a terminal breaks a line anywhere)
    click.echo(wrapped(f"run directories under {runs}/; store {store_path} ({see})", console().width))


def _bench_exit(results: list[dict[str, Any]], device: str, backend: str) -> None:
    """Exit 1 when no run ended ok (as deploy: a sweep where nothing could run failed); runs
    that did not end ok are counted on stderr either way."""
    refused = {r["method"]: " ".join(str(r["detail"]).split()) for r in results if r["status"] == "unsupported"}
    if results and len(refused) == len(results):
        click.secho(f"{device}: no method can run there ({backend}): "
                    + "; ".join(f"{m}: {why}" for m, why in refused.items()), fg="red", err=True)
        raise SystemExit(1)
    ended = Counter(str(r["status"]) for r in results)
    if ended["ok"] < len(results):
        click.secho(f"{device}: {ended['ok']} of {len(results)} runs ended ok ("
                    + ", ".join(f"{n} {status}" for status, n in ended.items() if status != "ok")
                    + "); the table and `edgebench report` give each run's detail",
                    fg="red" if not ended["ok"] else "yellow", err=True)
    if results and not ended["ok"]:
        raise SystemExit(1)


@click.command()
@click.option("--device", "devices", multiple=True, required=True,
              help="Inventory name (repeatable; several devices run at once). See `edgebench devices`.")
@run_options
@click.option("--program", default=None, type=click.Path(exists=True, file_okay=False),
              help="A program exported beforehand (`edgebench export`); default: export for each device's "
                   "profile now (cached).")
@click.option("--spec", "spec_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="RunSpec JSON file to run as is (repeatable); replaces --methods and the shape options.")
@RERUN_OPTION
@SAVE_OPTION
def deploy(devices: tuple[str, ...], shape: dict[str, Any], methods: list[str], runs_dir: str | None, as_json: bool,
           program: str | None, spec_files: tuple[str, ...], rerun_disturbed: int, save: str | None,
           force: bool) -> None:
    """Start a sweep of methods on one or more devices, detached; print the run ids.

    Takes the same run options as `bench`. Preflight checks the device (Python,
    torch/executorch versions, free RAM and disk, arch vs backend); exported backends get
    their program exported for each device's profile (or --program); then edgebench's own
    source (no dependencies are installed on the device), the programs and one spec per
    method are shipped and the sweep starts with setsid/nohup, so it survives a dropped
    connection. Programs, a --model checkpoint folder, a --data dataset folder, a --tokenizer
    file and the native worker are shipped once and cached on the device; before every sweep
    the device checks each file's sha256, and a copy that changed there is sent again. One sweep runs on a device at a
    time: while one is running there, deploy is refused. With --save DIR each run keeps
    its trained weights, which `collect` brings back into DIR/<run_id>/. Clock probes are recorded
    for alignment. Fetch results with
    `edgebench collect`; watch with `edgebench status`. A board farm's device (a labgrid
    place) is acquired for the sweep: refused while someone holds it, given back if the
    deploy fails or is interrupted, else by `collect` once the sweep has ended.
    """
    from edgebench.fleet.stopping import deploy_or_stop

    _device_names(devices, with_local=True)  # an unknown or unsafe name is refused before any work
    specs = _deploy_specs(spec_files, program, shape, methods, save)
    try:
        # Each stage is a line on stderr; off a terminal each carries the elapsed time too.
        results = deploy_or_stop(list(devices), specs, runs_dir_for(runs_dir), store_for(None, runs_dir),
                                 log=(lambda _: None) if as_json else plain_progress(sys.stderr) or _echo_err,
                                 said=_echo_err, save_to=str(Path(save).resolve()) if save else None, force=force,
                                 rerun_disturbed=rerun_disturbed)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    _show_deploy(results, as_json)
    failed = {name: str(r) for name, r in results.items() if isinstance(r, Exception)}
    if failed:
        started = [r for r in results.values() if not isinstance(r, Exception)]
        _echo_err(f"deploy: {len(started)} of {len(results)} device(s) started a sweep "
                  f"({sum(len(r.run_ids) for r in started)} runs); {', '.join(failed)} failed")
        raise SystemExit(1)


def _deploy_specs(spec_files: tuple[str, ...], program: str | None, shape: dict[str, Any], methods: list[str],
                  save: str | None) -> list[RunSpec]:
    """The specs deploy ships: the --spec files checked, else one per method; with --save each
    keeps its weights in its run directory (collect brings them back)."""
    if spec_files:
        specs = [_checked_spec(path) for path in spec_files]
    else:
        _check_program(program, shape["backend"])
        specs = make_specs(methods, program=program, **shape)
    for spec in specs:
        _check_program_fits(spec)
        _check_save(save, spec.backend)
        spec.save_dir = WEIGHTS_DIR if save else spec.save_dir
    return specs


def _show_deploy(results: dict[str, Deployment | Exception], as_json: bool) -> None:
    """Each device's sweep and run ids (or why it failed), as lines or JSON."""
    if as_json:
        click.echo(json.dumps({name: {"error": str(r)} if isinstance(r, Exception) else
                               {"sweep_id": r.sweep_id, "sweep_dir": r.sweep_dir, "run_ids": r.run_ids,
                                "refused": r.refused}
                               for name, r in results.items()}, indent=2))
        return
    for name, r in results.items():
        if isinstance(r, Exception):
            _echo(f"{name}: FAILED: {r}", fg="red", err=True)
            continue
        click.echo(f"{name}: sweep {r.sweep_id}")
        for run_id in r.run_ids:
            click.echo(f"  {run_id}")
        for method, why in r.refused.items():
            _echo(f"  {method}: unsupported: {why}", fg="yellow")


# A RunSpec file's fields checked as the options that set them are (deploy --spec).
SPEC_FIELD_TYPES = {
    "backend": BACKEND_CHOICE,
    "batch_size": click.IntRange(min=1),
    "text_length": click.IntRange(min=2),
    "steps": STEPS,
    "warmup_steps": WARMUP_STEPS,
    "max_image_size": click.IntRange(min=1),
    "image_size": click.IntRange(min=1),
    "threads": THREADS,
    "lr": FinitePositive(),
    "weight_decay": FiniteNonNegative(),
    "timeout_s": FinitePositive(),
    "duration_s": FiniteRange(0, MAX_DURATION_S, min_open=True),
    "eval_every": click.IntRange(1, MAX_STEPS),
    "sample_hz": FiniteRange(1, 100),
    "accelerator": click.Choice(["cpu", "cuda"]),
    "seed": SEED,
}


def _checked_spec(path: str) -> RunSpec:
    """A --spec file checked on this host as the options are (model, method, every number, a
    checkpoint or dataset folder on this host), so a typo is refused here, not on the device."""
    try:
        spec = RunSpec.load(path)
        for name, kind in SPEC_FIELD_TYPES.items():
            value = getattr(spec, name)
            if value is not None:
                try:
                    setattr(spec, name, kind.convert(value, None, None))
                except click.BadParameter as exc:
                    raise ValueError(f"{name}: {exc.message}") from None
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--spec") from None
    on_host = spec.checkpoint is not None and Path(spec.checkpoint).is_dir()
    shape = {**spec.to_dict(), "model": spec.checkpoint if on_host else spec.model}
    try:
        if spec.checkpoint is None or on_host:  # a checkpoint already on the device is checked there
            _check_request(shape, [spec.method])
            _model_and_data(shape)
            _check_image_budget(shape)
            _check_packing(shape)
            _check_shape(shape)
        else:
            _check_request({"model": "tiny", "batch_size": spec.batch_size}, [spec.method])
    except click.BadParameter as exc:  # named by the spec's field, not the option
        field = {"--methods": "method", "--data": "data_dir"}.get(str(exc.param_hint),
                                                                  str(exc.param_hint).lstrip("-").replace("-", "_"))
        raise click.BadParameter(f"{path}: {field}: {exc.message}", param_hint="--spec") from None
    spec.data_dir, spec.tokenizer = shape["data_dir"], shape["tokenizer"]
    return spec


@click.command()
@click.option("--device", "devices", multiple=True, help="Inventory name (repeatable). Default: every device.")
@click.option("--run", "run_id", default=None, help="Only this run id.")
@click.option("--store", default=None, help=f"DuckDB results store to ingest into (default: RUNS_DIR/edgebench.duckdb "
                                            f"with --runs-dir, else {STORE_DEFAULT_HELP}).")
@click.option("--no-ingest", is_flag=True, help="Fetch only; do not touch the store.")
@click.option("--runs-dir", default=None, type=click.Path(file_okay=False),
              help="Local folder: runs land in RUNS_DIR/<device>/<run_id>/ (default: beside the store).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--all", "every", is_flag=True,
              help="Every sweep on the device, other hosts' too. Default: this host's sweeps, and an older "
                   "edgebench's (no host record).")
def collect(devices: tuple[str, ...], run_id: str | None, store: str | None, no_ingest: bool, runs_dir: str | None,
            as_json: bool, every: bool) -> None:
    """Fetch finished and partial runs from devices and ingest them into the store.

    Every file is checked against the size and sha256 the device lists; interrupted
    downloads resume; running it again fetches only what changed. Fresh clock probes are
    taken each time. A labgrid place held for a sweep that has ended is released. Other
    hosts' sweeps are left alone (each sweep records its host); --all fetches them too.
    """
    from edgebench.fleet.collect import collect_device

    names, problems = _device_names(devices, with_local=False)
    report: dict[str, dict[str, Any]] = dict(problems)  # printed as JSON with --json
    errors, store_path = bool(report), store_for(store, runs_dir)
    for name in names:  # one at a time: the store takes one writer
        try:
            got = collect_device(name, run_id, runs_dir_for(runs_dir),
                                 None if no_ingest else store_path,
                                 log=(lambda _: None) if as_json else _echo_err, every=every)
        except (RuntimeError, ValueError, OSError) as exc:
            errors = True
            report[name] = {"error": str(exc)}
            if not as_json:
                _echo(f"{name}: FAILED: {exc}", fg="red", err=True)
            continue
        report[name] = {"runs": got.runs, "files_fetched": got.files_fetched, "bytes_fetched": got.bytes_fetched,
                        "ingested": got.ingested, "not_ingested": got.not_ingested, "refused": got.refused,
                        "other_hosts_runs": got.owners, "other_sweeps_left": got.others}
        errors = errors or bool(got.refused)
        if not as_json:
            click.echo(f"{name}: {len(got.runs)} runs, {got.files_fetched} files ({got.bytes_fetched / 1024:.0f} KiB) "
                       f"fetched, {len(got.ingested)} ingested into {store_path if not no_ingest else '(no store)'}")
            if got.others:
                click.echo(f"  left alone: {got.others} sweep(s) of other hosts (--all fetches them)")
            for rid, owner in got.owners.items():
                click.echo(f"  {rid}: started by {owner}")
            for rid, why in got.not_ingested.items():
                _echo(f"  not ingested {rid}: {why}")
            for rid, why in got.refused.items():
                _echo(f"  refused {rid}: {why}", err=True, fg="red")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    if errors:
        raise SystemExit(1)


@click.command()
@click.option("--device", "devices", multiple=True, help="Inventory name (repeatable). Default: every device.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--all", "every", is_flag=True,
              help="Every sweep on the device, other hosts' marked with whose they are. Default: this host's "
                   "sweeps, and an older edgebench's (no host record).")
def status(devices: tuple[str, ...], as_json: bool, every: bool) -> None:
    """Show what is running where: each device's sweeps this host deployed (--all: other hosts'
    too) and their runs' statuses, and for a board farm's device who holds its labgrid place (since
    when, for which sweep)."""
    from edgebench.fleet.status import fleet_status

    names, problems = _device_names(devices, with_local=True)
    rows = fleet_status(names, every) + [{"device": name, **why} for name, why in problems.items()]
    unasked = [row["device"] for row in rows if "error" in row]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    for row in [] if as_json else rows:
        place = row.get("place")
        if place:  # board farm: who holds the device's labgrid place
            sweep = f" for sweep {place['sweep']}" if place["sweep"] else ""
            held = f"held by {place['held_by']} since {place['since']}{sweep}" if place["held_by"] else "free"
            _echo(f"{row['device']}: labgrid place {place['name']}: {held}")
        if "error" in row:
            _echo(f"{row['device']}: {row['error']}", fg="red")
            continue
        if not row["sweeps"]:
            click.echo(f"{row['device']}: no sweeps" + (" of this host's" if row["others"] else ""))
        if row["others"]:
            click.echo(f"{row['device']}: {row['others']} sweep(s) of other hosts not shown (--all shows them)")
        for sweep_id, sweep in row["sweeps"].items():
            done = sum(1 for rid, s in sweep["runs"].items()  # a kept partial attempt is not a spec of its own
                       if s not in ("running", "not started", "stopped") and ".attempt-" not in rid)
            why = f" ({_said(sweep['why'])})" if sweep.get("why") else ""
            owner = f" [started by {sweep['owner']}]" if sweep.get("owner") else ""
            _echo(f"{row['device']}: sweep {_said(sweep_id)}: {_said(sweep['state'])}{why}, {done}/"
                  f"{len(sweep['specs'])} runs done{owner}")
            for rid, run_status in sweep["runs"].items():
                _echo(f"  {_said(rid)}: {_said(run_status)}")
    if unasked:  # a script must not read "nothing running" into a device that could not be asked
        raise SystemExit(1)


@click.command("calibrate", short_help="Measure the step-time model's rates on a device; predict ranks by them.")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the rates stored and where).")
def calibrate(name: str, as_json: bool) -> None:
    """Measure on the device the rates the step-time estimate weighs a step's work by (fp32
    matmul GFLOP/s, bf16 matmul time over fp32's, ns per elementwise pass and per normal sample:
    methods.device_speed), with its own Python and torch, and store them in its inventory entry
    with when and on what CPU, torch and thread count they were measured.

    Until then `predict --device NAME` and deploy's memory preflight rank methods by a reference
    x86 host's rates and leave the bf16 methods unestimated; the ratios between methods differ
    between CPUs. Takes seconds on a board, minutes under the arm64 lab's emulation. Run it
    again after changing the board's torch. On a device without Python (`python: none`: a
    phone) or whose Python has no torch, the native ExecuTorch worker measures them as its runs
    spend time (matmuls as ExecuTorch programs, its own update loop and MeZO generator): the
    host builds it for the device's arch and ships it with its rates programs, as deploy does;
    predict then ranks the native worker's runs there.

    \b
    edgebench devices calibrate orin
    edgebench predict --device orin --model nanovlm-222m
    """
    from edgebench.devices.commands import UserError
    from edgebench.devices.inventory import InventoryError, get_device, inventory_path, read_inventory
    from edgebench.devices.transport import TransportError
    from edgebench.fleet.calibrate import CalibrationError, measure_on, store

    if name not in read_inventory():
        raise UserError(f"{name}: local is this host, whose profile measures its rates here when predict needs them "
                        "(`speed: measure`); nothing to calibrate" if name == "local" else
                        f"{name} is not in {inventory_path()}, so its rates have nowhere to be stored; add it with "
                        f"`edgebench devices add {name} --host HOST`")
    try:
        speed = measure_on(get_device(name), log=lambda line: click.echo(printable(line), err=True))
        store(name, speed)
    except (InventoryError, CalibrationError, TransportError) as exc:
        raise UserError(printable(str(exc), newlines=False)) from None
    if as_json:
        click.echo(json.dumps({"device": name, "inventory": str(inventory_path()), "speed": speed.model_dump()},
                              indent=2))
        return
    _print_rates(name, speed)


def _print_rates(name: str, speed: MeasuredSpeed) -> None:
    """The rates measured, with what measured them and where they are stored, on one line."""
    from edgebench.devices.inventory import inventory_path

    bf16 = speed.bf16_matmul_cost
    click.echo(printable(
        f"{name}: fp32 matmuls {speed.matmul_gflops:.0f} GFLOP/s, bf16 matmuls "
        f"{'unknown' if bf16 is None else f'{bf16:.2f}x fp32 time'}, {speed.pass_ns:.2f} ns per elementwise pass, "
        f"{speed.normal_ns:.2f} ns per normal sample ({speed.cpu}, {speed.measured_with()}, {speed.threads} threads); "
        f"stored in {inventory_path()}: `edgebench predict --device {name}` ranks by them", newlines=False))
