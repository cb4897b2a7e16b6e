"""Tables that read at any terminal width (a tmux pane of 80 columns too): the full table when
it fits; else a compact one (short headers, their units in one line below it), leaving out, in
a stated order, figures a narrow window can spare (that line names them; --json has them all);
only when not even that fits, one card per row, its names on the first line and one figure a
line below. Several tables (a report's devices, a study's settings) take the same layout, so a
reader never meets tables and cards side by side. Piped (stdout not a terminal: a file, `| less`,
a CI log) the width is $COLUMNS where it is a number of at least MIN_WIDTH, else 80
(`output_width`): the same layouts as a terminal that wide, never rich's own guess (300 columns,
or the terminal stderr sits on). Nothing is cut but a value longer than VALUE_CHARS (a device's
20 MB string), and no name sits apart from its figures; a name wraps after a `+` or at a space
(`Name`: `lora+ckpt+` / `bf16`), and only a word longer than its column is folded. Prose wraps at
spaces (`wrapped`, `echo`). Used by every command that prints a table of rows. Every text is
shown printable only (edgebench.untrusted: a board's strings may carry escape sequences), never
as rich markup."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from edgebench.untrusted import printable

EMPTY = ("", "-")  # a figure a row does not have
VALUE_CHARS = 300  # longer than any name edgebench makes (a model's path, a run id)
DEFAULT_WIDTH = 80  # piped without $COLUMNS: what a pager, a CI log or an 80-column terminal shows
MIN_WIDTH = 20  # a $COLUMNS below this is no width to lay tables out in (80 instead)
MEASURE_WIDTH = 10_000  # wide enough to measure a table's rows unwrapped


@dataclass(frozen=True)
class Field:
    header: str  # short, with the unit
    label: str  # spelt out, for cards
    value: Callable[[dict[str, Any]], str]
    name: bool = False  # a name: left-aligned, never shortened
    short: str = ""  # the compact table's header; its unit goes to the line below the table
    unit: str = ""  # what `short` leaves out, e.g. "MiB"
    drop: int = 0  # narrow windows leave figures out by this rank, 1 first (0: never)


@dataclass(frozen=True)
class Section:
    """One table of a command's output: its rows under a title, a caption below."""

    title: str | None
    ident: list[Field]
    figures: list[Field]
    rows: list[dict[str, Any]]
    caption: str | None = None


def output_width(environ: Mapping[str, str] | None = None) -> int:
    """The width of output that goes to no terminal: $COLUMNS where it is a whole number of at
    least MIN_WIDTH, else DEFAULT_WIDTH (80)."""
    columns = (os.environ if environ is None else environ).get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) >= MIN_WIDTH else DEFAULT_WIDTH


def console() -> Console:
    """Where a command prints its tables: the terminal at its width; piped, `output_width`
    (80 unless $COLUMNS says otherwise), laid out as a terminal that wide would be."""
    out = Console()
    return out if out.is_terminal else Console(width=output_width())


def width() -> int:
    """The width a command's output is laid out for (`console`)."""
    return console().width


def echo(text: str, err: bool = False) -> None:
    """A line of prose wrapped at spaces to the output's width (`wrapped`), as click.echo prints."""
    import click

    click.echo(wrapped(text, width()), err=err)


def wrapped(text: str, width: int) -> str:
    """Prose wrapped at spaces, never inside a word: a path or a command longer than the
    window stays whole (and copyable) on its own line."""
    return "\n".join(textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False,
                                   subsequent_indent=" " * (len(line) - len(line.lstrip(" "))))
                     for line in text.split("\n"))


_PIECE = re.compile(r"[^\s+]*\+|\S+\s*|\s+")  # a name's pieces: up to a `+`, else a word and its spaces


