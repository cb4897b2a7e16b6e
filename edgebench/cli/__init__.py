"""The `edgebench` command: the host's entry point.

Commands of the host rooms live in each room's `commands.py` (the fleet's in `fleet/commands/`,
one module a command); commands that present the device-side rooms (models, methods, sensors)
live here in `cli/`, so the device side never imports click. Every command is imported and
registered below, in the order `--help` lists them.

`main` is the one place errors reach the user: a user error (a bad name, a damaged file,
an unreachable device: any EdgebenchError) is one line and exit code 2, Ctrl-C is exit code
130, anything else one line and exit code 1; `edgebench --debug ...` (or EDGEBENCH_DEBUG=1) shows the traceback.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback

import click

from edgebench import __version__
from edgebench.cli.methods import methods_command, predict_command
from edgebench.cli.models import models_command
from edgebench.cli.sensors import sensors_command
from edgebench.devices.commands import devices, lab
from edgebench.errors import EdgebenchError
from edgebench.fleet.commands.bench import bench
from edgebench.fleet.commands.calibrate import calibrate
from edgebench.fleet.commands.collect import collect
from edgebench.fleet.commands.deploy import deploy
from edgebench.fleet.commands.measure import measure
from edgebench.fleet.commands.status import status
from edgebench.fleet.export import export_command
from edgebench.live.commands import live_command
from edgebench.report.commands import report_command
from edgebench.results.commands import import_trace_command, ingest_command, runs_group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="edgebench")
@click.option("--debug", is_flag=True, help="Show the Python traceback of an error.")
def cli(debug: bool) -> None:
    """edgebench: what does each memory-efficient way of computing gradients really cost
    on this device? Fine-tunes nanoVLM with each method and measures RAM, time, power,
    energy and temperature.

    \b
    Quick start (no hardware needed):
      edgebench bench --device local --model tiny
      edgebench methods
      edgebench lab up && edgebench deploy --device lab-pi4 && edgebench collect
      edgebench report
    """
    if debug:
        os.environ["EDGEBENCH_DEBUG"] = "1"


for _command in (models_command, bench, measure, methods_command, predict_command, devices, lab, deploy, collect,
                 status, sensors_command, ingest_command, import_trace_command, runs_group, report_command,
                 live_command, export_command):
    cli.add_command(_command)
devices.add_command(calibrate)  # measured by what the fleet ships to the device (fleet/calibrate.py)


EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)  # the disk's fault, said as is


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the input or the environment is wrong, not edgebench: their
    message names the thing and the fix, so the user sees it alone. edgebench's own all
    subclass EdgebenchError (edgebench/errors.py); the rest are click's, DuckDB's and the
    file system's."""
    import duckdb

    return (EdgebenchError, click.ClickException, duckdb.Error,
            FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _one_line(exc: BaseException) -> str:
    """The message on one line, without control characters (it may quote what a device said)."""
    from edgebench.untrusted import printable

    text = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    return " ".join(printable(text).split()) or type(exc).__name__


def refuse_empty_values(args: list[str]) -> None:
    """An empty value is never "not given": `--runs-dir ''` or `--target=` from a script whose
    variable was unset would otherwise run with the default. One check for every option."""
    if "--" in args:  # what follows is a measured command's own (edgebench measure), not edgebench's
        args = args[:args.index("--")]
    for before, arg in zip(["", *args], args):
        option = before if arg == "" and before.startswith("--") else arg[:-1] if arg.startswith("--") and \
            arg.endswith("=") else None
        if option:
            raise click.UsageError(f"{option}: an empty value; give one, or leave {option} out for its default")


def main(argv: list[str] | None = None) -> None:
    """Runs the CLI; every error ends here as one line on stderr and an exit code."""
    try:
        refuse_empty_values(sys.argv[1:] if argv is None else argv)
        code = cli.main(args=argv, prog_name="edgebench", standalone_mode=False)
    except (KeyboardInterrupt, click.Abort):
        click.echo("edgebench: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.UsageError as exc:  # click's wording names the option; --help shows the choices
        where = exc.ctx.command_path if exc.ctx is not None else "edgebench"
        click.echo(f"error: {_one_line(exc)} (see `{where} --help`)", err=True)
        sys.exit(EXIT_USER_ERROR)
    except Exception as exc:
        if os.environ.get("EDGEBENCH_DEBUG") == "1":
            traceback.print_exc()
        if isinstance(exc, _user_errors()) or (isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS):
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_USER_ERROR)
        click.echo(f"edgebench: internal error: {type(exc).__name__}: {_one_line(exc)} "
                   "(run `edgebench --debug ...` for the traceback, and please report it)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
