"""`edgebench methods` (the presets) and `edgebench predict` (a method's memory, estimated)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgebench.cli_types import RAM_BYTES, SIZE
from edgebench.methods.device_speed import DeviceSpeed
from edgebench.methods.fit import rank
from edgebench.methods.knobs import MODIFIERS, PRESETS, Method, MethodError, parse_method
from edgebench.results import STORE_DEFAULT_HELP

if TYPE_CHECKING:
    from edgebench.devices.profiles import Profile
    from edgebench.methods.budget import Budget
    from edgebench.model.config import VLMConfig

NativeFigures = Callable[[Method, int], dict[str, Any] | None]  # the native worker's figures (methods.fit.rank)


def _knob_text(knobs: dict[str, Any]) -> str:
    defaults = parse_method("adamw").knobs()
    changed = {k: v for k, v in knobs.items() if v != defaults[k]}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "(nanoVLM defaults)"


@click.command("methods")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def methods_command(as_json: bool) -> None:
    """List the fine-tuning methods: presets, the knobs behind each, and the backends that can
    run it (with --json: why each other backend refuses it). Combine presets and modifiers with
    `+` (e.g. `lora+ckpt+bf16`, `bitfit+frozen-int8`, `adamw+accum4`); impossible combinations
    are refused with the reason."""
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
    from edgebench.terminal import Field, fitted
    from edgebench.terminal import console as terminal

    console = terminal()
    modifiers = ", ".join([*MODIFIERS, "accumN", "lastK", "an optimizer", "a trainable subset"])
    for part in fitted(f"edgebench methods (combine with +: {modifiers})",
                       [Field("preset", "preset", lambda r: r["name"], True)],
                       [Field("what it does", "what it does", lambda r: r["description"]),
                        Field("knobs (vs adamw)", "knobs (vs adamw)", lambda r: _knob_text(r["knobs"])),
                        Field("backends", "backends", lambda r: ", ".join(r["backends"]))], rows, console.width,
                       caption="`edgebench methods --json` says why each missing backend refuses a method"):
        console.print(part)


def _device(device: str | None, ram_bytes: int | None,
            os_memory: int | None) -> tuple[Budget, DeviceSpeed, str | None]:
    """The budget a run would be held to (methods.budget), the rates of the step-time estimate
    and why only the native worker runs there: --ram-bytes (a reference host's rates, any
    runtime), else the device's (_named_device). --os-memory replaces the OS's idle figure."""
    if ram_bytes is not None:
        from edgebench.methods.budget import board_budget
        from edgebench.methods.device_speed import REFERENCE

        held_to, speed = board_budget("a board with --ram-bytes", ram_bytes, 0, "none given: --os-memory"), REFERENCE
        native_only = None
    elif device is None:
        raise click.UsageError("give --device PROFILE (see device_profiles/) or --ram-bytes N")
    else:
        held_to, speed, native_only = _named_device(device)
    if os_memory is not None:
        if os_memory >= held_to.ram_bytes:
            raise click.BadParameter(f"{os_memory} bytes for the OS is all of the {held_to.ram_bytes}-byte RAM; "
                                     "give less", param_hint="--os-memory")
        held_to = dataclasses.replace(held_to, os_bytes=os_memory, os_source="--os-memory")
    return held_to, speed, native_only


def _named_device(device: str) -> tuple[Budget, DeviceSpeed, str | None]:
    """This host as it reports itself now (`local`); a profile's board, or an inventory or lab
    device's (its own RAM; a lab device holds its board's idle OS inside it), with its
    calibrated rates, else its profile's (a lab device's: this host's CPU's), and why only the
    native worker runs there (Device.native_only; a profile says nothing of what is installed)."""
    from edgebench.devices.inventory import InventoryError, get_device
    from edgebench.devices.profiles import ProfileError, load_profile

    try:
        found = get_device(device)
    except (InventoryError, ProfileError):
        found = None
    if found is None or device == "local":
        try:
            profile = load_profile(device)
        except ProfileError as exc:
            raise click.BadParameter(f"{exc} (nor is {device!r} a lab or inventory device)",
                                     param_hint="--device") from None
        held_to = _this_host(profile) if profile.id == "local" else profile.budget(device)
        return held_to, profile.device_speed(), None
    held_to = found.profile.budget(f"{'lab' if found.lab else 'inventory'} device {device}",
                                   supervisor="python" if found.has_python else "shell")
    if found.lab and found.speed is None:
        from edgebench.methods.device_speed import host_speed

        return held_to, host_speed(), found.native_only()
    return held_to, found.device_speed(), found.native_only()


def _this_host(profile: Profile) -> Budget:
    """This host's budget as it reports itself now (fleet.local.host_budget)."""
    import tempfile

    from edgebench.fleet.local import host_budget

    return host_budget(profile, Path(tempfile.gettempdir()))


