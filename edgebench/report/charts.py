"""The HTML report's interactive charts (plotly): the same figures as the PNGs (plots.py),
from the same data (series.py), as plotly figure dicts that html.py draws offline.

Every point, bar and line hovers with its device, model, method, backend (the runtime
where it is the native worker's: executorch-native) and run shape where configurations
differ, and its figure with the spread (median [min-max], n); an estimate says
"estimated". Each configuration (or device, or line) is a trace of its own, so clicking
its legend entry hides it. Titles stay in the page (html.py), where they wrap; legends sit
above the plot, never on the data; names are escaped (plotly reads a subset of HTML).
"""

from __future__ import annotations

import textwrap
from html import escape
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from edgebench.figures.learning import parse_target
from edgebench.report.axes import batch_memory, decimal, lr_decay_grid, thread_scaling
from edgebench.report.series import (
    MIB,
    NO_FINISHED,
    comparison,
    energy_colour,
    err,
    memory_samples,
    names,
    pareto_sets,
    pareto_y,
    power_samples,
    thinned,
)
from edgebench.results.aggregate import config_label
from edgebench.results.pareto import learned
from edgebench.results.store import Store

SYMBOLS = ["circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon", "hexagon", "star",
           "cross", "triangle-left", "triangle-right", "hourglass", "bowtie", "star-square", "star-diamond"]
