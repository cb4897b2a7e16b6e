"""`export(request)`: the model and method of a request, lowered for its runtime, with
a manifest, through the content-keyed cache (the same request twice exports once)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebench.errors import EdgebenchError
from exporters.manifest import (
    FORMAT,
    ExportRequest,
    altered_files,
    cache_root,
    describe_files,
    library_versions,
    link_or_copy,
    materialize,
    read_manifest,
    sha256_file,
    write_manifest,
)
from exporters.own_process import in_own_process, refuse_inside_export_process

if TYPE_CHECKING:
    import numpy as np
    import torch

    from edgebench.methods import Method
    from edgebench.model.vision_language_model import VisionLanguageModel
    from exporters.et_methods import JointRewrite
    from exporters.executorch import LoweredProgram
    from exporters.onnxruntime import Artifacts

PTE = "model.pte"
PROGRAM_FACTS = "lowered.json"  # the program cache's record of a lowering
TRAINABLE_INIT = "trainable_init.pt"  # MeZO: the starting values of the program's weight inputs
TRAINABLE_INIT_RAW = "trainable_init.bin"  # the same, raw float32 in order, for the native worker


class ExportRefused(EdgebenchError):
    """The request cannot be exported for its device or runtime; the message says what to do."""


@dataclass
class ExportResult:
    directory: Path
    manifest: dict[str, Any]
    cached: bool
    replaced: tuple[str, ...] = ()  # files found altered (not their recorded sha256), exported or copied again


def request_from_profile(profile: Any, **fields: Any) -> ExportRequest:
    """A request with the device profile's export settings (delegate, bf16, dtype) and name."""
    delegate = "xnnpack" if profile.export.xnnpack else None
    return ExportRequest(profile=profile.id, delegate=delegate, bf16=profile.export.bf16, dtype=profile.export.dtype,
                         **fields)


def check_request(request: ExportRequest, profile: Any | None = None) -> None:
    """Refuse early (before any lowering) what the device or runtime cannot run."""
    from edgebench.backends.support import device_reason, unsupported_reason
    from edgebench.methods import parse_method

    runtime = request.backend
    if profile is not None:
        reason = device_reason(runtime, profile.arch, list(profile.backends), device=profile.id)
        if reason:
            raise ExportRefused(reason)
    reason = unsupported_reason(parse_method(request.method), runtime, request.weight_decay)
    if reason:
        raise ExportRefused(f"method {request.method!r} on {runtime}: {reason}")
    if request.dtype != "float32":
        raise ExportRefused(
            f"dtype {request.dtype}: training programs are exported in float32 only (ExecuTorch's "
            "portable training kernels and ORT's training graphs are fp32); set the profile's "
            "export.dtype to float32"
        )


def build_training_model(request: ExportRequest) -> tuple[VisionLanguageModel, Method, dict[str, np.ndarray]]:
    """(model with the method's trainable subset, method, example numpy batch).

    Same seed, same calls, same order as the eager backend: identical initial weights.
    """
    import torch

    from edgebench.data.synthetic import synthetic_batches
    from edgebench.methods import parse_method
    from edgebench.methods.subsets import apply_trainable
    from edgebench.methods.trainer import build_model_for

    method = parse_method(request.method)
    torch.manual_seed(request.seed)
    # build_model_for and apply_trainable type what they give nn.Module: the VisionLanguageModel, or for
    # LoRA peft's wrapper of it, which forwards its attributes (cfg) to it
    model: VisionLanguageModel = build_model_for(  # type: ignore[assignment]
        method, request.model, image_size=request.image_size)  # bf16 if frozen bf16/int8
    model = apply_trainable(method, model)  # type: ignore[assignment]
    batch = next(iter(synthetic_batches(model.cfg, request.batch_size, request.text_length,
                                        request.seed, image_size=model.cfg.vit_img_size)))
    return model, method, batch


def _model_facts(model: VisionLanguageModel) -> dict[str, Any]:
    return {"config": model.cfg.to_dict() if hasattr(model.cfg, "to_dict") else None,
            "vit_img_size": model.cfg.vit_img_size, "lm_vocab_size": model.cfg.lm_vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "trainable_elements": sum(p.numel() for p in model.parameters() if p.requires_grad),
            # the native worker's memory prediction (edgebench.native.memory): trained weights as stored
            "trainable_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
            "largest_trainable_bytes": max((p.numel() * p.element_size() for p in model.parameters()
                                            if p.requires_grad), default=0)}


