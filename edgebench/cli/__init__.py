"""The `edgebench` command. Thin: each room defines its commands in its own `commands.py`."""

from __future__ import annotations

import importlib

import click

from edgebench import __version__

# Each module listed here defines click commands and a `COMMANDS` list of them.
COMMAND_MODULES = [
    "edgebench.model.commands",  # models
    "edgebench.runner.commands",  # bench
    "edgebench.methods.commands",  # methods, predict
    "edgebench.devices.commands",  # devices, lab
    "edgebench.fleet.commands",  # deploy, collect, status
    "edgebench.telemetry.commands",  # sensors
    "edgebench.results.commands",  # ingest, import-trace
    "edgebench.report.commands",  # report
    "edgebench.live.commands",  # live
    "exporters.commands",  # export
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="edgebench")
def cli() -> None:
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


for _name in COMMAND_MODULES:
    for _command in importlib.import_module(_name).COMMANDS:
        cli.add_command(_command)


def main() -> None:
    cli(prog_name="edgebench")


if __name__ == "__main__":
    main()
