"""Gathers what a report shows: the per-run metrics, the configurations they fold into
(repeats: median, min-max, n), the study rows when asked, and the figures, from one store:
PNGs (plots.py) or, for the HTML report, interactive charts (charts.py) of the same data."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from edgebench.figures.carbon import CarbonIntensity, with_co2
from edgebench.report import plots
from edgebench.report.axes import axis_effects
from edgebench.report.series import learning_curves, pareto_y
from edgebench.report.tables import sensor_notes, unfinished_notes
from edgebench.results.aggregate import group_runs
from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store
from edgebench.results.study import study_rows


@dataclass
class Figure:
    name: str  # file name stem, safe for file systems
    title: str
    png: bytes = b""  # --format png
    charts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # --format html: (its title, a plotly
    # figure) for each chart it draws (charts.py); the title is empty where the figure's own says it all


@dataclass
class Report:
    rows: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    groups: list[dict[str, Any]] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said once, e.g. a device without sensors
    unfinished: list[str] = field(default_factory=list)  # each device and model with no finished run
    study: list[dict[str, Any]] | None = None
    study_notes: list[str] = field(default_factory=list)
    carbon: CarbonIntensity = field(default_factory=CarbonIntensity)  # the grid's, for the CO2 beside energy
    axes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # each swept axis' effect (axes.py)


def safe_name(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", str(p)) for p in parts)


def _figure(name: str, title: str, drawn: bytes | dict[str, Any] | list[tuple[str, dict[str, Any]]]) -> Figure:
    if isinstance(drawn, bytes):
        return Figure(name, title, png=drawn)
    return Figure(name, title, charts=drawn if isinstance(drawn, list) else [("", drawn)])


def collect(store: Store, device: str | None = None, model: str | None = None, figures: bool = True,
            baseline: str | None = None, interactive: bool = False, tag: str | None = None,
            carbon: CarbonIntensity | None = None) -> Report:
    """Metrics for the matching runs (each energy figure's estimated CO2 beside it, from the
    grid's `carbon` intensity, else the default), their configurations, the study against `baseline`
    when one is given, and, when asked, every figure of the report: PNGs, or interactive
    charts (`interactive`) drawn by the same functions of charts.py. `tag`: only the runs so
    labelled (`edgebench runs tag`)."""
    carbon = carbon or CarbonIntensity()
    rows = [with_co2(r, carbon) for r in all_metrics(store, device=device, model=model, tag=tag)]
    report = Report(rows, store.runs(device=device, model=model, tag=tag), group_runs(rows), carbon=carbon)
    report.notes = sensor_notes(report.groups)
    report.unfinished = unfinished_notes(report.groups)
    report.axes = axis_effects(report.groups)
    if baseline:
        report.study, report.study_notes = study_rows(report.groups, baseline)
    if not figures or not report.rows:
        return report
    if interactive:
        from edgebench.report import charts
    draw: Any = charts if interactive else plots  # the same functions, the same inputs
    by_setting: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for g in report.groups:
        by_setting.setdefault((g["device"], g["model"]), []).append(g)
    for (dev, mdl), groups in sorted(by_setting.items()):
        drawn = charts.pareto_figure(groups) if interactive else \
            plots.pareto_figure(groups, f"{dev} / {mdl}")  # HTML: the title in the page
        report.figures.append(_figure(safe_name("pareto", dev, mdl), f"Pareto frontier: device {dev}, model {mdl}: "
                                      f"peak memory vs {pareto_y(groups)[1]}", drawn))
        if interactive:  # the held-out curves against training time and joules, where runs evaluated
            curves, basis = learning_curves(store, [r for r in report.runs if (r["device"], r["model"]) == (dev, mdl)],
                                            groups)
            if curves:
                report.figures.append(_figure(safe_name("learning", dev, mdl),
                                              f"Held-out learning curves: device {dev}, model {mdl}",
                                              charts.learning_figure(curves, basis)))
    if interactive and any(report.axes.values()):
        report.figures.append(_figure("axes", "Each axis' effect: threads, lr x weight decay, batch size",
                                      charts.axis_charts(report.groups)))
    if len({g["device"] for g in report.groups}) > 1:
        report.figures.append(_figure("compare_devices", "Comparison across devices",
                                      draw.compare_devices_figure(report.groups)))
    metrics_by_run = {(r["device"], r["run_id"]): r for r in report.rows}
    shapes = {(g["device"], run_id): g["shape"] for g in report.groups for run_id in g["run_ids"]}
    for run in report.runs:
        key = (run["device"], run["run_id"])
        run = {**run, "shape": shapes.get(key)}  # named as its configuration is
        report.figures.append(_figure(safe_name("memory", *key), f"Memory timeline: {plots.run_label(run)}",
                                      draw.memory_timeline_figure(store, run)))
        source = metrics_by_run[key].get("energy_source") or ""
        external = None
        if source.startswith("external:"):
            host_t, watts = store.external_arrays(source.removeprefix("external:"))
            external = (store.alignment(*key).to_mono_ns(host_t), watts)
        power = draw.power_temp_figure(store, run, external)
        if power is not None:
            report.figures.append(_figure(safe_name("power", *key), f"Power and temperature: {plots.run_label(run)}",
                                          power))
    return report
