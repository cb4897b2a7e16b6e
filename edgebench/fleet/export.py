"""`edgebench export`: lower the training step for a device profile, with a manifest.

It takes the user's model, data and lr as bench and deploy do (one definition of each option,
fleet/options.py) and shows its stages as they do (fleet/progress.py), so it lives beside
them; the lowering is exporters/'s (exporters/exporting.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypedDict

import click

from edgebench.fleet.options import DATA_OPTION, LR_OPTION, MODEL_OPTION, THREADS, WEIGHT_DECAY_OPTION
from exporters.manifest import BF16_MODES, EXPORT_BACKENDS

if TYPE_CHECKING:
    from rich.console import Console

    from edgebench.devices.profiles import Profile
    from edgebench.methods import Method
    from exporters.exporting import Exported
    from exporters.manifest import ExportRequest


class DataFigures(TypedDict):
    """--data's dataset as `_check_data` read it against the program's shapes."""

    dir: str
    examples: int
    longest_tokens: int
    text_length: int


@click.command("export")
@click.option("--device", "device", default="local", show_default=True,
              help="Device profile id or YAML path; its `export:` settings (xnnpack, bf16, dtype) and arch "
                   "apply.")
@MODEL_OPTION
@DATA_OPTION
@LR_OPTION
@WEIGHT_DECAY_OPTION
@click.option("--method", default="sgd", show_default=True, help="Method preset or combination (`edgebench methods`).")
@click.option("--backend", type=click.Choice(list(EXPORT_BACKENDS)), default="executorch", show_default=True)
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--text-length", default=32, show_default=True, type=click.IntRange(min=2))
@click.option("--image-size", default=None, type=int, help="Image side in pixels (default: the model's).")
@click.option("--seed", default=0, show_default=True, help="Seed of the fresh weights (as the eager backend).")
@click.option("--delegate", type=click.Choice(["profile", "xnnpack", "none"]), default="profile",
              show_default=True, help="ExecuTorch delegate; `profile` follows the profile's export.xnnpack "
                                      "(false: linear layers on the runtime's kernels).")
@click.option("--bf16", type=click.Choice(["profile", *BF16_MODES]), default="profile", show_default=True,
              help="How an XNNPACK program computes a bf16 method's values (qlora, adamw-bf16, frozen "
                   "bf16/int8): `rounded` to bf16 wherever eager rounds (eager's losses), `fp32` in fp32, "
                   "unrounded (faster; losses off eager's by bf16's rounding); `profile` follows the "
                   "profile's export.bf16.")
@click.option("--out", "out", default=None, type=click.Path(file_okay=False),
              help="Directory for the files (default: the export cache entry).")
@click.option("--profile", "profile_steps", default=0, type=click.IntRange(min=0), metavar="STEPS",
              help="Then run STEPS steps of the program (ExecuTorch's ETDump) and of eager torch, each in a "
                   "fresh process, and show where a step's time and memory go (also written to profile.json).")
@click.option("--threads", default=None, type=THREADS,
              help="With --profile: threads for both runtimes (default: each one's own; 1 is fairer on a busy host).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def export_command(device: str, model: str, data_dir: str | None, lr: float | None, weight_decay: float | None,
                   method: str, backend: str, batch_size: int, text_length: int, image_size: int | None, seed: int,
                   delegate: str, bf16: str, out: str | None, profile_steps: int, threads: int | None,
                   as_json: bool) -> None:
    """Lower one training step (model + loss + backward) for an on-device runtime.

    \b
    executorch: a .pte joint forward-backward program (torch.export ->
      to_edge -> optional XNNPACK -> to_executorch); MeZO gets a forward-only
      program.
    onnxruntime: ONNX Runtime training artifacts (training and eval graphs
      and checkpoint; SGD, Adam and AdamW update between calls and share them).

    Shapes are fixed at export (batch size, text length, image size); with --data the
    dataset is checked against them first (every example must fit --text-length). The
    learning rate is not part of any program (the update after each program call applies
    it at run time): --lr is checked and shown with the lr runs of this program use.
    --weight-decay is baked into a program only where the update is written into it (LOMO,
    fused); bench and deploy export with theirs.
    Every export writes manifest.json (inputs, trainable parameters, planned memory, file
    sha256, versions).
    The same request again is served from the cache ($EDGEBENCH_EXPORT_CACHE or
    ~/.cache/edgebench/exports) without exporting.

    \b
    Example:
      edgebench export --device raspberry-pi-5-8gb --model tiny \\
          --method sgd --out pte/
      edgebench export --model tiny --profile 3   # + top operators, memory split
      edgebench export --model CHECKPOINT_DIR --data DATASET_DIR \\
          --text-length 64 --lr 1e-4
    """
    from rich.console import Console

    from edgebench.fleet.progress import StageBar
    from exporters.exporting import export_and_profile, export_stages
    from exporters.pipeline import ExportRefused

    profile, parsed, request, data = _checked_request(
        device, method, delegate, bf16, profile_steps, data_dir,
        dict(model=model, backend=backend, batch_size=batch_size, text_length=text_length, image_size=image_size,
             seed=seed, weight_decay=weight_decay))
    console = Console(stderr=True)
    stages = export_stages(request.backend, parsed.grad_mode == "zeroth-order", profile_steps)
    with StageBar(f"export {request.backend}", profile.id, stages, as_json, console) as bar:
        try:
            exported = export_and_profile(request, out, profile, parsed, lr, profile_steps, threads, bar.stage)
        except ExportRefused as exc:
            raise click.ClickException(str(exc)) from None
        bar.ended("cached" if exported.result.cached else "done")
    if as_json:
        click.echo(json.dumps(_as_json(exported, data), indent=2))
    else:
        _print_export(console, exported, data)


def _as_json(exported: Exported, data: DataFigures | None) -> dict[str, Any]:
    """--json: the manifest, where the export is, whether it came from the cache, --profile's and --data's figures."""
    result = exported.result
    return {**result.manifest, "directory": str(result.directory), "cached": result.cached,
            "replaced": list(result.replaced), "lr": exported.lr,
            **({"profile": exported.report} if exported.report else {}), **({"data": data} if data else {})}


def _checked_request(device: str, method: str, delegate: str, bf16: str, profile_steps: int, data_dir: str | None,
                     fields: dict[str, Any]) -> tuple[Profile, Method, ExportRequest, DataFigures | None]:
    """The profile, the method, the request the options make and --data's figures, each checked
    before any progress display or lowering: a bad option is a usage error, what the device or
    runtime cannot run a refusal."""
    from edgebench.devices.profiles import ProfileError, load_profile
    from edgebench.methods import MethodError, parse_method
    from exporters.exporting import export_request
    from exporters.pipeline import ExportRefused, check_request

    try:
        profile = load_profile(device)
        parsed = parse_method(method)
    except (ProfileError, MethodError) as exc:
        raise click.UsageError(str(exc)) from None
    data = _check_data(data_dir, fields["model"], fields["text_length"]) if data_dir else None
    try:
        request = export_request(profile, delegate, bf16, method=method, **fields)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        check_request(request, profile)
    except ExportRefused as exc:
        raise click.ClickException(str(exc)) from None
    if profile_steps and request.backend != "executorch":
        raise click.UsageError("--profile reads ExecuTorch's per-operator profile; use it with --backend executorch")
    return profile, parsed, request, data


def _print_export(console: Console, exported: Exported, data: DataFigures | None) -> None:
    """The export's files, planned memory, inputs, lowering, data and lr, then --profile's tables."""
    from rich.markup import escape

    result, manifest, run_lr = exported.result, exported.result.manifest, exported.lr
    for path in result.replaced:
        console.print(f"{escape(path)}: not the file the export wrote (its sha256 differs: edited or truncated); "
                      "replaced with a fresh copy" + ("" if result.cached else " of a new export"), soft_wrap=True)
    how = "from cache" if result.cached else f"exported in {manifest['export_time_s']:.1f} s"
    console.print(f"[bold]{result.directory}[/] ({how})")
    for name, info in manifest["files"].items():
        console.print(f"  {name:22s} {info['bytes'] / 2**20:9.2f} MiB  sha256 {info['sha256'][:16]}")
    planned = manifest.get("planned_memory_bytes")
    if planned is not None:
        console.print(f"  planned memory         {planned / 2**20:9.2f} MiB (ExecuTorch memory plan)")
    shapes = ", ".join(f"{i['name']}{i['shape']}" for i in manifest["inputs"][:3])
    console.print(f"  trainable parameters   {len(manifest['trainable_parameters'])} tensors; inputs {shapes}")
    lowering = manifest.get("lowering")
    if lowering and "delegate" in lowering:  # ExecuTorch's
        console.print(f"  lowering               delegate {lowering['delegate']}; {lowering['matmuls']}; "
                      f"weights {lowering['weights']}")
    elif lowering:  # ONNX Runtime's
        console.print(f"  lowering               {lowering['grad_mode']}; {lowering['optimizer']}")
    if data:
        console.print(f"  data                   {data['examples']} examples, the longest {data['longest_tokens']} of "
                      f"{data['text_length']} tokens ({data['dir']})")
    console.print(f"  lr                     {run_lr['value']:g} ({run_lr['source']}), applied at run time "
                  "(not in the program)")
    if exported.report:
        _print_profile(console, exported.report)


def _check_data(data_dir: str, model: str, text_length: int) -> DataFigures:
    """The dataset read as runs will read it, against the program's shapes: a text longer
    than --text-length or a tokenizer larger than the model's vocabulary is refused now,
    not on the device."""
    from pathlib import Path

    from edgebench.data.folder import DatasetError, FolderDataset
    from edgebench.fleet.assets import as_folder_dataset
    from edgebench.model.checkpoint import read_config
    from edgebench.model.config import get_config

    try:
        dataset = FolderDataset(as_folder_dataset(Path(data_dir).resolve()))
        cfg = read_config(model) if Path(model).expanduser().is_dir() else get_config(model)
    except (DatasetError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--data") from None
    if dataset.vocab_size > cfg.image_token_id:
        raise click.BadParameter(f"{dataset.jsonl}: the tokenizer has {dataset.vocab_size} tokens, more than the "
                                 f"model's base vocabulary {cfg.image_token_id}; use the model's own tokenizer.json",
                                 param_hint="--data")
    lengths = [(len(dataset.text(example, cfg)[0]), example.where) for example in dataset.examples]
    longest, where = max(lengths)
    if longest > text_length:
        raise click.BadParameter(f"{where} needs {longest} tokens but the program's text length is {text_length}; "
                                 f"export with --text-length {longest} (or more)", param_hint="--data")
    return {"dir": str(Path(data_dir).resolve()), "examples": len(lengths), "longest_tokens": longest,
            "text_length": text_length}


def _print_profile(console: Console, report: dict[str, Any]) -> None:
    """Top operators side by side (program vs eager) and the memory split per runtime."""
    from rich.table import Table

    et, eager = report.get("executorch", {}), report.get("eager", {})
    for name, run in (("executorch", et), ("eager", eager)):
        if "error" in run:
            console.print(f"[red]{name} profile failed:[/] {run['error']}")
    times = Table(title=f"Where a step's time goes (median of {report['steps']} steps)")
    for col in ("ExecuTorch operator", "s/step", "calls", "eager operator", "s/step", "calls"):
        times.add_column(col, justify="left" if "operator" in col else "right")
    left, right = et.get("top_ops", []), eager.get("top_ops", [])
    def cells(ops: list[dict[str, Any]], i: int) -> list[str]:
        if i >= len(ops):
            return ["", "", ""]
        return [ops[i]["name"], f"{ops[i]['s_per_step']:.3f}", f"{ops[i]['calls_per_step']:g}"]

    for i in range(max(len(left), len(right))):
        times.add_row(*cells(left, i), *cells(right, i))
    console.print(times)
    if et.get("step_s") and eager.get("step_s"):
        console.print(f"  step: ExecuTorch {et['step_s']:.3f} s (program {et['program_s']:.3f} s + update "
                      f"{et['update_s']:.3f} s) vs eager {eager['step_s']:.3f} s = {report['step_vs_eager']:.2f}x; "
                      f"program load {et['load_s']:.2f} s")
    memory = Table(title="Where the memory goes (MiB; remainder = peak minus the known parts)")
    keys = ("peak_rss", "imports", "weights", "gradients", "optimizer_state", "planned_arena",
            "activations_in_arena_estimate", "remainder")
    memory.add_column("runtime")
    for key in keys:
        memory.add_column(key.replace("_", " "), justify="right")
    for name, run in (("executorch", et), ("eager", eager)):
        split = run.get("memory")
        if split:
            memory.add_row(name, *("-" if split.get(k) is None else f"{split[k] / 2**20:,.0f}" for k in keys))
    console.print(memory)
    console.print("  ExecuTorch's planned arena holds its trainable weights, gradients and activations; "
                  "eager's activations are in its remainder")