def _profile(device: str | None) -> Profile:
    """The profile the native worker's programs are exported for: the device's, or this host's."""
    from edgebench.devices.inventory import InventoryError, get_device
    from edgebench.devices.profiles import ProfileError, load_profile

    try:
        return load_profile(device or "local")
    except ProfileError:
        try:
            return get_device(str(device)).profile
        except (InventoryError, ProfileError) as exc:
            raise click.BadParameter(str(exc), param_hint="--device") from None


def _native_peaks(model_name: str, device: str | None, text_length: int, image_size: int | None,
                  quiet: bool) -> NativeFigures:
    """The native worker's predicted figures of a method at a batch size (edgebench.native.memory),
    from its program exported for the device's profile (cached: the first export of a large
    model takes minutes); None where the native worker cannot run the method."""
    from edgebench.native import memory as native_memory
    from edgebench.native.plan import native_reason
    from exporters.pipeline import ExportRefused, export, request_from_profile

    profile = _profile(device)

    def figures(method: Method, batch_size: int) -> dict[str, Any] | None:
        if native_reason(method):
            return None
        if not quiet:
            click.echo(f"predict: {method.name}: the native worker's program (export, cached)", err=True)
        request = request_from_profile(profile, model=model_name, method=method.name, backend="executorch",
                                       batch_size=batch_size, image_size=image_size, text_length=text_length)
        try:
            program = export(request, profile=profile).directory
        except ExportRefused as exc:  # the device or runtime cannot run it: said, the rank goes on
            click.echo(f"predict: {method.name}: no native program for {profile.id} ({exc})", err=True)
            return None
        return native_memory.predict_for(program, method)

    return figures


@click.command("predict")
@click.option("--device",
              help="Device profile name or YAML path, a lab device or an inventory device (its RAM is the budget).")
@click.option("--ram-bytes", type=RAM_BYTES, help="RAM budget in bytes, instead of --device.")
@click.option("--model", "model_name", default="tiny", show_default=True,
              help="Model config name, or a nanoVLM checkpoint folder (its config.json).")
@click.option("--method", help="Preset or + combination (see `edgebench methods`); without it, every "
                                "preset ranked: the ones that fit, fastest first.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--text-length", default=32, show_default=True, type=click.IntRange(min=2))
@click.option("--image-size", type=click.IntRange(min=1), help="Square image side (default: the config's).")
@click.option("--os-memory", type=SIZE, default=None,
              help="What the OS holds at idle, e.g. 200MiB (default: the device's figure; with --ram-bytes, 0).")
@click.option("--runtime", type=click.Choice(["python", "native"]), default=None,
              help="python: a Python process with torch (eager; ExecuTorch's Python worker); native: the native "
                   "ExecuTorch worker (no Python, no torch), predicted from each method's program, exported for "
                   "the device's profile first (cached; minutes for a large model's first export). Default: "
                   "native on an inventory device without Python (`python: none`) or torch (rates `devices "
                   "calibrate` measured with the native worker), else python.")
