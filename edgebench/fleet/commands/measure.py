"""`edgebench measure -- CMD ...`: any command measured as a run on this host (fleet/measure.py),
its one-line summary or JSON, and an exit code that says whether it ended ok."""

from __future__ import annotations

import json

import click

from edgebench.cli_types import FinitePositive, FiniteRange
from edgebench.results import STORE_DEFAULT_HELP, runs_dir_for, store_for
from edgebench.terminal import echo
from edgebench.untrusted import printable

# What running a command on a device would need that edgebench does not have yet: said as --device's refusal
NO_DEVICE = ("measure runs the command on this host only (--device local): a device would need deploy to ship the "
             "command and its files and start it under the device's supervisor, and collect to bring its run back, "
             "which edgebench does not do for a command yet; run it on the device with `python -m edgebench.runner` "
             "there, or measure it here")


@click.command("measure", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--device", default="local", show_default=True,
              help="Where to run: `local`, this host (a device's commands are not supported yet).")
@click.option("--name", default=None,
              help="The run's name in the store and the report (its `model`); default: the command's basename.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="Samples in one marked step: samples/s and energy per sample count them.")
@click.option("--timeout", "timeout_s", default=None, type=FinitePositive(),
              help="Wall-clock limit, seconds: past it the command is killed and the run ends `timeout`.")
@click.option("--sample-hz", default=20.0, show_default=True, type=FiniteRange(1, 100), help="Telemetry sampling rate.")
@click.option("--runs-dir", default=None, type=click.Path(file_okay=False),
              help="Folder for the run directory (its store inside it). Default: beside your store.")
@click.option("--store", default=None, type=click.Path(dir_okay=False),
              help=f"Results store to ingest into (default: RUNS_DIR/edgebench.duckdb with --runs-dir, else "
                   f"{STORE_DEFAULT_HELP}); see `edgebench report`.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's figures as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def measure(device: str, name: str | None, batch_size: int, timeout_s: float | None, sample_hz: float,
            runs_dir: str | None, store: str | None, as_json: bool, command: tuple[str, ...]) -> None:
    """Measure any command (your own training script) as a run: `edgebench measure -- python3 train.py`.

    The command runs under the same supervisor, sampler and cgroup as bench's runs; its run
    directory (samples, events, result) is recorded and ingested, so `edgebench report` shows it
    beside edgebench's runs (method `measure`). Its status: ok for exit code 0, error (with the
    code) for any other, oom/killed/timeout/interrupted as for any run. Steps the script marks
    with `from edgebench import measure; with measure.step(): ...` (or begin_window/end_window)
    give step time, energy per step and the frontier; without marks, whole-run figures only.
    Exit 1 when the command did not end ok, 130 after a Ctrl-C. docs/interfaces.md: "edgebench measure".
    """
    from edgebench.fleet.measure import check_command, measure_on_host, measure_spec, summary

    if device != "local":
        raise click.BadParameter(NO_DEVICE, param_hint="--device")
    argv = check_command(command)
    spec = measure_spec(argv, name, batch_size, timeout_s, sample_hz)
    measured = measure_on_host(spec, runs_dir_for(runs_dir), store_for(store, runs_dir))
    if as_json:
        click.echo(json.dumps({**measured.figures, "run_dir": str(measured.run_dir), "store": str(measured.store),
                               "duration_s": measured.duration_s, "command": argv}, indent=2, default=str))
    else:
        echo(printable(summary(measured)))  # the command's name is the user's: printable, wrapped to the width
    if measured.interrupted:
        raise SystemExit(130)
    if measured.figures["status"] != "ok":
        raise SystemExit(1)