def _inputs(arrays: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()]


def _export_executorch(request: ExportRequest, directory: Path, on_stage: Callable[[str], None]) -> dict[str, Any]:
    import torch

    from edgebench.backends.program import BATCH_INPUTS
    from edgebench.data.synthetic import to_torch
    from exporters import et_methods
    from exporters.executorch import lower_forward, lower_training_step
    from exporters.lora import write_lora_into_model

    on_stage("build model")
    model, method, batch = build_training_model(request)
    if method.trainable == "lora":
        write_lora_into_model(model)  # peft's computation without its Python: traced sooner
    batch = et_methods.example_batch(method, batch)  # accumN: one micro-batch
    rewrite = et_methods.JointRewrite(method, request.weight_decay)  # ckpt: recomputation in the joint graph
    rewrite.prepare_model(model)  # frozen bf16/int8 storage, bf16 autocast
    tensors = to_torch(batch)
    example = tuple(tensors[k] for k in BATCH_INPUTS)  # model(input_ids, images, labels, attention_mask)
    files = [PTE]
    delegate = request.delegate
    lowered: LoweredProgram | SharedProgram  # forward-only: lowered here; forward-backward: the shared program's
    shared_facts: dict[str, Any] = {}
    if method.grad_mode == "zeroth-order":
        forward = lowered = lower_forward(model, example, delegate=delegate, bf16=request.bf16, on_stage=on_stage)
        named = dict(model.named_parameters())
        torch.save({n: named[n].detach().clone() for n in forward.trainable_parameters},
                   directory / TRAINABLE_INIT)
        with open(directory / TRAINABLE_INIT_RAW, "wb") as fh:
            for n in forward.trainable_parameters:
                fh.write(named[n].detach().float().contiguous().numpy().astype("<f4").tobytes())
        files += [TRAINABLE_INIT, TRAINABLE_INIT_RAW]
        forward.write(directory / PTE)
        program = "forward-only"
    else:
        shared = lowered = _lowered_once(
            _program_key(request, method, example, delegate), directory, rewrite,
            lambda: lower_training_step(model, example, delegate=delegate, bf16=request.bf16, on_stage=on_stage,
                                        joint_rewrite=rewrite))
        shared_facts = {"program_key": shared.key, "gradients_summed_in_program": method.accumulation}
        program = "forward-backward"
    inputs = _inputs({k: batch[k] for k in BATCH_INPUTS})  # the program's inputs
    if program == "forward-only":
        named = dict(model.named_parameters())
        inputs += [{"name": n, "shape": list(named[n].shape), "dtype": "float32"}
                   for n in lowered.trainable_parameters]
    return {
        "model": _model_facts(model),
        "program": program,
        "inputs": inputs,
        "trainable_parameters": lowered.trainable_parameters,
        "frozen_parameters": lowered.frozen_parameters,
        "planned_memory_bytes": lowered.planned_memory_bytes,
        "planned_memory_parts": lowered.planned_memory_parts,
        "lowering": {**lowered.lowering, **rewrite.lowering()},  # + the method's knobs
        "weight_decay": rewrite.weight_decay,  # the run's; baked into an update written into the program
        **shared_facts,
        "files": files,
    }


@dataclass
class SharedProgram:
    """A lowered forward-backward program as the program cache holds it."""
    key: str
    planned_memory_bytes: int
    planned_memory_parts: dict[str, Any]
    trainable_parameters: list[str]
    frozen_parameters: list[str]
    lowering: dict[str, Any]


