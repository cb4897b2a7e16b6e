"""One self-contained HTML file: inline CSS, PNGs as base64 data URIs, no scripts, no
network references, so it opens offline and can be mailed as is."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from html import escape

from edgebench.report.build import Figure, Report, safe_name
from edgebench.report.study import STUDY_IDENT, STUDY_LEGEND, setting_title, settings, study_fields
from edgebench.report.tables import (
    FRONTIER_LEGEND,
    LEGEND,
    REPORT_FIGURES,
    REPORT_IDENT,
    alignment_notes,
    cell,
    emulated_notes,
    visible_columns,
    with_shape,
)
from edgebench.terminal import Field

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f0f0f0; }
td.text { text-align: left; }
.est { font-style: italic; background: #fff8dc; }
tr.failed td { color: #b00; }
figure { margin: 1.5em 0; }
img { max-width: 100%; border: 1px solid #ddd; }
.note { color: #666; font-size: 13px; }
.side { display: flex; flex-wrap: wrap; gap: 2em; align-items: flex-start; }
.side > * { flex: 1 1 480px; }
"""


def _img(fig: Figure) -> str:
    png = base64.b64encode(fig.png).decode()
    return (
        f'<figure id="fig-{escape(fig.name)}"><img alt="{escape(fig.title)}" src="data:image/png;base64,{png}">'
        f"<figcaption>{escape(fig.title)}</figcaption></figure>"
    )


def _fields_table(fields: list[Field], rows: list[dict]) -> str:
    head = "".join(f"<th>{escape(f.header)}</th>" for f in fields)
    body = "".join("<tr>" + "".join(f'<td class="{"text" if f.name else ""}">{escape(f.value(r))}</td>' for f in fields)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _by_device(groups: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for g in groups:
        out.setdefault(g["device"], []).append(g)
    return out


def _study(report: Report) -> str:
    if report.study is None:
        return ""
    parts = [
        '<h2 id="study">Study: each method against the baseline</h2>',
        f'<p class="note">{escape(STUDY_LEGEND)}</p>',
    ]
    pareto = {f.name: f for f in report.figures if f.name.startswith("pareto_")}
    for key, rows in settings(report.study).items():
        fig = pareto.get(safe_name("pareto", key[0], key[1]))
        parts.append(f"<h3>{escape(setting_title(key, rows))}</h3><div class=\"side\"><div>"
                     f"{_fields_table(STUDY_IDENT + study_fields(rows), rows)}</div>{_img(fig) if fig else ''}</div>")
    if report.study_notes:
        parts.append('<ul class="note">' + "".join(f"<li>{escape(n)}</li>" for n in report.study_notes) + "</ul>")
    return "".join(parts)


def _contents(report: Report, notes: bool) -> str:
    """The table of contents: each section, and each figure by its title (the file is long)."""
    sections = [("study", "Study", report.study is not None), ("configurations", "Configurations", True),
                ("notes", "Notes", notes), ("runs", "Runs", True), ("figures", "Figures", bool(report.figures))]
    items = []
    for anchor, name, shown in sections:
        if not shown:
            continue
        sub = "" if anchor != "figures" else "<ul>" + "".join(
            f'<li><a href="#fig-{escape(f.name)}">{escape(f.title)}</a></li>' for f in report.figures) + "</ul>"
        items.append(f'<li><a href="#{anchor}">{name}</a>{sub}</li>')
    return f'<nav><h2>Contents</h2><ul class="note">{"".join(items)}</ul></nav>'


def render_html(report: Report, title: str = "edgebench report") -> str:
    columns = visible_columns(report.rows)
    head = "".join(f'<th class="{"est" if c.estimated else ""}">{escape(c.header)}</th>' for c in columns)
    body = []
    for row in report.rows:
        cells = "".join(
            f'<td class="{"text" if c.fmt is str else ""}{" est" if c.estimated else ""}">{escape(cell(row, c))}</td>'
            for c in columns)
        css = "" if row.get("status") == "ok" else ' class="failed"'
        body.append(f'<tr id="run-{escape(row["device"])}-{escape(row["run_id"])}"{css}>{cells}</tr>')
    configurations = "".join(
        f"<h3>{escape(device)}</h3>" + _fields_table(with_shape(REPORT_IDENT, mine) + REPORT_FIGURES, mine)
        for device, mine in _by_device(report.groups).items())
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.notes + alignment_notes(report.runs)
                    + emulated_notes(report.runs))
    figures = "".join(_img(f) for f in report.figures)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="note">{len(report.rows)} runs in {len(report.groups)} configurations, made {stamp}. Columns and figures
marked <span class="est">est.</span> or ESTIMATED come from a power model, not a measurement.</p>
{_contents(report, bool(notes))}
{_study(report)}
<h2 id="configurations">Configurations</h2>
<p class="note">{escape(LEGEND)}</p>
{configurations}
{f'<h2 id="notes">Notes</h2><ul class="note">{notes}</ul>' if notes else ''}
<h2 id="runs">Runs</h2>
<p class="note">One row per run. {escape(FRONTIER_LEGEND)}</p>
<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
<h2 id="figures">Figures</h2>
{figures}
</body></html>
"""
