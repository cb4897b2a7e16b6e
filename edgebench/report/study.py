"""`edgebench report --study`: each method as ratios to a baseline method, per device,
model and backend (edgebench.results.study computes them), for the terminal, CSV and JSON.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from edgebench.report.tables import MIB, Field, fitted
from edgebench.results.study import STUDY_COLUMNS
from edgebench.untrusted import printable


def ratio_cell(row: dict[str, Any], name: str) -> str:
    ratio, low, high = row.get(f"{name}_ratio"), row.get(f"{name}_ratio_min"), row.get(f"{name}_ratio_max")
    if ratio is None:
        return "-"
    text = f"{ratio:.2f}x"
    if low is not None and high is not None and f"{low:.2f}" != f"{high:.2f}":
        text += f" [{low:.2f}-{high:.2f}]"
    return text + (" est" if name == "energy" and row.get("energy_estimated") else "")


STUDY_IDENT = [Field("method", "method", lambda r: str(r["method"]), True),
               Field("status", "status", lambda r: str(r["status"]) + (" !" if r.get("disturbed") else "")
                     + (" ★" if r.get("on_frontier") else ""), True),
               Field("n", "runs (n)", lambda r: str(r["n"]))]
STUDY_FIELDS = [Field("peak mem", "peak memory vs baseline", lambda r: ratio_cell(r, "peak_mem")),
                Field("time/step", "time per step vs baseline", lambda r: ratio_cell(r, "step_time")),
                Field("energy/step", "energy per step vs baseline", lambda r: ratio_cell(r, "energy"))]
STUDY_LEGEND = ("Ratios of medians to the baseline's (1.00x = the same; <1 = less). [low-high]: the method's "
                "min over the baseline's max to its max over the baseline's min. n = the method's runs. "
                "est = from a power model, not measured. ! = a disturbed run. ★ = Pareto frontier.")


def _settings(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["device"], r["model"], r["backend"]), []).append(r)
    return out


def setting_title(key: tuple, rows: list[dict[str, Any]]) -> str:
    """`device / model / backend`, with the baseline's own figures (the 1.00x)."""
    base = next((r for r in rows if r["method"] == r["baseline"]), None)
    title = " / ".join(str(k) for k in key)
    if base is None or base["step_time_s"] is None:
        return title
    energy = "" if base["energy_per_step_j"] is None else \
        f", {base['energy_per_step_j']:.3g} J" + (" est" if base["energy_estimated"] else "")
    return (f"{title}: baseline {base['baseline']} = {(base['peak_mem_bytes'] or 0) / MIB:,.0f} MiB, "
            f"{base['step_time_s']:.3g} s/step{energy} (n={base['n']})")


def study_terminal(rows: list[dict[str, Any]], notes: list[str], width: int) -> Group:
    parts: list[RenderableType] = []
    for key, members in _settings(rows).items():
        parts += fitted(setting_title(key, members), STUDY_IDENT, STUDY_FIELDS, members, width)
    parts.append(Text(STUDY_LEGEND, style="dim", overflow="fold"))
    if notes:
        parts.append(Text("Not compared:\n  " + "\n  ".join(printable(n, newlines=False) for n in notes), style="yellow",
                          overflow="fold"))
    return Group(*parts)


def study_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=STUDY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in STUDY_COLUMNS})
    return buf.getvalue()


def study_json(rows: list[dict[str, Any]], notes: list[str]) -> str:
    return json.dumps({"columns": STUDY_COLUMNS, "rows": rows, "notes": notes}, indent=2, default=str) + "\n"
