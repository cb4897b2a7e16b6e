"""deploy --spec: a RunSpec file a user wrote, held to the rules of the run options
(fleet/checks.py), its refusals named by the file and its field."""

from __future__ import annotations

from pathlib import Path

import click

from edgebench.cli_types import SEED, FiniteNonNegative, FinitePositive, FiniteRange
from edgebench.fleet.checks import check_request, check_run_shape
from edgebench.fleet.options import BACKEND_CHOICE, STEPS, THREADS, WARMUP_STEPS
from edgebench.runner.spec import MAX_DURATION_S, MAX_STEPS, RunSpec

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


def checked_spec(path: str) -> RunSpec:
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
    if spec.command is not None:  # a device's runs are edgebench's methods: no way yet to ship a command there
        raise click.BadParameter(f"{path}: command: deploy runs edgebench's methods, not a command; measure a command "
                                 "on this host with `edgebench measure -- CMD`", param_hint="--spec")
    on_host = spec.checkpoint is not None and Path(spec.checkpoint).is_dir()
    shape = {**spec.to_dict(), "model": spec.checkpoint if on_host else spec.model}
    try:
        if spec.checkpoint is None or on_host:  # a checkpoint already on the device is checked there
            check_run_shape(shape, [spec.method])
        else:
            check_request({"model": "tiny", "batch_size": spec.batch_size}, [spec.method])
    except click.BadParameter as exc:  # named by the spec's field, not the option
        field = {"--methods": "method", "--data": "data_dir"}.get(str(exc.param_hint),
                                                                  str(exc.param_hint).lstrip("-").replace("-", "_"))
        raise click.BadParameter(f"{path}: {field}: {exc.message}", param_hint="--spec") from None
    spec.data_dir, spec.tokenizer = shape["data_dir"], shape["tokenizer"]
    return spec
