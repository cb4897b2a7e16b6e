"""`edgebench methods` (the presets) and `edgebench predict` (a method's memory, estimated)."""

from __future__ import annotations

import json

import click

from edgebench.methods.knobs import PRESETS, MethodError, parse_method

# Room the runtime needs beyond the predicted peak (other processes, page cache, allocator).
DEFAULT_HEADROOM = 0.15


def _knob_text(knobs: dict) -> str:
    defaults = parse_method("adamw").knobs()
    changed = {k: v for k, v in knobs.items() if v != defaults[k]}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "(nanoVLM defaults)"


@click.command("methods")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def methods_command(as_json: bool) -> None:
    """List the fine-tuning methods: presets, the knobs behind each, and the backends that can
    run it (with --json: why each other backend refuses it). Combine presets and modifiers with `+` (e.g. `lora+ckpt+bf16`, `bitfit+frozen-int8`,
    `adamw+accum4`); impossible combinations are refused with the reason."""
    from edgebench.backends.support import support_matrix

    matrix = support_matrix({name: parse_method(name) for name in PRESETS})
    rows = []
    for name, (description, _) in PRESETS.items():
        rows.append({"name": name, "description": description, "knobs": parse_method(name).knobs(),
                     "backends": [b for b, why in matrix[name].items() if why is None],
                     "refused": {b: why for b, why in matrix[name].items() if why is not None}})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="edgebench methods (combine with +: ckpt, bf16, accumN, fused, frozen-bf16, frozen-int8)",
                  caption="`edgebench methods --json` says why each missing backend refuses a method")
    for column in ("preset", "what it does", "knobs (vs adamw)", "backends"):
        table.add_column(column, overflow="fold")  # wrap, never cut: a name must stay typeable
    for row in rows:
        table.add_row(row["name"], row["description"], _knob_text(row["knobs"]), ", ".join(row["backends"]))
    Console().print(table)


def _ram_bytes(device: str | None, ram_bytes: int | None) -> tuple[int, str]:
    if ram_bytes is not None:
        return ram_bytes, "--ram-bytes"
    if device is None:
        raise click.UsageError("give --device PROFILE (see device_profiles/) or --ram-bytes N")
    from edgebench.devices.profiles import load_profile

    return int(load_profile(device).ram_bytes), device


@click.command("predict")
@click.option("--device", help="Device profile name or YAML path (its RAM is the budget).")
@click.option("--ram-bytes", type=int, help="RAM budget in bytes, instead of --device.")
@click.option("--model", "model_name", default="tiny", show_default=True, help="Model config name.")
@click.option("--method", required=True, help="Preset or + combination (see `edgebench methods`).")
@click.option("--batch-size", default=1, show_default=True, type=int)
@click.option("--text-length", default=32, show_default=True, type=int)
@click.option("--image-size", type=int, help="Square image side (default: the config's).")
@click.option("--headroom", default=DEFAULT_HEADROOM, show_default=True, type=float,
              help="Fraction of RAM kept free for the OS and runtime.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def predict_command(device, ram_bytes, model_name, method, batch_size, text_length, image_size,
                    headroom, as_json) -> None:
    """Predict a method's memory (weights, gradients, optimizer state, activations,
    temporaries, runtime baseline, peak) before running it, and whether it fits the device's
    RAM with headroom. All figures are estimates."""
    from edgebench.methods import memory
    from edgebench.model.config import ConfigError, get_config

    try:
        parsed = parse_method(method)
        cfg = get_config(model_name)
    except (MethodError, ConfigError) as exc:
        raise click.BadParameter(str(exc)) from exc
    budget, source = _ram_bytes(device, ram_bytes)
    figures = memory.predict(cfg, parsed, batch_size, text_length, image_size=image_size)
    usable = int(budget * (1.0 - headroom))
    verdict = {"ram_bytes": budget, "ram_source": source, "headroom": headroom,
               "usable_bytes_est": usable, "fits_est": figures["peak_bytes"] <= usable}
    if as_json:
        click.echo(json.dumps({"model": model_name, "method": parsed.name, "batch_size": batch_size,
                               "text_length": text_length, **figures, **verdict}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{parsed.name} on {model_name}, batch {batch_size} (estimates)")
    table.add_column("part")
    table.add_column("MiB (est.)", justify="right")
    for key, value in figures.items():
        if key.endswith("_bytes"):
            table.add_row(key[: -len("_bytes")].replace("_", " "), f"{value / 2**20:,.1f}")
    console = Console()
    console.print(table)
    console.print(f"sequence: {figures['sequence_length']:,} decoder positions a sample "
                  f"({figures['image_tiles']} image(s) through the vision encoder)")
    word = "fits" if verdict["fits_est"] else "does NOT fit"
    console.print(f"{word}: peak {figures['peak_bytes'] / 2**20:,.0f} MiB vs {usable / 2**20:,.0f} MiB usable "
                  f"({budget / 2**20:,.0f} MiB RAM from {source}, {headroom:.0%} headroom)")


