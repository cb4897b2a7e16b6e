"""The report's tables: which columns, how each value reads, which ones are estimates.

The per-run column list (COLUMNS) serves the HTML report and CSV/JSON. The terminal
shows one row per configuration (repeats folded: median [min-max] and n) and adapts to
the window (edgebench.terminal): one table when it fits, else one card per configuration.
Nothing is cut: a cell that cannot fit wraps whole.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from edgebench.figures.carbon import ENV, OPTION, CarbonIntensity
from edgebench.figures.learning import LEARNING_COLUMNS
from edgebench.figures.memory import prediction_error_pct
from edgebench.measure import METHOD
from edgebench.results.aggregate import config_label, group_runs
from edgebench.results.pareto import loss_drop_pct
from edgebench.runner.native import backend_label
from edgebench.terminal import VALUE_CHARS, Field, Section, fits, fitted, fitted_sections
from edgebench.terminal import console as terminal
from edgebench.untrusted import printable

MIB = 1 << 20
MG = 1e-3  # grams in a milligram


def shown(value: Any) -> Text:
    """A cell whose text came from a device or a run directory: control characters and escape
    sequences removed (edgebench.untrusted.printable), cut to VALUE_CHARS, rich markup not interpreted."""
    return Text(printable(value, newlines=False, limit=VALUE_CHARS))


def _num(fmt: str, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else format(v / scale, fmt)


def _yes_no(value: Any) -> str:
    return "yes" if value else ("no" if value is False else "-")


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str]
    estimated: bool = False


def _loss(row: dict[str, Any]) -> str:
    first, last = row.get("loss_first"), row.get("loss_last")
    return "-" if first is None else f"{first:.4g}→{last:.4g}"


CO2_STEP = "CO2e mg/step (est.)"  # tables read CO2 in mg (a step's is well under a gram); CSV/JSON in g
COLUMNS = [
    Column("device", "device", str),
    Column("run_id", "run", str),
    Column("model", "model", str),
    Column("method", "method", str),
    Column("backend", "backend", str),
    Column("steps", "steps", str),
    Column("text_length", "text tokens", str),
    Column("image_size", "image px", str),
    Column("data", "data", str),
    Column("status", "status", str),
    Column("peak_mem_bytes", "worker peak RSS MiB (kernel)", _num(",.1f", MIB)),
    Column("predicted_peak_bytes_est", "predicted peak MiB (est.)", _num(",.1f", MIB), estimated=True),
    Column("predicted_peak_error_pct", "predicted peak's error %", _num("+.1f")),
    Column("budget_bytes", "budget MiB (RAM less OS, supervisor, margin)", _num(",.0f", MIB)),
    Column("peak_of_budget", "peak / budget", _num(".2f")),
    Column("device_ram_peak_bytes", "device RAM peak MiB", _num(",.1f", MIB)),
    Column("device_ram_limit_bytes", "device RAM limit MiB", _num(",.0f", MIB)),
    Column("device_ram_peak_what", "device RAM is", str),
    Column("peak_rss_bytes_sampled", "RSS MiB (sampled)", _num(",.1f", MIB)),
    Column("step_time_median_s", "step s (median)", _num(".4g")),
    Column("step_time_p90_s", "step s (p90)", _num(".4g")),
    Column("samples_per_s", "samples/s (batch / median step)", _num(".4g")),
    Column("tokens_per_s", "tokens/s", _num(".4g")),
    Column("energy_per_step_j", "J/step", _num(".4g")),
    Column("co2e_est_per_step_g", CO2_STEP, _num(".3g", MG), estimated=True),
    Column("energy_per_sample_j", "J/sample", _num(".4g")),
    Column("co2e_est_per_sample_g", "CO2e mg/sample (est.)", _num(".3g", MG), estimated=True),
    Column("power_mean_w", "W mean", _num(".3g")),
    Column("power_peak_w", "W peak", _num(".3g")),
    Column("energy_source", "energy from", str),
    Column("carbon_intensity_g_per_kwh", "grid g CO2e/kWh", _num("g")),
    Column("power_covers", "power covers", str),
    Column("power_flags", "power flags", str),
    Column("energy_per_step_j_est", "J/step (est.)", _num(".4g"), estimated=True),
    Column("co2e_est_per_step_g_est", "CO2e mg/step (est., from est. J)", _num(".3g", MG), estimated=True),
    Column("power_mean_w_est", "W mean (est.)", _num(".3g"), estimated=True),
    Column("temp_peak_c", "°C peak", _num(".1f")),
    Column("time_throttled_s", "throttled s", _num(".1f")),
    Column("loss", "loss first → last", str),
    Column("eval_loss_first", "held-out loss first", _num(".4g")),
    Column("eval_loss_last", "held-out loss last", _num(".4g")),
    Column("eval_accuracy_last", "held-out accuracy % (last)", _num(".0f", 0.01)),
    Column("target", "target", str),
    Column("target_reached", "reached", _yes_no),
    Column("steps_to_target", "steps to target", _num(".0f")),
    Column("time_to_target_s", "s to target", _num(".4g")),
    Column("energy_to_target_j", "J to target", _num(".4g")),
    Column("co2e_est_to_target_g", "CO2e mg to target (est.)", _num(".3g", MG), estimated=True),
    Column("energy_to_target_j_est", "J to target (est.)", _num(".4g"), estimated=True),
    Column("co2e_est_to_target_g_est", "CO2e mg to target (est., from est. J)", _num(".3g", MG), estimated=True),
    Column("cpu_others_pct", "CPU % taken by others", _num(".0f")),
    Column("disturbed", "disturbed", _yes_no),
    Column("on_frontier", "frontier", lambda v: "★" if v else ("" if v is False else "-")),
]
BY_KEY = {c.key: c for c in COLUMNS}


def cell(row: dict[str, Any], column: Column) -> str:
    if column.key == "loss":
        return _loss(row)
    value = row.get(column.key)
    return "-" if value is None and column.fmt is str else column.fmt(value)


def visible_columns(rows: list[dict[str, Any]], keys: set[str] | None = None) -> list[Column]:
    """Drops figure columns no run has (e.g. energy on a device without sensors)."""
    always = {"device", "run_id", "model", "method", "backend", "status", "loss", "on_frontier"}
    return [c for c in COLUMNS if (keys is None or c.key in keys)
            and (c.key in always or any(r.get(c.key) is not None for r in rows))]


# ---- figures with their spread ------------------------------------------------------------
def figure(group: dict[str, Any], key: str, fmt: str, scale: float = 1.0) -> str:
    """`median [min-max]` of a configuration's runs (just the median when n = 1 or they agree)."""
    s = group["spread"].get(key)
    if s is None:
        return "-"
    text = format(s["median"] / scale, fmt)
    low, high = format(s["min"] / scale, fmt), format(s["max"] / scale, fmt)
    return text if s["n"] == 1 or low == high else f"{text} [{low}-{high}]"