LABEL_CHARS = 20  # a name on a bar chart's axis wraps at this, so a phone still has room for bars
LEGEND_CHARS = 40  # a legend entry wraps at this: it fits a phone's width
# Below everything, never on the data (the plot's bottom margin grows to hold it).
LEGEND = {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container", "y": 0, "yanchor": "bottom"}
RAM = "#ff7f0e"


def _layout(height: int, **axes: Any) -> dict[str, Any]:
    """Every chart's layout: as wide as the page, the legend below, room above for plotly's buttons."""
    return {"template": "plotly_white", "height": height, "autosize": True, "legend": LEGEND, "showlegend": True,
            "margin": {"l": 10, "r": 10, "t": 36, "b": 10}, "hovermode": "closest",
            "font": {"family": "system-ui, sans-serif", "size": 12}, **axes}


def _plain(fig: go.Figure) -> dict[str, Any]:
    """The figure as plain data (html.py writes it as JSON)."""
    out: dict[str, Any] = fig.to_plotly_json()
    return out


def _axis(title: str, **more: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "automargin": True, **more}


def _wrap(text: str, width: int = LABEL_CHARS) -> str:
    """Escaped and broken into lines of at most `width` characters (plotly reads <br>)."""
    return "<br>".join(escape(line) for line in textwrap.wrap(text, width, break_on_hyphens=False)) or escape(text)


def _names_lines(row: dict[str, Any]) -> list[str]:
    """What a tooltip names first: device, model, method, backend (the native worker's runtime
    reads executorch-native) and the run shape where configurations differ in it."""
    lines = [f"{k}: {row[k]}" for k in ("device", "model", "method", "backend") if row.get(k) is not None]
    return lines + ([f"run shape: {row['shape']}"] if row.get("shape") else [])


def _value(group: dict[str, Any], key: str, label: str, unit: str, scale: float = 1.0) -> str:
    """`label: median unit [min-max], n=N`, with "estimated" for an estimate."""
    value = group.get(key)
    if value is None:
        return f"{label}: -"
    s = (group.get("spread") or {}).get(key) or {}
    spread = f" [{s['min'] / scale:.4g}–{s['max'] / scale:.4g}], n={s['n']}" if s else ""
    return f"{label}: {value / scale:.4g} {unit}" + (" (estimated)" if key.endswith("_est") else "") + spread


def _flags(group: dict[str, Any]) -> str:
    """As the tables mark a configuration: ★ on the frontier, ! disturbed, and a loss that did not fall."""
    return (" ★" if group.get("on_frontier") else "") + (" !" if group.get("disturbed") else "") + (
        " (loss did not fall)" if learned(group) is False else "")


def _group_hover(group: dict[str, Any]) -> str:
    """A configuration as a tooltip: its names, status and every key figure with its spread."""
    energy = "energy_per_step_j" if group.get("energy_per_step_j") is not None else "energy_per_step_j_est"
    first, last = group.get("loss_first"), group.get("loss_last")
    lines = _names_lines(group) + [f"status: {group.get('status')}, runs: {group.get('runs')}{_flags(group)}",
                                   _value(group, "peak_mem_bytes", "peak memory, kernel", "MiB", MIB),
                                   _value(group, "step_time_median_s", "time per step, median", "s"),
                                   _value(group, energy, "energy per step", "J")]
    lines += [] if first is None or last is None else [f"loss: {first:.4g} → {last:.4g}"]
    if group.get("eval_loss_last") is not None:
        accuracy = group.get("eval_accuracy_last")
        lines.append(f"held-out loss: {group.get('eval_loss_first'):.4g} → {group['eval_loss_last']:.4g}"
                     + ("" if accuracy is None else f", accuracy {100 * accuracy:.0f}%"))
    if group.get("target"):
        lines += [f"target {group['target']}: reached by {group.get('reached')} of {group.get('n')} runs",
                  _value(group, "time_to_target_s", "time to the target", "s")]
    return "<br>".join(escape(line) for line in lines)


def _point_name(group: dict[str, Any]) -> str:
    return _wrap(f"{config_label(group, device=False, model=False)} n={group.get('n', 1)}{_flags(group)}",
                 LEGEND_CHARS)


def _errors(groups: list[dict[str, Any]], key: str, scale: float = 1.0) -> dict[str, Any]:
    low, high = zip(*(err(g, key, scale) for g in groups)) if groups else ((), ())
    return {"type": "data", "symmetric": False, "array": list(high), "arrayminus": list(low),
            "visible": any(low) or any(high), "color": "grey", "thickness": 1}


def pareto_figure(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak memory vs median step time (with targets: time to the target, series.pareto_y) for one
    device and model: a trace per configuration (symbol: which; colour: energy per step; error
    bars: min-max over its runs), the frontier, the device's RAM. The page names the device and
    model above the chart (html.py)."""
    y_key, y_what = pareto_y(groups)
    done, finished, failed, rams = pareto_sets(groups, y_key)
    fig = go.Figure()
    energy, energy_label = energy_colour(finished)
    known = [e for e in energy if e is not None]
    for i, (g, e) in enumerate(zip(finished, energy)):
        marker: dict[str, Any] = {"symbol": SYMBOLS[i % len(SYMBOLS)], "size": 12,
                                  "line": {"color": "black", "width": 1}}
        marker.update({"color": [e], "coloraxis": "coloraxis"} if e is not None else {"color": "white"})
        fig.add_scatter(x=[g["peak_mem_bytes"] / MIB], y=[g[y_key]], mode="markers", marker=marker,
                        name=_point_name(g), hovertext=[_group_hover(g)], hoverinfo="text",
                        error_x=_errors([g], "peak_mem_bytes", MIB), error_y=_errors([g], y_key))
    front = sorted((g for g in finished if g.get("on_frontier")), key=lambda g: g["peak_mem_bytes"])
    if front:
        fig.add_scatter(x=[g["peak_mem_bytes"] / MIB for g in front], y=[g[y_key] for g in front],
                        mode="lines+markers", line={"color": "#d62728", "shape": "hv", "width": 2},
                        marker={"symbol": "circle-open", "size": 22, "color": "#d62728"}, name="Pareto frontier",
                        hovertext=[_group_hover(g) for g in front], hoverinfo="text")
    for g in failed:
        fig.add_scatter(x=[g["peak_mem_bytes"] / MIB], y=[g[y_key]], mode="markers",
                        marker={"symbol": "x", "color": "grey", "size": 11},
                        name=_wrap(f"{config_label(g, device=False, model=False)} ({g['status']})", LEGEND_CHARS),
                        hovertext=[_group_hover(g)], hoverinfo="text")
    widest = max((g["peak_mem_bytes"] for g in done), default=0)
    top = 1.1 * max((g[y_key] for g in done), default=1.0)
    device = escape(names(groups[0])["device"])  # of the RAM lines: `done` may be empty (no run has figures)
    for ram in rams:
        off = ram > 4 * widest  # drawn, it would squash every point against the axis: a click on its entry shows it
        fig.add_scatter(x=[ram / MIB] * 2, y=[0, top], mode="lines", line={"color": RAM, "dash": "dash"},
                        name=f"device RAM {ram / MIB:,.0f} MiB" + (" (off scale, hidden)" if off else ""),
                        visible="legendonly" if off else True, hoverinfo="text",
                        hovertext=[f"device: {device}<br>device RAM {ram / MIB:,.0f} MiB"] * 2)
    if not finished:
        fig.add_annotation(text=NO_FINISHED, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False)
    colour = {"coloraxis": {"colorscale": "Viridis", "cmin": min(known), "cmax": max(known),
                            "colorbar": {"title": {"text": energy_label, "side": "right"}, "thickness": 12}}} \
        if known else {}
    fig.update_layout(**_layout(480, xaxis=_axis("peak memory, kernel (MiB)"),
                                yaxis=_axis(f"{y_what}, median (s)", rangemode="tozero"), **colour))
    return _plain(fig)


def compare_devices_figure(groups: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Per configuration, each device's step time, peak memory and energy per step as
    horizontal bars (medians, error bars min-max): a chart per figure, titled in the page
    (so a title wraps, never cut), a device one legend entry."""
    devices, methods, by, panels = comparison(groups)
    methods = [m for m in methods if by.get(m)]  # a configuration no device finished has no bar
    labels = [_wrap(m) for m in methods]
    out = []
    for key, label, scale in panels:
        fig = go.Figure()
        for dev in devices:
            have = [(lab, by[m][dev]) for lab, m in zip(labels, methods)
                    if dev in by[m] and by[m][dev].get(key) is not None]
            fig.add_bar(y=[lab for lab, _ in have], x=[g[key] / scale for _, g in have], orientation="h",
                        name=_wrap(dev, LEGEND_CHARS), marker={"color": _device_colour(devices, dev)},
                        error_x=_errors([g for _, g in have], key, scale),
                        hovertext=[_group_hover(g) for _, g in have], hoverinfo="text")
        fig.update_layout(**_layout(90 + 24 * len(methods) * max(1, len(devices)), barmode="group",
                                    xaxis=_axis("", rangemode="tozero"),
                                    yaxis={"automargin": True, "autorange": "reversed", "categoryorder": "array",
                                           "categoryarray": labels}))
        out.append((label, _plain(fig)))
    return out


def _device_colour(devices: list[str], device: str) -> str:
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    return palette[devices.index(device) % len(palette)]


def _line(fig: go.Figure, t: np.ndarray, values: np.ndarray, name: str, run: str, unit: str, colour: str,
          **where: Any) -> None:
    """One thinned line; its tooltip names the run (`meta`, so no name is read as a template)."""
    t, values = thinned(t, values)
    if len(t):
        fig.add_scatter(x=t, y=values, mode="lines", name=name, line={"color": colour, "width": 1.5}, meta=[run],
                        hovertemplate=f"%{{meta[0]}}<br>{name}: %{{y:.4g}} {unit} at %{{x:.2f}} s<extra></extra>",
                        **where)


def _run_hover(run: dict[str, Any]) -> str:
    run = names(run)
    return "<br>".join(escape(line) for line in _names_lines(run) + [f"run: {run['run_id']}"])


def memory_timeline_figure(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """RSS (and cgroup usage) over the run, step starts marked, the RAM budget as a line."""
    t, s, starts = memory_samples(store, run)
    who = _run_hover(run)
    fig = go.Figure()
    _line(fig, t, s["rss_bytes"] / MIB, "RSS of the worker's process tree (sampled)", who, "MiB", "#1f77b4")
    _line(fig, t, s["cgroup_usage_bytes"] / MIB, "device RAM: its cgroup's usage (page cache too)", who, "MiB",
          "#9467bd")
    top = float(np.nanmax(s["rss_bytes"])) / MIB if np.isfinite(s["rss_bytes"]).any() else 0.0
    if len(starts):
        fig.add_scatter(x=np.repeat(starts, 3), y=np.tile([0.0, top * 1.05, np.nan], len(starts)), mode="lines",
                        line={"color": "grey", "width": 0.5}, opacity=0.5, name="step start", meta=[who],
                        hovertemplate="%{meta[0]}<br>step start at %{x:.2f} s<extra></extra>")
    ram = run.get("device_ram_bytes")
    if ram:
        off = ram > 4 * top * MIB
        end = float(t[-1]) if len(t) else 0.0
        fig.add_scatter(x=[0.0, end], y=[ram / MIB] * 2, mode="lines", line={"color": RAM, "dash": "dash"},
                        name=f"device RAM limit {ram / MIB:,.0f} MiB" + (" (off scale, hidden)" if off else ""),
                        visible="legendonly" if off else True, hoverinfo="text",
                        hovertext=[f"{who}<br>device RAM limit {ram / MIB:,.0f} MiB"] * 2)
    fig.update_layout(**_layout(380, xaxis=_axis("time since start (s)"),
                                yaxis=_axis("MiB", rangemode="tozero")))
    return _plain(fig)


def power_temp_figure(store: Store, run: dict[str, Any], external: tuple[np.ndarray, np.ndarray] | None
                      ) -> dict[str, Any] | None:
    """Measured power (the device's sensor, an external meter) and temperature over the run,
    throttling shaded; None when the run has neither (an estimate is never drawn per run:
    plots.power_temp_figure says why)."""
    t, s, inside, throttled = power_samples(store, run, external)
    has_power = inside is not None or bool(np.isfinite(s["power_w"]).any())
    has_temp = bool(np.isfinite(s["temp_c_max"]).any())
    if not (has_power or has_temp):
        return None
    rows = int(has_power) + int(has_temp)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.12)
    who = _run_hover(run)
    if has_power:
        _line(fig, t, s["power_w"], "power (device sensor)", who, "W", "#d62728", row=1, col=1)
        if inside is not None:
            _line(fig, inside[0], inside[1], "power (external meter)", who, "W", "#2ca02c", row=1, col=1)
        fig.update_yaxes(title_text="W", automargin=True, row=1, col=1)
    if has_temp:
        temp = s["temp_c_max"]
        _line(fig, t, temp, "max temperature", who, "°C", "#ff7f0e", row=rows, col=1)
        low, high = float(np.nanmin(temp)), float(np.nanmax(temp))
        edges = np.flatnonzero(np.diff(np.concatenate([[0], throttled.astype(int), [0]])))
        xs: list[float | None] = []
        ys: list[float | None] = []
        for a, b in zip(edges[::2], edges[1::2]):
            x0, x1 = float(t[a]), float(t[min(b, len(t) - 1)])
            xs += [x0, x0, x1, x1, x0, None]
            ys += [low, high, high, low, low, None]
        if xs:
            fig.add_scatter(x=xs, y=ys, fill="toself", mode="lines", line={"width": 0},
                            fillcolor="rgba(255,0,0,0.15)", name="throttled", hoverinfo="text",
                            hovertext=[f"{who}<br>throttled" if x is not None else None for x in xs], row=rows, col=1)
        fig.update_yaxes(title_text="°C", automargin=True, row=rows, col=1)
    fig.update_xaxes(automargin=True)
    fig.update_xaxes(title_text="time since start (s)", row=rows, col=1)
    fig.update_layout(**_layout(220 + 160 * rows))
    return _plain(fig)


def learning_figure(curves: list[tuple[dict[str, Any], list[dict[str, Any]]]], basis: str | None
                    ) -> list[tuple[str, dict[str, Any]]]:
    """The held-out loss (and, where evaluated, accuracy) of each configuration's runs against
    the seconds of training before each evaluation, and against its joules (estimated where
    the power is: series.learning_curves); a trace per configuration, its runs apart, the
    target a dashed line."""
    energy = None if basis is None else "energy (J, ESTIMATED)" if basis == "estimated" else "energy (J, measured)"
    out = []
    for x_key, x_title in (("seconds", "training time (s), evaluations left out"), ("joules", energy)):
        if x_title is None:
            continue
        rows = [("loss", "held-out loss", 1)] + ([("accuracy", "held-out accuracy", 100)] if any(
            p.get("accuracy") is not None for _, points in curves for p in points) else [])
        fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.1)
        for i, (group, points) in enumerate(curves):
            label = _wrap(f"{config_label(group, device=False, model=False)} n={group.get('n', 1)}", LEGEND_CHARS)
            for r, (key, title, scale) in enumerate(rows, 1):
                xs: list[float | None] = []
                ys: list[float | None] = []
                hover: list[str | None] = []
                for j, p in enumerate(points):
                    if j and p["run_id"] != points[j - 1]["run_id"]:  # each run its own line
                        xs, ys, hover = xs + [None], ys + [None], hover + [None]
                    value = p.get(key)
                    xs.append(p[x_key])
                    ys.append(None if value is None else value * scale)
                    hover.append("<br>".join(escape(line) for line in _names_lines(group) + [
                        f"run: {p['run_id']}", f"after {p['after_steps']} steps, {p['seconds']:.4g} s of training"
                        + ("" if p.get("joules") is None else f", {p['joules']:.4g} J"
                           + (" (estimated)" if basis == "estimated" else "")),
                        f"held-out loss: {'-' if p.get('loss') is None else format(p['loss'], '.4g')}",
                        "held-out accuracy: " + ("-" if p.get("accuracy") is None
                                                 else f"{100 * p['accuracy']:.0f}%")]))
                fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=label, legendgroup=label, showlegend=r == 1,
                                marker={"symbol": SYMBOLS[i % len(SYMBOLS)], "size": 8}, line={"width": 1.5},
                                hovertext=hover, hoverinfo="text", row=r, col=1)
                fig.update_yaxes(title_text=title + (" (%)" if scale == 100 else ""), automargin=True, row=r, col=1)
        targets = {g["target"] for g, _ in curves if g.get("target")}
        for target in sorted(targets):
            metric, value = parse_target(target)
            row = next((r for r, (key, *_) in enumerate(rows, 1) if key == metric), None)
            if row is not None:
                fig.add_hline(y=value * (100 if metric == "accuracy" else 1), line_dash="dash", line_color="#d62728",
                              annotation_text=escape(f"target {target}"), row=row, col=1)
        fig.update_xaxes(automargin=True)
        fig.update_xaxes(title_text=x_title, row=len(rows), col=1)
        fig.update_layout(**_layout(220 + 160 * len(rows)))
        out.append((f"held-out {' and '.join(k for k, *_ in rows)} against {x_title}", _plain(fig)))
    return out


