"""The devices a fleet command is aimed at: those named on its command line, checked before
any is asked, else every good entry of the inventory."""

from __future__ import annotations

import click

from edgebench.fleet.commands.output import echo_err


def device_names(given: tuple[str, ...], with_local: bool) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The devices named, or every good inventory device; bad entries come back as errors."""
    from edgebench.devices.inventory import InventoryError, get_device, scan_devices

    if given:
        for name in given:  # refused before any device is asked
            try:
                get_device(name)
            except InventoryError as exc:
                raise click.BadParameter(str(exc), param_hint="--device") from None
        return list(dict.fromkeys(given)), {}
    try:
        found, problems = scan_devices()
    except InventoryError as exc:
        raise click.ClickException(str(exc)) from None
    for name, why in problems.items():
        echo_err(f"{name}: skipped: {why}")
    names = [d.name for d in found if with_local or d.name != "local"]
    return names, {name: {"error": why} for name, why in problems.items()}
