"""Figures for the report (matplotlib, Agg backend: no display needed).

Every figure has a fixed pixel size (FIGSIZE x DPI) so reports lay out predictably, and
any estimated figure is labelled "estimated" in the plot itself.
"""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from edgebench.results.metrics import forward_fill  # noqa: E402
from edgebench.results.store import Store  # noqa: E402

DPI = 100
PARETO_SIZE = (10, 6)  # inches: 1000 x 600 px
TIMELINE_SIZE = (10, 4)
POWER_SIZE = (10, 5)
COMPARE_SIZE = (12, 5)
MAX_POINTS = 4000
MIB = 1 << 20


def png_bytes(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _plot(ax: plt.Axes, t: np.ndarray, values: np.ndarray, **style: Any) -> None:
    """One line through the samples that have this field (lines are sparse), at most
    ~MAX_POINTS points, always keeping the peak (a peak is the story)."""
    have = np.isfinite(values)
    if not have.any():
        return
    t, values = t[have], values[have]
    if len(t) > MAX_POINTS:
        keep = np.union1d(np.linspace(0, len(t) - 1, MAX_POINTS).astype(int), [int(np.argmax(values))])
        t, values = t[keep], values[keep]
    ax.plot(t, values, **style)


def _energy_colour(rows: list[dict[str, Any]]) -> tuple[list[float | None], str]:
    """Measured energy per step when any run has it, else the estimate, labelled as such."""
    if any(r.get("energy_per_step_j") is not None for r in rows):
        return [r.get("energy_per_step_j") for r in rows], "energy per step (J, measured)"
    return [r.get("energy_per_step_j_est") for r in rows], "energy per step (J, ESTIMATED)"


def pareto_figure(rows: list[dict[str, Any]], title: str) -> bytes:
    """Peak memory vs median step time for one device and model; frontier, RAM line, energy colour."""
    fig, ax = plt.subplots(figsize=PARETO_SIZE)
    done = [r for r in rows if r.get("peak_mem_bytes") and r.get("step_time_median_s")]
    ok = [r for r in done if r.get("status") == "ok"]
    failed = [r for r in done if r.get("status") != "ok"]
    energy, label = _energy_colour(ok)
    have_energy = [e is not None for e in energy]
    if ok:
        x = np.array([r["peak_mem_bytes"] / MIB for r in ok])
        y = np.array([r["step_time_median_s"] for r in ok])
        if any(have_energy):
            c = np.array([np.nan if e is None else e for e in energy])
            sc = ax.scatter(x[np.isfinite(c)], y[np.isfinite(c)], c=c[np.isfinite(c)], cmap="viridis", s=70, zorder=3,
                            edgecolors="black")
            fig.colorbar(sc, ax=ax, label=label)
        missing = ~np.array(have_energy)
        if missing.any():
            ax.scatter(x[missing], y[missing], facecolors="white", edgecolors="black", s=70, zorder=3,
                       label="no energy figure")
        front = sorted((r for r in ok if r.get("on_frontier")), key=lambda r: r["peak_mem_bytes"])
        if front:
            fx = [r["peak_mem_bytes"] / MIB for r in front]
            fy = [r["step_time_median_s"] for r in front]
            ax.step(fx, fy, where="post", color="tab:red", lw=1.5, zorder=2, label="Pareto frontier")
        for r, xi, yi in zip(ok, x, y):
            ax.annotate(f"{r['method']}/{r['backend']}", (xi, yi), textcoords="offset points", xytext=(6, 4), fontsize=8)
    for r in failed:
        ax.scatter([r["peak_mem_bytes"] / MIB], [r["step_time_median_s"]], marker="x", color="grey", s=60, zorder=3)
        ax.annotate(f"{r['method']} ({r['status']})", (r["peak_mem_bytes"] / MIB, r["step_time_median_s"]),
                    textcoords="offset points", xytext=(6, -10), fontsize=8, color="grey")
    rams = sorted({r["device_ram_bytes"] for r in rows if r.get("device_ram_bytes")})
    widest = max((r["peak_mem_bytes"] for r in done), default=0)
    for i, ram in enumerate(rams):
        if ram <= 4 * widest:
            ax.axvline(ram / MIB, color="tab:orange", ls="--", label=f"device RAM {ram / MIB:,.0f} MiB")
        else:  # a line that far out would squash every point against the axis
            ax.text(0.99, 0.02 + 0.05 * i, f"device RAM {ram / MIB:,.0f} MiB (off scale)", transform=ax.transAxes,
                    ha="right", va="bottom", color="tab:orange", fontsize=8)
    ax.set_xlabel("peak memory (MiB)")
    ax.set_ylabel("time per step, median (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize=8)
    return png_bytes(fig)


def memory_timeline_figure(store: Store, run: dict[str, Any]) -> bytes:
    """RSS (and cgroup usage) over the run, step starts marked, the RAM budget as a line."""
    s = store.samples(run["device"], run["run_id"], ["rss_bytes", "cgroup_usage_bytes"])
    steps = store.steps(run["device"], run["run_id"])
    t0 = s["t_ns"][0] if len(s["t_ns"]) else 0
    fig, ax = plt.subplots(figsize=TIMELINE_SIZE)
    t = (s["t_ns"] - t0) / 1e9
    _plot(ax, t, s["rss_bytes"] / MIB, label="RSS (process tree)", color="tab:blue")
    _plot(ax, t, s["cgroup_usage_bytes"] / MIB, label="cgroup usage (whole group, page cache too)",
          color="tab:purple", alpha=0.7)
    for i, b in enumerate(steps["begin_ns"]):
        ax.axvline((b - t0) / 1e9, color="grey", lw=0.5, alpha=0.5, label="step start" if i == 0 else None)
    ram = run.get("device_ram_bytes")
    peak = np.nanmax(s["rss_bytes"]) if np.isfinite(s["rss_bytes"]).any() else 0
    if ram and ram <= 4 * peak:
        ax.axhline(ram / MIB, color="tab:orange", ls="--", label="device RAM")
    elif ram:
        ax.text(0.01, 0.95, f"device RAM {ram / MIB:,.0f} MiB (off scale)", transform=ax.transAxes, va="top",
                color="tab:orange", fontsize=8)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("MiB")
    ax.set_title(f"memory: {run['device']} / {run['run_id']} ({run['method']}, {run['backend']}, {run['status']})")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return png_bytes(fig)


def power_temp_figure(store: Store, run: dict[str, Any], external: tuple[np.ndarray, np.ndarray] | None) -> bytes:
    """Power (measured, external, estimated) and temperature over the run, throttling shaded.

    `external` is an external meter's trace already mapped onto the device clock.
    """
    s = store.samples(run["device"], run["run_id"], ["power_w", "power_w_est", "temp_c_max", "throttle_flags"])
    t0 = s["t_ns"][0] if len(s["t_ns"]) else 0
    fig, (ax_p, ax_t) = plt.subplots(2, 1, figsize=POWER_SIZE, sharex=True)
    t = (s["t_ns"] - t0) / 1e9
    _plot(ax_p, t, s["power_w"], label="power (device sensor)", color="tab:red")
    if external is not None and len(external[0]):
        end = t[-1] if len(t) else 0
        et = (external[0] - t0) / 1e9
        inside = (et >= 0) & (et <= end)
        ax_p.plot(et[inside], external[1][inside], label="power (external meter)", color="tab:green")
    _plot(ax_p, t, s["power_w_est"], label="power ESTIMATED (model, not measured)", color="tab:gray", ls="--")
    ax_p.set_ylabel("W")
    ax_p.grid(alpha=0.3)
    if ax_p.get_legend_handles_labels()[0]:
        ax_p.legend(loc="upper right", fontsize=8)
    else:
        ax_p.text(0.5, 0.5, "no power figures for this run", transform=ax_p.transAxes, ha="center")
    _plot(ax_t, t, s["temp_c_max"], color="tab:orange", label="max temperature")
    throttled = np.nan_to_num(forward_fill(s["throttle_flags"])) != 0
    if throttled.any():
        ax_t.fill_between(t, 0, 1, where=throttled, transform=ax_t.get_xaxis_transform(), color="red", alpha=0.15,
                          label="throttled")
    ax_t.set_ylabel("°C")
    ax_t.set_xlabel("time since start (s)")
    ax_t.grid(alpha=0.3)
    if ax_t.get_legend_handles_labels()[0]:
        ax_t.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"power and temperature: {run['device']} / {run['run_id']} ({run['method']}, {run['backend']})")
    return png_bytes(fig)


def compare_devices_figure(rows: list[dict[str, Any]]) -> bytes:
    """Per method, each device's step time, peak memory and energy per step side by side."""
    devices = sorted({r["device"] for r in rows})
    methods = sorted({f"{r['method']}/{r['backend']}" for r in rows})
    by = defaultdict(dict)
    for r in rows:
        if r.get("status") == "ok":
            by[f"{r['method']}/{r['backend']}"][r["device"]] = r
    energy_key = "energy_per_step_j" if any(r.get("energy_per_step_j") is not None for r in rows) else "energy_per_step_j_est"
    panels = [("step_time_median_s", "time per step (s)", 1), ("peak_mem_bytes", "peak memory (MiB)", MIB),
              (energy_key, "energy per step (J)" + (", ESTIMATED" if energy_key.endswith("_est") else ""), 1)]
    fig, axes = plt.subplots(1, 3, figsize=COMPARE_SIZE)
    width = 0.8 / max(1, len(devices))
    x = np.arange(len(methods))
    for ax, (key, label, scale) in zip(axes, panels):
        for j, dev in enumerate(devices):
            vals = [(by[m].get(dev) or {}).get(key) for m in methods]
            ax.bar(x + j * width, [np.nan if v is None else v / scale for v in vals], width, label=dev)
        ax.set_xticks(x + width * (len(devices) - 1) / 2, methods, rotation=45, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle("comparison across devices (finished runs)")
    fig.tight_layout()
    return png_bytes(fig)
