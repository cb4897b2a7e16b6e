"""Tables that read at any terminal width (a tmux pane of 80 columns too): one table when
it fits, else one card per row, its names on the first line and one figure a line below.
Nothing is cut but a value longer than VALUE_CHARS (a device's 20 MB string), and no name sits
apart from its figures; a word longer than the window is the only thing folded. Used by every
command that prints a table of rows. Every text is shown printable only (edgebench.untrusted: a
board's strings may carry escape sequences), never as rich markup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from edgebench.untrusted import printable

EMPTY = ("", "-")  # a figure a row does not have
VALUE_CHARS = 300  # longer than any name edgebench makes (a model's path, a run id)


@dataclass(frozen=True)
class Field:
    header: str  # short, with the unit
    label: str  # spelt out, for cards
    value: Callable[[dict[str, Any]], str]
    name: bool = False  # a name: left-aligned, never shortened


def _failed(row: dict[str, Any]) -> bool:
    """A row whose `status` is not ok (rows without one are never failed): drawn red."""
    return not str(row.get("status", "ok")).startswith("ok")


def _text(value: Any, **style: Any) -> Text:
    return Text(printable(value, newlines=False), overflow="fold", **style)


def _value(f: Field, row: dict[str, Any]) -> str:
    """A row's value for a field, printable and at most VALUE_CHARS long."""
    return printable(f.value(row), newlines=False, limit=VALUE_CHARS)


def _table(fields: list[Field], rows: list[dict[str, Any]]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), header_style="bold")
    for f in fields:
        table.add_column(f.header, justify="left" if f.name else "right", overflow="fold")
    for row in rows:
        table.add_row(*[_text(_value(f, row)) for f in fields], style="red" if _failed(row) else None)
    return table


def fits(renderable: RenderableType, width: int) -> bool:
    """Whether `renderable` fits `width` columns without wrapping a cell."""
    return Console(width=10_000).measure(renderable).maximum <= width


def _cards(ident: list[Field], figures: list[Field], rows: list[dict[str, Any]]) -> Group:
    """One block per row: `#i` and its names (`: status` when it has one) on the first line,
    then one figure a line (those it lacks left out)."""
    parts: list[RenderableType] = []
    for i, row in enumerate(rows, 1):
        head = " / ".join(_value(f, row) for f in ident if f.name and f.header != "status")
        status = next((_value(f, row) for f in ident if f.header == "status"), "")
        extra = ", ".join(f"{f.label} {_value(f, row)}" for f in ident if not f.name)
        parts.append(_text(f"#{i} {head}" + (f": {status}" if status else "") + (f", {extra}" if extra else ""),
                           style="red" if _failed(row) else ""))
        for f in figures:
            value = _value(f, row)
            if value not in EMPTY:  # indented as a block: a wrapped figure stays under its card
                parts.append(Padding(_text(f"{f.label}: {value}"), (0, 0, 0, 4)))
    return Group(*parts)


def fitted(title: str | None, ident: list[Field], figures: list[Field], rows: list[dict[str, Any]],
           width: int, caption: str | None = None) -> list[RenderableType]:
    """One table if it fits `width`, else one card per row (its names, then its figures);
    the title above and the caption below, wrapped whole. A figure no row has is left out."""
    figures = [f for f in figures if any(f.value(row) not in EMPTY for row in rows)]
    head: list[RenderableType] = [_text(title, style="bold")] if title else []
    tail: list[RenderableType] = [_text(caption, style="dim")] if caption else []
    one = _table(ident + figures, rows)
    return head + [one if fits(one, width) else _cards(ident, figures, rows)] + tail
