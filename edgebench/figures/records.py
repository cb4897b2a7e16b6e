"""The one checker of the typed records edgebench reads from a run's files: result.json's `end`
(`figures.run_end.RunEnd`), meta.json (`figures.run_meta.RunMeta`) and each event of
events.jsonl (`figures.run_events`). A record module declares only its fields (a frozen
dataclass: each field's type, and in its metadata its range or its length,
`whole`/`number`/`text`), its caps (`Caps`) and the keys written before a field existed
(`Renamed`); `read_record` checks a record read from a file against that declaration, once,
where the file is read.

Each field is checked against its declared type:
- `int`: a whole number (not true/false, not a float, so never NaN) in the field's range
  (`whole`; 0 to MAX_COUNT unless it says otherwise);
- `float`: a finite number, 0 or more, unless its field says otherwise (`number`: no lower
  bound, or NaN and infinity allowed too; a whole number past a float's range never is);
- `bool`: true or false;
- `str`: text of at most the field's length (`text`), else the record's `Caps.text_chars`;
- `Literal[...]`: one of the named choices;
- a dataclass: a nested record, checked field by field the same way;
- `dict[str, X]`: a JSON object (see below), each value checked as an X;
- `list[X]`: a JSON list, each item checked as an X (RunSpec's `command`);
- a field whose metadata holds `Keys` (`free_object`): a free-form JSON object kept as a dict,
  the keys `Keys` names checked by their kind where it holds them (each may be null), its
  other keys passed as they are;
- `X | None`: null as well.
A JSON object holds at most `Caps.object_chars` characters of JSON, is nested at most
`Caps.depth` deep and holds no NaN or infinity anywhere (its known keys' own checks come first:
they name the field).

A key the record does not hold takes its field's default (records written before the field
existed), as does null where a field holds an object made by a default factory; a field
without a default of its type (None for a whole number that is not optional) is missing. A key
the record does not know is left out.

A bad field raises `untrusted.BadRecord`: one line naming the file, the field (`end.exit_code`,
`clock.start.mono_ns`) and the value (`untrusted.quote`: never the whole of it), and the fix.

Standard library only: the device side (the supervisor) imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from edgebench.untrusted import BadRecord, printable, quote

MAX_COUNT = 2**63 - 1  # the store's BIGINT: the top of a whole number unless its field says otherwise
FIX = "it is not what edgebench writes (a damaged or foreign file): collect the run again, or move it aside"
JSONObject = dict[str, Any]
Record = TypeVar("Record")
NO_METADATA: Mapping[str, Any] = types.MappingProxyType({})


@dataclass(frozen=True)
class Caps:
    """What a record may hold at most: `text_chars` characters of text where a field states no
    length of its own; for its JSON objects, `object_chars` characters of JSON nested `depth` deep
    (None: the record holds no JSON object)."""

    text_chars: int
    object_chars: int | None = None
    depth: int | None = None


@dataclass(frozen=True)
class Keys:
    """A free-form JSON object's keys that edgebench reads: each checked by its kind (a type as a
    field declares it, or `Keys` for an object inside) where the object holds it, a whole number
    within its `ranges` entry (0 to MAX_COUNT otherwise)."""

    kinds: Mapping[str, Any]
    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Renamed:
    """A key written before the field `to` existed: where a record holds no `to` key and this key
    is not null, its value is read as `to`'s (a message names it by this key) and the fields of
    `implies` take their values."""

    to: str
    implies: Mapping[str, object] = field(default_factory=dict)


def whole(low: int = 0, high: int = MAX_COUNT) -> Any:
    """A whole-number field from `low` to `high`, None until set."""
    return field(default=None, metadata={"range": (low, high)})


def number(low: float | None = 0.0, finite: bool = True) -> Any:
    """A number field of `low` or more (None: any), NaN and infinity refused unless not `finite`; None until set."""
    return field(default=None, metadata={"low": low, "finite": finite})


def text(chars: int | None = None) -> Any:
    """A text field of at most `chars` characters (None: the record's Caps.text_chars), None until set."""
    return field(default=None, metadata={} if chars is None else {"chars": chars})


def free_object(keys: Keys, empty: bool = False) -> Any:
    """A free-form JSON object field whose `keys` are checked: None until set, or `{}` (`empty`)."""
    if empty:
        return field(default_factory=dict, metadata={"keys": keys})
    return field(default=None, metadata={"keys": keys})


def read_record(cls: type[Record], data: object, source: str, caps: Caps, record: str | None = None,
                renamed: Mapping[str, Renamed] = NO_METADATA) -> Record:
    """The record `cls` (a dataclass) from `data` read from `source` (the file, for the message),
    every field checked; BadRecord naming the file and the field otherwise (`record`.field, or the
    field alone for a record without a name)."""
    check = _Check(_where(source), caps)
    if not isinstance(data, dict):
        raise check.bad(record or "the record", data, "not a JSON object")
    names: dict[str, str] = {}
    for old, new in renamed.items():
        if new.to not in data and data.get(old) is not None:  # written before `new.to` existed
            data = {**data, new.to: data[old], **new.implies}
            names[new.to] = old
    return check.record(cls, data, f"{record}." if record else "", names)


def refused(source: str, what: str) -> BadRecord:
    """The BadRecord of a record from `source` that breaks its own rule `what` (one line, no fix in it)."""
    return BadRecord(f"{_where(source)}: {what}; {FIX}")


def _where(source: str) -> str:
    return printable(source, newlines=False, limit=300)


def _named(name: str) -> str:
    """A field's name for a message (a key from the file may be anything)."""
    return printable(name, newlines=False, limit=120)


@functools.lru_cache(maxsize=256)  # a few declared types, asked once per field of every record read
def _optional(hint: Any) -> tuple[Any, bool]:
    """A declared type as (the type, whether null is allowed)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    (kind,) = [a for a in args if a is not type(None)]
    return kind, type(None) in args


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


@dataclass(frozen=True)
class _Check:
    """The checks of one record: `where` is its file (for the message), `caps` its caps."""

    where: str
    caps: Caps

    def refuse(self, what: str) -> BadRecord:
        return BadRecord(f"{self.where}: {what}; {FIX}")

    def bad(self, name: str, value: object, why: str) -> BadRecord:
        return self.refuse(f"{_named(name)} is {quote(value)}, {why}")

    def record(self, cls: type[Record], data: object, prefix: str, names: Mapping[str, str] = NO_METADATA) -> Record:
        """An instance of the dataclass `cls` from the object `data`, each field checked."""
        if not isinstance(data, dict):
            raise self.bad(prefix.rstrip("."), data, "not a JSON object")
        hints = _hints(cls)
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(typing.cast(Any, cls)):
            made = spec.default_factory is not dataclasses.MISSING
            name = prefix + names.get(spec.name, spec.name)
            if spec.name in data and not (data[spec.name] is None and made):
                values[spec.name] = self.checked(hints[spec.name], data[spec.name], name, spec.metadata)
            elif made:  # left out, or null where an object belongs
                values[spec.name] = spec.default_factory()  # type: ignore[operator]
            elif spec.default is dataclasses.MISSING or (spec.default is None and not _optional(hints[spec.name])[1]):
                raise self.refuse(f"{_named(name)} is missing")  # no default of its type
            else:
                values[spec.name] = spec.default
        return cls(**values)

    def checked(self, hint: Any, value: object, name: str, metadata: Mapping[str, Any] = NO_METADATA) -> Any:
        """`value` when it is of the declared type `hint` (and within the range or length of
        `metadata`, or its `Keys`); BadRecord naming `name` otherwise."""
        kind, nullable = _optional(hint)
        if value is None and nullable:
            return None
        kind = metadata.get("keys", kind)
        if isinstance(kind, Keys):
            return self.keys(kind, value, name)
        if kind is bool:
            if not isinstance(value, bool):
                raise self.bad(name, value, "not true or false")
        elif kind is int:
            low, high = metadata.get("range", (0, MAX_COUNT))
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                bounds = "0 or more" if (low, high) == (0, MAX_COUNT) else f"from {low:,} to {high:,}"
                raise self.bad(name, value, f"not a whole number {bounds}")
        elif kind is float:
            low, finite = metadata.get("low", 0.0), metadata.get("finite", True)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or (not _finite(value) and (finite or isinstance(value, int)))
                    or (low is not None and value < low)):
                what = "a finite number" if finite and low != 0 else "a number"
                raise self.bad(name, value, f"not {what}" + ("" if low is None else f" {low:g} or more"))
        elif kind is str:
            if not isinstance(value, str):
                raise self.bad(name, value, "not text")
            chars = metadata.get("chars", self.caps.text_chars)
            if len(value) > chars:
                raise self.refuse(f"{_named(name)} holds {len(value):,} characters, more than the {chars:,} it may "
                                  f"({quote(value, 40)})")
        elif typing.get_origin(kind) is Literal:
            if value not in typing.get_args(kind):
                raise self.bad(name, value, f"not one of {', '.join(typing.get_args(kind))}")
        elif dataclasses.is_dataclass(kind):
            return self.record(typing.cast(type, kind), value, f"{name}.")
        elif typing.get_origin(kind) is list:
            (of,) = typing.get_args(kind)
            if not isinstance(value, list):
                raise self.bad(name, value, "not a JSON list")
            for i, item in enumerate(value):
                self.checked(of, item, f"{name}[{i}]")
        elif typing.get_origin(kind) is dict:
            _, of = typing.get_args(kind)
            if not isinstance(value, dict):
                raise self.bad(name, value, "not a JSON object")
            if of is not Any:
                for key, item in value.items():
                    self.checked(of, item, f"{name}.{key}")
            self.json_object(value, name)
        else:  # a field of a type this module does not check: a programming error, caught by its tests
            raise TypeError(f"{name}: no check for {kind!r}")
        return value

    def keys(self, keys: Keys, value: object, name: str) -> JSONObject:
        """`value` (a free-form JSON object) with the keys of `keys` it holds checked by their kind: an
        object inside (`Keys`) as any JSON object first, its own keys once the whole is checked."""
        if not isinstance(value, dict):
            raise self.bad(name, value, "not a JSON object")
        held = {key: kind for key, kind in keys.kinds.items() if value.get(key) is not None}
        for key, kind in held.items():
            metadata = {"range": keys.ranges[key]} if key in keys.ranges else NO_METADATA
            self.checked(JSONObject if isinstance(kind, Keys) else kind, value[key], f"{name}.{key}", metadata)
        self.json_object(value, name)
        for key, kind in held.items():
            if isinstance(kind, Keys):
                self.keys(kind, value[key], f"{name}.{key}")
        return value

    def json_object(self, value: JSONObject, name: str) -> None:
        """BadRecord unless `value` holds at most Caps.object_chars characters of JSON, nested at
        most Caps.depth deep, without a NaN or an infinity anywhere in it."""
        if self.caps.object_chars is None or self.caps.depth is None:  # a programming error, caught by its tests
            raise TypeError(f"{name}: a JSON object in a record whose Caps hold none")
        stack: list[tuple[object, str, int]] = [(value, name, 1)]
        while stack:
            item, path, depth = stack.pop()
            if isinstance(item, float) and not math.isfinite(item):
                raise self.refuse(f"{_named(path)} is {item}, not a finite number")
            if isinstance(item, (dict, list)):
                if depth > self.caps.depth:
                    raise self.refuse(f"{_named(path)} is nested more than {self.caps.depth} deep")
                pairs = item.items() if isinstance(item, dict) else enumerate(item)
                stack.extend((v, f"{path}.{k}" if isinstance(item, dict) else f"{path}[{k}]", depth + 1)
                             for k, v in pairs)
        size = len(json.dumps(value))
        if size > self.caps.object_chars:
            raise self.refuse(f"{_named(name)} holds {size:,} characters of JSON, more than the "
                              f"{self.caps.object_chars:,} it may")


def _finite(value: int | float) -> bool:
    """A float that is not NaN or infinite, or a whole number a float holds (JSON's 1e400 as
    digits overflows math.isfinite)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
