"""A run's figures, made on the host from what the device recorded: result.json's raw end
facts and CPU snapshots, events.jsonl and the raw samples. Every runtime's run directory
gives the same figures here; `recorded_by` (python or shell) is kept, and nothing that reads
the figures depends on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgebench.figures.cpu import DEFAULT_CLOCK_TICKS, cpu_share
from edgebench.figures.learning import learning_figures, memory_apart
from edgebench.figures.memory import WORKER_RSS, device_ram
from edgebench.figures.run_end import RunEnd, result_end
from edgebench.figures.run_events import Event, Memory, Predicted, RunEvents, read_events
from edgebench.figures.run_meta import RunMeta, run_meta_of
from edgebench.figures.samples import raw_columns, read_columns, sample_figures
from edgebench.figures.status import run_status, signal_name
from edgebench.figures.steps import samples_per_s, step_statistics

# The native worker reports its own VmHWM: a process's ru_maxrss starts at its parent's RSS
# (Linux keeps the high-water mark across exec), which for a ~30 MB worker is the supervisor's.
NATIVE_WORKER_RSS = "kernel RSS of the worker process (its own VmHWM, as the native worker reports it)"
SHELL_WORKER_RSS = "kernel RSS of the worker process (VmHWM, last read while it ran)"
PEAK_WHAT = {"ru_maxrss": WORKER_RSS, "vm_hwm": SHELL_WORKER_RSS}  # by RunEnd.worker_peak_from
# The host's held-out evaluations of an exported program's saved weights (edgebench.results.heldout)
HOST_EVALS = "heldout.jsonl"


def _max(values: np.ndarray | None) -> float | None:
    if values is None:
        return None
    finite = np.asarray(values, dtype=float)[np.isfinite(np.asarray(values, dtype=float))]
    return float(finite.max()) if len(finite) else None


def _min(values: np.ndarray | None) -> float | None:
    top = _max(None if values is None else -np.asarray(values, dtype=float))
    return None if top is None else -top


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def memory_figures(columns: dict[str, np.ndarray], mem_total: int | None, shared_host: bool) -> dict[str, Any]:
    """The sampled peaks and the device's RAM from the raw memory readings."""
    peak = _max(columns.get("cgroup_peak_bytes"))
    cgroup = peak if peak is not None else _max(columns.get("cgroup_usage_bytes"))
    limit = _min(columns.get("cgroup_limit_bytes"))
    ram = device_ram(cgroup, limit, mem_total, _min(columns.get("mem_available_bytes")), shared_host) or {}
    return {"peak_rss_bytes_sampled": _int(_max(columns.get("rss_bytes"))), "cgroup_peak_bytes": _int(cgroup),
            "device_ram_peak_bytes": ram.get("bytes"), "device_ram_limit_bytes": ram.get("limit_bytes"),
            "device_ram_peak_what": ram.get("what")}


def _kernel_peak(raw: dict[str, Any], end: RunEnd | None, events: Sequence[Event]) -> tuple[int | None, str]:
    """The worker's kernel RSS peak: the native worker's own VmHWM event, else the end record's
    (wait4's ru_maxrss from the Python supervisor, the last VmHWM the shell read)."""
    own = next((e.vm_hwm_bytes for e in events if isinstance(e, Memory)), None)
    if own is not None:
        return own, NATIVE_WORKER_RSS
    if end is not None and end.worker_peak_bytes:
        return end.worker_peak_bytes, PEAK_WHAT.get(end.worker_peak_from or "", WORKER_RSS)
    return raw.get("peak_rss_bytes_kernel"), WORKER_RSS  # a run recorded before raw end facts


def not_deployed(meta: RunMeta) -> str | None:
    """Why the native worker that ran is not the one deployed (a file of its bundle with another
    sha256 when the run read it, meta.json `ran`, than bundle.json says), with the fix; None."""
    deployed = (meta.native_worker or {}).get("files") or {}
    ran = meta.ran or {}
    differ = sorted(name for name, digest in deployed.items() if ran.get(f"worker/{name}") not in (None, digest))
    if not differ:
        return None
    return (f"the native worker that ran is not the one deployed: {', '.join(differ)} had another sha256 when the run "
            "started; its figures are not the deployed worker's: deploy again")


