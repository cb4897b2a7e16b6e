"""Per-run figures: memory, step time, throughput, energy, power, heat, loss, status.

Step figures use the measured steps (warmup excluded) when there are any, with the
definitions of edgebench.figures.steps. The per-sample figures (power, estimated power,
temperatures) come from the run's raw readings through edgebench.figures.samples, the same
for every runtime. Energy is the exact integral of the power trace over each step window
(energy.py), taken from an external meter's trace when one covers the run on the host
timeline, else from the device's own measured `power_w`. A device's estimated `power_w_est`
only ever feeds the `*_est` figures, so an estimate is never mistaken for a measurement.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from edgebench.figures import steps as figures
from edgebench.figures.learning import LEARNING_COLUMNS
from edgebench.figures.memory import device_ram, prediction_error_pct
from edgebench.figures.samples import raw_columns, sample_figures
from edgebench.results.energy import window_energy_j, window_mean_peak_w
from edgebench.results.pareto import mark_frontier
from edgebench.results.store import Store
from edgebench.runner.native import backend_label

# Column order of `edgebench report --format csv|json`.
METRIC_COLUMNS = [
    "device", "run_id", "model", "method", "backend", "status", "detail", "batch_size", "steps", "text_length",
    "image_size", "data", "lr", "weight_decay", "threads", "steps_measured", "last_step",
    "peak_rss_bytes_sampled", "peak_rss_bytes_kernel", "cgroup_peak_bytes", "peak_mem_bytes",
    "predicted_peak_bytes_est", "predicted_peak_error_pct", "budget_bytes", "peak_of_budget", "device_ram_bytes",
    "device_ram_peak_bytes", "device_ram_limit_bytes", "device_ram_peak_what",
    "step_time_median_s", "step_time_p90_s", "samples_per_s", "tokens_per_s",
    "energy_per_step_j", "energy_per_sample_j", "power_mean_w", "power_peak_w", "energy_source",
    "power_covers", "power_flags", "power_warning",
    "energy_per_step_j_est", "energy_per_sample_j_est", "power_mean_w_est", "power_peak_w_est", "power_est_basis",
    "temp_peak_c", "time_throttled_s", "loss_first", "loss_last",
    "eval_loss_first", "eval_loss_last", "eval_accuracy_first", "eval_accuracy_last", "eval_count", "eval_time_s",
    "target", "target_reached", "steps_to_target", "time_to_target_s", "energy_to_target_j",
    "energy_to_target_j_est",
    "cpu_others_pct", "cpu_steal_pct", "load_avg_1m", "disturbed", "disturbed_why", "figure_gaps", "align_source",
    "on_frontier",
]


def run_shape(run: dict[str, Any]) -> dict[str, Any]:
    """What a run was asked to do besides its method (pareto.SHAPE_KEYS): runs that differ here
    are different configurations. `data` is the folder dataset's name (else synthetic), `packed` added."""
    spec = (json.loads(run.get("meta_json") or "{}") or {}).get("spec") or {}
    if spec.get("command"):  # a measured command (edgebench measure): it chose its steps, its data its own
        return {"steps": None, "text_length": None, "image_size": None, "data": None, "target": None, "lr": None,
                "weight_decay": None, "threads": None}
    data = str(spec["data_dir"]).rstrip("/").rsplit("/", 1)[-1] if spec.get("data_dir") else "synthetic"
    return {"steps": spec.get("steps") if not spec.get("duration_s") else f"{spec['duration_s']:g} s",
            "text_length": run.get("text_length"), "image_size": run.get("image_size"),
            "data": data + (" packed" if spec.get("packing") else ""), "target": spec.get("target"),
            # the sweep's axes (bench --lr 1e-3,1e-4): None is the method's (torch's) own
            "lr": spec.get("lr"), "weight_decay": spec.get("weight_decay"), "threads": spec.get("threads")}


def _pct(share: float | None) -> float | None:
    return None if share is None else round(100 * share, 1)


