"""`edgebench report` apart from its options: read the store, build the report and write it
in the asked format, so the command only parses, calls `write_report` and says what was written."""

from __future__ import annotations

import sys
from pathlib import Path

from edgebench.errors import EdgebenchError
from edgebench.figures.carbon import CarbonIntensity
from edgebench.report import build, export
from edgebench.results.store import Store
from edgebench.untrusted import printable


class ReportError(EdgebenchError):
    """The store is missing or busy, or holds no run that matches: the message says what to do."""


def open_store(path: Path) -> Store:
    """The store read-only, with an error that says what to do when it is missing or busy."""
    import duckdb

    try:
        return Store(path, read_only=True)
    except FileNotFoundError as exc:
        raise ReportError(str(exc)) from exc
    except duckdb.IOException as exc:
        raise ReportError(f"{path}: cannot open the store ({exc}); is a collect still writing to it?") from exc


def write_report(store_path: Path, device: str | None, model: str | None, fmt: str, out: Path | None,
                 study: bool, baseline: str, tag: str | None = None,
                 carbon: CarbonIntensity | None = None) -> str | None:
    """Writes the report of the matching runs: term to the terminal, csv/json to `out` or
    stdout, html and png to files; CO2 from the grid's `carbon` intensity (else the default).
    Returns the line that says what was written (None: nothing to say)."""
    with open_store(store_path) as store:
        report = build.collect(store, device=device, model=model, figures=fmt in ("html", "png"),
                               baseline=baseline if study else None, interactive=fmt == "html", tag=tag,
                               carbon=carbon)
    if not report.rows:
        asked = " and ".join(f"{k} {v!r}" for k, v in (("device", device), ("model", model), ("tag", tag)) if v)
        none = f"no runs of {asked}" if asked else "no runs yet"
        raise ReportError(f"{store_path}: {none}; {_how_to_add(store_path)}")
    if fmt == "term":
        _print_terminal(report, study)
        return None
    said = _write(report, fmt, out, study)
    # what the files cannot show: their rows carry each run's status, their charts no point of it
    lines = [said] if said else []
    lines += [printable(n, newlines=False) for n in report.unfinished]
    return "\n".join(lines) or None


def _how_to_add(store_path: Path) -> str:
    """The ways runs reach a store: a quick benchmark on this host, a device's sweep, run files."""
    from edgebench.results import default_store

    mine = store_path.expanduser().resolve() == default_store().expanduser().resolve()
    into = "" if mine else f" (bench, collect and ingest with --store {store_path})"
    return (f"add some{into}: `edgebench bench --device local --model tiny` (a quick benchmark of this host), "
            "`edgebench deploy --device NAME` then `edgebench collect` (a device's sweep), or "
            "`edgebench ingest RUN_DIR` (run directories copied by hand)")


def _write(report: build.Report, fmt: str, out: Path | None, study: bool) -> str | None:
    """Writes the report as a file (csv/json: or to stdout); the line that says what it wrote."""
    if fmt in ("csv", "json"):
        return _write_text(report, fmt, out, study)
    if fmt == "html":
        from edgebench.report.html import render_html

        out = out or Path("report.html")
        out.write_text(render_html(report), encoding="utf-8")
        return f"wrote {out} ({len(report.rows)} runs, {len(report.figures)} figures)"
    out = out or Path("report")
    out.mkdir(parents=True, exist_ok=True)
    for fig in report.figures:
        (out / f"{fig.name}.png").write_bytes(fig.png)
    return f"wrote {len(report.figures)} PNG files to {out}/"


def _print_terminal(report: build.Report, study: bool) -> None:
    from edgebench.terminal import console as terminal

    console = terminal()  # piped: laid out for $COLUMNS, else 80 columns
    if study:
        from edgebench.report.study import study_terminal

        assert report.study is not None  # collect makes it when given a baseline
        console.print(study_terminal(report.study, report.study_notes, width=console.width, carbon=report.carbon,
                                     axes=report.axes))
    else:
        from edgebench.report.tables import terminal_report

        console.print(terminal_report(report.rows, report.runs, width=console.width, carbon=report.carbon))


def _write_text(report: build.Report, fmt: str, out: Path | None, study: bool) -> str | None:
    """CSV or JSON to `out` (returning the line that says so) or to stdout."""
    if study:
        from edgebench.report.study import study_csv, study_json

        assert report.study is not None  # collect makes it when given a baseline
        text = study_csv(report.study) if fmt == "csv" else study_json(report.study, report.study_notes,
                                                                       report.carbon, report.axes)
    else:
        text = export.to_csv(report.rows) if fmt == "csv" else export.to_json(report.rows, report.groups,
                                                                               report.carbon)
    if out:
        out.write_text(text)
        return f"wrote {out} ({len(report.rows)} runs)"
    if sys.stdout.isatty():  # read on a terminal: what devices wrote stays text (edgebench.untrusted)
        text = printable(text)
    sys.stdout.write(text)
    return None
