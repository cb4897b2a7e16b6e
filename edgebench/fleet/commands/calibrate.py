"""`edgebench devices calibrate`: a device's rates measured by what the fleet ships and runs
there (fleet/calibrate.py), stored in its inventory entry."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from edgebench.fleet.commands.output import echo_err
from edgebench.untrusted import printable

if TYPE_CHECKING:
    from edgebench.devices.inventory import MeasuredSpeed


@click.command("calibrate", short_help="Measure the step-time model's rates on a device; predict ranks by them.")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the rates stored and where).")
def calibrate(name: str, as_json: bool) -> None:
    """Measure on the device the rates the step-time estimate weighs a step's work by (fp32
    matmul GFLOP/s, bf16 matmul time over fp32's, ns per elementwise pass and per normal sample:
    methods.device_speed), with its own Python and torch, and store them in its inventory entry
    with when and on what CPU, torch and thread count they were measured.

    Until then `predict --device NAME` and deploy's memory preflight rank methods by a reference
    x86 host's rates and leave the bf16 methods unestimated; the ratios between methods differ
    between CPUs. Takes seconds on a board, minutes under the arm64 lab's emulation. Run it
    again after changing the board's torch. On a device without Python (`python: none`: a
    phone) or whose Python has no torch, the native ExecuTorch worker measures them as its runs
    spend time (matmuls as ExecuTorch programs, its own update loop and MeZO generator): the
    host builds it for the device's arch and ships it with its rates programs, as deploy does;
    predict then ranks the native worker's runs there.

    \b
    edgebench devices calibrate orin
    edgebench predict --device orin --model nanovlm-222m
    """
    from edgebench.devices.commands import UserError
    from edgebench.devices.inventory import InventoryError, get_device, inventory_path, read_inventory
    from edgebench.devices.transport import TransportError
    from edgebench.fleet.calibrate import CalibrationError, measure_on, store

    if name not in read_inventory():
        raise UserError(f"{name}: local is this host, whose profile measures its rates here when predict needs them "
                        "(`speed: measure`); nothing to calibrate" if name == "local" else
                        f"{name} is not in {inventory_path()}, so its rates have nowhere to be stored; add it with "
                        f"`edgebench devices add {name} --host HOST`")
    try:
        speed = measure_on(get_device(name), log=echo_err)
        store(name, speed)
    except (InventoryError, CalibrationError, TransportError) as exc:
        raise UserError(printable(str(exc), newlines=False)) from None
    if as_json:
        click.echo(json.dumps({"device": name, "inventory": str(inventory_path()), "speed": speed.model_dump()},
                              indent=2))
        return
    _print_rates(name, speed)


def _print_rates(name: str, speed: MeasuredSpeed) -> None:
    """The rates measured, with what measured them and where they are stored, on one line."""
    from edgebench.devices.inventory import inventory_path

    bf16 = speed.bf16_matmul_cost
    click.echo(printable(
        f"{name}: fp32 matmuls {speed.matmul_gflops:.0f} GFLOP/s, bf16 matmuls "
        f"{'unknown' if bf16 is None else f'{bf16:.2f}x fp32 time'}, {speed.pass_ns:.2f} ns per elementwise pass, "
        f"{speed.normal_ns:.2f} ns per normal sample ({speed.cpu}, {speed.measured_with()}, {speed.threads} threads); "
        f"stored in {inventory_path()}: `edgebench predict --device {name}` ranks by them", newlines=False))