def energy_cell(group: dict[str, Any], key: str = "energy_per_step_j", scale: float = 1.0) -> str:
    """Measured energy (per step, or to the target), else the estimate marked `est`; the same for
    the CO2 of either (`co2e_est_...`, in mg: an estimate whichever it comes from, so its header says)."""
    if group["spread"].get(key):
        return figure(group, key, ".3g", scale)
    if group["spread"].get(f"{key}_est"):
        return figure(group, f"{key}_est", ".3g", scale) + " est"
    return "-"


def power_cell(group: dict[str, Any]) -> str:
    """Mean power over the measured steps, with its flags (e.g. charging); else the estimate marked `est`."""
    if group["spread"].get("power_mean_w"):
        flags = group.get("power_flags")
        return figure(group, "power_mean_w", ".3g") + (f" {flags.replace(',', ' ')}" if flags else "")
    if group["spread"].get("power_mean_w_est"):
        return figure(group, "power_mean_w_est", ".3g") + " est"
    return "-"


def device_ram_cell(group: dict[str, Any]) -> str:
    """The device's RAM at peak as % of the limit that applies to it (edgebench.figures.memory.device_ram)."""
    limit = group.get("device_ram_limit_bytes")
    if not limit or not group["spread"].get("device_ram_peak_bytes"):
        return "-"
    return figure(group, "device_ram_peak_bytes", ".0f", limit / 100) + "%"


