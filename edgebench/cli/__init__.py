"""The `edgebench` command: the host's entry point.

Commands of the host rooms live in each room's `commands.py`; commands that present the
device-side rooms (models, methods, sensors) live here in `cli/`, so the device side never
imports click. Every command is imported and registered below, in the order `--help` lists them.
"""

from __future__ import annotations

import click

from edgebench import __version__
from edgebench.cli.methods import methods_command, predict_command
from edgebench.cli.models import models_command
from edgebench.cli.sensors import sensors_command
from edgebench.devices.commands import devices, lab
from edgebench.fleet.commands import bench, collect, deploy, status
from edgebench.live.commands import live_command
from edgebench.report.commands import report_command
from edgebench.results.commands import import_trace_command, ingest_command
from exporters.commands import export_command


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


for _command in (models_command, bench, methods_command, predict_command, devices, lab, deploy, collect,
                 status, sensors_command, ingest_command, import_trace_command, report_command, live_command,
                 export_command):
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="edgebench")