def run_figures(meta: RunMeta, raw: dict[str, Any], end: RunEnd | None, events: Sequence[Event],
                columns: dict[str, np.ndarray], shared_host: bool = False) -> dict[str, Any]:
    """result.json's figures (docs/figures.md) from the run's raw records: `meta` and `raw` (the
    result as read) with its `end` record and `events`, each parsed where it was read
    (`run_meta.RunMeta`, `run_end.result_end`, `run_events.read_events`). A result without raw
    end facts (a cut-off attempt, a run recorded before them) keeps the status it states."""
    spec = meta.spec
    readings = meta.readings or {}
    if end is not None:
        status, detail = run_status(end, events)
    else:
        status, detail = raw.get("status") or "error", raw.get("detail") or ""
    swapped = not_deployed(meta)
    if swapped:
        status, detail = "error", swapped
    stats = step_statistics(events)
    median = (stats["step_time_s"] or {}).get("median")
    predicted = next((e.memory for e in events if isinstance(e, Predicted)), None)
    kernel, kernel_what = _kernel_peak(raw, end, events)
    _, account = sample_figures(columns, readings, spec)
    batch = spec.get("batch_size") or 1
    figures = {
        **{k: v for k, v in raw.items() if k not in ("end", "cpu_start", "cpu_end")},
        "status": status,
        "detail": detail,
        "run_id": raw.get("run_id") or meta.run_id,
        "model": spec.get("checkpoint") or spec.get("model") or raw.get("model"),
        "method": spec.get("method") or raw.get("method"),
        "backend": spec.get("backend") or raw.get("backend"),
        "runtime": meta.runtime or raw.get("runtime"),
        "batch_size": batch,
        "recorded_by": readings.get("recorded_by") or raw.get("recorded_by") or raw.get("written_by"),
        "exit_code": end.exit_code if end is not None else raw.get("exit_code"),
        "exit_signal": signal_name(end.exit_signal if end is not None else None) or raw.get("exit_signal"),
        **stats,
        **learning_figures(events, spec.get("target")),
        **memory_apart(events, columns),
        "samples_per_s": samples_per_s(batch, median),
        "cpu": cpu_share(raw.get("cpu_start"), raw.get("cpu_end"),
                         readings.get("clock_ticks") or DEFAULT_CLOCK_TICKS) or raw.get("cpu"),
        # a run recorded before raw readings keeps the memory figures its device made (below)
        **(memory_figures(columns, meta.device.mem_total_bytes, shared_host) if meta.recorded_raw else {}),
        "peak_rss_bytes_kernel": kernel,
        "peak_rss_kernel_what": kernel_what,
        "predicted_peak_bytes_est": (predicted or {}).get("peak_bytes"),
        **budget_figures(spec, kernel),
        # a run recorded before raw readings said what its power covers in its sampler's summary
        "power": account if meta.recorded_raw else {**account, **(raw.get("sampler") or {})},
    }
    if not meta.recorded_raw:  # recorded before raw readings: the figures its device made stand
        figures.update({k: v for k, v in raw.items() if v is not None and k not in ("power", "cpu_start", "cpu_end")})
    return figures


def budget_figures(spec: dict[str, Any], kernel_peak: Any) -> dict[str, Any]:
    """The budget the run was held to (methods.budget: its device's RAM less the OS at idle, the
    supervisor and the margin, recorded by the preflight in the spec) and the share of it the
    worker's kernel peak took; None for a run recorded without one."""
    held = (spec.get("extra") or {}).get("budget") or {}
    budget = held.get("budget_bytes") if isinstance(held, dict) else None
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        return {"budget_bytes": None, "peak_of_budget": None}
    share = kernel_peak / budget if isinstance(kernel_peak, int) and kernel_peak > 0 else None
    return {"budget_bytes": budget, "peak_of_budget": None if share is None else round(share, 3)}


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None
    return data if isinstance(data, dict) else None


def status_of_run_dir(run_dir: str | Path) -> str | None:
    """The status of a run directory's run (None before result.json exists), from its raw end
    facts where it has them: what collect and status show without reading its samples. A bad end
    record or event raises untrusted.BadRecord."""
    path = Path(run_dir)
    raw = read_json(path / "result.json")
    if raw is None:
        return None
    end = result_end(raw, str(path / "result.json"))
    if end is None:
        return str(raw["status"]) if raw.get("status") else None
    return run_status(end, read_events(path / "events.jsonl").events)[0]


def run_events(run_dir: Path, device: RunEvents | None = None) -> list[Event]:
    """The run's events, checked (`run_events.read_events`): the device's trace (`device`, where
    it was read already), then the host's evaluations of its saved weights."""
    device = read_events(run_dir / "events.jsonl") if device is None else device
    return device.events + read_events(run_dir / HOST_EVALS).events


def figures_of_run_dir(run_dir: str | Path, shared_host: bool = False) -> dict[str, Any] | None:
    """The figures of a run directory read from its own files (None before result.json exists);
    `bench` shows these for the runs it just made. A bad meta.json, end record or event raises
    untrusted.BadRecord."""
    path = Path(run_dir)
    raw = read_json(path / "result.json")
    if raw is None:
        return None
    meta = run_meta_of(read_json(path / "meta.json"), str(path / "meta.json"))
    trace = read_events(path / "events.jsonl")
    numbers, texts = raw_columns(meta.readings or {})
    events = run_events(path, trace)
    end = result_end(raw, str(path / "result.json"))
    figures = run_figures(meta, raw, end, events, read_columns(path / "samples.jsonl", numbers, texts), shared_host)
    figures.update(events_truncated_last_line=trace.truncated_last_line, events_bad_lines=trace.bad_lines)
    return figures