class Name:
    """A name in a table cell that wraps after a `+` or at a space, never inside a word
    (`lora+ckpt+` / `frozen-int8`, where rich would fold it at the column's edge): it measures
    as narrow as its longest piece, and only a piece wider than its column is folded."""

    def __init__(self, text: Text) -> None:
        self.text = text

    def _pieces(self) -> list[Text]:
        plain = self.text.plain
        ends = [m.end() for m in _PIECE.finditer(plain)]
        return list(self.text.divide(ends[:-1])) if plain else [self.text]

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        longest = max((cell_len(p.plain.rstrip()) for p in self._pieces()), default=0)
        return Measurement(longest, cell_len(self.text.plain)).with_maximum(options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = max(1, options.max_width)
        lines = [self.text.blank_copy()]
        for piece in self._pieces():
            if lines[-1].plain and cell_len(lines[-1].plain) + cell_len(piece.plain.rstrip()) > room:
                lines.append(self.text.blank_copy())
            lines[-1].append_text(piece)
        for line in lines:
            line.rstrip()
        yield self.text.blank_copy("\n").join(lines)


def narrowed(table: Table, width: int, names: Iterable[int] = (0,)) -> Table:
    """A table of names and figures (its names `Name`s) fitted into `width` the way a reader
    wants it, not rich's way (narrowing the widest column first, which folds names mid-word):
    while it is too wide, the other columns narrow first, widest first, each at most down to its
    widest value or the longest word of its header (the header wraps at spaces), until the names
    have all they need or a third of the width; the names take the room left."""
    if fits(table, width):
        return table
    measure = Console(width=MEASURE_WIDTH)

    def widest(cells: Iterable[Any], least: bool = False) -> int:
        sizes = [Measurement.get(measure, measure.options, c) for c in cells]
        return max((m.minimum if least else m.maximum for m in sizes), default=0)

    pad = int(table.padding[1]) + int(table.padding[3])
    natural = [widest([c.header, *c.cells]) for c in table.columns]
    floor = [max(widest(c.cells), _longest_word(c.header)) for c in table.columns]
    edges = (2 if table.box and table.show_edge else 0) + (len(natural) - 1 if table.box else 0)  # its rules
    names = [i for i in names if i < len(natural)]
    least = sum(max(widest(table.columns[i].cells, least=True), _longest_word(table.columns[i].header))
                for i in names)  # each name's longest piece
    need = min(sum(natural[i] for i in names), max(least, width // 3))
    widths = {i: w for i, w in enumerate(natural) if i not in names}

    def excess() -> int:
        return edges + pad * len(natural) + need + sum(widths.values()) - width

    while excess() > 0:
        wide = [i for i in widths if widths[i] > floor[i]]
        if not wide:
            break
        i = max(wide, key=lambda k: widths[k])
        widths[i] = max(floor[i], widths[i] - excess())
    for i, w in widths.items():
        if w < natural[i]:
            table.columns[i].max_width = w
    return table


def _longest_word(header: Any) -> int:
    text = header.plain if isinstance(header, Text) else str(header)
    return max((cell_len(w) for w in text.split()), default=0)


def _failed(row: dict[str, Any]) -> bool:
    """A row whose `status` is not ok (rows without one are never failed): drawn red."""
    return not str(row.get("status", "ok")).startswith("ok")


def _text(value: Any, **style: Any) -> Text:
    return Text(printable(value, newlines=False), overflow="fold", **style)


def _value(f: Field, row: dict[str, Any]) -> str:
    """A row's value for a field, printable and at most VALUE_CHARS long."""
    return printable(f.value(row), newlines=False, limit=VALUE_CHARS)


def _table(fields: list[Field], rows: list[dict[str, Any]], compact: bool = False) -> Table:
    """The rows under `fields`; compact: short headers, one space between columns, none around."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0) if compact else (0, 1), show_edge=not compact,
                  header_style="bold")
    for f in fields:
        table.add_column(f.short or f.header if compact else f.header, justify="left" if f.name else "right",
                         overflow="fold")
    for row in rows:
        table.add_row(*[_text(_value(f, row)) for f in fields], style="red" if _failed(row) else None)
    return table


def fits(renderable: RenderableType, width: int) -> bool:
    """Whether `renderable` fits `width` columns without wrapping a cell."""
    return Console(width=MEASURE_WIDTH).measure(renderable).maximum <= width


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
                parts.append(Padding(_text(f"{f.label}: {value}"), (0, 0, 0, 4), expand=False))
    return Group(*parts)


def _units(fields: list[Field], left_out: list[Field]) -> list[str]:
    """The compact table's legend: one line of each short header's unit (`peak, est.: MiB; t:
    s/step`), and one naming the figures this width left out."""
    by_unit: dict[str, list[str]] = {}
    for f in fields:
        if f.unit:
            by_unit.setdefault(f.unit, []).append(f.short or f.header)
    lines = ["; ".join(f"{', '.join(names)}: {unit}" for unit, names in by_unit.items())]
    if left_out:
        lines.append("left out at this width: " + ", ".join(f.header for f in left_out)
                     + " (a wider window shows them; --json has every figure)")
    return [line for line in lines if line]


def _layout(section: Section, level: int) -> tuple[Table, list[str]]:
    """The section's table at `level`: 0 the full one, 1 compact, 1 + k compact without the
    figures of drop rank 1 to k; with the legend that goes below it."""
    if level == 0:
        return _table(section.ident + section.figures, section.rows), []
    kept = [f for f in section.figures if not 0 < f.drop < level]
    left_out = [f for f in section.figures if f not in kept]
    fields = section.ident + kept
    return _table(fields, section.rows, compact=True), _units(fields, left_out)


def present(fields: list[Field], rows: list[dict[str, Any]]) -> list[Field]:
    """The fields some row has a value for: a table shows no column that is empty throughout
    (held-out figures without evaluations, energy without power)."""
    return [f for f in fields if any(f.value(row) not in EMPTY for row in rows)]


def fitted_sections(sections: list[Section], width: int) -> list[RenderableType]:
    """Each section, title above and caption below (wrapped whole), all in one layout: the
    widest tables that all fit `width`, else cards for all. A figure no row of a section has is
    left out of it."""
    sections = [replace(s, figures=present(s.figures, s.rows)) for s in sections]
    ranks = max((f.drop for s in sections for f in s.figures), default=0)
    chosen: list[tuple[Table, list[str]]] | None = None
    for level in range(ranks + 2):
        laid = [_layout(s, level) for s in sections]
        if all(fits(table, width) for table, _ in laid):
            chosen = laid
            break
    parts: list[RenderableType] = []
    for i, s in enumerate(sections):
        body, legend = chosen[i] if chosen else (_cards(s.ident, s.figures, s.rows), [])
        parts += [_text(s.title, style="bold")] if s.title else []
        parts += [body, *(_text(line, style="dim") for line in legend)]
        parts += [_text(s.caption, style="dim")] if s.caption else []
    return parts


def fitted(title: str | None, ident: list[Field], figures: list[Field], rows: list[dict[str, Any]],
           width: int, caption: str | None = None) -> list[RenderableType]:
    """One section laid out to fit `width` (fitted_sections)."""
    return fitted_sections([Section(title, ident, figures, rows, caption)], width)