def _lines(rows: list[dict[str, Any]], x: str, y: str, title: str, x_title: str, scale: float = 1.0,
           log_x: bool = False) -> tuple[str, dict[str, Any]]:
    """A line per series of `rows`: `y` against `x`."""
    fig = go.Figure()
    for series in dict.fromkeys(r["series"] for r in rows):
        mine = [r for r in rows if r["series"] == series and r.get(y) is not None]
        fig.add_trace(go.Scatter(x=[r[x] for r in mine], y=[r[y] / scale for r in mine], mode="lines+markers",
                                 name=escape(series), hovertemplate=f"{escape(series)}<br>{escape(x_title)}: %{{x}}"
                                 f"<br>{escape(title)}: %{{y:.4g}}<extra></extra>"))
    fig.update_layout(**_layout(360, xaxis=_axis(x_title, type="log" if log_x else "linear"), yaxis=_axis(title)))
    return title, _plain(fig)


def axis_charts(groups: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The HTML report's charts of each axis' effect (none where no axis varies)."""
    charts = []
    threads = thread_scaling(groups)
    if threads:
        energy = "energy per step, J" + (" (estimated)" if any(r["energy_estimated"] for r in threads) else "")
        charts += [_lines(threads, "threads", "step_time_median_s", "median step time, s", "threads"),
                   _lines(threads, "threads", "samples_per_s", "samples/s", "threads"),
                   _lines(threads, "threads", "energy_per_step_j", energy, "threads"),
                   _lines(threads, "threads", "scaling_efficiency", "scaling efficiency (1 = linear)", "threads")]
    for grid in lr_decay_grid(groups):
        fig = go.Figure(go.Heatmap(
            z=grid["values"], x=[f"wd {decimal(v)}" for v in grid["weight_decay"]],
            y=[f"lr {decimal(v)}" for v in grid["lr"]], colorscale="Viridis", reversescale=True,
            colorbar={"title": {"text": escape(grid["words"])}},
            hovertemplate="%{y}, %{x}<br>" + escape(grid["words"]) + ": %{z:.4g}<extra></extra>"))
        fig.update_layout(**_layout(360, xaxis=_axis("weight decay", type="category"),
                                    yaxis=_axis("learning rate", type="category")))
        charts.append((f"{grid['words']} over lr x weight decay: {grid['series']}", _plain(fig)))
    batch = batch_memory(groups)
    if batch:
        charts.append(_lines(batch, "batch_size", "peak_mem_bytes", "peak memory, MiB", "batch size", MIB))
    return charts
