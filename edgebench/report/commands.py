"""`edgebench report`: tables, Pareto frontiers and timelines from the results store."""

from __future__ import annotations

from pathlib import Path

import click

from edgebench.cli_types import GramsPerKwh
from edgebench.figures.carbon import DEFAULT_G_PER_KWH, ENV, CarbonIntensityError, carbon_intensity
from edgebench.results import STORE_DEFAULT_HELP, default_store

FORMATS = ["term", "html", "png", "csv", "json"]


def _default_store() -> Path:
    """The user's store, with a warning when an older store (per working folder) is left beside it."""
    from edgebench.results.merge import older_store_note

    store_path = default_store()
    note = older_store_note(store_path)
    if note:
        click.secho(note, fg="yellow", err=True)
    return store_path


@click.command("report")
@click.option("--store", "store_path", type=click.Path(path_type=Path), default=None,
              help=f"The results store (DuckDB file). Default: {STORE_DEFAULT_HELP}: every run of yours, "
                   "from any folder.")
@click.option("--device", help="Only runs of this device.")
@click.option("--model", help="Only runs of this model config.")
@click.option("--tag", help="Only runs with this tag (`edgebench runs tag`).")
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
@click.option("--carbon-intensity", "carbon", type=GramsPerKwh(), default=None, metavar="G",
              help="Your grid's carbon intensity in g CO2e per kWh: it turns each energy figure into the "
                   "estimated CO2 beside it (CO2e g, est.). Default: $" + ENV + f" where set, else "
                   f"{DEFAULT_G_PER_KWH:g} (codecarbon's world average).")
def report_command(store_path: Path | None, device: str | None, model: str | None, tag: str | None, fmt: str,
                   as_json: bool, out: Path | None, study: bool, baseline: str, carbon: float | None) -> None:
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
    carry `_est` in CSV/JSON column names. Beside each energy figure its CO2 (grams of CO2e:
    kWh x the grid's carbon intensity, as codecarbon computes it) is always an estimate
    (`co2e_est_...` in CSV/JSON, with the intensity and whether it is the default or yours).
    docs/figures.md defines every figure.

    \b
    Examples:
      edgebench report
      edgebench report --device lab-pi4 --format html --out pi4.html
      edgebench report --format png --out figures/
      edgebench report --json > runs.json
      edgebench report --study --baseline sgd --format html --out study.html
      edgebench report --tag quiet-host --study
      edgebench report --carbon-intensity 56   # France's grid: g CO2e per kWh
    """
    from edgebench.report.output import ReportError, write_report

    fmt = "json" if as_json else fmt
    try:  # the option, else the environment's, else the default
        intensity = carbon_intensity(carbon)
    except CarbonIntensityError as exc:
        raise click.UsageError(str(exc)) from exc
    store_path = store_path or _default_store()
    try:
        said = write_report(store_path, device, model, fmt, out, study, baseline, tag, intensity)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from exc
    if said:
        from edgebench.terminal import echo

        echo(said, err=fmt in ("csv", "json"))  # stdout may be the data itself
