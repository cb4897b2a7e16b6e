"""The options of the commands that start or prepare runs (bench, deploy, export), declared
once so no two commands can drift apart in a name, a default or a help text; `run_options`
turns bench's and deploy's into one checked run shape (fleet/checks.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from edgebench.backends import BACKENDS
from edgebench.cli_types import SEED, FiniteNonNegative, FinitePositive, FiniteRange, ListOf
from edgebench.figures.learning import DEFAULT_EVAL_EVERY
from edgebench.fleet.checks import check_evaluation, check_run_shape
from edgebench.fleet.plan import parse_duration
from edgebench.runner.spec import MAX_STEPS, MAX_THREADS

# Value types the options share with deploy's --spec fields (fleet/spec_file.py).
BACKEND_CHOICE = click.Choice(list(BACKENDS))
STEPS = click.IntRange(1, MAX_STEPS)
MAX_RERUNS = 100  # --rerun-disturbed: extra runs a sweep may add
WARMUP_STEPS = click.IntRange(0, MAX_STEPS)
THREADS = click.IntRange(1, MAX_THREADS)


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
LR_HELP = ("Backbone learning rate (default: the method's own: the recipe's for a checkpoint, the lr measured to "
           "learn soonest for a config's fresh weights).")
WEIGHT_DECAY_HELP = (
    "Weight decay, as torch's optimizers apply it: L2 (added to the gradient) for SGD, SGD-momentum, Adam "
    "and the estimated-gradient methods, decoupled (w *= 1 - lr*wd) for the AdamW family, LOMO and "
    "Adafactor (default: the optimizer's own: AdamW's 0.01, else 0; cg refuses any but 0).")
LR_OPTION = click.option("--lr", default=None, type=FinitePositive(), help=LR_HELP)
WEIGHT_DECAY_OPTION = click.option("--weight-decay", default=None, type=FiniteNonNegative(), help=WEIGHT_DECAY_HELP)
# The axes of bench's and deploy's sweeps: each takes comma-separated values and the sweep runs
# methods x lr x weight decay x threads x batch size (fleet/plan.py: make_specs).
SEVERAL = " Several, comma-separated (e.g. {}), run each: the sweep is their cross product with the other axes."
AXIS_OPTIONS = [
    click.option("--lr", default=None, type=ListOf(FinitePositive()), metavar="LR[,LR...]",
                 help=LR_HELP + SEVERAL.format("1e-3,1e-4")),
    click.option("--weight-decay", default=None, type=ListOf(FiniteNonNegative()), metavar="WD[,WD...]",
                 help=WEIGHT_DECAY_HELP + SEVERAL.format("0,0.01")),
    click.option("--batch-size", default="1", show_default=True, type=ListOf(click.IntRange(min=1)),
                 metavar="N[,N...]",
                 help="Samples per step." + SEVERAL.format("1,4")),
    click.option("--threads", default=None, type=ListOf(THREADS), metavar="N[,N...]",
                 help="torch threads (default: torch's own)." + SEVERAL.format("1,2,4")),
]

# What bench and deploy do beyond the runs asked for: run a disturbed one again, keep the weights.
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


def run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The run-shape options every command that starts runs takes (bench, deploy), so the
    two can never drift apart. They arrive as one `shape` dict of RunSpec fields (the axes'
    lr, weight_decay, threads and batch_size as tuples of their values, or None: make_specs runs
    their cross product) plus `methods` (each method --repeats times), `runs_dir` and `as_json`."""
    options = [
        MODEL_OPTION,
        DATA_OPTION,
        TOKENIZER_OPTION,
        *AXIS_OPTIONS,
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
        check_run_shape(shape, methods)
        check_evaluation(shape)
        return command(shape=shape, methods=methods * kwargs.pop("repeats"), **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