def _program_key(request: ExportRequest, method: Method, example: tuple[torch.Tensor, ...],
                 delegate: str | None) -> str:
    """What shapes the .pte: the request but its method, batch size and device profile (a
    profile shapes the program only through its delegate and dtype, both in the request), the
    delegate it is lowered with, the method's program knobs (exporters.et_methods.program_knobs)
    and the traced inputs' shapes (an accumN program takes one micro-batch: adamw-accum4 at
    batch 4 is sgd's program at batch 1). Two devices with one delegate share the program, and
    an fp32 method's program is one whatever the request's bf16 mode, or its weight decay where
    the update runs outside the program."""
    from exporters.et_methods import program_knobs

    bf16 = request.bf16 if method.precision == "bf16" else "rounded"
    knobs = program_knobs(method, request.weight_decay)
    request = dataclasses.replace(request, method="", batch_size=1, delegate=delegate, bf16=bf16, profile=None,
                                  weight_decay=None)
    content = {"request": request.key(), "knobs": knobs, "inputs": [list(t.shape) for t in example]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _lowered_once(key: str, directory: Path, rewrite: JointRewrite,
                  lower: Callable[[], LoweredProgram]) -> SharedProgram:
    """Lowers a program once per program key and links its .pte into `directory`: sgd,
    adafactor, adamw-8bit, galore, ... (updates between program calls) share one program,
    so a sweep over them exports it once (at nanoVLM-222M, ~2 minutes each)."""
    entry = cache_root() / "programs" / key[:24]
    with locked(entry):
        if not _intact(entry):

            def build(work: Path) -> None:
                lowered = lower()
                lowered.write(work / PTE)
                facts = {"key": key, "planned_memory_bytes": lowered.planned_memory_bytes,
                         "planned_memory_parts": lowered.planned_memory_parts,
                         "trainable_parameters": lowered.trainable_parameters,
                         "frozen_parameters": lowered.frozen_parameters,
                         "lowering": lowered.lowering, "counts": rewrite.counts, "sha256": _digests(work, [PTE])}
                (work / PROGRAM_FACTS).write_text(json.dumps(facts))

            build_whole(entry, build)
        facts = json.loads((entry / PROGRAM_FACTS).read_text())
    link_or_copy(entry / PTE, directory / PTE)
    facts.pop("sha256")
    rewrite.counts.update(facts.pop("counts"))  # what the rewrites did, for the manifest
    return SharedProgram(**facts)


def _artifacts_key(request: ExportRequest, method: Method) -> str:
    """What shapes ONNX Runtime's artifacts: the request but its method and weight decay, and the
    method's knobs but its optimizer (the update runs in the backend: sgd, adam and adamw share
    artifacts)."""
    knobs = {k: v for k, v in method.knobs().items() if k != "optimizer"}
    content = {"request": dataclasses.replace(request, method="", weight_decay=None).key(), "knobs": knobs}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _artifacts_once(key: str, directory: Path, build_artifacts: Callable[[Path], Artifacts]) -> dict[str, Any]:
    """Builds ORT's artifacts once per artifacts key (`_artifacts_key`) and links their files
    into `directory`; returns what export_artifacts returned (a sweep over SGD, Adam and AdamW
    at nanoVLM-222M exports once, not three times at ~1 minute each)."""
    entry = cache_root() / "programs" / key[:24]
    with locked(entry):
        if not _intact(entry):

            def build(work: Path) -> None:
                info = build_artifacts(work)
                (work / PROGRAM_FACTS).write_text(json.dumps({"key": key, **info,
                                                              "sha256": _digests(work, info["files"])}))

            build_whole(entry, build)
        info: dict[str, Any] = json.loads((entry / PROGRAM_FACTS).read_text())
    for name in info["files"]:
        link_or_copy(entry / name, directory / name)
    info.pop("sha256")
    return info


def _digests(folder: Path, names: list[str]) -> dict[str, str]:
    return {name: sha256_file(folder / name) for name in names}


def _intact(entry: Path) -> bool:
    """A shared program entry holds its facts and every file with the sha256 recorded when it was
    built (an edited or truncated program is built again, never linked into an export)."""
    try:
        recorded = json.loads((entry / PROGRAM_FACTS).read_text())["sha256"]
        return all(sha256_file(entry / name) == digest for name, digest in recorded.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _export_onnxruntime(request: ExportRequest, directory: Path, on_stage: Callable[[str], None]) -> dict[str, Any]:
    from edgebench.backends.onnxruntime import MMAP_THRESHOLD, SESSION_OPTIONS, shifted_labels
    from edgebench.data.synthetic import to_torch
    from edgebench.methods import optim
    from edgebench.methods.optimizers import optimizer as optimizer_descriptor
    from edgebench.methods.optimizers import run_weight_decay
    from edgebench.methods.subsets import LORA_ALPHA, LORA_RANK
    from exporters.lora import write_lora_into_model
    from exporters.onnxruntime import export_artifacts

    on_stage("build model")
    model, method, batch = build_training_model(request)
    lora_layers = write_lora_into_model(model) if method.trainable == "lora" else 0
    tensors = to_torch(batch)
    forward_only = method.grad_mode == "zeroth-order"
    info = _artifacts_once(
        _artifacts_key(request, method), directory,
        lambda work: export_artifacts(model, tensors["input_ids"], tensors["images"], tensors["attention_mask"],
                                      work, training=not forward_only, on_stage=on_stage))
    optimizer = None if forward_only else method.optimizer
    weight_decay = run_weight_decay(method.optimizer, request.weight_decay)
    if forward_only:
        update = ("MeZO (SPSA) in numpy, in place on numpy arrays of the weights (read from "
                  "parameters.safetensors); the eval graph runs in an InferenceSession fed those buffers "
                  "(no training session, no gradients)"
                  + (f"; L2 weight decay {weight_decay:g}" if weight_decay else ""))
    else:
        assert optimizer is not None  # not forward-only: the method's optimizer
        torch_name = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}[optimizer]
        update = (f"torch.optim.{torch_name}'s update in numpy "
                  "between training-graph calls (edgebench.backends.numpy_updates.RecipeUpdate), in place on "
                  f"ORT's parameter and gradient buffers; global-norm clip {optim.MAX_GRAD_NORM}"
                  + (f", {optimizer_descriptor(optimizer).decay} weight decay {weight_decay:g}" if weight_decay else "")
                  + ("; moments in numpy" if optimizer != "sgd" else "") + "; no optimizer graph")
    labels = shifted_labels(batch["labels"])
    return {
        "model": _model_facts(model),
        "program": "forward-only" if forward_only else "training-artifacts",
        "inputs": _inputs({"input_ids": batch["input_ids"], "images": batch["images"],
                           "attention_mask": batch["attention_mask"], "labels": labels}),
        "labels": "shifted: labels[:, 1:] flattened (edgebench.backends.onnxruntime.shifted_labels)",
        "optimizer": optimizer,
        "weight_decay": weight_decay,
        "max_grad_norm": optim.MAX_GRAD_NORM,
        "lowering": {  # which method knobs were lowered, and how
            "optimizer": update,
            "grad_mode": "forward-only eval graph" if forward_only else "training graph (forward + backward)",
            "trainable": (f"LoRA r={LORA_RANK} alpha={LORA_ALPHA} written into the graph (exporters.lora, "
                          f"{lora_layers} layers); base weights frozen params"
                          if lora_layers else f"{method.trainable}: requires_grad / frozen_params in the checkpoint"),
            "gradients": (None if forward_only else f"accumulated in ORT's buffers; "
                          f"{info['gradient_sums_accumulated_in_place']} summed gradient(s) added part by part "
                          "(exporters.onnxruntime.accumulate_sums_in_place)"),
            "session_options": {**SESSION_OPTIONS, "eval_graph_loaded": forward_only,
                                "glibc_mmap_threshold_bytes": MMAP_THRESHOLD},
            "lr": ("nanoVLM's lr groups (projector at max(lr, lr_mp)), warmup + cosine schedule per step "
                   "(edgebench.methods.optim, as eager)"),
        },
        "trainable_parameters": info["trainable_parameters"],
        "frozen_parameters": info["frozen_parameters"],
        "planned_memory_bytes": None,  # ORT allocates at run time; no static plan to read
        "files": info["files"],
    }


def _build(request: ExportRequest, key: str, directory: Path, on_stage: Callable[[str], None]) -> dict[str, Any]:
    from edgebench.methods import parse_method

    started = time.perf_counter()
    stages: dict[str, float] = {}  # seconds per stage: where an export's time goes

    def timed_stage(stage: str) -> None:
        now = time.perf_counter()
        if stages:
            last = next(reversed(stages))
            stages[last] = round(now - stages[last], 3)
        stages[stage] = now
        on_stage(stage)

    built = (_export_executorch if request.backend == "executorch" else _export_onnxruntime)(
        request, directory, timed_stage)
    timed_stage("write manifest")
    stages.pop("write manifest")
    manifest = {
        "format": FORMAT,
        "key": key,
        "backend": request.backend,
        "request": request.to_dict(),
        "profile": request.profile,
        "method": {"text": request.method, "knobs": parse_method(request.method).knobs()},
        "versions": library_versions(),
        "export_time_s": round(time.perf_counter() - started, 3),
        "export_stages_s": stages,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{k: v for k, v in built.items() if k != "files"},
        "files": describe_files(directory, built["files"]),
    }
    write_manifest(directory, manifest)
    return manifest


@contextlib.contextmanager
def locked(entry: Path) -> Iterator[None]:
    """Holds `entry`'s lock: another process building the same entry (two deploys, test
    workers) finishes first, and this one reuses what it built instead of building it twice."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _remove_stale_staging(root: Path) -> None:
    """Removes the staging folders (`.<entry>-*`) that killed exports left in the cache: each
    once no process holds its entry's lock (a live export holds it while it builds)."""
    for work in root.glob(".*-*"):
        name = work.name[1:].rsplit("-", 1)[0]
        if not work.is_dir() or not (root / f".{name}.lock").exists():
            continue
        with open(root / f".{name}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built right now
            shutil.rmtree(work, ignore_errors=True)


def build_whole(entry: Path, build: Callable[[Path], Any]) -> None:
    """Builds in a new folder beside `entry`, then moves it in whole: an export that fails
    or is killed half-way leaves no entry that looks complete (and the next export removes
    the killed one's folder: _remove_stale_staging)."""
    work = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        build(work)
        shutil.rmtree(entry, ignore_errors=True)  # an incomplete earlier attempt
        os.replace(work, entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def export(
    request: ExportRequest,
    out: str | Path | None = None,
    *,
    profile: Any | None = None,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> ExportResult:
    """Exports `request` (or finds it in the cache) and returns where its files are.

    The export lives in `cache_root()/<key>`; `out`, when given, gets copies of its files. A
    cached export is served only when each file has the sha256 recorded when it was written;
    an altered one is exported again (or copied again from the cache) and named in `replaced`.
    Refuses early (ExportRefused) what the profile's device or the runtime cannot run.
    """
    refuse_inside_export_process()
    check_request(request, profile)
    key = request.key()
    target = Path(out) if out is not None else None
    in_target = altered_files(target, key) if target is not None else None
    if target is not None and in_target == []:
        return ExportResult(target, read_manifest(target), cached=True)
    entry = cache_root() / key[:24]
    if entry.parent.is_dir():
        _remove_stale_staging(entry.parent)
    with locked(entry):
        in_entry = altered_files(entry, key)
        cached = in_entry == []
        if not cached:
            build_whole(entry, lambda work: in_own_process(_build, request, key, work, on_stage=on_stage))
    replaced = tuple(str(entry / name) for name in in_entry or [])
    if target is not None:
        replaced += tuple(str(target / name) for name in in_target or [])
    if target is None or target.resolve() == entry.resolve():
        return ExportResult(entry, read_manifest(entry), cached, replaced)
    materialize(entry, target)
    return ExportResult(target, read_manifest(target), cached, replaced)


def request_for_spec(spec: Any, profile: Any | None = None) -> ExportRequest:
    """The export request of a RunSpec (with the device profile's export settings, where given)."""
    fields = dict(model=spec.checkpoint or spec.model, method=spec.method, backend=spec.backend,
                  batch_size=spec.batch_size, image_size=spec.image_size, text_length=spec.text_length, seed=spec.seed,
                  weight_decay=spec.weight_decay)
    return request_from_profile(profile, **fields) if profile is not None else ExportRequest(**fields)


def export_for_spec(spec: Any, profile: Any | None = None,
                    on_stage: Callable[[str], None] = lambda stage: None) -> str:
    """The program directory for a RunSpec with backend executorch/onnxruntime (exported
    now or found in the cache), for the host to set as `spec.program` before the run."""
    result = export(request_for_spec(spec, profile), profile=profile, on_stage=on_stage)
    for path in result.replaced:  # bench and deploy say so too, as `edgebench export` does
        on_stage(f"{path}: not the file the export wrote (its sha256 differs); replaced")
    return str(result.directory)
