"""The study table: each method against a baseline method, per device, model and backend.

For peak memory, time per step and energy per step it gives the method's median and its
ratio to the baseline's median (beside the peak, the memory model's prediction and its
error). The ratio's range divides the method's min by the baseline's max and the method's
max by the baseline's min, so every pairing of their runs lies inside it. Energy is
measured where both have a measurement, else the estimate: then its figure and ratios sit
in the `_est` columns (`energy_estimated` says which).
Configurations of another run shape (steps, text length, image size, data, target) are
another setting with their own baseline.

Where the setting has a held-out target (`--target`), the study also ranks by what learning
cost: steps, seconds and joules to the target (medians of the runs that reached it), their
ratios to the baseline's, and how many runs reached it (`reached` of `n`); the frontier is
then peak memory against time to the target.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from edgebench.figures.carbon import CO2_OF
from edgebench.figures.steps import spread
from edgebench.results.pareto import SHAPE_KEYS

STUDY_FIGURES = (("peak_mem", "peak_mem_bytes"), ("step_time", "step_time_median_s"))
STUDY_COLUMNS = [
    "device", "model", "backend", *SHAPE_KEYS, "method", "baseline", "status", "n", "n_baseline",
    "peak_mem_bytes", "peak_mem_ratio", "peak_mem_ratio_min", "peak_mem_ratio_max",
    "predicted_peak_bytes_est", "predicted_peak_error_pct",
    "step_time_s", "step_time_ratio", "step_time_ratio_min", "step_time_ratio_max",
    "energy_per_step_j", "co2e_est_per_step_g", "energy_ratio", "energy_ratio_min", "energy_ratio_max",
    "energy_per_step_j_est", "co2e_est_per_step_g_est", "energy_ratio_est", "energy_ratio_min_est",
    "energy_ratio_max_est", "energy_estimated",
    "loss_first", "loss_last", "eval_loss_first", "eval_loss_last", "eval_accuracy_last",
    "reached", "steps_to_target", "time_to_target_s", "time_to_target_ratio", "time_to_target_ratio_min",
    "time_to_target_ratio_max", "energy_to_target_j", "co2e_est_to_target_g", "energy_to_target_ratio",
    "energy_to_target_ratio_min", "energy_to_target_ratio_max", "energy_to_target_j_est", "co2e_est_to_target_g_est",
    "energy_to_target_ratio_est", "energy_to_target_ratio_min_est", "energy_to_target_ratio_max_est",
    "carbon_intensity_g_per_kwh", "carbon_intensity_source", "disturbed", "on_frontier",
]


def _ratio(
    method: dict[str, Any] | None, base: dict[str, Any] | None
) -> tuple[float | None, float | None, float | None]:
    if not method or not base or not base["median"] or not base["min"]:
        return None, None, None
    return method["median"] / base["median"], method["min"] / base["max"], method["max"] / base["min"]


def _finished(group: dict[str, Any]) -> bool:
    status: str = group["status"]
    return status == "ok" or status.startswith("ok ")


def _energy(row: dict[str, Any], g: dict[str, Any], base: dict[str, Any] | None, figure: str, name: str) -> None:
    """An energy figure, its CO2 (the CO2's ratios are the energy's) and its ratios: measured where
    both sides have it, else the estimates (`_est`)."""
    measured = bool(g["spread"][figure]) and bool(base and base["spread"][figure])
    key = figure if measured or (base is None and g["spread"][figure]) else f"{figure}_est"
    est = "_est" if key.endswith("_est") else ""
    row[f"{figure}{est}"], row[CO2_OF[key]] = g[key], g.get(CO2_OF[key])
    if name == "energy":
        row["energy_estimated"] = bool(est) if g[key] is not None else None
    ratio = _ratio(g["spread"][key], base["spread"][key] if base else None) if _finished(g) else (None,) * 3
    row.update(zip((f"{name}_ratio{est}", f"{name}_ratio_min{est}", f"{name}_ratio_max{est}"), ratio))


def _ended(groups: list[dict[str, Any]]) -> str:
    """`1 oom, 2 interrupted`: how the groups' runs ended."""
    statuses = sum((Counter(g["statuses"]) for g in groups), Counter[str]())
    return ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))