@click.option("--store", default=None, type=click.Path(dir_okay=False),
              help=f"Results store whose runs of this model with a --target show what reaching it took, measured, "
                   f"beside the estimates (default: {STORE_DEFAULT_HELP}; none there: no such figures).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def predict_command(device: str | None, ram_bytes: int | None, model_name: str, method: str | None, batch_size: int,
                    text_length: int, image_size: int | None, os_memory: int | None, runtime: str | None,
                    store: str | None, as_json: bool) -> None:
    """Predict a method's memory (weights, gradients, optimizer state, activations,
    temporaries, runtime baseline, peak) before running it, and whether it fits what a run may
    take on the device: its RAM less what its OS holds at idle, the sweep's supervisor and a
    margin (the budget bench and deploy hold runs to). Without --method: which methods fit,
    best first by predicted step time (relative to SGD, from a FLOP and memory-traffic model);
    with --runtime native (the default on a device without Python or torch), the methods the
    native worker runs, by its own memory (planned arena, mapped program, its runtime). All
    figures are per-step estimates; where the results store holds runs of the model with a
    held-out target (`bench --target`), each method's measured steps and seconds to it are
    shown beside them."""
    from edgebench.model.checkpoint import read_config
    from edgebench.model.config import ConfigError, get_config

    try:
        parsed = None if method is None else parse_method(method)
        cfg = read_config(model_name) if Path(model_name).is_dir() else get_config(model_name)
    except (MethodError, ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from exc
    held_to, speed, native_only = _device(device, ram_bytes, os_memory)
    chosen, why = _runtime(runtime, native_only)
    if runtime is None and native_only and not as_json:  # the device chose it: said before any export
        from edgebench.terminal import echo

        echo(f"runtime: native: {why}")
    runtime = chosen
    usable = held_to.bytes
    verdict = {"ram_bytes": held_to.ram_bytes, "budget": held_to.record(), "budget_text": held_to.text(),
               "usable_bytes_est": usable, "speed": asdict(speed), "runtime": runtime, "runtime_why": why}
    native = _native_peaks(model_name, device, text_length, image_size, as_json) if runtime == "native" else None
    measured = _measured(store, model_name)
    if parsed is None:
        unavailable: dict[str, str] = {}
        rows = rank(cfg, batch_size, text_length, image_size, usable, speed, native, unavailable)
        for r in rows:
            r["measured_to_target"] = measured.get(r["method"], [])
        _print_ranking(rows, model_name, batch_size, {**verdict, "unavailable": unavailable}, as_json)
        return
    figures = _figures(cfg, parsed, batch_size, text_length, image_size, native)
    verdict["fits_est"] = figures["peak_bytes"] <= usable
    mine = measured.get(parsed.name, [])
    if as_json:
        click.echo(json.dumps({"model": model_name, "method": parsed.name, "batch_size": batch_size,
                               "text_length": text_length, **figures, **verdict, "measured_to_target": mine},
                              indent=2))
        return
    _print_prediction(parsed.name, model_name, batch_size, figures, verdict, native is not None, mine)


def _runtime(asked: str | None, native_only: str | None) -> tuple[str, str]:
    """The runtime predicted for and why: --runtime's, else the native worker where only it runs
    on the device (Device.native_only), else a Python process with torch."""
    if asked is not None:
        return asked, f"--runtime {asked}"
    if native_only:
        return "native", f"{native_only}, so its runs are the native worker's (--runtime python: a torch process's)"
    return "python", "the default: a Python process with torch (--runtime native: the native worker's)"


def _figures(cfg: VLMConfig, parsed: Method, batch_size: int, text_length: int, image_size: int | None,
             native: NativeFigures | None) -> dict[str, Any]:
    """One method's predicted figures: torch's (methods.memory), or the native worker's from its
    program; a method the native worker cannot run is refused as --method."""
    from edgebench.methods import memory

    figures = memory.predict(cfg, parsed, batch_size, text_length, image_size=image_size) if native is None \
        else native(parsed, batch_size)
    if figures is None:
        from edgebench.native.plan import native_reason

        raise click.BadParameter(f"the native ExecuTorch worker does not run {parsed.name}: "
                                 f"{native_reason(parsed) or 'its program cannot be exported'}", param_hint="--method")
    return figures


def _print_prediction(method: str, model_name: str, batch_size: int, figures: dict[str, Any],
                      verdict: dict[str, Any], native: bool, measured: list[dict[str, Any]]) -> None:
    """One method's predicted memory as a table, whether it fits, and what its stored runs took
    to reach their targets."""
    from rich.table import Table

    from edgebench.terminal import console as terminal
    from edgebench.terminal import echo

    worker = " (native worker)" if native else ""
    table = Table(title=f"{method} on {model_name}, batch {batch_size}{worker} (estimates)")
    table.add_column("part")
    table.add_column("MiB (est.)", justify="right")
    for key, value in figures.items():
        if key.endswith("_bytes"):
            table.add_row(key[: -len("_bytes")].replace("_", " "), f"{value / 2**20:,.1f}")
    console = terminal()
    console.print(table)
    if not native:
        echo(f"sequence: {figures['sequence_length']:,} decoder positions a sample "
             f"({figures['image_tiles']} image(s) through the vision encoder)")
    word = "fits" if verdict["fits_est"] else "does NOT fit"
    echo(f"{word}: peak {figures['peak_bytes'] / 2**20:,.0f} MiB vs {verdict['budget_text']}")
    echo(PER_STEP_NOTE)
    for entry in measured:
        echo(f"{method}: measured: {_to_target_text(entry)}")


PER_STEP_NOTE = ("These figures are per-step estimates, made before any run: what reaching a held-out target "
                 "costs is measured (`edgebench bench --target`), and shown where the store has such runs.")


def _measured(store: str | None, model_name: str) -> dict[str, list[dict[str, Any]]]:
    """Per method, what its stored runs of this model took to reach their targets
    (results.study.measured_to_target); nothing where there is no store or it is busy."""
    from edgebench.errors import EdgebenchError
    from edgebench.results import default_store
    from edgebench.results.store import Store
    from edgebench.results.study import measured_to_target

    path = Path(store) if store else default_store()
    if not path.is_file():
        return {}
    try:
        with Store(path, read_only=True, wait_s=0) as opened:
            return measured_to_target(opened.runs(model=model_name))
    except EdgebenchError:  # a writer holds it, or it is no store: the estimates stand alone
        return {}


def _to_target_text(entry: dict[str, Any]) -> str:
    """`reached loss=1.0 in 40 steps, 2.1 s (n=3, batch 1)`: medians of the runs that reached it."""
    n, reached, target = entry["n"], entry["reached"], entry["target"]
    where = f"n={n}, batch {entry['batch_size']}"
    if not reached:
        return f"{target} not reached within the cap ({where})"
    who = "reached" if reached == n else f"{reached} of {n} runs reached"
    return f"{who} {target} in {entry['steps']:.3g} steps, {entry['seconds']:.3g} s ({where})"


def _print_ranking(rows: list[dict[str, Any]], model_name: str, batch_size: int, verdict: dict[str, Any],
                   as_json: bool) -> None:
    fitting = [r for r in rows if r["fits_est"]]
    if as_json:
        click.echo(json.dumps({"model": model_name, "batch_size": batch_size, **verdict,
                               "step_time_model": "FLOPs + bytes moved, relative to sgd (edgebench.methods.steptime)",
                               "fits_est": [r["method"] for r in fitting], "methods": rows}, indent=2))
        return
    from rich.table import Table
    from rich.text import Text

    from edgebench.terminal import Name, echo, narrowed
    from edgebench.terminal import console as terminal

    speed = verdict["speed"]
    cost = speed["bf16_matmul_cost"]
    bf16_note = (f"; bf16 matmuls {cost:.2f}x fp32's time" if cost else
                 "; -: a bf16 method, this device's bf16 matmul speed unknown (`edgebench devices calibrate "
                 "DEVICE` measures it)")
    worker = "the native worker's " if verdict["runtime"] == "native" else ""
    table = Table(title=f"{worker}methods for {model_name}, batch {batch_size}, in {verdict['budget_text']}: "
                        "estimates",
                  caption="step time (est.): the step's work at the device's rates, relative to sgd on it; "
                          f"it ranks, it does not time. Rates: {speed['source']}{bf16_note}")
    measured = any(r["measured_to_target"] for r in rows)
    columns = ["method", "fits (est.)", "peak MiB (est.)", "step time x sgd (est.)", "trained params"]
    for column in columns + ["to target (measured)"] * measured:
        # a name wraps after a `+` (Name) and the figures' headers wrap first (narrowed): at 80
        # columns rich alone folded the longest combinations mid-word
        table.add_column(column, justify="left" if column == "method" else "right",
                         overflow="fold" if column in ("method", "to target (measured)") else "ellipsis")
    for r in rows:
        to_target = ["; ".join(_to_target_text(e) for e in r["measured_to_target"])
                     or "-"] if measured else []
        table.add_row(Name(Text(r["method"])), "yes" if r["fits_est"] else "no",
                      f"{r['peak_bytes_est'] / 2**20:,.0f}",
                      "-" if r["step_time_vs_sgd_est"] is None else f"{r['step_time_vs_sgd_est']:.2f}",
                      f"{r['trainable_params'] / 1e6:,.1f} M", *to_target)
    console = terminal()
    console.print(narrowed(table, console.width))
    best = fitting[0]["method"] if fitting else None
    echo(f"best that fits (est.): {best}" if best else
         "nothing fits: the smallest predicted peak is listed first among the rest")
    for name, why in verdict["unavailable"].items():  # the name wraps after a `+`
        console.print(Name(Text(f"not for this model: {name}: {why}")))
    echo(PER_STEP_NOTE)
