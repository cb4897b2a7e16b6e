"""Figures for the report (matplotlib, Agg backend: no display needed).

Every figure has a fixed pixel size (FIGSIZE x DPI) so reports lay out predictably, and
any estimated figure is labelled "estimated" in the plot itself. Every point, bar and
timeline is named by device, model, method and backend (aggregate.label; the run shape
where configurations differ in it), and each PNG carries the texts drawn on it in its
`Description` text chunk, so scripts and tests read what a chart says without OCR. Names
from a device are drawn printable and cut short (`_names`).
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from edgebench.report.series import (  # noqa: E402
    MIB,
    NO_FINISHED,
    comparison,
    memory_samples,
    pareto_sets,
    pareto_y,
    power_samples,
    thinned,
)
from edgebench.report.series import energy_colour as _energy_colour  # noqa: E402
from edgebench.report.series import err as _err  # noqa: E402
from edgebench.report.series import names as _names  # noqa: E402
from edgebench.results.aggregate import config_label  # noqa: E402
from edgebench.results.pareto import learned  # noqa: E402
from edgebench.results.store import Store  # noqa: E402
from edgebench.untrusted import printable  # noqa: E402

DPI = 100
PARETO_SIZE = (10, 6)  # inches: 1000 x 600 px
TIMELINE_SIZE = (10, 4)
POWER_SIZE = (10, 5)
COMPARE_SIZE = (12, 5)
TITLE_CHARS = 100  # a 10-inch figure at 11 pt holds about this many


def drawn_texts(fig: Figure) -> list[str]:
    """Every text set on the figure: titles, axis labels, named ticks, legend entries, point labels."""
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Description": "\n".join(drawn_texts(fig))})
    plt.close(fig)
    return buf.getvalue()


def _plot(ax: Axes, t: np.ndarray, values: np.ndarray, **style: Any) -> None:
    """One line through the samples that have this field (series.thinned)."""
    t, values = thinned(t, values)
    if len(t):
        ax.plot(t, values, **style)


def _title(ax_or_fig: Axes | Figure, text: str, size: int = 11) -> None:
    """A title wrapped to the figure's width, so long run ids and paths are never clipped."""
    wrapped = textwrap.fill(printable(text, newlines=False, limit=4 * TITLE_CHARS), TITLE_CHARS)
    if isinstance(ax_or_fig, Figure):
        ax_or_fig.suptitle(wrapped, fontsize=size)
    else:
        ax_or_fig.set_title(wrapped, fontsize=size)


def _off_scale(ax: Axes, text: str, colour: str) -> None:
    """A legend entry, not text on the data, for a line too far out to draw."""
    ax.plot([], [], ls="--", color=colour, label=text)


