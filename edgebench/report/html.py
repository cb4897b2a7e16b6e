"""One self-contained HTML file: inline CSS, PNGs as base64 data URIs, no scripts, no
network references, so it opens offline and can be mailed as is."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from html import escape

from edgebench.report.build import Report
from edgebench.report.tables import alignment_notes, cell, visible_columns

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
"""


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
    notes = "".join(f"<li>{escape(n)}</li>" for n in alignment_notes(report.runs))
    figures = "".join(
        f'<figure><img alt="{escape(f.title)}" src="data:image/png;base64,{base64.b64encode(f.png).decode()}">'
        f"<figcaption>{escape(f.title)}</figcaption></figure>" for f in report.figures)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="note">{len(report.rows)} runs, made {stamp}. Columns and figures marked <span class="est">est.</span>
or ESTIMATED come from a power model, not a measurement. ★ = on the memory/time Pareto frontier.</p>
<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
{f'<h2>Clock alignment</h2><ul class="note">{notes}</ul>' if notes else ''}
<h2>Figures</h2>
{figures}
</body></html>
"""
