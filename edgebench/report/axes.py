"""What each axis of a sweep did (bench and deploy take several values of --threads, --lr,
--weight-decay and --batch-size: fleet/plan.py), from the configurations (results.aggregate)
that differ only in it, per device, model, method, backend and the rest of the run shape:

- threads: median step time, samples/s and energy per step against the thread count, with the
  speedup and the scaling efficiency relative to the fewest threads (docs/figures.md);
- lr x weight decay: the time to the held-out target where the runs had one, else the last
  held-out loss, else the last training loss, as a heatmap;
- batch size: the peak memory, measured and predicted.

Tables for the terminal and JSON (`report --study`) and the HTML report (its charts: charts.axis_charts).
"""

from __future__ import annotations

from typing import Any

from edgebench.report.series import MIB
from edgebench.results.aggregate import GROUP_KEYS, config_label, shape_text
from edgebench.terminal import Field, Section

Series = tuple[Any, ...]  # the group keys an axis' configurations share


def _finished(group: dict[str, Any]) -> bool:
    return str(group.get("status", "")).startswith("ok")


def _series(groups: list[dict[str, Any]], axes: tuple[str, ...], key: str) -> dict[Series, list[dict[str, Any]]]:
    """Finished configurations with a `key` figure that differ only in `axes`, by what they share;
    only where two or more points differ on them."""
    rest = [k for k in GROUP_KEYS if k not in axes]
    out: dict[Series, list[dict[str, Any]]] = {}
    for g in groups:
        if _finished(g) and g.get(key) is not None:
            out.setdefault(tuple(g.get(k) for k in rest), []).append(g)
    return {k: v for k, v in out.items() if len({tuple(g.get(a) for a in axes) for g in v}) > 1}


def _name(group: dict[str, Any], axes: tuple[str, ...]) -> str:
    """A series' name: device / model / method / backend and the shape it holds fixed where it matters."""
    others = [k for k in ("lr", "weight_decay", "threads", "batch_size") if k not in axes and group.get(k) is not None]
    fixed = shape_text(group, others)
    return config_label({**group, "shape": fixed})


def _energy_key(groups: list[dict[str, Any]]) -> str:
    return "energy_per_step_j" if any(g.get("energy_per_step_j") is not None for g in groups) else \
        "energy_per_step_j_est"


