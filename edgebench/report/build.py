"""Gathers what a report shows: the metrics rows and the figures, from one store."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from edgebench.report import plots
from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store


@dataclass
class Figure:
    name: str  # file name stem, safe for file systems
    title: str
    png: bytes


@dataclass
class Report:
    rows: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    figures: list[Figure] = field(default_factory=list)


def safe_name(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", str(p)) for p in parts)


def collect(store: Store, device: str | None = None, model: str | None = None, figures: bool = True) -> Report:
    """Metrics for the matching runs and, when asked, every figure of the report."""
    report = Report(all_metrics(store, device=device, model=model), store.runs(device=device, model=model))
    if not figures or not report.rows:
        return report
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in report.rows:
        groups.setdefault((row["device"], row["model"]), []).append(row)
    for (dev, mdl), rows in sorted(groups.items()):
        report.figures.append(Figure(safe_name("pareto", dev, mdl), f"Pareto frontier: {dev}, model {mdl}",
                                     plots.pareto_figure(rows, f"{dev} / {mdl}: peak memory vs time per step")))
    if len({r["device"] for r in report.rows}) > 1:
        report.figures.append(Figure("compare_devices", "Comparison across devices", plots.compare_devices_figure(report.rows)))
    metrics_by_run = {(r["device"], r["run_id"]): r for r in report.rows}
    for run in report.runs:
        key = (run["device"], run["run_id"])
        report.figures.append(Figure(safe_name("memory", *key), f"Memory timeline: {key[0]} / {key[1]}",
                                     plots.memory_timeline_figure(store, run)))
        source = metrics_by_run[key].get("energy_source") or ""
        external = None
        if source.startswith("external:"):
            host_t, watts = store.external_arrays(source.removeprefix("external:"))
            external = (store.alignment(*key).to_mono_ns(host_t), watts)
        report.figures.append(Figure(safe_name("power", *key), f"Power and temperature: {key[0]} / {key[1]}",
                                     plots.power_temp_figure(store, run, external)))
    return report