def _legend_below(fig: Figure, ax: Axes) -> None:
    """The axes' legend under the plot (the constrained layout makes room): it never covers a curve."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 3), fontsize=8)


def _place_labels(fig: Figure, ax: Axes, texts: list[Text]) -> None:
    """Point labels apart and inside the axes: each starts on its point's side toward the centre (a
    point at the right edge is labelled to its left); adjustText moves them apart on the settled
    layout, which is then frozen so saving cannot move the axes under them; last, any label still
    past an edge is pushed back in."""
    from adjustText import adjust_text

    fig.canvas.draw()  # the constrained layout settles (colorbar, legend) first
    to_axes = ax.transData + ax.transAxes.inverted()
    for t in texts:
        at_x, at_y = to_axes.transform(t.get_position())
        t.set_horizontalalignment("right" if at_x > 0.5 else "left")
        t.set_verticalalignment("top" if at_y > 0.5 else "bottom")
    adjust_text(texts, ax=ax, arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5})
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's canvas (matplotlib.use above); the stubs type the base
    for t in texts:
        box, frame = t.get_window_extent(renderer), ax.bbox
        dx = max(0.0, frame.x0 - box.x0) + min(0.0, frame.x1 - box.x1)
        dy = max(0.0, frame.y0 - box.y0) + min(0.0, frame.y1 - box.y1)
        if dx or dy:
            at = ax.transData.transform(t.get_position())
            new_x, new_y = ax.transData.inverted().transform((at[0] + dx, at[1] + dy))
            t.set_position((new_x, new_y))


def _label(group: dict[str, Any]) -> str:
    """A point of one device's and model's frontier (the title names them)."""
    flags = (" !" if group.get("disturbed") else "") + (" loss did not fall" if learned(group) is False else "")
    return f"{config_label(group, device=False, model=False)} n={group.get('n', 1)}{flags}"


def _merged_labels(groups: list[dict[str, Any]], x: np.ndarray, y: np.ndarray) -> list[tuple[tuple[float, float], str]]:
    """One label per spot: points closer than 1% of the axis spans share a label, one name a
    line (no label-moving can pull apart two labels of the same point)."""
    span_x, span_y = max(np.ptp(x), 1e-9), max(np.ptp(y), 1e-9)
    spots: list[tuple[tuple[float, float], list[str]]] = []
    for g, xi, yi in zip(groups, x, y):
        near = next((names for (sx, sy), names in spots
                     if abs(sx - xi) < 0.01 * span_x and abs(sy - yi) < 0.01 * span_y), None)
        if near is None:
            spots.append(((float(xi), float(yi)), [_label(g)]))
        else:
            near.append(_label(g))
    return [(xy, "\n".join(names)) for xy, names in spots]


def pareto_figure(groups: list[dict[str, Any]], title: str) -> bytes:
    """Peak memory vs median step time for one device and model, one point per configuration
    (error bars: min-max over its runs; with targets: time to the target, series.pareto_y); frontier, RAM line,
    energy colour; labels kept apart. The title says which time."""
    y_key, y_what = pareto_y(groups)
    done, finished, failed, rams = pareto_sets(groups, y_key)
    fig, ax = plt.subplots(figsize=PARETO_SIZE, layout="constrained")
    texts = []
    if finished:
        x = np.array([g["peak_mem_bytes"] / MIB for g in finished])
        y = np.array([g[y_key] for g in finished])
        xerr = np.array([_err(g, "peak_mem_bytes", MIB) for g in finished]).T
        yerr = np.array([_err(g, y_key) for g in finished]).T
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="none", ecolor="grey", elinewidth=1, capsize=3, zorder=2)
        energy, label = _energy_colour(finished)
        c = np.array([np.nan if e is None else e for e in energy])
        have = np.isfinite(c)
        if have.any():
            sc = ax.scatter(x[have], y[have], c=c[have], cmap="viridis", s=70, zorder=3, edgecolors="black")
            fig.colorbar(sc, ax=ax, label=label)
        if (~have).any():
            ax.scatter(x[~have], y[~have], facecolors="white", edgecolors="black", s=70, zorder=3,
                       label="no energy figure")
        front = sorted((g for g in finished if g.get("on_frontier")), key=lambda g: g["peak_mem_bytes"])
        if front:
            ax.step([g["peak_mem_bytes"] / MIB for g in front], [g[y_key] for g in front],
                    where="post", color="tab:red", lw=1.5, zorder=1, label="Pareto frontier")
        texts += [ax.text(xi, yi, label, fontsize=8) for (xi, yi), label in _merged_labels(finished, x, y)]
    for g in failed:
        gx, gy = g["peak_mem_bytes"] / MIB, g[y_key]
        ax.scatter([gx], [gy], marker="x", color="grey", s=60, zorder=3)
        texts.append(ax.text(gx, gy, f"{config_label(g, device=False, model=False)} ({g['status']})", fontsize=8,
                             color="grey"))
    if not finished:
        ax.text(0.5, 0.5, NO_FINISHED, transform=ax.transAxes, ha="center", color="grey")
    widest = max((g["peak_mem_bytes"] for g in done), default=0)
    for ram in rams:
        if ram <= 4 * widest:
            ax.axvline(ram / MIB, color="tab:orange", ls="--", label=f"device RAM {ram / MIB:,.0f} MiB")
        else:  # a line that far out would squash every point against the axis
            _off_scale(ax, f"device RAM {ram / MIB:,.0f} MiB (off scale, right)", "tab:orange")
    ax.set_xlabel("peak memory, kernel (MiB)")
    ax.set_ylabel(f"{y_what}, median (s)")
    _title(ax, f"{title}: peak memory vs {y_what}")
    ax.grid(alpha=0.3)
    _legend_below(fig, ax)
    if texts:
        _place_labels(fig, ax, texts)
    return png_bytes(fig)


def run_label(run: dict[str, Any]) -> str:
    run = _names(run)
    return f"{config_label(run)} ({run['status']}), run {run['run_id']}"


def memory_timeline_figure(store: Store, run: dict[str, Any]) -> bytes:
    """RSS (and cgroup usage) over the run, step starts marked, the RAM budget as a line."""
    t, s, starts = memory_samples(store, run)
    fig, ax = plt.subplots(figsize=TIMELINE_SIZE, layout="constrained")
    _plot(ax, t, s["rss_bytes"] / MIB, label="RSS of the worker's process tree (sampled)", color="tab:blue")
    _plot(ax, t, s["cgroup_usage_bytes"] / MIB, label="device RAM: its cgroup's usage (page cache too; the limit "
          "applies to it)", color="tab:purple", alpha=0.7)
    for i, b in enumerate(starts):
        ax.axvline(b, color="grey", lw=0.5, alpha=0.5, label="step start" if i == 0 else None)
    ram = run.get("device_ram_bytes")
    peak = np.nanmax(s["rss_bytes"]) if np.isfinite(s["rss_bytes"]).any() else 0
    if ram and ram <= 4 * peak:
        ax.axhline(ram / MIB, color="tab:orange", ls="--", label="device RAM limit")
    elif ram:
        _off_scale(ax, f"device RAM {ram / MIB:,.0f} MiB (off scale, above)", "tab:orange")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("MiB")
    _title(ax, f"memory: {run_label(run)}")
    ax.grid(alpha=0.3)
    _legend_below(fig, ax)
    return png_bytes(fig)


def power_temp_figure(store: Store, run: dict[str, Any], external: tuple[np.ndarray, np.ndarray] | None
                      ) -> bytes | None:
    """Measured power (the device's sensor, an external meter) and temperature over the run,
    throttling shaded.

    Only panels with data are drawn; None when the run has neither measured power nor
    temperature. An estimate is never drawn per run (it would only restate the device's
    CPU use through its power model): the report says once per device that it has no
    sensor and what the estimate is built from. `external` is an external meter's trace
    already mapped onto the device clock.
    """
    t, s, inside, throttled = power_samples(store, run, external)
    has_ext = inside is not None
    has_power = has_ext or np.isfinite(s["power_w"]).any()
    has_temp = np.isfinite(s["temp_c_max"]).any()
    if not (has_power or has_temp):
        return None
    fig, axes = plt.subplots(int(has_power) + int(has_temp), 1, figsize=POWER_SIZE, sharex=True, squeeze=False,
                             layout="constrained")
    panels = list(axes[:, 0])
    if has_power:
        ax_p = panels.pop(0)
        _plot(ax_p, t, s["power_w"], label="power (device sensor)", color="tab:red")
        if inside is not None:
            ax_p.plot(*inside, label="power (external meter)", color="tab:green")
        ax_p.set_ylabel("W")
        ax_p.grid(alpha=0.3)
        ax_p.legend(loc="upper right", fontsize=8)
        ax_p.set_xlabel("time since start (s)")
    if has_temp:
        ax_t = panels.pop(0)
        _plot(ax_t, t, s["temp_c_max"], color="tab:orange", label="max temperature")
        if throttled.any():
            ax_t.fill_between(t, 0, 1, where=throttled, transform=ax_t.get_xaxis_transform(), color="red",
                              alpha=0.15, label="throttled")
        ax_t.set_ylabel("°C")
        ax_t.set_xlabel("time since start (s)")
        ax_t.grid(alpha=0.3)
        ax_t.legend(loc="upper left", fontsize=8)
    what = " and ".join(w for w, have in (("power", has_power), ("temperature", has_temp)) if have)
    _title(fig, f"{what}: {run_label(run)}")
    return png_bytes(fig)


def compare_devices_figure(groups: list[dict[str, Any]]) -> bytes:
    """Per configuration (model, method, backend, shape), each device's step time, peak memory
    and energy per step side by side (medians, error bars min-max); a panel no device has a
    figure for is left out."""
    devices, methods, by, panels = comparison(groups)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=COMPARE_SIZE, squeeze=False, sharey=True,
                             layout="constrained")
    height = 0.8 / max(1, len(devices))
    y = np.arange(len(methods))
    for ax, (key, label, scale) in zip(axes[0], panels):
        for j, dev in enumerate(devices):
            got = [by[m].get(dev) for m in methods]
            vals = [np.nan if g is None or g.get(key) is None else g[key] / scale for g in got]
            err = np.array([(0.0, 0.0) if g is None else _err(g, key, scale) for g in got]).T
            ax.barh(y + j * height, vals, height, xerr=err, capsize=2, label=dev)
        head, _, tail = label.rpartition(", ")  # the unit or ESTIMATED on a line of its own
        ax.set_title(f"{head}\n{tail}" if head else label, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    # one name a row, down the shared axis: names of any length never overlap, at most 8 pt
    axes[0][0].set_yticks(y + height * (len(devices) - 1) / 2, methods,
                          fontsize=min(8.0, 0.7 * COMPARE_SIZE[1] * 72 * 0.6 / max(1, len(methods))))
    axes[0][0].invert_yaxis()  # the first configuration on top
    _legend_below(fig, axes[0][0])
    fig.suptitle("comparison across devices (finished configurations; error bars: min-max over repeats)")
    return png_bytes(fig)
