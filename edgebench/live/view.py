"""Rendering a LiveState as a rich dashboard (pure: state in, renderable out)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from edgebench.figures.memory import WORKER_RSS
from edgebench.figures.run_meta import RunMeta
from edgebench.live.state import LiveState
from edgebench.untrusted import printable

BLOCKS = "▁▂▃▄▅▆▇█"
MIB = 1 << 20


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """The last `width` values as block characters scaled between their min and max."""
    vals = [v for v in list(values)[-width:] if v == v]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo or 1.0
    return "".join(BLOCKS[min(len(BLOCKS) - 1, int((v - lo) / span * (len(BLOCKS) - 1) + 0.5))] for v in vals)


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def _bar(done: float, total: float | None, width: int = 30) -> ProgressBar:
    return ProgressBar(total=total or 1.0, completed=min(done, total or 1.0) if total else 0, width=width)


def _status_style(status: str) -> str:
    return {"ok": "bold green", "oom": "bold red", "error": "bold red", "diverged": "bold red",
            "timeout": "bold yellow", "interrupted": "yellow", "unsupported": "yellow"}.get(status, "bold cyan")


def header(state: LiveState, now: float) -> Text:
    spec = state.spec
    t = Text()
    t.append("edgebench live ", style="bold")
    t.append(printable(f"{state.device or 'local'} · {state.run_id} ", newlines=False), style="bold white")
    t.append(printable(f"· model {spec.get('model', '?')} · method {spec.get('method', '?')} · backend "
                       f"{spec.get('backend', '?')} ", newlines=False))
    t.append(printable(f"[{state.status}]", newlines=False), style=_status_style(state.status))
    t.append(f"  {time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 10) % 10}", style="dim")
    return t


def gauges(state: LiveState) -> Table:
    s = state.last_sample
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", width=9)
    grid.add_column(width=31)
    grid.add_column()
    ram, rss = state.device_ram, s.get("rss_bytes")
    if ram:
        pct = ram["bytes"] / ram["limit_bytes"]
        grid.add_row("RAM", _bar(ram["bytes"], ram["limit_bytes"]),
                     f"{ram['bytes'] / MIB:,.1f} MiB / {ram['limit_bytes'] / MIB:,.0f} MiB ({pct:.0%}): {ram['what']}")
    budget = ((state.spec.get("extra") or {}).get("budget") or {}).get("budget_bytes")
    if isinstance(rss, (int, float)):
        against = (f" of its {budget / MIB:,.0f} MiB budget (RAM less the OS, supervisor, margin)"
                   if isinstance(budget, int) and budget > 0 else "")
        grid.add_row("" if ram else "RAM", Text(""), f"{rss / MIB:,.1f} MiB {WORKER_RSS} (peak "
                     f"{state.peak_rss_bytes / MIB:,.1f} MiB{against})")
    elif not ram:
        grid.add_row("RAM", Text("-"), "no memory sample yet")
    grid.add_row("", Text(sparkline(state.rss_history, 30), style="blue"), "")
    if isinstance(s.get("power_w"), (int, float)):
        grid.add_row("power", Text(sparkline(state.power_history, 30), style="red"), f"{s['power_w']:.2f} W (measured)")
    elif isinstance(s.get("power_w_est"), (int, float)):
        grid.add_row("power", Text(sparkline(state.power_history, 30), style="red"),
                     Text(f"~{s['power_w_est']:.2f} W (ESTIMATED)", style="italic yellow"))
    else:
        grid.add_row("power", Text("-"), "no power sensor")
    temp = s.get("temp_c_max")
    throttled = s.get("throttle_flags")
    temp_text = f"{temp:.1f} °C" if isinstance(temp, (int, float)) else "no thermal sensor"
    if throttled:
        temp_text += f"  THROTTLED (flags {throttled:#x})" if isinstance(throttled, int) else "  THROTTLED"
    grid.add_row("temp", Text(""), Text(temp_text, style="bold red" if throttled else ""))
    if isinstance(s.get("cpu_proc_pct"), (int, float)):
        grid.add_row("CPU", Text(""), f"{s['cpu_proc_pct']:.0f} %")
    return grid


def progress(state: LiveState) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", width=9)
    grid.add_column(width=31)
    grid.add_column()
    total = state.steps_total
    done = state.steps_done.get("measure", 0)
    warm = state.steps_done.get("warmup", 0)
    stats = state.step_stats  # the summary's figure: the median of every measured step so far
    rate = f"{stats['median']:.3f} s/step (median of {stats['n']:.0f} steps)" if stats else "-"
    if stats and _emulator(state.meta):
        rate += f" {NOT_REPRESENTATIVE}"
    grid.add_row("steps", _bar(done, total), f"step {done}/{total if total else '?'} (+{warm} warmup)  {rate}  "
                 f"ETA {_fmt_s(state.eta_s)}")
    loss = state.losses[-1] if state.losses else None
    grid.add_row("loss", Text(sparkline(state.losses, 30), style="green"),
                 f"{loss:.4f}" if loss is not None else "-")
    return grid


def _cpu_text(cpu: dict[str, Any]) -> str:
    """The noise guard's verdict on a finished run (docs/figures.md)."""
    if cpu.get("others_share") is None:
        return ""
    text = f"{100 * cpu['others_share']:.0f}% (steal {100 * cpu.get('steal_share', 0):.0f}%)"
    return text + (f": DISTURBED, {cpu['disturbed_why']}" if cpu.get("disturbed") else "")


