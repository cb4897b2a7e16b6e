"""What the native ExecuTorch worker's process holds at its peak, predicted from its exported
program (estimates, bytes): not a torch process's figure, which is 300 MB of Python and torch
before any model (methods.memory).

The worker (worker.cpp) holds, measured part by part in /proc/PID/smaps on x86_64 (tiny and
nanovlm-222m, sgd, adamw, lora, mezo; docs/native.md):
- its runtime: the ExecuTorch libraries it touches, its stacks and small heap;
- the program's planned arena, every page of it written while loading (the runtime sets it up
  whole): a forward-backward program keeps its trained weights there, copied from the .pte,
  beside the gradients and the activations;
- the .pte itself, mapped: its frozen weights stay there, used in place; the trained ones are
  read once, a tensor at a time (the largest is the load's transient);
- what the worker allocates itself: the optimizer's state of an update it runs between
  program calls (Adam's two moments, momentum's buffer); MeZO's copy of the trained weights
  (program inputs) and the records that restore them bitwise after a perturbation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MiB = 1 << 20
# The worker's own RSS beside the parts counted here: libraries, stacks, its small heap and one
# batch. Fitted on tiny (sgd 12.4-12.8, adamw 12.1, lora 13.4 MiB; mezo 10.4, whose forward-only
# program touches fewer kernels). Estimates.
RUNTIME_BYTES_EST = {"forward-only": 10.5 * MiB, "backprop": 12.5 * MiB}
# MeZO's restore records: (index, old value) pairs, 8 bytes, for the ~7.5% of elements whose
# perturbation would not undo bitwise, in vectors that grow by doubling. Measured: nanovlm-222m's
# heap rises 176 MiB over the first step, 0.83 bytes a trained weight. Estimate.
RESTORE_RECORD_BYTES_PER_WEIGHT_EST = 0.83
PTE = "model.pte"


def predict(manifest: dict[str, Any], pte_bytes: int, method: Any) -> dict[str, Any]:
    """The worker's predicted peak and its parts for `method` (a methods.Method) running the
    program that `manifest` (exporters' manifest.json) describes, its .pte `pte_bytes` long.

    Keys, each `<name>_bytes`: runtime_baseline, planned_arena, mapped_program (the .pte pages
    that stay resident: frozen weights), load_transient (the largest trained weight, mapped
    while it is copied into the arena), optimizer_state, weights_copy (MeZO's trained
    weights), restore_records (MeZO), peak; `"estimate": True`."""
    from edgebench.methods.optimizers import optimizer

    facts = manifest["model"]
    trained, largest = int(facts["trainable_bytes"]), int(facts["largest_trainable_bytes"])
    elements = int(facts["trainable_elements"])
    forward_only = manifest["program"] == "forward-only"
    in_program = manifest["lowering"].get("update", "").startswith("inside the program")
    parts = {
        "runtime_baseline_bytes": int(RUNTIME_BYTES_EST["forward-only" if forward_only else "backprop"]),
        "planned_arena_bytes": int(manifest["planned_memory_bytes"]),
        "mapped_program_bytes": pte_bytes if forward_only else max(pte_bytes - trained, 0),
        "load_transient_bytes": 0 if forward_only else largest,
        "optimizer_state_bytes": 0 if forward_only or in_program else
        optimizer(method.optimizer).state_bytes("", (elements,)),
        "weights_copy_bytes": 4 * elements if forward_only else 0,  # trainable_init.bin: float32
        "restore_records_bytes": int(RESTORE_RECORD_BYTES_PER_WEIGHT_EST * elements) if forward_only else 0,
    }
    resident = parts["runtime_baseline_bytes"] + parts["planned_arena_bytes"] + parts["mapped_program_bytes"]
    loading = resident + parts["load_transient_bytes"]
    stepping = resident + sum(parts[k] for k in ("optimizer_state_bytes", "weights_copy_bytes",
                                                  "restore_records_bytes"))
    return {**parts, "peak_bytes": max(loading, stepping), "estimate": True}


def predict_for(program_dir: str | Path, method: Any) -> dict[str, Any]:
    """predict() for the exported program in `program_dir` (its manifest.json and .pte)."""
    folder = Path(program_dir)
    manifest = json.loads((folder / "manifest.json").read_text())
    return predict(manifest, (folder / PTE).stat().st_size, method)