def cpu_figures(result: dict[str, Any]) -> dict[str, Any]:
    """The noise guard's record (result.json `cpu`): others' and stolen CPU as % of all cores' time."""
    cpu = result.get("cpu") or {}
    return {"cpu_others_pct": _pct(cpu.get("others_share")), "cpu_steal_pct": _pct(cpu.get("steal_share")),
            "load_avg_1m": cpu.get("load_1m"), "disturbed": cpu.get("disturbed"),
            "disturbed_why": cpu.get("disturbed_why")}


def power_figures(result: dict[str, Any]) -> dict[str, Any]:
    """What the device's measured power covers (the sampler's `power_total`, e.g. VDD_IN or
    "sum of rails") and why it may fall short (`power_flags`, e.g. charging), from result.json;
    for an estimate, the power model and whose CPU use scales it (`power_est_basis`)."""
    sampler = result.get("power") or result.get("sampler") or {}  # `sampler`: runs stored before raw readings
    flags = sampler.get("power_flags") or []
    model = sampler.get("power_model") or {}
    basis = sampler.get("power_est_basis") or ("the whole system's CPU use" if model else None)
    return {"power_covers": sampler.get("power_total"), "power_flags": ",".join(flags) if flags else None,
            "power_warning": sampler.get("power_warning"),
            "power_est_basis": f"{model['idle_w']:g}-{model['max_w']:g} W by {basis}" if model and basis else None}


def _finite_max(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.max()) if len(values) else None


def _or_none(value: float | None) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def _energy(
    t_ns: np.ndarray, p_w: np.ndarray, begin: np.ndarray, end: np.ndarray, batch: int
) -> dict[str, float | None]:
    """Energy per step and per sample, mean and peak power over the measured steps the power trace
    covers, when it covers at least half of them (a trace begins a reading or two into a run: a
    CPU-use estimate needs two readings of its counter)."""
    none: dict[str, float | None] = {"energy_per_step_j": None, "energy_per_sample_j": None,
                                     "power_mean_w": None, "power_peak_w": None}
    if np.isfinite(p_w).sum() < 2 or not len(begin):
        return none
    per_step = window_energy_j(t_ns, p_w, begin, end)
    covered = np.isfinite(per_step)
    if 2 * covered.sum() < len(per_step):
        return none
    mean_w, peak_w = window_mean_peak_w(t_ns, p_w, int(begin[covered].min()), int(end[covered].max()))
    per_step_mean = float(np.mean(per_step[covered]))
    return {
        "energy_per_step_j": per_step_mean,
        "energy_per_sample_j": per_step_mean / batch,
        "power_mean_w": _or_none(mean_w),
        "power_peak_w": _or_none(peak_w),
    }


