"""`edgebench models`: the model configs and their sizes, or a checkpoint folder checked."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    import torch

    from edgebench.model.vision_language_model import VisionLanguageModel

BYTES_PER_PARAM = {"fp32": 4, "bf16": 2}
TEXT_LENGTH = 32  # bench's default text length, for the sequence length shown


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (the tied embedding/head counted once)."""
    return sum(p.numel() for p in model.parameters())


def describe(name: str, model: VisionLanguageModel) -> dict[str, Any]:
    cfg = model.cfg
    n = count_parameters(model)
    return {
        "name": name,
        "parameters": n,
        **{f"weights_{dtype}_bytes": n * size for dtype, size in BYTES_PER_PARAM.items()},
        "image_size": cfg.vit_img_size,
        "image_tokens": cfg.n_image_tokens,  # per image or tile
        "image_tiles": cfg.n_tiles,  # images the vision encoder sees per sample
        "sequence_length": cfg.sequence_length(TEXT_LENGTH),  # decoder positions, image included
        "text_length": TEXT_LENGTH,
        "vision": {"hidden": cfg.vit_hidden_dim, "blocks": cfg.vit_n_blocks, "heads": cfg.vit_n_heads,
                   "mlp": cfg.vit_inter_dim, "patch": cfg.vit_patch_size},
        "decoder": {"hidden": cfg.lm_hidden_dim, "blocks": cfg.lm_n_blocks, "heads": cfg.lm_n_heads,
                    "kv_heads": cfg.lm_n_kv_heads, "mlp": cfg.lm_inter_dim, "vocab": cfg.lm_vocab_size},
        "pixel_shuffle": cfg.mp_pixel_shuffle_factor,
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _render(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from edgebench.terminal import console as terminal

    table = Table(title="nanoVLM configs: weights memory (training needs more); sequence: decoder "
                        f"positions of a sample with {TEXT_LENGTH} text tokens, image tokens included")
    for column in ("name", "parameters", "fp32", "bf16", "image px", "sequence"):
        table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True)
    for r in rows:
        table.add_row(r["name"], f"{r['parameters']:,}", _mib(r["weights_fp32_bytes"]), _mib(r["weights_bf16_bytes"]),
                      str(r["image_size"]), f"{r['sequence_length']:,}")
    terminal().print(table)


def _render_loaded(r: dict[str, Any]) -> None:
    v, d = r["vision"], r["decoder"]
    click.echo(f"{r['name']}: every key matched; {r['parameters']:,} parameters "
               f"({_mib(r['weights_fp32_bytes'])} fp32, {_mib(r['weights_bf16_bytes'])} bf16)")
    click.echo(f"  vision:  {v['hidden']} hidden, {v['blocks']} blocks, {v['heads']} heads, MLP {v['mlp']}, "
               f"patch {v['patch']}, image {r['image_size']} px")
    click.echo(f"  project: pixel shuffle {r['pixel_shuffle']} -> {r['image_tokens']} tokens per image, "
               f"{r['image_tiles']} image(s) per sample: {r['sequence_length']:,} positions with "
               f"{r['text_length']} text tokens")
    click.echo(f"  decoder: {d['hidden']} hidden, {d['blocks']} blocks, {d['heads']} heads "
               f"({d['kv_heads']} KV), MLP {d['mlp']}, vocab {d['vocab']:,}")


@click.command("models")
@click.option("--load", "load_dir", metavar="DIR",
              help="Load a nanoVLM checkpoint folder (config.json + model.safetensors) or hub id, "
                   "check every key strictly and print its dimensions.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def models_command(load_dir: str | None, as_json: bool) -> None:
    """List the model configs with exact parameter counts and weight memory.

    \b
    Configs: tiny (tests, seconds to train),
      nanovlm-222m (nanoVLM v0.1: SigLIP-B/16-224 + SmolLM2-135M),
      nanovlm-460m (nanoVLM HEAD: SigLIP2-B/16-512 + SmolLM2-360M).

    Sizes are counted on the meta device: nothing is allocated. With --load DIR the folder's
    weights are loaded; any missing, unexpected or mis-shaped key is listed and the exit
    status is 2, as for every user error.
    """

    from edgebench.model import CONFIG_NAMES, get_config
    from edgebench.model.layout import meta_layout
    from edgebench.model.vision_language_model import VisionLanguageModel

    if load_dir:
        from edgebench.model.checkpoint import CheckpointError, from_pretrained
        from edgebench.model.config import ConfigError

        try:
            rows = [describe(load_dir, from_pretrained(load_dir))]
        except (CheckpointError, ConfigError, FileNotFoundError) as exc:
            if as_json:
                click.echo(json.dumps({"error": str(exc)}))
                sys.exit(2)
            from edgebench.devices.commands import UserError

            raise UserError(str(exc)) from None
    else:
        rows = []
        for name in CONFIG_NAMES:
            with meta_layout():
                rows.append(describe(name, VisionLanguageModel(get_config(name))))
    if as_json:
        click.echo(json.dumps(rows[0] if load_dir else rows, indent=2))
    elif load_dir:
        _render_loaded(rows[0])
    else:
        _render(rows)


