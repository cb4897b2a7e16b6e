"""Turning what a user asked for into RunSpecs a device can run: one path for every
command that starts runs (`bench` on this host, `deploy` to devices).

Steps: specs from methods x run shape, per-device copies (run ids, the profile's sensors
and power model), then the export step for exported backends (a refusal becomes an
`unsupported` result, not a crash), and, once runs are back, ingest into the store.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebench.errors import EdgebenchError
from edgebench.runner.spec import MAX_DURATION_S, RunSpec

if TYPE_CHECKING:
    from edgebench.devices.profiles import Profile
    from edgebench.methods.budget import Budget
    from edgebench.methods.device_speed import DeviceSpeed
    from edgebench.model.config import VLMConfig

class RequestError(EdgebenchError, ValueError):
    """What the user asked for cannot be read (a duration, a model name); the message says the fix."""


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """'90s', '10m', '1h' or plain seconds -> seconds; RequestError names the accepted forms."""
    text = text.strip().lower()
    try:
        seconds = float(text[:-1]) * DURATION_UNITS[text[-1]] if text and text[-1] in DURATION_UNITS else float(text)
    except ValueError:
        raise RequestError(f"{text!r}: use e.g. 90s, 10m or 1h") from None
    if not 0 < seconds <= MAX_DURATION_S:
        raise RequestError(f"{text!r}: a duration must be more than 0 and at most 7 days (e.g. 90s, 10m, 1h)")
    return seconds


def check_method(text: str) -> str:
    """A method as given, refused (MethodError: names the part and the fix) when it is unknown,
    conflicting or names one part twice (`sgd+sgd`), before any run starts."""
    from edgebench.methods.knobs import MethodError, parse_method

    parse_method(text)
    tokens = [t.strip().lower() for t in text.split("+")]
    twice = sorted({t for t in tokens if tokens.count(t) > 1})
    if twice:
        raise MethodError(f"{text!r} names {', '.join(twice)} twice; write each part once (e.g. "
                          f"{'+'.join(dict.fromkeys(tokens))!r})")
    return text


def check_model(name: str) -> str:
    """A model config name or a checkpoint folder; anything else is refused with the choices."""
    from edgebench.model.config import CONFIG_NAMES

    if name in CONFIG_NAMES or Path(name).expanduser().is_dir():
        return name
    raise RequestError(f"unknown model {name!r}: use one of {', '.join(CONFIG_NAMES)} (`edgebench models`) "
                       "or a nanoVLM checkpoint folder")


def spec_config(spec: RunSpec) -> VLMConfig | None:
    """The model config a spec trains: its checkpoint's (a folder on this host) or the named
    config, with its image budget applied; None when the checkpoint is only on the device."""
    from edgebench.model.config import get_config
    from edgebench.runner.worker import image_budget

    if spec.checkpoint:
        if not Path(spec.checkpoint).is_dir():
            return None
        from edgebench.model.checkpoint import read_config

        cfg = read_config(spec.checkpoint)
    else:
        cfg = get_config(spec.model)
    return image_budget(cfg, spec.max_image_size)


def size_text(n: float) -> str:
    """Bytes as a person reads them (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} PiB"


def device_budget(profile: Profile, where: str, supervisor: str, facts: dict[str, Any] | None = None) -> Budget:
    """What a run may take on a device (methods.budget): from what the device reports now
    (`facts`: deploy's preflight, this host's for bench), within its profile's RAM (an inventory
    entry's detected, a lab device's own) or memory cgroup limit; without facts, the profile's
    idle figure for its RAM."""
    from edgebench.methods.budget import available_bytes, reported_budget

    if facts is None:
        return profile.budget(where, supervisor=supervisor)
    ram = min(v for v in (int(profile.ram_bytes), facts.get("cgroup_limit_bytes")) if v)
    return reported_budget(where, ram, available_bytes(facts), supervisor, profile.memory_margin)


