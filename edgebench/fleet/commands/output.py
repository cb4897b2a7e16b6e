"""A fleet command's lines: they may quote what a device said (a status, an error), so they
are printed printable only (edgebench.untrusted)."""

from __future__ import annotations

from typing import Any

import click

from edgebench.untrusted import printable


def echo_err(message: str) -> None:
    """A line on stderr, printable only: the log a command hands the fleet's work, and its notes."""
    click.echo(printable(message), err=True)


def echo(message: str, err: bool = False, **style: Any) -> None:
    """A line that may quote what a device said (a status, an error): printable only."""
    click.secho(printable(message), err=err, **style)
