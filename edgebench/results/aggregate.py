"""Repeats: the runs of one configuration folded into one row, each figure the median of
its runs with min, max and n (definitions: edgebench.figures, docs/figures.md).

A configuration is (device, model, method, backend) and the run shape (batch size, steps,
text length, image size, data, held-out target, lr, weight decay, threads): runs that differ in
any of them stay apart, never folded as repeats. Figures come
from the runs that finished (`ok`); a configuration where none finished shows its failed
runs' figures (an OOM's peak is still the story) with their status. `config_label` names a
configuration the same way in every table and chart.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgebench.figures.carbon import CO2_OF, INTENSITY_COLUMNS
from edgebench.figures.steps import spread
from edgebench.results.pareto import SHAPE_KEYS, mark_frontier

GROUP_KEYS = ("device", "model", "method", "backend", *SHAPE_KEYS)
SHAPE_NAMES = {"batch_size": "batch", "steps": "steps", "text_length": "text", "image_size": "image", "data": "data",
               "target": "target", "lr": "lr", "weight_decay": "wd", "threads": "threads"}
DEFAULTED = ("lr", "weight_decay", "threads")  # None: the method's (optimizer's, torch's) own
FIGURE_KEYS = (
    "peak_mem_bytes",
    "device_ram_peak_bytes",
    "peak_rss_bytes_kernel",
    "peak_rss_bytes_sampled",
    "step_time_median_s",
    "step_time_p90_s",
    "samples_per_s",
    "tokens_per_s",
    "energy_per_step_j",
    "energy_per_step_j_est",
    "energy_per_sample_j",
    "energy_per_sample_j_est",
    "power_mean_w",
    "power_mean_w_est",
    "power_peak_w",
    "power_peak_w_est",
    "temp_peak_c",
    "time_throttled_s",
    "loss_first",
    "loss_last",
    "cpu_others_pct",
    "predicted_peak_bytes_est",
    "predicted_peak_error_pct",
    "budget_bytes",
    "peak_of_budget",
    "eval_loss_first",
    "eval_loss_last",
    "eval_accuracy_last",
    "steps_to_target",  # of the runs that reached the target
    "time_to_target_s",
    "energy_to_target_j",
    "energy_to_target_j_est",
    *CO2_OF.values(),  # each energy figure's CO2 (report: edgebench.figures.carbon.with_co2)
)


def _status(statuses: Counter[str]) -> str:
    ok, total = statuses.get("ok", 0), sum(statuses.values())
    if ok == total:
        return "ok"
    if ok == 0:
        return statuses.most_common(1)[0][0] if len(statuses) == 1 else "/".join(sorted(statuses))
    return f"ok {ok}/{total}"


def shape_text(group: dict[str, Any], keys: list[str]) -> str:
    """The run shape's `keys` as words (`steps 5, text 32, no target`); empty when none is asked."""
    return ", ".join("no target" if k == "target" and group.get(k) is None else
                     f"{SHAPE_NAMES[k]} {('default' if k in DEFAULTED else '-') if group.get(k) is None else group[k]}"
                     for k in keys)


def config_label(group: dict[str, Any], device: bool = True, model: bool = True) -> str:
    """`device / model / method / backend`, with the run shape where configurations differ
    in it (`group_runs` sets `shape`); a caller that names the device or model above may drop them."""
    names = [group["device"]] * device + [group["model"]] * model + [group["method"], group["backend"]]
    shape = group.get("shape")
    return " / ".join(str(n) for n in names) + (f" ({shape})" if shape else "")


def group_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration, in first-seen order: each FIGURE_KEYS entry is the median,
    `spread[key]` its {median, min, max, n}; `n` counts the runs the figures come from."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in GROUP_KEYS), []).append(row)
    out = []
    for key, members in groups.items():
        ok = [r for r in members if r.get("status") == "ok"]
        used = ok or members
        statuses = Counter(str(r.get("status")) for r in members)
        group: dict[str, Any] = dict(zip(GROUP_KEYS, key))
        group.update({"status": _status(statuses), "n": len(used), "runs": len(members),
                      "run_ids": [r["run_id"] for r in members], "statuses": dict(statuses), "spread": {}})
        for fig in FIGURE_KEYS:
            s = spread(r.get(fig) for r in used)
            group["spread"][fig] = s
            group[fig] = None if s is None else s["median"]
        disturbed = [r for r in used if r.get("disturbed")]
        group["disturbed"] = len(disturbed)
        group["disturbed_why"] = sorted({r["disturbed_why"] for r in disturbed if r.get("disturbed_why")})
        group["disturbed_pct"] = [max(r.get("cpu_others_pct") or 0, r.get("cpu_steal_pct") or 0) for r in disturbed]
        for name in ("energy_source", "power_covers", "power_warning", "power_est_basis", "device_ram_limit_bytes",
                     "device_ram_peak_what"):
            group[name] = next((r.get(name) for r in used if r.get(name)), None)
        flags = {f for r in used if r.get("power_flags") for f in r["power_flags"].split(",")}
        group["power_flags"] = ",".join(sorted(flags)) or None
        group["device_ram_bytes"] = next((r.get("device_ram_bytes") for r in used if r.get("device_ram_bytes")), None)
        for name in INTENSITY_COLUMNS:  # the grid's that made the CO2 (one per report)
            group[name] = next((r[name] for r in members if r.get(name) is not None), None)
        group["detail"] = next((r.get("detail") for r in members if r.get("status") != "ok" and r.get("detail")), None)
        group["reached"] = sum(1 for r in used if r.get("target_reached"))
        # runs that ended before their cap without reaching the target: `interrupted at step 16`
        group["ended_early"] = [
            str(r.get("status")) + ("" if r.get("last_step") is None else f" at step {r['last_step']}")
            for r in used if r.get("status") != "ok" and not r.get("target_reached")]
        group["target_reached"] = bool(group["target"]) and group["reached"] == len(used)  # every run reached it
        group["on_frontier"] = None
        out.append(group)
    differ = [k for k in SHAPE_KEYS if len({g.get(k) for g in out}) > 1]
    for group in out:
        group["shape"] = shape_text(group, differ)
    return mark_frontier(out, finished=lambda g: g["status"] == "ok" or g["status"].startswith("ok "))