def loss_cell(group: dict[str, Any], prefix: str = "loss") -> str:
    """First -> last loss (training's, or held-out: prefix `eval_loss`) and how much it fell (a
    rise reads +; a training loss that rose is never on the frontier)."""
    first, last = group.get(f"{prefix}_first"), group.get(f"{prefix}_last")
    if first is None or last is None:
        return "-"
    drop = loss_drop_pct({"loss_first": first, "loss_last": last})
    return f"{first:.3g}->{last:.3g}" + ("" if drop is None else f" {-drop:+.0f}%")


def accuracy_cell(row: dict[str, Any]) -> str:
    """Held-out exact-match accuracy of the last evaluation, in % (the median of the runs')."""
    accuracy = row.get("eval_accuracy_last")
    return "-" if accuracy is None else f"{100 * accuracy:.0f}%"


def reached_cell(row: dict[str, Any]) -> str:
    """How many of the runs reached the target (`2/3`); `-` without a target."""
    return f"{row['reached']}/{row['n']}" if row.get("target") and row.get("reached") is not None else "-"


def heldout_fields(cost: list[Field]) -> list[Field]:
    """The held-out loss and accuracy, whether the target was reached, and `cost`: what
    reaching it took. A table shows each only where some row has it (edgebench.terminal)."""
    return [Field("held-out loss", "held-out loss first->last, change", lambda r: loss_cell(r, "eval_loss"),
                  short="h-loss", drop=5),
            Field("held-out acc", "held-out exact-match accuracy, last evaluation (%)", accuracy_cell,
                  short="acc", unit="%"),
            Field("reached", "runs that reached the target", reached_cell, short="hit"),
            *cost]


# What reaching the target took, medians of the runs that reached it; a narrow window leaves the steps out first.
TO_TARGET_FIELDS = [Field("steps to target", "steps to the target", lambda g: figure(g, "steps_to_target", ".3g"),
                          short="stp", unit="steps to target", drop=4),
                    Field("s to target", "training time to the target (s)",
                          lambda g: figure(g, "time_to_target_s", ".3g"), short="tgt", unit="s to target"),
                    Field("J to target", "energy to the target (J)", lambda g: energy_cell(g, "energy_to_target_j"),
                          short="Etgt", unit="J to target", drop=6),
                    Field("CO2e mg to target (est.)", "CO2 to the target, an estimate (mg CO2e)",
                          lambda g: energy_cell(g, "co2e_est_to_target_g", MG), short="Ctgt",
                          unit="mg CO2e to target (est.)", drop=1)]
HELDOUT_LEGEND = ("held-out loss: first->last evaluation on data never trained on; held-out acc: the share of "
                  "answers greedy decoding reproduced exactly, at the last evaluation; reached: runs that met "
                  "the target (of n) before their cap; steps/s/J to target: what the runs that reached it trained, "
                  "medians (s: step times only, evaluations left out). With a target, ★ weighs peak memory "
                  "against the time to the target, among configurations every run of which reached it.")


def heldout_legend(rows: list[dict[str, Any]]) -> str:
    """HELDOUT_LEGEND where some row evaluated, else nothing (the columns are not shown)."""
    return " " + HELDOUT_LEGEND if any(r.get("eval_loss_last") is not None or r.get("target") for r in rows) else ""


def error_cell(row: dict[str, Any]) -> str:
    """The predicted peak's error against the measured one, in % (the median of the runs')."""
    error = row.get("predicted_peak_error_pct")
    return "-" if error is None else f"{error:+.1f}%"


# The memory model's predicted peak beside the measured one, for a configuration or a study row.
PREDICTED_FIELDS = [Field("est. MiB", "predicted peak, an estimate (MiB)",
                          lambda r: _num(",.0f", MIB)(r.get("predicted_peak_bytes_est")), short="est.", unit="MiB"),
                    Field("est. err", "predicted peak's error, (predicted - measured) / measured", error_cell,
                          short="err", unit="%")]
PREDICTED_LEGEND = ("est. MiB: the memory model's predicted peak, made before the run; est. err: its error "
                    "against the measured kernel peak, (predicted - measured) / measured.")
BUDGET_LEGEND = ("of budget: the kernel peak as a share of what a run may take on the device (its RAM less its OS "
                 "at idle, the supervisor and a margin).")


