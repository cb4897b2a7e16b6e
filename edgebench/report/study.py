"""`edgebench report --study`: each method as ratios to a baseline method, per device,
model and backend (edgebench.results.study computes them), for the terminal, CSV and JSON.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from typing import Any

from rich.console import Group
from rich.text import Text

from edgebench.figures.carbon import CarbonIntensity
from edgebench.report.axes import axis_sections
from edgebench.report.tables import (
    FRONTIER_LEGEND,
    LOSS_FIELD,
    MG,
    MIB,
    PREDICTED_FIELDS,
    PREDICTED_LEGEND,
    carbon_legend,
    heldout_fields,
)
from edgebench.results.study import STUDY_COLUMNS
from edgebench.terminal import Field, Section, fitted_sections
from edgebench.untrusted import printable


def ratio_cell(row: dict[str, Any], name: str) -> str:
    """`0.80x [0.70-0.90]`; an energy ratio between estimates (only its `_est` columns set) ends `est`."""
    est = "_est" if row.get(f"{name}_ratio") is None and row.get(f"{name}_ratio_est") is not None else ""
    ratio, low, high = (row.get(f"{name}_ratio{k}{est}") for k in ("", "_min", "_max"))
    if ratio is None:
        return "-"
    text = f"{ratio:.2f}x"
    if low is not None and high is not None and f"{low:.2f}" != f"{high:.2f}":
        text += f" [{low:.2f}-{high:.2f}]"
    return text + (" est" if est else "")


STUDY_IDENT = [Field("method", "method", lambda r: str(r["method"]), True),
               Field("status", "status", lambda r: str(r["status"]) + (" !" if r.get("disturbed") else "")
                     + (" ★" if r.get("on_frontier") else ""), True),
               Field("n", "runs (n)", lambda r: str(r["n"]))]
PEAK_MIB = Field("peak MiB", "peak memory, kernel RSS of the worker (MiB)",  # a narrow window can spare it
                 lambda r: "-" if r.get("peak_mem_bytes") is None else f"{r['peak_mem_bytes'] / MIB:,.0f}",
                 short="peak", unit="MiB", drop=2)
STUDY_FIELDS = [Field("peak mem", "peak memory vs baseline", lambda r: ratio_cell(r, "peak_mem"), short="mem",
                      unit="x the baseline's"),
                PEAK_MIB,
                *PREDICTED_FIELDS,
                Field("time/step", "time per step vs baseline", lambda r: ratio_cell(r, "step_time"), short="t",
                      unit="x the baseline's"),
                Field("energy/step", "energy per step vs baseline", lambda r: ratio_cell(r, "energy"), short="E",
                      unit="x the baseline's", drop=8),
                LOSS_FIELD,
                *heldout_fields([  # what reaching the target cost, beside the per-step ratios' units
                    Field("time to target", "time to the target vs baseline", lambda r: ratio_cell(r, "time_to_target"),
                          short="Ttgt", unit="x the baseline's"),
                    Field("energy to target", "energy to the target vs baseline",
                          lambda r: ratio_cell(r, "energy_to_target"), short="Etgt", unit="x the baseline's", drop=6)])]
TARGET_LEGEND = ("With a target: reached = runs that met it (of n) before their cap; time/energy to target: the "
                 "median seconds (step times only) and joules until the target, as ratios to the baseline's; the "
                 "rows run cheapest to the target first, and ★ is then peak memory against time to the target.")
STUDY_LEGEND = ("Ratios of medians to the baseline's (1.00x = the same; <1 = less). [low-high]: the method's "
                "min over the baseline's max to its max over the baseline's min. n = the method's runs. "
                "peak MiB: the method's median kernel peak. " + PREDICTED_LEGEND + " est = from a power model, "
                "not measured. ! = a disturbed run. " + FRONTIER_LEGEND)


def study_legend(rows: list[dict[str, Any]], carbon: CarbonIntensity | None = None) -> str:
    """STUDY_LEGEND, with what the target's columns mean where some setting has a target, and
    what the baseline's CO2 is where it has one."""
    return STUDY_LEGEND + (" " + TARGET_LEGEND if any(r.get("target") for r in rows) else "") + \
        carbon_legend(rows, carbon)


def study_fields(rows: list[dict[str, Any]]) -> list[Field]:
    """STUDY_FIELDS; the peak in MiB only beside a prediction (the ratio says it otherwise), so a
    study of runs without one is no wider than it was."""
    predicted = any(r.get("predicted_peak_bytes_est") is not None for r in rows)
    return [f for f in STUDY_FIELDS if predicted or f is not PEAK_MIB]


Setting = tuple[str, str, str, str]  # device, model, backend, run shape


