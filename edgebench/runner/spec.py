"""RunSpec: everything one run needs, and nothing else (the runner takes only this)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgebench.errors import EdgebenchError

WEIGHTS_DIR = "weights"  # where a deployed run keeps its trained weights, inside its run directory
# The most a run may ask for, checked where a count comes from the command line or a spec file:
# past these a count is a typo or a hostile file (steps 1e20 never ends, 100000 threads crash
# the worker), refused before any run starts.
MAX_STEPS = 1_000_000
MAX_THREADS = 1024
MAX_DURATION_S = 7 * 24 * 3600  # --duration


class SpecError(EdgebenchError, ValueError):
    """A RunSpec file or dict edgebench cannot read (not JSON, not an object, unknown fields);
    the message names the file or fields and the ones it knows."""


@dataclass
class RunSpec:
    """One (model, method, backend, shapes, steps) combination to execute on a device.

    `model` is a config name (`tiny`, `nanovlm-222m`, ...) unless `checkpoint` names a
    nanoVLM folder (then `model` is just its label). Batches come from `data_dir` (a
    folder dataset) when set, else from the synthetic task. `method` is a preset or a `+`
    combination (`lora+ckpt+bf16`).
    A run stops after `steps` measured steps, or after `duration_s` if that is set.
    """

    model: str = "tiny"
    method: str = "adamw"
    backend: str = "eager"
    checkpoint: str | None = None
    data_dir: str | None = None  # a folder dataset (images + JSONL); None: synthetic
    # --tokenizer: the data's tokenizer.json; None: the dataset folder's, else the checkpoint's
    # (edgebench.data.folder.find_tokenizer)
    tokenizer: str | None = None
    batch_size: int = 1
    image_size: int | None = None  # None: the model config's own
    # main layout: the long side images are resized to before tiling, i.e. the image budget
    # ((side / tile)^2 tiles + a global view); None: the config's own (nanovlm-460m: 2048, 17 views)
    max_image_size: int | None = None
    text_length: int = 32
    # main layout, eager: several samples per row, each after a masked separator (nanoVLM's
    # ConstantLengthDataset) instead of one left-padded sample per row
    packing: bool = False
    warmup_steps: int = 1
    steps: int = 5
    duration_s: float | None = None
    timeout_s: float | None = None
    lr: float | None = None  # None: the method's default
    # --weight-decay: L2 for SGD/Adam, decoupled for the AdamW family (the optimizer's descriptor,
    # methods/optimizers.py); None: the optimizer's own default (AdamW 0.01, else 0)
    weight_decay: float | None = None
    seed: int = 0
    sample_hz: float = 20.0
    threads: int | None = None  # None: torch's default
    accelerator: str = "cpu"  # cpu | cuda
    program: str | None = None  # exported program dir (executorch / onnxruntime backends)
    # executorch: "native" (the C++ worker, no Python or torch in the training process) or
    # "python" (the pybind runtime under torch); native runs also need these two folders
    runtime: str = "python"
    native_worker: str | None = None  # worker bundle (edgebench-worker, lib/, bundle.json)
    native_plan: str | None = None  # plan.txt + batches.bin (edgebench.native.plan)
    # held-out evaluation (eager): after every `eval_every` steps, before the first and after the
    # last, on `eval_samples` samples training never sees (a --data folder: a seed-fixed
    # `eval_fraction` of it); `target` ("accuracy=0.9", "loss=2.0") ends the run once reached
    eval_every: int | None = None
    eval_samples: int = 32
    eval_fraction: float = 0.1
    target: str | None = None
    run_id: str | None = None
    # `edgebench measure`: the command (argv, run as given, no shell) the supervisor runs and samples
    # instead of edgebench's worker; its steps are the ones it marks (edgebench.measure), its exit
    # code its own (0 ok, any other an error: figures.run_end.RunEnd.exit_codes). None: edgebench's run
    command: list[str] | None = None
    # where the worker writes the trained weights after the last step (eager): a nanoVLM
    # checkpoint, plus the LoRA adapter in peft's format; a relative path is inside the run directory
    save_dir: str | None = None
    repeat: int = 0  # which repeat of the same configuration this run is (0-based)
    power_model: dict[str, float] | None = None  # {"idle_w":..,"max_w":..} for estimates
    sensors: dict[str, Any] = field(default_factory=dict)  # from the device profile
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fresh_weights(self) -> bool:
        """The run trains a config's random weights, not a checkpoint's (edgebench.model.starts_fresh)."""
        from edgebench.model import starts_fresh

        return starts_fresh(self.checkpoint or self.model)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict):
            raise SpecError(f"RunSpec: a {type(data).__name__}, not an object of fields; known fields are "
                            f"{sorted(known)}")
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            raise SpecError(f"RunSpec: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        try:
            data = json.loads(Path(path).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SpecError(f"{path}: not valid JSON ({exc}); give a RunSpec JSON file (`edgebench deploy --spec`)") \
                from exc
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")
