"""The report's tables: which columns, how each value reads, which ones are estimates.

One column list serves the terminal (rich) and the HTML report, so both say the same.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

MIB = 1 << 20


def _num(fmt: str, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else format(v / scale, fmt)


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str]
    estimated: bool = False
    short: str = ""  # terminal header, where the full one is long


def _loss(row: dict[str, Any]) -> str:
    first, last = row.get("loss_first"), row.get("loss_last")
    return "-" if first is None else f"{first:.4g}→{last:.4g}"


COLUMNS = [
    Column("device", "device", str),
    Column("run_id", "run", str),
    Column("method", "method", str),
    Column("backend", "backend", str),
    Column("status", "status", str),
    Column("peak_mem_bytes", "peak mem MiB", _num(".1f", MIB), short="mem MiB"),
    Column("peak_rss_bytes_sampled", "RSS sampled MiB", _num(".1f", MIB)),
    Column("step_time_median_s", "step s (med)", _num(".3f"), short="step s"),
    Column("step_time_p90_s", "step s (p90)", _num(".3f")),
    Column("samples_per_s", "samples/s", _num(".2f"), short="smp/s"),
    Column("tokens_per_s", "tokens/s", _num(".1f")),
    Column("energy_per_step_j", "J/step", _num(".3f")),
    Column("energy_per_sample_j", "J/sample", _num(".3f")),
    Column("power_mean_w", "W mean", _num(".2f"), short="W"),
    Column("power_peak_w", "W peak", _num(".2f")),
    Column("energy_source", "energy from", str),
    Column("energy_per_step_j_est", "J/step (est.)", _num(".3f"), estimated=True, short="J/step est."),
    Column("power_mean_w_est", "W mean (est.)", _num(".2f"), estimated=True),
    Column("temp_peak_c", "°C peak", _num(".1f"), short="°C"),
    Column("time_throttled_s", "throttled s", _num(".1f"), short="thr s"),
    Column("loss", "loss first → last", str, short="loss"),
    Column("on_frontier", "frontier", lambda v: "★" if v else ("" if v is False else "-"), short="★"),
]
BY_KEY = {c.key: c for c in COLUMNS}


def cell(row: dict[str, Any], column: Column) -> str:
    if column.key == "loss":
        return _loss(row)
    value = row.get(column.key)
    return "-" if value is None and column.fmt is str else column.fmt(value)


# The terminal shows fewer columns than HTML so that the table fits a normal window.
TERMINAL_KEYS = {"device", "run_id", "method", "backend", "status", "peak_mem_bytes", "step_time_median_s",
                 "samples_per_s", "energy_per_step_j", "energy_per_step_j_est", "power_mean_w", "temp_peak_c",
                 "time_throttled_s", "loss", "on_frontier"}


def visible_columns(rows: list[dict[str, Any]], keys: set[str] | None = None) -> list[Column]:
    """Drops figure columns no run has (e.g. energy on a device without sensors)."""
    always = {"device", "run_id", "method", "backend", "status", "loss", "on_frontier"}
    return [c for c in COLUMNS if (keys is None or c.key in keys)
            and (c.key in always or any(r.get(c.key) is not None for r in rows))]


PERF_KEYS = {"device", "run_id", "method", "backend", "status", "peak_mem_bytes", "step_time_median_s",
             "samples_per_s", "on_frontier"}
ENERGY_KEYS = {"device", "run_id", "energy_per_step_j", "energy_per_step_j_est", "power_mean_w", "temp_peak_c",
               "time_throttled_s", "loss"}


def _table(rows: list[dict[str, Any]], columns: list[Column], title: str, caption: str | None) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), header_style="bold", caption=caption)
    for c in columns:
        width = max([len(c.short or c.header)] + [len(cell(r, c)) for r in rows])
        table.add_column(c.short or c.header, style="italic yellow" if c.estimated else None,
                         justify="left" if c.fmt is str else "right", no_wrap=True, min_width=width)
    for row in rows:
        table.add_row(*[cell(row, c) for c in columns], style=None if row.get("status") == "ok" else "red")
    return table


def runs_tables(rows: list[dict[str, Any]], width: int) -> list[Table]:
    """One table of runs, or two (performance, then energy and heat) when one would not fit `width`."""
    caption = ("(est.) = estimated from a power model, not measured; ★ = on the memory/time Pareto frontier "
               "of its device and model")
    columns = visible_columns(rows, TERMINAL_KEYS)
    needed = sum(max([len(c.short or c.header)] + [len(cell(r, c)) for r in rows]) + 2 for c in columns)
    if needed <= width:
        return [_table(rows, columns, "Runs", caption)]
    return [_table(rows, [c for c in columns if c.key in PERF_KEYS], "Runs: memory and time", None),
            _table(rows, [c for c in columns if c.key in ENERGY_KEYS], "Runs: energy, heat, loss", caption)]


def comparison_table(rows: list[dict[str, Any]]) -> Table | None:
    """Methods down, devices across: median step time and peak memory of finished runs."""
    devices = sorted({r["device"] for r in rows})
    if len(devices) < 2:
        return None
    by = defaultdict(dict)
    for r in rows:
        if r.get("status") == "ok":
            by[(r["model"], r["method"], r["backend"])][r["device"]] = r
    table = Table(title="Across devices: step s (median) / peak MiB", header_style="bold")
    for name in ("model", "method", "backend", *devices):
        table.add_column(name)
    for key in sorted(by):
        cells = []
        for dev in devices:
            r = by[key].get(dev)
            cells.append("-" if r is None else f"{cell(r, BY_KEY['step_time_median_s'])} / {cell(r, BY_KEY['peak_mem_bytes'])}")
        table.add_row(*key, *cells)
    return table


def alignment_notes(runs: list[dict[str, Any]]) -> list[str]:
    """Runs whose host times rest on the device's own clock (or on nothing)."""
    by_note: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in runs:
        if r.get("align_source") != "probes":
            by_note[(r["device"], r["align_note"])].append(r["run_id"])
    return [f"{dev} ({len(ids)} run{'s' if len(ids) > 1 else ''}): {note}" for (dev, note), ids in by_note.items()]