def thread_scaling(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration of a thread series (threads given; torch's default has no count),
    fewest threads first: step time, samples/s, energy per step, and against the fewest threads'
    run the speedup (its step time / this one's) and the scaling efficiency (speedup / (threads /
    its threads)): 1.0 is linear scaling."""
    rows = []
    for members in _series([g for g in groups if g.get("threads")], ("threads",), "step_time_median_s").values():
        members = sorted(members, key=lambda g: int(g["threads"]))
        base = members[0]
        energy = _energy_key(members)
        for g in members:
            speedup = base["step_time_median_s"] / g["step_time_median_s"] if g["step_time_median_s"] else None
            rows.append({"series": _name(g, ("threads",)), **{k: g.get(k) for k in GROUP_KEYS},
                         "step_time_median_s": g["step_time_median_s"], "samples_per_s": g.get("samples_per_s"),
                         "energy_per_step_j": g.get(energy), "energy_estimated": energy.endswith("_est"),
                         "speedup": speedup,
                         "scaling_efficiency": None if speedup is None else
                         speedup * int(base["threads"]) / int(g["threads"])})
    return rows


def learning_key(groups: list[dict[str, Any]]) -> tuple[str, str]:
    """What the lr x weight decay heatmap shows: the figure's key and its words."""
    if any(g.get("target") for g in groups):
        return "time_to_target_s", "time to the held-out target, s"
    if any(g.get("eval_loss_last") is not None for g in groups):
        return "eval_loss_last", "held-out loss, last evaluation"
    return "loss_last", "training loss, last step"


def decimal(value: Any) -> str:
    return "default" if value is None else f"{value:g}"


def lr_decay_grid(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One grid per series of configurations that differ in lr or weight decay (None: the
    method's own): its lrs (rows), weight decays (columns) and the figure in each cell (None:
    no finished run there)."""
    key, words = learning_key(groups)
    grids = []
    for members in _series(groups, ("lr", "weight_decay"), key).values():
        lrs = sorted({g.get("lr") for g in members}, key=lambda v: (v is not None, v or 0.0))
        decays = sorted({g.get("weight_decay") for g in members}, key=lambda v: (v is not None, v or 0.0))
        cell = {(g.get("lr"), g.get("weight_decay")): g[key] for g in members}
        grids.append({"series": _name(members[0], ("lr", "weight_decay")), "figure": key, "words": words,
                      "lr": lrs, "weight_decay": decays,
                      "values": [[cell.get((lr, wd)) for wd in decays] for lr in lrs]})
    return grids


def batch_memory(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration of a batch-size series, smallest first: the peak memory measured
    (the worker's kernel peak) and predicted before the run."""
    rows = []
    for members in _series(groups, ("batch_size",), "peak_mem_bytes").values():
        for g in sorted(members, key=lambda g: int(g["batch_size"])):
            rows.append({"series": _name(g, ("batch_size",)), **{k: g.get(k) for k in GROUP_KEYS},
                         "peak_mem_bytes": g["peak_mem_bytes"],
                         "predicted_peak_bytes_est": g.get("predicted_peak_bytes_est")})
    return rows


def axis_effects(groups: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each axis' effect where the configurations vary it (empty lists where none does)."""
    return {"threads": thread_scaling(groups), "lr_weight_decay": lr_decay_grid(groups),
            "batch_size": batch_memory(groups)}


def _number(key: str, fmt: str, scale: float = 1.0) -> Any:
    return lambda r: "-" if r.get(key) is None else format(r[key] / scale, fmt)


THREAD_FIELDS = [Field("series", "method, backend and the rest of its shape", lambda r: str(r["series"]), True),
                 Field("threads", "torch threads", lambda r: str(r["threads"]), True),
                 Field("step s", "median step time, s", _number("step_time_median_s", ".4g")),
                 Field("samples/s", "samples per second", _number("samples_per_s", ".3g")),
                 Field("J/step", "energy per step, J (est: the power model's)",
                       lambda r: "-" if r.get("energy_per_step_j") is None else
                       f"{r['energy_per_step_j']:.3g}" + (" est" if r.get("energy_estimated") else "")),
                 Field("speedup", "step time of the fewest threads / this one's", _number("speedup", ".2f")),
                 Field("efficiency", "scaling efficiency: speedup / (threads / the fewest threads)",
                       _number("scaling_efficiency", ".0%"))]
BATCH_FIELDS = [THREAD_FIELDS[0], Field("batch", "batch size", lambda r: str(r["batch_size"]), True),
                Field("peak MiB", "peak memory, the worker's kernel peak, MiB", _number("peak_mem_bytes", ",.0f", MIB)),
                Field("est. MiB", "predicted peak (estimate), MiB", _number("predicted_peak_bytes_est", ",.0f", MIB))]


def grid_rows(grid: dict[str, Any]) -> tuple[list[Field], list[dict[str, Any]]]:
    """A heatmap as a table: a row per lr, a column per weight decay."""
    def cell(j: int) -> Any:
        return lambda r: "-" if r["values"][j] is None else f"{r['values'][j]:.4g}"

    fields = [Field("lr", "learning rate", lambda r: decimal(r["lr"]), True)] + [
        Field(f"wd {decimal(wd)}", f"weight decay {decimal(wd)}: {grid['words']}", cell(j))
        for j, wd in enumerate(grid["weight_decay"])]
    return fields, [{"lr": lr, "values": values} for lr, values in zip(grid["lr"], grid["values"])]


def axis_sections(effects: dict[str, list[dict[str, Any]]]) -> list[Section]:
    """The tables of `axis_effects` (the terminal's `report --study`, the HTML report)."""
    sections = []
    if effects["threads"]:
        sections.append(Section("Threads: step time, throughput and energy against cores", THREAD_FIELDS[:1],
                                THREAD_FIELDS[1:], effects["threads"], SCALING_CAPTION))
    for grid in effects["lr_weight_decay"]:
        fields, rows = grid_rows(grid)
        sections.append(Section(f"lr x weight decay: {grid['words']}: {grid['series']}", fields[:1], fields[1:], rows))
    if effects["batch_size"]:
        sections.append(Section("Batch size: peak memory", BATCH_FIELDS[:1], BATCH_FIELDS[1:], effects["batch_size"]))
    return sections


SCALING_CAPTION = ("speedup: the fewest threads' median step time / this one's; efficiency: speedup / (threads / "
                   "the fewest threads), 100% = linear scaling (docs/figures.md)")
