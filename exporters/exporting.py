"""`edgebench export`'s work: the request the options and the device profile make, the program
exported (or found in the cache) and, with --profile, profiled; and the learning rate its runs
use. The command (fleet/export.py) checks the options before and renders the result after."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporters.manifest import ExportRequest
from exporters.pipeline import ExportResult, export, request_from_profile


@dataclass
class Exported:
    """An export done: where its files are (and whether from the cache), --profile's report
    (None without it) and the learning rate runs of the program use."""

    result: ExportResult
    report: dict[str, Any] | None
    lr: dict[str, Any]


def export_request(profile: Any, delegate: str, bf16: str, **fields: Any) -> ExportRequest:
    """The profile's request with --delegate and --bf16 where they are not `profile`; a
    program without XNNPACK rounds bf16 as eager does, as the profile's fp32 choice is
    XNNPACK's. A request those choices make invalid raises ValueError."""
    request = request_from_profile(profile, **fields)
    chosen = {**({"delegate": None if delegate == "none" else delegate} if delegate != "profile" else {}),
              **({"bf16": bf16} if bf16 != "profile" else {})}
    if chosen.get("delegate", "xnnpack") is None and bf16 == "profile":
        chosen["bf16"] = "rounded"
    return ExportRequest.from_dict({**request.to_dict(), **chosen})


def export_stages(backend: str, zeroth_order: bool, profile_steps: int) -> list[str]:
    """The stages the export (and --profile) goes through, in order: what its bar counts."""
    # Imported here: the exporters load torch, which `edgebench --help` should not wait for.
    from exporters.executorch import STAGES as ET_STAGES
    from exporters.onnxruntime import STAGES as ONNX_STAGES

    if backend != "executorch":
        stages = ["build model", *ONNX_STAGES, "write manifest"]
    else:
        stages = ["build model", *(s for s in ET_STAGES if not (zeroth_order and s == "joint graph")),
                  "write manifest"]
    return stages + (["profile executorch", "profile eager"] if profile_steps else [])


def export_and_profile(request: ExportRequest, out: str | None, profile: Any, method: Any, lr: float | None,
                       profile_steps: int, threads: int | None, on_stage: Callable[[str], None]) -> Exported:
    """Exports the request (ExportRefused: the device or runtime cannot run it), then with
    `profile_steps` runs that many steps of the program and of eager torch."""
    result = export(request, out, profile=profile, on_stage=on_stage)
    report = None
    if profile_steps:
        from exporters.profile import profile_export

        report = profile_export(result.directory, steps=profile_steps, threads=threads, on_stage=on_stage)
    return Exported(result, report, run_lr(lr, method, result.manifest))


def run_lr(lr: float | None, method: Any, manifest: dict[str, Any]) -> dict[str, Any]:
    """The learning rate runs of this program use and where it is applied (no program holds one)."""
    from edgebench.backends.program import program_lr
    from edgebench.model import starts_fresh

    fresh = starts_fresh(manifest["request"]["model"])
    return {"value": program_lr(lr, method, manifest, fresh_weights=fresh),
            "source": "--lr" if lr is not None else "the method's default",
            "where": "applied at run time by the update after each program call, not part of the exported "
                     "files (pass it to bench/deploy --lr)"}
