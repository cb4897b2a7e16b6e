"""One self-contained HTML file: inline CSS, interactive charts (plotly: hover, zoom, a
legend that hides what it names) with plotly.js inlined once and each chart's figure as
JSON beside its div, and no network reference, so it opens offline and can be mailed as is.

Wide tables scroll inside their own box and run ids show short (the whole id on hover), so
the page reads on a 1,400 px screen and on a 390 px phone. The page keeps any script
error, and its own width against the window's, in hidden elements (`report-errors`,
`report-checks`) that tests/test_report_browser.py reads from a headless browser.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from html import escape
from typing import Any

from plotly.io.json import to_json_plotly
from plotly.offline import get_plotlyjs

from edgebench.report.axes import SCALING_CAPTION, axis_sections
from edgebench.report.build import Figure, Report, safe_name
from edgebench.report.study import (
    STUDY_IDENT,
    Setting,
    setting_title,
    settings,
    study_fields,
    study_legend,
    unreached_notes,
)
from edgebench.report.tables import (
    FRONTIER_LEGEND,
    LEGEND,
    REPORT_FIGURES,
    REPORT_IDENT,
    alignment_notes,
    carbon_legend,
    cell,
    emulated_notes,
    heldout_legend,
    visible_columns,
    with_shape,
)
from edgebench.terminal import Field, present

STYLE = """
* { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1em 2em; max-width: 1500px; color: #222; }
h1, h2, h3, h4, p, li, figcaption { overflow-wrap: anywhere; }
.wide { overflow-x: auto; max-width: 100%; margin: 1em 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f0f0f0; }
td { white-space: nowrap; }  /* a table wider than the page scrolls in its box */
td.text { text-align: left; }
td.id { white-space: nowrap; font-family: ui-monospace, monospace; }
.est { font-style: italic; background: #fff8dc; }
tr.failed td { color: #b00; }
figure { margin: 1.5em 0; }
figcaption { font-weight: 600; margin-bottom: .3em; }
figure h5 { font-size: 13px; font-weight: 600; margin: 1em 0 .2em; }
.chart { width: 100%; min-height: 200px; border: 1px solid #eee; }
.note { color: #666; font-size: 13px; }
@media (max-width: 600px) {
  body { padding: .5em; }
  table { font-size: 12px; }
  nav ul { padding-left: 1.2em; }
}
"""
# Plotly's own options: no logo, no link to its cloud, math never typeset (no MathJax fetched).
CONFIG = {"displaylogo": False, "responsive": True, "showLink": False, "showSendToCloud": False,
          "typesetMath": False}
# Kept before plotly.js runs, so an error anywhere on the page lands in #report-errors.
CATCH = """window.reportErrors = [];
function reportError(text) {
  window.reportErrors.push(String(text));
  var el = document.getElementById('report-errors');
  if (el) el.textContent = window.reportErrors.join('\\n');
}
window.addEventListener('error', function (e) { reportError(e.message + ' (line ' + e.lineno + ')'); });
window.addEventListener('unhandledrejection', function (e) { reportError('unhandled: ' + e.reason); });"""
DRAW = """(function () {
  var config = %s, drawn = [];
  document.querySelectorAll('div.chart').forEach(function (div) {
    try {
      var fig = JSON.parse(document.getElementById('data-' + div.dataset.chart).textContent);
      drawn.push(Plotly.newPlot(div, fig.data, fig.layout, config));
    } catch (e) { reportError('chart ' + div.dataset.chart + ': ' + e); }
  });
  Promise.all(drawn).then(function () {
    var checks = document.getElementById('report-checks'), page = document.documentElement;
    checks.dataset.charts = String(drawn.length);
    checks.dataset.pageWidth = String(page.scrollWidth);
    checks.dataset.windowWidth = String(page.clientWidth);
    checks.dataset.bodyWidth = String(document.body.scrollWidth);
  }, function (e) { reportError('drawing: ' + e); });
})();"""


def _chart(fig: Figure) -> str:
    """The figure's title and, for each of its charts, a div the page's script draws it into,
    the chart as JSON beside it (every "<" escaped, so no text in it can end the script element)."""
    parts = [f'<figure id="fig-{escape(fig.name)}"><figcaption>{escape(fig.title)}</figcaption>']
    for i, (title, chart) in enumerate(fig.charts):
        name = escape(f"{fig.name}-{i}")
        data = to_json_plotly(chart).replace("<", "\\u003c")
        parts.append(f'{f"<h5>{escape(title)}</h5>" if title else ""}<div class="chart" id="chart-{name}" '
                     f'data-chart="{name}"></div><script type="application/json" id="data-{name}">{data}</script>')
    return "".join(parts) + "</figure>"


def _wide(table: str) -> str:
    """A table in a box that scrolls sideways, so a wide one never widens the page."""
    return f'<div class="wide">{table}</div>'


def _fields_table(fields: list[Field], rows: list[dict[str, Any]]) -> str:
    """The rows under the fields some row has (as the terminal's tables)."""
    fields = present(fields, rows)
    head = "".join(f"<th>{escape(f.header)}</th>" for f in fields)
    body = "".join("<tr>" + "".join(f'<td class="{"text" if f.name else ""}">{escape(f.value(r))}</td>' for f in fields)
                   + "</tr>" for r in rows)
    return _wide(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def run_id_tails(run_ids: list[str]) -> dict[str, str]:
    """Each run id by its last `-`-parts, as few as tell every run of the table apart
    (`…a3f1`, or `…0800-sgd-0`), the same number for all: its head is the date and time, the
    same for a whole sweep, and its device, model, method and backend have columns of their own.
    An id no shorter tail tells apart is shown whole."""
    ids = sorted(set(run_ids))
    most = max((len(i.split("-")) for i in ids), default=1)
    for k in range(1, most):
        tails = {i: "-".join(i.split("-")[-k:]) for i in ids}
        if len(set(tails.values())) == len(ids):
            return {i: tail if tail == i else "…" + tail for i, tail in tails.items()}
    return {i: i for i in ids}  # all their parts: each whole


def _run_id(run_id: str, tails: dict[str, str]) -> str:
    """A run id by the tail that tells it apart (run_id_tails), whole on hover."""
    return f'<td class="text id" title="{escape(run_id)}">{escape(tails.get(run_id, run_id))}</td>'


def _by_device(groups: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        out.setdefault(g["device"], []).append(g)
    return out


def _study(report: Report) -> tuple[str, set[str]]:
    """The study's tables, per device and model its Pareto frontier (and held-out curves) once
    above the tables of its settings (backend, run shape); and the names of the figures shown here."""
    if report.study is None:
        return "", set()
    parts = [
        '<h2 id="study">Study: each method against the baseline</h2>',
        f'<p class="note">{escape(study_legend(report.study, report.carbon))}</p>',
    ]
    charts = {f.name: f for f in report.figures if f.name.startswith(("pareto_", "learning_"))}
    shown: set[str] = set()
    by_model: dict[tuple[str, str], list[tuple[Setting, list[dict[str, Any]]]]] = {}
    for key, rows in settings(report.study).items():
        by_model.setdefault((key[0], key[1]), []).append((key, rows))
    for (device, model), members in by_model.items():
        parts.append(f"<h3>{escape(device)} / {escape(model)}</h3>")
        for kind in ("pareto", "learning"):  # the held-out curves, where runs evaluated, below the frontier
            fig = charts.get(safe_name(kind, device, model))
            if fig:
                parts.append(_chart(fig))
                shown.add(fig.name)
        parts += [f"<h4>{escape(setting_title(key, rows))}</h4>{_fields_table(STUDY_IDENT + study_fields(rows), rows)}"
                  for key, rows in members]
    notes = report.study_notes + unreached_notes(report.study)
    if notes:
        parts.append('<ul class="note">' + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
    return "".join(parts), shown


def _axes(report: Report) -> tuple[str, set[str]]:
    """What each swept axis did (report.axes): its tables, then its charts; and the figures shown here."""
    if not any(report.axes.values()):
        return "", set()
    parts = ['<h2 id="axes">Axes: threads, lr x weight decay, batch size</h2>',
             f'<p class="note">{escape(SCALING_CAPTION)}</p>']
    parts += [(f"<h4>{escape(s.title)}</h4>" if s.title else "") + _fields_table(s.ident + s.figures, s.rows)
              for s in axis_sections(report.axes)]
    figures = [f for f in report.figures if f.name == "axes"]
    return "".join(parts + [_chart(f) for f in figures]), {f.name for f in figures}


def _links(figures: list[Figure]) -> str:
    """Links to the figures, folded where there are many (a chart or two per run)."""
    links = "".join(f'<li><a href="#fig-{escape(f.name)}">{escape(f.title)}</a></li>' for f in figures)
    items = f"<ul>{links}</ul>"
    return items if len(figures) <= 4 else f"<details><summary>{len(figures)} charts</summary>{items}</details>"


def _contents(report: Report, notes: bool, studied: list[Figure], figures: list[Figure]) -> str:
    """The table of contents: each section, and each figure by its title (the file is long)."""
    sections = [("study", "Study", report.study is not None, studied),
                ("axes", "Axes", any(report.axes.values()), []), ("configurations", "Configurations", True, []),
                ("notes", "Notes", notes, []), ("runs", "Runs", True, []),
                ("figures", "Figures", bool(figures), figures)]
    items = [f'<li><a href="#{anchor}">{name}</a>{_links(figs) if figs else ""}</li>'
             for anchor, name, shown, figs in sections if shown]
    return f'<nav><h2>Contents</h2><ul class="note">{"".join(items)}</ul></nav>'


def render_html(report: Report, title: str = "edgebench report") -> str:
    columns = visible_columns(report.rows)
    head = "".join(f'<th class="{"est" if c.estimated else ""}">{escape(c.header)}</th>' for c in columns)
    body = []
    tails = run_id_tails([cell(row, c) for row in report.rows for c in columns if c.key == "run_id"])
    for row in report.rows:
        cells = "".join(
            _run_id(cell(row, c), tails) if c.key == "run_id" else
            f'<td class="{"text" if c.fmt is str else ""}{" est" if c.estimated else ""}">{escape(cell(row, c))}</td>'
            for c in columns)
        css = "" if row.get("status") == "ok" else ' class="failed"'
        body.append(f'<tr id="run-{escape(row["device"])}-{escape(row["run_id"])}"{css}>{cells}</tr>')
    configurations = "".join(
        f"<h3>{escape(device)}</h3>" + _fields_table(with_shape(REPORT_IDENT, mine) + REPORT_FIGURES, mine)
        for device, mine in _by_device(report.groups).items())
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.unfinished + report.notes + alignment_notes(report.runs)
                    + emulated_notes(report.runs))
    study, in_study = _study(report)
    axes, in_axes = _axes(report)
    studied = [f for f in report.figures if f.name in in_study]
    figures = [f for f in report.figures if f.name not in in_study | in_axes]  # each chart once
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{STYLE}</style>
<script>{CATCH}</script>
<script>{get_plotlyjs()}</script></head>
<body>
<div id="report-errors" hidden></div><div id="report-checks" hidden></div>
<h1>{escape(title)}</h1>
<p class="note">{len(report.rows)} runs in {len(report.groups)} configurations, made {stamp}. Columns and figures
marked <span class="est">est.</span> or ESTIMATED come from a power model, not a measurement; CO2e is always an
estimate: energy x the grid's carbon intensity, {escape(report.carbon.what)}. Charts: hover a point,
bar or line for what it is; drag to zoom (double-click: back); click a legend entry to hide it.</p>
{_contents(report, bool(notes), studied, figures)}
{study}
{axes}
<h2 id="configurations">Configurations</h2>
<p class="note">{escape(LEGEND + heldout_legend(report.groups) + carbon_legend(report.groups, report.carbon))}</p>
{configurations}
{f'<h2 id="notes">Notes</h2><ul class="note">{notes}</ul>' if notes else ''}
<h2 id="runs">Runs</h2>
<p class="note">One row per run. {escape(FRONTIER_LEGEND)}</p>
{_wide(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")}
{'<h2 id="figures">Figures</h2>' if figures else ''}
{"".join(_chart(f) for f in figures)}
<script>{DRAW % json.dumps(CONFIG)}</script>
</body></html>
"""