def _no_baseline_note(where: str, baseline: str, members: list[dict[str, Any]]) -> str:
    """Why a setting has no ratios: its baseline has no finished run. The --baseline it could
    take instead are only the methods with a finished run there; where none has one, how to get one."""
    finished = sorted({g["method"] for g in members if _finished(g)} - {baseline})
    if not finished:
        return (f"{where}: no finished run ({_ended(members)}): nothing to compare; a run that ends ok comes first "
                f"(`edgebench bench --methods {baseline}` on this host, `edgebench deploy` then `edgebench collect` "
                "on a device)")
    mine = [g for g in members if g["method"] == baseline]
    return (f"{where}: no finished {baseline} run to compare against" + (f" (its runs: {_ended(mine)})" if mine else "")
            + f"; run it, or pass --baseline with a method that finished here: {', '.join(finished)}")


def study_rows(groups: list[dict[str, Any]], baseline: str = "sgd") -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of the study table (STUDY_COLUMNS) and notes on what could not be compared."""
    rows, notes = [], []
    by_setting: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for g in groups:
        by_setting.setdefault((g["device"], g["model"], g["backend"], *(g.get(k) for k in SHAPE_KEYS)), []).append(g)
    for setting, members in by_setting.items():
        device, model, backend = setting[:3]
        base = next((g for g in members if g["method"] == baseline and _finished(g)), None)
        if base is None:
            where = f"{device} / {model} / {backend}" + (f" ({members[0]['shape']})" if members[0].get("shape") else "")
            notes.append(_no_baseline_note(where, baseline, members))
        for g in members:
            row: dict[str, Any] = {"device": device, "model": model, "backend": backend, "method": g["method"],
                                   **{k: g.get(k) for k in SHAPE_KEYS}, "shape": g.get("shape"),
                                   "loss_first": g.get("loss_first"), "loss_last": g.get("loss_last"),
                                   "baseline": baseline, "status": g["status"], "n": g["n"],
                                   "n_baseline": base["n"] if base else None, "disturbed": g["disturbed"],
                                   "on_frontier": g["on_frontier"],
                                   **{k: g.get(k) for k in ("carbon_intensity_g_per_kwh", "carbon_intensity_source")},
                                   "peak_mem_bytes": g["peak_mem_bytes"], "step_time_s": g["step_time_median_s"],
                                   "predicted_peak_bytes_est": g["predicted_peak_bytes_est"],
                                   "predicted_peak_error_pct": g["predicted_peak_error_pct"],
                                   **{k: g.get(k) for k in ("eval_loss_first", "eval_loss_last", "eval_accuracy_last",
                                                            "steps_to_target", "time_to_target_s")}}
            figures = STUDY_FIGURES + ((("time_to_target", "time_to_target_s"),) if g.get("target") else ())
            for name, key in figures:
                ratio = _ratio(g["spread"][key], base["spread"][key] if base else None) if _finished(g) else (None,) * 3
                row.update(zip((f"{name}_ratio", f"{name}_ratio_min", f"{name}_ratio_max"), ratio))
            _energy(row, g, base, "energy_per_step_j", "energy")
            if g.get("target"):
                row["reached"], row["ended_early"] = g["reached"], g.get("ended_early") or []
                _energy(row, g, base, "energy_to_target_j", "energy_to_target")
            rows.append(row)
    return [{k: r.get(k) for k in [*STUDY_COLUMNS, "shape", "ended_early"]} for r in rows], notes


def measured_to_target(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What a method's finished runs with a held-out target took to reach it, from the store's
    run rows (their result.json figures; no samples read, so `predict` stays quick): per
    method, one entry per target and batch size with `n` runs, how many `reached` it, and the
    median `steps` and `seconds` of those that did."""
    by: dict[tuple[str, str, Any], list[dict[str, Any]]] = {}
    for run in runs:
        result = json.loads(run.get("result_json") or "{}") or {}
        if run.get("status") == "ok" and result.get("target"):
            by.setdefault((run["method"], result["target"], run.get("batch_size")), []).append(result)
    out: dict[str, list[dict[str, Any]]] = {}
    for (method, target, batch), results in by.items():
        hit = [r for r in results if r.get("target_reached")]
        steps, seconds = (spread(r.get(k) for r in hit) for k in ("steps_to_target", "time_to_target_s"))
        out.setdefault(method, []).append({"target": target, "batch_size": batch, "n": len(results),
                                           "reached": len(hit), "steps": steps and steps["median"],
                                           "seconds": seconds and seconds["median"]})
    return out