NOT_REPRESENTATIVE = "(not representative: emulated)"


def _emulator(meta: RunMeta | None) -> str | None:
    """The emulator the run's python ran under (the arm64 lab), from meta.json."""
    return None if meta is None else meta.device.emulator


def summary(result: dict[str, Any], meta: RunMeta | None = None) -> Table:
    """The run's figures (edgebench.figures.run.run_figures, as the store and report make them)."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    step = result.get("step_time_s") or {}
    rows: list[tuple[str, Text | str]] = [
        (
            "status",
            Text(printable(result.get("status"), newlines=False), style=_status_style(str(result.get("status")))),
        ),
        ("detail", str(result.get("detail") or "")),
        ("steps done", str(result.get("steps_done", "-"))),
        (
            "device RAM peak",
            f"{result['device_ram_peak_bytes'] / MIB:,.1f} MiB of "
            f"{result['device_ram_limit_bytes'] / MIB:,.0f} MiB: {result.get('device_ram_peak_what')}"
            if result.get("device_ram_peak_bytes")
            else "",
        ),
        (
            f"peak {WORKER_RSS}",
            f"{result['peak_rss_bytes_kernel'] / MIB:,.1f} MiB" if result.get("peak_rss_bytes_kernel") else "-",
        ),
        (
            "peak of its budget",
            f"{result['peak_of_budget']:.0%} of {result['budget_bytes'] / MIB:,.0f} MiB (the device's RAM less its OS "
            "at idle, the supervisor and a margin)" if result.get("peak_of_budget") else "",
        ),
        (
            "peak RSS (sampled)",
            f"{result['peak_rss_bytes_sampled'] / MIB:,.1f} MiB" if result.get("peak_rss_bytes_sampled") else "-",
        ),
        (
            "step time median/p90",
            f"{step.get('median', 0):.3f} / {step.get('p90', 0):.3f} s"
            + (f" {NOT_REPRESENTATIVE} under {_emulator(meta)}" if _emulator(meta) else "")
            if step
            else "-",
        ),
        ("samples/s (batch / median step)", f"{result['samples_per_s']:.2f}" if result.get("samples_per_s") else "-"),
        ("CPU taken by others", _cpu_text(result.get("cpu") or {})),
        (
            "loss first → last",
            f"{result['loss_first']:.4g} → {result['loss_last']:.4g}"
            if isinstance(result.get("loss_first"), (int, float)) and isinstance(result.get("loss_last"), (int, float))
            else "-",
        ),
    ]
    for k, v in rows:
        if v:
            t.add_row(k, Text(printable(v)) if isinstance(v, str) else v)
    return t


def ended_line(state: LiveState, sweep: dict[str, Any] | None, name: str = "", follow: bool = False) -> str:
    """What ended: the run (outside a sweep), or its sweep `name` (its sweep.json) with its runs'
    statuses counted; with `follow`, that the view waits for the next sweep."""
    if sweep is None:
        line = f"run {state.run_id} ended: {state.status}"
    else:
        counts = Counter(str(status) for status in (sweep.get("runs") or {}).values())
        line = f"sweep {name} ended ({sweep.get('state')}): " + ", ".join(f"{n} {s}" for s, n in counts.items())
        line += f"; {sweep['why']}" if sweep.get("why") else ""
    if follow:
        line += f"; waiting for the next sweep on {state.device or 'this machine'}  ·  Ctrl-C to leave"
    return line


def render(state: LiveState, now: float | None = None) -> Group:
    now = time.time() if now is None else now
    parts: list[Any] = [header(state, now), Panel(gauges(state), title="device", title_align="left"),
                        Panel(progress(state), title="training", title_align="left")]
    notes = list(state.errors)
    if state.follow_error:
        notes.append(state.follow_error)
    if state.bad_lines:
        notes.append(f"{state.bad_lines} unreadable trace line(s) skipped")
    if notes:
        parts.append(Text("\n".join(printable(note) for note in notes), style="yellow"))
    if state.figures:
        parts.append(
            Panel(
                summary(state.figures, state.meta), title="finished: summary", title_align="left", border_style="green"
            )
        )
    if state.ended:
        parts.append(Text(printable(state.ended, newlines=False), style="bold"))
    else:
        parts.append(Text(f"following {state.source}  ·  Ctrl-C to leave", style="dim"))
    return Group(*parts)