def budget_cell(group: dict[str, Any]) -> str:
    """The worker's kernel peak as a % of the budget the run was held to (methods.budget)."""
    share = group.get("peak_of_budget")
    return "-" if share is None else f"{100 * share:.0f}%"


BUDGET_FIELD = Field("of budget", "kernel peak, % of the device's run budget (RAM less OS, supervisor, margin)",
                     budget_cell, short="bud", unit="%", drop=3)


def status_cell(group: dict[str, Any]) -> str:
    status: str = group["status"]
    return status + (" !" if group.get("disturbed") else "") + (" ★" if group.get("on_frontier") else "")


REPORT_IDENT = [Field("model", "model", lambda g: str(g["model"]), True),
                Field("method", "method", lambda g: str(g["method"]), True),
                Field("backend", "backend", lambda g: str(g["backend"]), True),
                Field("status", "status", status_cell, True),
                Field("n", "runs (n)", lambda g: str(g["n"]))]
SHAPE_FIELD = Field("shape", "run shape", lambda g: g.get("shape") or "-", True)


def with_shape(ident: list[Field], groups: list[dict[str, Any]]) -> list[Field]:
    """The identifying fields, plus the run shape when these configurations differ in it."""
    return ident + [SHAPE_FIELD] if any(g.get("shape") for g in groups) else ident


def common_names(title: str, ident: list[Field], groups: list[dict[str, Any]]) -> tuple[str, list[Field]]:
    """A name every row shares (the model, the backend) moves into the title (`pi / tiny /
    eager`), so the rows keep only what tells them apart and fit narrower windows."""
    shared = [f for f in ident if f.header in ("model", "backend") and len({f.value(g) for g in groups}) == 1]
    names = [title, *(f.value(groups[0]) for f in shared)] if groups else [title]
    return " / ".join(names), [f for f in ident if f not in shared]


PEAK_FIELD = Field("peak MiB", "peak memory: kernel RSS of the worker (MiB)",
                   lambda g: figure(g, "peak_mem_bytes", ",.0f", MIB), short="peak", unit="MiB")
STEP_FIELD = Field("step s", "time per step, median (s)", lambda g: figure(g, "step_time_median_s", ".3g"),
                   short="t", unit="s/step")
CO2_FIELD = Field(CO2_STEP, "CO2 per step, an estimate (mg CO2e)",
                  lambda g: energy_cell(g, "co2e_est_per_step_g", MG), short="CO2", unit="mg CO2e/step (est.)",
                  drop=1)
# The order a narrow window leaves figures out (Field.drop): the CO2 first (the joules beside it say it), power, then
# the device's RAM, the steps to
# the target (its seconds say it), the held-out loss (its accuracy and the target say it), the joules to the
# target, the training loss, the energy per step (report, study). A table of repeats with a target then still
# fits 80 columns.
LOSS_FIELD = Field("loss", "loss first->last, change", loss_cell, drop=7)
REPORT_FIGURES = [PEAK_FIELD,
                  *PREDICTED_FIELDS,
                  BUDGET_FIELD,
                  Field("dev RAM", "device RAM at peak, % of its limit", device_ram_cell, short="RAM",
                        unit="%", drop=3),
                  STEP_FIELD,
                  Field("J/step", "energy per step (J)", energy_cell, short="E", unit="J/step", drop=8),
                  CO2_FIELD,
                  Field("W", "power, mean over the steps (W)", power_cell, short="P", unit="W", drop=2),
                  LOSS_FIELD,
                  *heldout_fields(TO_TARGET_FIELDS)]
FRONTIER_LEGEND = ("★ = on the Pareto frontier: the loss fell and no other configuration of the device, model "
                   "and run shape that learned is both smaller (peak memory) and faster (step time); a "
                   "configuration whose loss did not fall is never on it.")
LEGEND = ("n = runs behind each figure: the median, [min-max] over them. peak MiB: the worker's kernel RSS "
          "(ru_maxrss, or the native worker's own VmHWM; it counts shared library pages). " + PREDICTED_LEGEND
          + " " + BUDGET_LEGEND
          + " dev RAM: the device's RAM at "
          "peak, as % of the limit that applies to it (a lab device: its cgroup, page cache included; a board: "
          "MemTotal - MemAvailable). step s: median step time. W: mean power over the measured steps (Sensors "
          "says what it covers). "
          "est = estimated from the device's power model, not measured. "
          "! = disturbed: other processes or steal took >10% of the CPU in a run. " + FRONTIER_LEGEND +
          " docs/figures.md defines each figure.")