def memory_refusals(specs: list[RunSpec], held_to: Budget,
                    rates: Callable[[], DeviceSpeed]) -> tuple[dict[str, int], str]:
    """The methods whose runs' predicted peak (an estimate: methods.memory for a torch process,
    native.memory for the native worker once its program is exported) exceeds the budget, with
    that peak, and one line saying so with the fix (methods that fit, fastest first at the
    device's `rates()`, asked only then; else a smaller shape). The one memory-fit preflight of
    bench and deploy; specs share one shape. Each spec records the budget it was held to."""
    from edgebench.methods import memory, parse_method
    from edgebench.methods.fit import rank
    from edgebench.native import memory as native_memory

    usable = held_to.bytes
    refused: dict[str, int] = {}
    fitting: list[str] | None = None
    native = False
    for spec in specs:
        spec.extra["budget"] = held_to.record()
        cfg = spec_config(spec)
        if cfg is None or spec.method in refused:
            continue
        if spec.backend == "executorch" and spec.runtime != "python":
            # the native worker's own model, from its program: known once the program is exported
            # and the worker settled (attach_program, attach_native); not a torch process's
            if spec.runtime != "native" or not spec.program:
                continue
            peak = native_memory.predict_for(spec.program, parse_method(spec.method))["peak_bytes"]
            native = native or peak > usable
        else:
            peak = memory.predict(cfg, parse_method(spec.method), spec.batch_size, spec.text_length,
                                  image_size=spec.image_size)["peak_bytes"]
            if peak > usable and fitting is None:
                fitting = [r["method"] for r in rank(cfg, spec.batch_size, spec.text_length, spec.image_size, usable,
                                                     rates()) if r["fits_est"]]
        if peak > usable:
            refused[spec.method] = peak
    if not refused:
        return {}, ""
    spec = next(s for s in specs if s.method in refused)
    fix = (f"methods that fit (fastest first): {', '.join(fitting[:4])}" if fitting else
           "`edgebench predict --runtime native` ranks what fits the native worker" if native else
           f"no method fits batch {spec.batch_size} with text length {spec.text_length} and these images: lower "
           "--batch-size, --text-length or --max-image-size, or pick a smaller model (`edgebench predict --device "
           "DEVICE --model MODEL` ranks what fits)")
    peaks = ", ".join(f"{method} {size_text(peak)}" for method, peak in refused.items())
    return (
        refused,
        f"{spec.model}, batch {spec.batch_size}: predicted peak (estimate) {peaks}, more than {held_to.text()}; {fix}",
    )


def force_memory(specs: list[RunSpec], refused: dict[str, int], why: str) -> None:
    """--force: the refused runs go ahead, and their meta.json (via the spec) says so."""
    for spec in specs:
        if spec.method in refused:
            spec.extra["forced"] = {"memory": why, "peak_bytes_est": refused[spec.method]}