def _measured_power(store: Store, run: dict[str, Any], steps: dict[str, np.ndarray], samples: dict[str, np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str | None]:
    """(times, watts, step begins, step ends, source) for measured power, on one timeline.

    An external meter's trace covering the aligned steps wins (it sees the whole device);
    otherwise the device's own `power_w` on its monotonic clock.
    """
    host_begin, host_end = steps["host_begin_ns"], steps["host_end_ns"]
    if len(host_begin) and host_begin.dtype.kind == "i":
        trace_id = store.external_covering(run["device"], int(host_begin.min()), int(host_end.max()))
        if trace_id:
            t_ns, p_w = store.external_arrays(trace_id)
            return t_ns, p_w, host_begin.astype(np.int64), host_end.astype(np.int64), f"external:{trace_id}"
    has_power = np.isfinite(samples["power_w"]).sum() >= 2
    return (samples["t_ns"], samples["power_w"], steps["begin_ns"].astype(np.int64), steps["end_ns"].astype(np.int64),
            "device" if has_power else None)


def step_energy_j(store: Store, device: str, run_id: str) -> tuple[dict[str, np.ndarray], np.ndarray, str | None]:
    """Measured energy of every step of a run: (steps, joules per step, source)."""
    run = store.runs(device=device, run_id=run_id)[0]
    steps = store.steps(device, run_id)
    t_ns, p_w, begin, end, source = _measured_power(store, run, steps, sample_columns(store, run))
    return steps, window_energy_j(t_ns, p_w, begin, end), source


def _measured_energy(store: Store, run: dict[str, Any], steps: dict[str, np.ndarray], measured: np.ndarray,
                     samples: dict[str, np.ndarray], batch: int) -> tuple[dict[str, float | None], str | None]:
    t_ns, p_w, begin, end, source = _measured_power(store, run, steps, samples)
    return _energy(t_ns, p_w, begin[measured], end[measured], batch), source


def step_joules(store: Store, run: dict[str, Any], steps: dict[str, np.ndarray], samples: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray | None]:
    """Each step's joules (warmup included) from measured power (`measured`, NaN where the
    trace does not cover a step) and from the power model (`est`); None without that power.
    The energy to a target sums the first steps'; the HTML's learning curve accumulates them."""
    t_ns, p_w, begin, end, _ = _measured_power(store, run, steps, samples)
    traces = {"measured": (t_ns, p_w, begin, end),
              "est": (samples["t_ns"], samples["power_w_est"], steps["begin_ns"].astype(np.int64),
                      steps["end_ns"].astype(np.int64))}
    return {key: window_energy_j(times, watts, b, e) if np.isfinite(watts).sum() >= 2 else None
            for key, (times, watts, b, e) in traces.items()}


def joules_of_first(per_step: np.ndarray | None, steps: int) -> float | None:
    """The joules of the first `steps` steps; None unless every one of them has a figure."""
    if per_step is None or len(per_step) < steps or not np.isfinite(per_step[:steps]).all():
        return None
    return float(per_step[:steps].sum())


def _energy_to_target(store: Store, run: dict[str, Any], steps: dict[str, np.ndarray], samples: dict[str, np.ndarray],
                      steps_to_target: int | None) -> dict[str, float | None]:
    """Joules of the steps trained until the target was first reached (warmup included, the
    evaluations not), measured where the power trace covers every one of them, and estimated."""
    if not steps_to_target:
        return {"energy_to_target_j": None, "energy_to_target_j_est": None}
    joules = step_joules(store, run, steps, samples)
    return {"energy_to_target_j": joules_of_first(joules["measured"], steps_to_target),
            "energy_to_target_j_est": joules_of_first(joules["est"], steps_to_target)}


def forward_fill(values: np.ndarray) -> np.ndarray:
    """Each missing value takes the last one seen (sample lines carry only some fields)."""
    idx = np.where(np.isfinite(values), np.arange(len(values)), 0)
    np.maximum.accumulate(idx, out=idx)
    return values[idx]


def _throttled_s(t_ns: np.ndarray, flags: np.ndarray) -> float | None:
    """Time spent with any throttle flag set (each sample holds until the next one)."""
    if not np.isfinite(flags).any() or len(t_ns) < 2:
        return None
    dt = np.diff(t_ns) / 1e9
    on = np.nan_to_num(forward_fill(flags)[:-1]) != 0
    return float(dt[on].sum())


def sample_columns(store: Store, run: dict[str, Any]) -> dict[str, np.ndarray]:
    """A stored run's per-sample figures, made from its raw readings (edgebench.figures.samples)."""
    meta = json.loads(run.get("meta_json") or "{}") or {}
    readings = meta.get("readings") or {}
    raw = store.samples(run["device"], run["run_id"], *raw_columns(readings))
    columns, _ = sample_figures(raw, readings, meta.get("spec") or {})
    return {**raw, **columns}


def run_metrics(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run row of the store."""
    device, run_id = run["device"], run["run_id"]
    result = json.loads(run["result_json"]) if run.get("result_json") else {}
    s = sample_columns(store, run)
    steps = store.steps(device, run_id)
    measured = steps["phase"] == "measure"
    if not measured.any():
        measured = np.ones(len(steps["step"]), dtype=bool)
    durations = steps["duration_s"][measured]
    batch = run.get("batch_size") or 1
    stats = figures.step_time_stats(durations.tolist()) or {}
    throughput = figures.samples_per_s(batch, stats.get("median"))
    losses = steps["loss"][np.isfinite(steps["loss"])] if len(steps["loss"]) else np.array([])

    out: dict[str, Any] = {k: run.get(k) for k in ("device", "run_id", "model", "method", "backend", "status",
                                                    "detail", "batch_size", "device_ram_bytes", "align_source")}
    out["backend"] = backend_label(run.get("backend"), run.get("runtime"))
    out.update(run_shape(run))
    out["steps_measured"] = int(len(durations))
    out["last_step"] = result.get("last_step")  # the last step it began: where a run that ended early stopped
    out["peak_rss_bytes_sampled"] = _finite_max(s["rss_bytes"]) or result.get("peak_rss_bytes_sampled")
    out["peak_rss_bytes_kernel"] = result.get("peak_rss_bytes_kernel")
    out["cgroup_peak_bytes"] = result.get("cgroup_peak_bytes") or _finite_max(s["cgroup_peak_bytes"])
    out["peak_mem_bytes"] = out["peak_rss_bytes_kernel"] or out["peak_rss_bytes_sampled"]
    out["predicted_peak_bytes_est"] = result.get("predicted_peak_bytes_est")
    out["predicted_peak_error_pct"] = prediction_error_pct(out["predicted_peak_bytes_est"],
                                                           out["peak_rss_bytes_kernel"])
    out["budget_bytes"], out["peak_of_budget"] = result.get("budget_bytes"), result.get("peak_of_budget")
    ram = ({"bytes": result["device_ram_peak_bytes"], "limit_bytes": result.get("device_ram_limit_bytes"),
            "what": result.get("device_ram_peak_what")} if result.get("device_ram_peak_bytes") else
           device_ram(out["cgroup_peak_bytes"], run.get("cgroup_limit_bytes"), None, None) or {})
    out.update({"device_ram_peak_bytes": ram.get("bytes"), "device_ram_limit_bytes": ram.get("limit_bytes"),
                "device_ram_peak_what": ram.get("what")})
    out["step_time_median_s"] = stats.get("median")
    out["step_time_p90_s"] = stats.get("p90")
    out["samples_per_s"] = throughput
    out["tokens_per_s"] = figures.tokens_per_s(throughput, run.get("text_length"))
    out.update(cpu_figures(result))

    measured_energy, source = _measured_energy(store, run, steps, measured, s, batch)
    out.update(measured_energy)
    out["energy_source"] = source
    out.update(power_figures(result))
    dev_begin, dev_end = steps["begin_ns"][measured].astype(np.int64), steps["end_ns"][measured].astype(np.int64)
    out.update({f"{k}_est": v for k, v in _energy(s["t_ns"], s["power_w_est"], dev_begin, dev_end, batch).items()})
    out["temp_peak_c"] = _finite_max(s["temp_c_max"])
    out["time_throttled_s"] = _throttled_s(s["t_ns"], s["throttle_flags"])
    out["loss_first"] = float(losses[0]) if len(losses) else result.get("loss_first")
    out["loss_last"] = float(losses[-1]) if len(losses) else result.get("loss_last")
    out.update({k: result.get(k) for k in LEARNING_COLUMNS})
    out.update(_energy_to_target(store, run, steps, s, result.get("steps_to_target")))
    gaps = (result.get("power") or {}).get("gaps") or {}
    out["figure_gaps"] = "; ".join(f"{key}: {why}" for key, why in gaps.items()) or None
    out["on_frontier"] = None
    return {k: out.get(k) for k in METRIC_COLUMNS}


def all_metrics(store: Store, device: str | None = None, model: str | None = None,
                tag: str | None = None) -> list[dict[str, Any]]:
    """Figures of every matching run, with the memory/time Pareto frontier marked per (device, model)."""
    rows = [run_metrics(store, run) for run in store.runs(device=device, model=model, tag=tag)]
    return mark_frontier(rows)