def carbon_legend(rows: list[dict[str, Any]], carbon: CarbonIntensity | None) -> str:
    """What the CO2 beside energy is, and the grid's intensity that made it, where some row has it."""
    if not any(r.get(k) is not None for r in rows for k in ("co2e_est_per_step_g", "co2e_est_per_step_g_est")):
        return ""
    carbon = carbon or CarbonIntensity()
    return (f" CO2e mg: milligrams of CO2-equivalent, an estimate: energy in kWh x the grid's carbon intensity, here "
            f"{carbon.what} ({OPTION} or ${ENV} sets yours); est beside it: from "
            "estimated energy.")


def sensor_notes(groups: list[dict[str, Any]]) -> list[str]:
    """Once per device: what its power figures are (measured and what they cover, with
    flags such as charging; estimated; none)."""
    notes = []
    for device in dict.fromkeys(g["device"] for g in groups):
        mine = [g for g in groups if g["device"] == device]
        if any(g["spread"].get("energy_per_step_j") or g["spread"].get("power_mean_w") for g in mine):
            covers = next((g["power_covers"] for g in mine if g.get("power_covers")), None)
            source = next((g["energy_source"] for g in mine if g.get("energy_source")), None)
            if covers or (source and source != "device"):
                where = f"an external meter ({source.removeprefix('external:')})" if source and source != "device" \
                    else covers
                notes.append(f"{device}: power measured; it covers {where}")
            for g in mine:
                if g.get("power_flags"):
                    why = f": {g['power_warning']}" if g.get("power_warning") else ""
                    notes.append(f"{config_label(g)}: power flagged {g['power_flags']}{why}")
        elif any(g["spread"].get("energy_per_step_j_est") or g["spread"].get("power_mean_w_est") for g in mine):
            basis = next((g["power_est_basis"] for g in mine if g.get("power_est_basis")), None)
            disturbed = sum(g.get("disturbed") or 0 for g in mine)
            notes.append(f"{device}: no power sensor; power and energy are estimated from its power model (est)"
                         + (f": {basis}" if basis else "")
                         + (f"; in its {disturbed} disturbed run(s) (!) the steps ran slowed, so their energy "
                            "estimate reads high" + (", and it counts the other processes' CPU too"
                                                      if basis and "whole system" in basis else "")
                            if disturbed else ""))
        else:
            notes.append(f"{device}: no power sensor and no power model; no power or energy figures")
    return notes


def disturbed_notes(groups: list[dict[str, Any]]) -> list[str]:
    """One line for all disturbed runs (each configuration with one is flagged `!` in its row)."""
    hit = [g for g in groups if g.get("disturbed")]
    if not hit:
        return []
    runs, total = sum(g["disturbed"] for g in hit), sum(g["n"] for g in groups)
    pct = [p for g in hit for p in g.get("disturbed_pct") or [] if p]
    took = f" took {min(pct):.0f}-{max(pct):.0f}% of the CPU" if len(pct) > 1 and min(pct) != max(pct) else \
        (f" took {pct[0]:.0f}% of the CPU" if pct else "")
    return [f"{runs} of {total} runs, in {len(hit)} configuration{'s' if len(hit) > 1 else ''} marked !, were "
            f"disturbed: other processes or steal{took} (their step times are likely too long)"]


def unmarked_notes(groups: list[dict[str, Any]]) -> list[str]:
    """Each measured command (edgebench measure) that marked no steps: its step columns are empty
    because it has no steps, not because a figure failed."""
    return [f"{config_label(g)}: the command marked no steps (edgebench.measure): whole-run figures only (peak "
            "memory, device RAM, CPU, temperature); no step time, energy per step or frontier"
            for g in groups if g.get("method") == METHOD and g.get("step_time_median_s") is None]


