"""`edgebench report`: tables, Pareto frontiers and timelines from the results store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from edgebench.results import STORE_DEFAULT_HELP, default_store

if TYPE_CHECKING:
    from edgebench.results.store import Store

FORMATS = ["term", "html", "png", "csv", "json"]


def open_store(path: Path) -> Store:
    """The store read-only, with an error that says what to do when it is missing or busy."""
    import duckdb

    from edgebench.results.store import Store

    try:
        return Store(path, read_only=True)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    except duckdb.IOException as exc:
        raise click.ClickException(f"{path}: cannot open the store ({exc}); is a collect still writing to it?") from exc


@click.command("report")
@click.option("--store", "store_path", type=click.Path(path_type=Path), default=None,
              help=f"The results store (DuckDB file). Default: {STORE_DEFAULT_HELP}: every run of yours, "
                   "from any folder.")
@click.option("--device", help="Only runs of this device.")
@click.option("--model", help="Only runs of this model config.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="term", show_default=True,
              help="term: tables in the terminal; html: one self-contained file that opens offline, its charts "
                   "interactive (hover, zoom, a legend that hides what it names); png: one file per figure; "
                   "csv/json: one row per run (json adds the configurations).")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json (for scripts).")
@click.option("--out", type=click.Path(path_type=Path),
              help="Output file (html, csv, json) or folder (png). Defaults: report.html, report/, stdout.")
@click.option("--study", is_flag=True,
              help="The study table: per device, model and backend, each method's peak memory, time per step "
                   "and energy per step as ratios to --baseline, with n and spread, and its peak beside the "
                   "memory model's prediction and that one's error (in HTML, each device and model's Pareto "
                   "frontier once, above its tables).")
@click.option("--baseline", default="sgd", show_default=True, help="The method --study compares against.")
def report_command(store_path: Path | None, device: str | None, model: str | None, fmt: str, as_json: bool,
                   out: Path | None, study: bool, baseline: str) -> None:
    """Report the runs in the store: per device, one row per configuration with its key
    figures (model, method, backend, status, n, peak memory (the worker's kernel RSS) beside
    the memory model's predicted peak and its error, the device's RAM at peak against its
    limit, time per step, energy per step, loss first->last and its change) laid out to fit
    the terminal (a card per configuration when a table would not); the Pareto frontier of
    memory against time per step for each device and model (energy as colour, device RAM as
    a line, error bars), memory and power/temperature timelines per run, and a comparison
    across devices.

    Repeats of a configuration (device, model, method, backend, and the run shape: batch,
    steps, text length, image size, data) fold into one row: each figure is the median of
    its runs with [min-max] and n. The frontier (★) takes only configurations whose loss
    fell. A run that other processes disturbed (they took >10% of the CPU) is flagged "!".
    Estimated figures
    (from a device's power model) are marked "est"/"ESTIMATED" in tables and plots and
    carry `_est` in CSV/JSON column names. docs/figures.md defines every figure.

    \b
    Examples:
      edgebench report
      edgebench report --device lab-pi4 --format html --out pi4.html
      edgebench report --format png --out figures/
      edgebench report --json > runs.json
      edgebench report --study --baseline sgd --format html --out study.html
    """
    from edgebench.report import build, export

    fmt = "json" if as_json else fmt
    if store_path is None:
        from edgebench.results.merge import older_store_note

        store_path = default_store()
        note = older_store_note(store_path)
        if note:
            click.secho(note, fg="yellow", err=True)
    with open_store(store_path) as store:
        report = build.collect(store, device=device, model=model, figures=fmt in ("html", "png"),
                               baseline=baseline if study else None, interactive=fmt == "html")
    if not report.rows:
        asked = " and ".join(f"{k} {v!r}" for k, v in (("device", device), ("model", model)) if v)
        raise click.ClickException(f"{store_path}: {f'no runs of {asked}' if asked else 'no runs yet'}; "
                                   "ingest some with `edgebench collect` or `edgebench ingest RUN_DIR`")
    if fmt == "term":
        from edgebench.terminal import console as terminal

        console = terminal()  # piped: tables as wide as their rows
        if study:
            from edgebench.report.study import study_terminal

            assert report.study is not None  # collect makes it when given a baseline
            console.print(study_terminal(report.study, report.study_notes, width=console.width))
        else:
            from edgebench.report.tables import terminal_report

            console.print(terminal_report(report.rows, report.runs, width=console.width))
    elif fmt in ("csv", "json"):
        if study:
            from edgebench.report.study import study_csv, study_json

            assert report.study is not None  # collect makes it when given a baseline
            text = study_csv(report.study) if fmt == "csv" else study_json(report.study, report.study_notes)
        else:
            text = export.to_csv(report.rows) if fmt == "csv" else export.to_json(report.rows, report.groups)
        if out:
            out.write_text(text)
            click.echo(f"wrote {out} ({len(report.rows)} runs)", err=True)
        elif sys.stdout.isatty():  # read on a terminal: what devices wrote stays text (edgebench.untrusted)
            from edgebench.untrusted import printable

            sys.stdout.write(printable(text))
        else:
            sys.stdout.write(text)
    elif fmt == "html":
        from edgebench.report.html import render_html

        out = out or Path("report.html")
        out.write_text(render_html(report), encoding="utf-8")
        click.echo(f"wrote {out} ({len(report.rows)} runs, {len(report.figures)} figures)")
    else:
        out = out or Path("report")
        out.mkdir(parents=True, exist_ok=True)
        for fig in report.figures:
            (out / f"{fig.name}.png").write_bytes(fig.png)
        click.echo(f"wrote {len(report.figures)} PNG files to {out}/")