def settings(rows: list[dict[str, Any]]) -> dict[Setting, list[dict[str, Any]]]:
    """The study's rows by setting: device, model, backend and run shape (each has its own
    baseline). A setting with a target ranks by what reaching it cost: the least time to the
    target first, those that never reached it last."""
    out: dict[Setting, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["device"], r["model"], r["backend"], r.get("shape") or ""), []).append(r)
    return {key: sorted(members, key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0))
            if members[0].get("target") else members for key, members in out.items()}


def unreached_notes(rows: list[dict[str, Any]]) -> list[str]:
    """The configurations some of whose runs did not reach the target: those that ran to their
    cap (steps or duration) apart from those that ended before it (`interrupted at step 16`)."""
    return [_unreached(r) for r in rows if r.get("target") and (r["reached"] or 0) < r["n"]]


def _unreached(row: dict[str, Any]) -> str:
    """`2 of 3 runs did not reach loss=1.0: 1 within its cap of 80 steps, 1 ended early (interrupted at step 16)`."""
    cap = str(row["steps"]) if str(row["steps"]).endswith(" s") else f"{row['steps']} steps"
    missed = row["n"] - (row["reached"] or 0)
    early = row.get("ended_early") or []
    capped = max(0, missed - len(early))
    where = f"{row['device']} / {row['model']} / {row['method']} / {row['backend']}: {missed} of {row['n']} runs"
    how = "; ".join(f"{n}x {s}" if n > 1 else s for s, n in Counter(early).items())
    if not early:
        return f"{where} did not reach {row['target']} within their cap of {cap}"
    if not capped:
        return f"{where} ended early, before reaching {row['target']} ({how}; their cap: {cap})"
    return (f"{where} did not reach {row['target']}: {capped} within the cap of {cap}, {len(early)} ended early "
            f"({how})")


def setting_title(key: Setting, rows: list[dict[str, Any]]) -> str:
    """`device / model / backend (shape)`, with the baseline's own figures (the 1.00x)."""
    base = next((r for r in rows if r["method"] == r["baseline"]), None)
    title = " / ".join(str(k) for k in key[:3]) + (f" ({key[3]})" if key[3] else "")
    if base is None or base["step_time_s"] is None:
        return title
    est = "_est" if base["energy_estimated"] else ""
    joules, co2 = base[f"energy_per_step_j{est}"], base.get(f"co2e_est_per_step_g{est}")
    energy = "" if joules is None else f", {joules:.3g} J" + (" est" if est else "") + \
        ("" if co2 is None else f" ({co2 / MG:.3g} mg CO2e est.)")
    to_target = "" if base["time_to_target_s"] is None else f", {base['time_to_target_s']:.3g} s to {base['target']}"
    return (f"{title}: baseline {base['baseline']} = {(base['peak_mem_bytes'] or 0) / MIB:,.0f} MiB, "
            f"{base['step_time_s']:.3g} s/step{energy}{to_target} (n={base['n']})")


def study_terminal(rows: list[dict[str, Any]], notes: list[str], width: int,
                   carbon: CarbonIntensity | None = None, axes: dict[str, list[dict[str, Any]]] | None = None) -> Group:
    """The study's tables, then what each swept axis did (`axes`: report.axes.axis_effects)."""
    parts = fitted_sections([Section(setting_title(key, members), STUDY_IDENT, study_fields(members), members)
                             for key, members in settings(rows).items()], width)
    parts.append(Text(study_legend(rows, carbon), style="dim", overflow="fold"))
    unreached = unreached_notes(rows)
    if unreached:
        parts.append(Text("Target not reached:\n  " + "\n  ".join(printable(n, newlines=False) for n in unreached),
                          style="yellow", overflow="fold"))
    if notes:
        parts.append(
            Text(
                "Not compared:\n  " + "\n  ".join(printable(n, newlines=False) for n in notes),
                style="yellow",
                overflow="fold",
            )
        )
    if axes and any(axes.values()):  # below the study's legend: the axes say their own
        parts += fitted_sections(axis_sections(axes), width)
    return Group(*parts)


def study_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=STUDY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in STUDY_COLUMNS})
    return buf.getvalue()


def study_json(rows: list[dict[str, Any]], notes: list[str], carbon: CarbonIntensity | None = None,
               axes: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The study's rows, its notes, the grid's carbon intensity its CO2 figures come from, and
    what each swept axis did (`axes`: report.axes.axis_effects)."""
    return json.dumps({"columns": STUDY_COLUMNS, "rows": [{k: r.get(k) for k in STUDY_COLUMNS} for r in rows],
                       "notes": notes, "carbon_intensity": (carbon or CarbonIntensity()).as_json(),
                       "axes": axes or {}}, indent=2, default=str) + "\n"