def unfinished_notes(groups: list[dict[str, Any]]) -> list[str]:
    """Each device and model where no run finished (one Ctrl-C'd run is enough): its frontier and
    the comparison across devices have nothing of it, so the report says so instead of leaving it out."""
    by: dict[tuple[str, str], Counter[str]] = {}
    for g in groups:
        by.setdefault((g["device"], g["model"]), Counter()).update(g["statuses"])
    return [f"{device} / {model}: no finished run ({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))}): "
            "nothing of it on a Pareto frontier or in the comparison across devices"
            for (device, model), statuses in by.items() if not statuses.get("ok")]


def comparison_table(groups: list[dict[str, Any]]) -> Table | None:
    """Methods down, devices across: median step time and peak memory of each configuration."""
    devices = sorted({g["device"] for g in groups})
    if len(devices) < 2:
        return None
    by: defaultdict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for g in groups:
        by[config_label(g, device=False)][g["device"]] = g
    table = Table(title="Across devices: step s (median) / peak MiB (kernel)", header_style="bold",
                  title_justify="left")
    for name in ("model / method / backend", *devices):
        table.add_column(shown(name), overflow="fold")
    for key in sorted(by):
        cells = []
        for dev in devices:
            found = by[key].get(dev)
            cells.append("-" if found is None or found["step_time_median_s"] is None else
                         f"{found['step_time_median_s']:.3g} / {(found['peak_mem_bytes'] or 0) / MIB:,.0f}")
        table.add_row(shown(key), *cells)
    return table


def alignment_notes(runs: list[dict[str, Any]]) -> list[str]:
    """Runs whose host times rest on the device's own clock (or on nothing)."""
    by_note: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in runs:
        if r.get("align_source") != "probes":
            by_note[(r["device"], r["align_note"])].append(r["run_id"])
    return [f"{dev} ({len(ids)} run{'s' if len(ids) > 1 else ''}): {note}" for (dev, note), ids in by_note.items()]


def emulated_notes(runs: list[dict[str, Any]]) -> list[str]:
    """Devices whose python ran under an emulator (the arm64 lab): their times mean nothing for hardware."""
    by_device: dict[tuple[str, str], int] = defaultdict(int)
    for r in runs:
        emulator = ((json.loads(r.get("meta_json") or "{}") or {}).get("device") or {}).get("emulator")
        if emulator:
            by_device[(r["device"], emulator)] += 1
    return [f"{dev} ({n} run{'s' if n > 1 else ''}): arm64 under {emu}: step times not representative (emulated); "
            "memory figures include the emulator's own (README: arm64 lab)" for (dev, emu), n in by_device.items()]


def _notes(title: str, lines: list[str]) -> Text:
    return Text(title + "\n  " + "\n  ".join(printable(line, newlines=False) for line in lines), style="dim",
                overflow="fold")


def terminal_report(rows: list[dict[str, Any]], runs: list[dict[str, Any]], width: int = 120,
                    carbon: CarbonIntensity | None = None) -> Group:
    """Per device, one row per configuration with every key figure, laid out to fit `width`
    (CO2 from the grid's `carbon` intensity, said in the legend)."""
    groups = group_runs(rows)
    sections = []
    for device in dict.fromkeys(g["device"] for g in groups):
        mine = [g for g in groups if g["device"] == device]
        title, ident = common_names(device, with_shape(REPORT_IDENT, mine), mine)
        sections.append(Section(title, ident, REPORT_FIGURES, mine))
    parts = fitted_sections(sections, width)
    parts.append(Text(LEGEND + heldout_legend(groups) + carbon_legend(groups, carbon), style="dim", overflow="fold"))
    comparison = comparison_table(groups)
    if comparison is not None:
        parts.append(comparison if fits(comparison, width) else
                     Text("(the across-devices comparison is wider than this window: see --format html)",
                          style="dim"))
    for title, lines in (("Not finished:", unfinished_notes(groups)), ("Sensors:", sensor_notes(groups)),
                         ("Disturbed:", disturbed_notes(groups)), ("Measured commands:", unmarked_notes(groups)),
                         ("Clock alignment:", alignment_notes(runs)), ("Emulated devices:", emulated_notes(runs))):
        if lines:
            parts.append(_notes(title, lines))
    return Group(*parts)