def terminal_report(rows: list[dict[str, Any]], runs: list[dict[str, Any]], width: int = 120) -> Group:
    parts: list[Any] = list(runs_tables(rows, width))
    comparison = comparison_table(rows)
    if comparison is not None:
        parts.append(comparison)
    notes = alignment_notes(runs)
    if notes:
        parts.append(Text("Clock alignment:\n  " + "\n  ".join(notes), style="dim"))
    return Group(*parts)


def _bench_mib(value: Any) -> str:
    return "-" if value is None else f"{value / MIB:,.0f}"


def _bench_loss(result: dict[str, Any]) -> str:
    first, last = result.get("loss_first"), result.get("loss_last")
    return "-" if first is None else f"{first:.2f}->{last:.2f}"


def render_bench_results(results: list[dict[str, Any]], title: str) -> None:
    """The table `edgebench bench` prints: one row per run, then the detail of each failure."""
    from rich.console import Console

    table = Table(title=title, caption="memory in MiB. peak: kernel ru_maxrss; smpl: sampled tree RSS; "
                                       "est.: the method's memory model (an estimate); step: median "
                                       "seconds; smp/s: samples per second; loss: first->last step")
    for name in ("method", "status", "peak", "smpl", "est.", "step", "smp/s", "loss"):
        table.add_column(name, justify="left" if name in ("method", "status") else "right",
                         no_wrap=name != "method", overflow="fold")
    for r in results:
        median = (r.get("step_time_s") or {}).get("median")
        status = r["status"] if r["status"] == "ok" else f"[red]{r['status']}[/red]"
        table.add_row(r.get("method", "?"), status,
                      _bench_mib(r.get("peak_rss_bytes_kernel")), _bench_mib(r.get("peak_rss_bytes_sampled")),
                      _bench_mib(r.get("predicted_peak_bytes_est")),
                      "-" if median is None else f"{median:.3g}",
                      "-" if r.get("samples_per_s") is None else f"{r['samples_per_s']:.2f}",
                      _bench_loss(r))
    console = Console()
    console.print(table)
    for r in results:
        if r["status"] != "ok":
            console.print(f"[red]{r.get('method')}[/red]: {r['status']}: {str(r.get('detail', ''))[:500]}")