def new_run_id(device: str, spec: RunSpec) -> str:
    """A sortable, unique, filesystem-safe run id."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = f"{stamp}-{device}-{spec.model}-{spec.method}-{spec.backend}-{secrets.token_hex(2)}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


# The run options that take several values (bench, deploy: `--lr 1e-3,1e-4`): a sweep runs the
# cross product of methods and their values, each combination a run shape of its own, in this order
# (lr outermost); the names are the report's (results.aggregate.SHAPE_NAMES).
AXES = ("lr", "weight_decay", "threads", "batch_size")


def axis_values(value: Any) -> tuple[Any, ...]:
    """An axis as given: several values (a tuple or list), or one (None too: the default)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def axis_grid(shape: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the axes' values in `shape` (RunSpec fields), lr outermost."""
    axes = [a for a in AXES if a in shape]
    return [dict(zip(axes, point)) for point in itertools.product(*(axis_values(shape[a]) for a in axes))]


def make_specs(methods: list[str], **shape: Any) -> list[RunSpec]:
    """One spec per method and combination of the axes' values (AXES: a tuple is several values),
    the rest of the run shape shared (RunSpec field names): every method at one combination, then
    the next. A method listed again is a repeat (numbered in `repeat`), so `[a, b, a, b]` interleaves them."""
    seen: dict[tuple[Any, ...], int] = {}
    specs = []
    for point in axis_grid(shape):
        for method in methods:
            key = (method, *point.values())
            specs.append(RunSpec(method=method, repeat=seen.get(key, 0), **{**shape, **point}))
            seen[key] = seen.get(key, 0) + 1
    return specs


def run_label(spec: RunSpec, specs: list[RunSpec]) -> str:
    """A run as a sweep's progress names it: its method, and the axes' values where the sweep's
    `specs` differ in them (`sgd, lr 0.01, threads 2`)."""
    from edgebench.results.aggregate import SHAPE_NAMES

    differ = [a for a in AXES if len({getattr(s, a) for s in specs}) > 1]
    return ", ".join([spec.method, *(f"{SHAPE_NAMES[a]} {getattr(spec, a)}" for a in differ)])


def fit_by_shape(specs: list[RunSpec], held_to: Budget, rates: Callable[[], DeviceSpeed], force: bool,
                 log: Callable[[str], None]) -> tuple[dict[str, str], list[str]]:
    """The memory preflight of a sweep: memory_refusals for each batch size (the axis the memory
    model reads). Returns the runs refused on their own (run id -> why: a batch size that does not
    fit while others run) and the lines refusing the whole sweep (it asked for one batch size, as
    a single shape always was, or no run fits). `force`: neither; the runs go ahead, recorded and logged."""
    sizes = list(dict.fromkeys(s.batch_size for s in specs))
    found = []
    for size in sizes:
        shape = [s for s in specs if s.batch_size == size]
        refused, why = memory_refusals(shape, held_to, rates)
        if refused:
            found.append((shape, refused, why))
    if force:
        for shape, refused, why in found:
            force_memory(shape, refused, why)
            log(f"forced (--force): {why}")
        return {}, []
    alone = {str(s.run_id): f"{why}; or --force to run anyway"
             for shape, refused, why in found for s in shape if s.method in refused}
    if len(sizes) == 1 or len(alone) == len(specs):
        return {}, [why for _, _, why in found]
    for *_, why in found:
        log(f"refused (the other batch sizes run): {why}")
    return alone, []


def disturbed_rerun(spec: RunSpec, result: dict[str, Any], device_name: str) -> RunSpec | None:
    """The spec again under a fresh run id where its run was disturbed (other processes or steal
    took more than the noise guard's share of the CPU: its step times read too long), else None.
    The disturbed run stays recorded; the re-run's spec names it (`extra.rerun_of`)."""
    if not (result.get("cpu") or {}).get("disturbed"):
        return None
    again = dataclasses.replace(spec, sensors=dict(spec.sensors), extra={**spec.extra, "rerun_of": spec.run_id})
    again.run_id = new_run_id(device_name, again)
    if spec.save_dir:
        again.save_dir = str(Path(spec.save_dir).parent / again.run_id)
    return again


def rerun_summary(results: list[dict[str, Any]], reran: int, budget: int) -> str:
    """What --rerun-disturbed did, under bench's table: the re-runs, and any disturbed run left
    as it was once the budget was spent."""
    left = sum(1 for r in results if (r.get("cpu") or {}).get("disturbed")) - reran
    return (f"--rerun-disturbed {budget}: {reran} disturbed run{'s' * (reran != 1)} re-run; each stays in the "
            "store beside its re-run (the table's n counts both)"
            + (f"; {left} disturbed run{'s' * (left != 1)} not re-run: the {budget} re-runs were spent" if left > 0
               else ""))


def for_device(device_name: str, profile: Profile, specs: list[RunSpec]) -> list[RunSpec]:
    """Per-device copies: fresh run ids, and the profile's sensors and power model where
    the spec has none of its own."""
    out = []
    for spec in specs:
        spec = dataclasses.replace(spec, sensors=dict(spec.sensors), extra=dict(spec.extra))
        if not spec.sensors and profile.sensors is not None:
            spec.sensors = profile.sensors.model_dump()
        if spec.power_model is None and profile.power_model is not None:
            spec.power_model = profile.power_model.model_dump()
        spec.run_id = new_run_id(device_name, spec)
        out.append(spec)
    return out


def attach_program(spec: RunSpec, profile: Profile, on_stage: Callable[[str], None] = lambda stage: None) -> str | None:
    """Exports (or finds in the cache) the program an exported backend runs, for this
    device's profile, and sets `spec.program`. Returns why it was refused, or None."""
    if spec.backend == "eager" or spec.program:
        return None
    from exporters.pipeline import ExportRefused, export_for_spec

    try:
        spec.program = export_for_spec(spec, profile, on_stage=on_stage)
    except ExportRefused as exc:
        return str(exc)
    return None


def attach_native(spec: RunSpec, arch: str, on_stage: Callable[[str], None] = lambda stage: None) -> str | None:
    """Settles which worker runs an ExecuTorch spec on a device of `arch`: with runtime `auto`,
    the native worker where it can be built for that arch and runs the method, else the Python
    one (said through on_stage); with `native`, that worker or the reason it cannot (returned,
    for an `unsupported` result). Builds the worker bundle (cached) and writes the run's plan."""
    if spec.backend != "executorch" or spec.runtime == "python" or spec.native_plan:
        if spec.backend != "executorch":
            spec.runtime = "python"
        return None
    from edgebench.backends.base import UnsupportedBackend
    from edgebench.native.build import NativeBuildError, bundle
    from edgebench.native.plan import write_plan
    from exporters.manifest import cache_root

    asked, spec.runtime = spec.runtime, "python"
    try:
        worker = bundle(arch, log=on_stage)
        spec.native_plan = str(write_plan(spec, cache_root()))
    except (UnsupportedBackend, NativeBuildError) as exc:
        if asked == "native":
            return str(exc)
        on_stage(f"Python ExecuTorch worker ({exc})")
        return None
    spec.runtime, spec.native_worker = "native", str(worker)
    return None


def unsupported_result(spec: RunSpec, detail: str) -> dict[str, Any]:
    """The recorded result of a run that was refused before it started."""
    return {"run_id": spec.run_id, "model": spec.model, "method": spec.method, "backend": spec.backend,
            **axes_of(spec), "status": "unsupported", "detail": detail}


def axes_of(spec: RunSpec) -> dict[str, Any]:
    """The run's values on the sweep's axes (bench's results carry them for its table and --json)."""
    return {a: getattr(spec, a) for a in AXES}


def ingest_runs(store_path: Path, run_dirs: list[Path], device: str) -> list[str]:
    """Loads run directories into the results store; returns their run ids."""
    from edgebench.results.store import Store

    with Store(store_path) as store:
        return [store.ingest_run(run_dir, device=device) for run_dir in run_dirs]