# ---- bench --------------------------------------------------------------------------------
def bench_rows(results: list[dict[str, Any]], device: str = "local") -> list[dict[str, Any]]:
    """result.json dicts as metric rows (the same keys the store's metrics use)."""
    rows = []
    for r in results:
        cpu = r.get("cpu") or {}
        rows.append({"device": device, "run_id": r.get("run_id"), "model": r.get("model"),
                     "method": r.get("method", "?"), "backend": backend_label(r.get("backend"), r.get("runtime")),
                     "batch_size": r.get("batch_size"), "status": r.get("status"), "detail": r.get("detail"),
                     **{k: r.get(k) for k in ("lr", "weight_decay", "threads")},  # the sweep's axes (bench adds them)
                     "peak_mem_bytes": r.get("peak_rss_bytes_kernel") or r.get("peak_rss_bytes_sampled"),
                     "peak_rss_bytes_sampled": r.get("peak_rss_bytes_sampled"),
                     "predicted_peak_bytes_est": r.get("predicted_peak_bytes_est"),
                     "predicted_peak_error_pct": prediction_error_pct(r.get("predicted_peak_bytes_est"),
                                                                      r.get("peak_rss_bytes_kernel")),
                     "budget_bytes": r.get("budget_bytes"), "peak_of_budget": r.get("peak_of_budget"),
                     "step_time_median_s": (r.get("step_time_s") or {}).get("median"),
                     "samples_per_s": r.get("samples_per_s"),
                     "loss_first": r.get("loss_first"), "loss_last": r.get("loss_last"),
                     **{k: r.get(k) for k in LEARNING_COLUMNS},
                     "cpu_others_pct": None if cpu.get("others_share") is None else 100 * cpu["others_share"],
                     "cpu_steal_pct": None if cpu.get("steal_share") is None else 100 * cpu["steal_share"],
                     "disturbed": cpu.get("disturbed"), "disturbed_why": cpu.get("disturbed_why")})
    return rows


BENCH_IDENT = [
    Field(
        "method",
        "method",  # the native ExecuTorch worker said beside the method it ran
        lambda g: f"{g['method']} (native)" if g.get("backend") == "executorch-native" else str(g["method"]),
        True,
    ),
    Field("status", "status", status_cell, True),
    Field("n", "runs (n)", lambda g: str(g["n"])),
]
BENCH_FIGURES = [PEAK_FIELD,
                 *PREDICTED_FIELDS,
                 BUDGET_FIELD,
                 STEP_FIELD,
                 Field("samples/s", "samples per second (batch / median step)",
                       lambda g: figure(g, "samples_per_s", ".3g"), drop=2),
                 LOSS_FIELD,
                 *heldout_fields(TO_TARGET_FIELDS[:2])]  # joules to the target come from the store (report)
BENCH_LEGEND = ("peak MiB: the worker's kernel peak (ru_maxrss; native: its own VmHWM); " + PREDICTED_LEGEND
                + " " + BUDGET_LEGEND
                + " step s: median step time; samples/s: "
                "batch / median step; n = runs, each figure their median [min-max]; ! = disturbed (other "
                "processes took >10% of the CPU). " + FRONTIER_LEGEND + " docs/figures.md")


def render_bench_results(results: list[dict[str, Any]], title: str, console: Console | None = None) -> None:
    """The table `edgebench bench` prints: one row per method (repeats folded), then each failure."""
    console = console or terminal()  # piped: the table as wide as its rows
    groups = group_runs(bench_rows(results))
    for part in fitted(title, with_shape(BENCH_IDENT, groups), BENCH_FIGURES, groups, console.width):
        console.print(part)
    console.print(Text(BENCH_LEGEND + heldout_legend(groups), style="dim", overflow="fold"))
    if os.environ.get("EDGEBENCH_EMULATOR"):  # bench ran by the arm64 lab's python
        console.print(Text(f"emulated ({os.environ['EDGEBENCH_EMULATOR']}): step times not representative; memory "
                           "figures include the emulator's own", style="yellow", overflow="fold"))
    for line in disturbed_notes(groups):
        console.print(Text(printable(line, newlines=False), style="yellow", overflow="fold"))
    for r in results:
        if r["status"] != "ok":
            console.print(Text(printable(f"{r.get('method')}: {r['status']}: {str(r.get('detail', ''))[:500]}"),
                               style="red", overflow="fold"))
