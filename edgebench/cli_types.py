"""Command-line values checked once, where they enter: the click parameter types every host
command uses for numbers and sizes. click's FloatRange lets NaN through (every comparison with
it is false) and its ints have no upper end; these do not.
"""

from __future__ import annotations

import math
from typing import Any

import click

MAX_SEED = 2**63 - 1  # torch.manual_seed and the native worker's int64
MAX_RAM_BYTES = 2**50  # 1 PiB: more is a typo, not a board


class FiniteRange(click.FloatRange):
    """click.FloatRange that refuses NaN and infinities before its range check."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


class FinitePositive(click.types.FloatParamType):
    """A number more than 0 that is finite (FloatRange lets inf and nan through)."""

    zero = False  # whether 0 is allowed
    said = "more than 0 (e.g. 1e-4)"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not (math.isfinite(number) and (number > 0 or (self.zero and number == 0))):
            self.fail(f"{value!r} is not a finite number {self.said}", param, ctx)
        return number


class FiniteNonNegative(FinitePositive):
    """A finite number of 0 or more (--weight-decay: 0 turns it off)."""

    zero = True
    said = "of 0 or more (e.g. 0.01; 0: no decay)"


class GramsPerKwh(FiniteNonNegative):
    """A grid's carbon intensity, g CO2e per kWh: finite, 0 or more (report --carbon-intensity)."""

    name = "g/kWh"
    said = "of 0 or more: grams of CO2e per kWh (e.g. 475, codecarbon's world average; 0: no emissions)"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number {self.said}", param, ctx)
        return super().convert(value, param, ctx)


class Size(click.ParamType[int, Any]):
    """A size in bytes: plain bytes or with a unit (1GiB, 512MiB, 200MB), more than 0."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from pydantic import ByteSize, TypeAdapter, ValidationError

        if isinstance(value, int):
            return value
        try:
            size = int(TypeAdapter(ByteSize).validate_python(str(value).strip()))
        except ValidationError:
            self.fail(f"{value!r}: write a size like 1GiB or 512MiB", param, ctx)
        if not 0 < size <= MAX_RAM_BYTES:
            self.fail(f"{value!r}: a size must be more than 0 and at most 1 PiB", param, ctx)
        return size


class ListOf(click.ParamType[tuple[Any, ...], Any]):
    """Comma-separated values (`0.01,0.001`), each checked by `item` as a single value is: a tuple
    in the order given. An empty item or one given twice is refused, naming it (a grid of runs
    must not run a shape twice by a typo; --repeats runs one again)."""

    def __init__(self, item: click.ParamType[Any, Any]) -> None:
        self.item = item
        self.name = f"{item.name}[,...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Any, ...]:
        if isinstance(value, tuple):
            return value
        text = str(value)
        values: dict[Any, str] = {}  # each value: its item as written
        for item in (i.strip() for i in text.split(",")):
            if not item:
                self.fail(f"{text!r}: an empty item; write the values with one comma between each (e.g. 1,2)",
                          param, ctx)
            try:
                one = self.item.convert(item, None, None)
            except click.BadParameter as exc:
                self.fail(f"{text!r}: {exc.message}", param, ctx)
            if one in values:
                again = "twice" if values[one] == item else f"twice ({values[one]!r} and {item!r} are one value)"
                self.fail(f"{text!r}: {item!r} is given {again}; give each value once (--repeats runs a shape "
                          "again)", param, ctx)
            values[one] = item
        return tuple(values)


SIZE = Size()
SEED = click.IntRange(0, MAX_SEED)
RAM_BYTES = click.IntRange(1, MAX_RAM_BYTES)
