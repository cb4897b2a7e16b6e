"""The rows edgebench reads from a store file that is not its own (`edgebench ingest
OTHER.duckdb`, results.merge): one typed definition of each (issue 71), checked before a row
of that store is used.

What comes across as rows is a run's name and where its files are (`runs`: the run itself is
ingested again from those files, so its samples and steps are read through
`figures.run_samples` and `figures.run_events`, never copied from the other store's `samples`
and `steps`), the device's clock probes (`clock_probes`) and the external power traces
(`external_sources`, `external_traces`). Each table is a frozen dataclass below, its fields
declared as `figures.records` declares a run file's: whole numbers in their range, numbers
finite, text of at most its length, a name a plain path component (`untrusted.path_name`), a
folder an absolute path.

The check runs in DuckDB over the attached store (millions of trace rows): each column must
exist with a type of its kind, and no row may hold a value out of its field's range, not finite
or too long. The first row that does is read back and checked with `figures.records.read_record`
for its message: one line naming the store, the table, the row and the field. The rule is
refuse, not skip: a store with one bad row is another edgebench's damaged or hostile file, and
nothing of it is ingested (exit 2).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgebench.figures.records import MAX_COUNT, Caps, number, read_record, refused, text, whole
from edgebench.untrusted import path_name, quote

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

MAX_PATH_CHARS = 4096  # PATH_MAX
MAX_NAME_CHARS = 200  # untrusted.SAFE_NAME
MAX_MAPPING_CHARS = 1 << 16  # a CSV mapping's JSON: a few hundred characters as written
CAPS = Caps(text_chars=MAX_NAME_CHARS)


@dataclass(frozen=True)
class RunRow:
    """A run of the other store: its name, and where its files are (read again from there)."""

    device: str = text(MAX_NAME_CHARS)
    run_id: str = text(MAX_NAME_CHARS)
    raw_dir: str | None = text(MAX_PATH_CHARS)
    run_dir: str | None = text(MAX_PATH_CHARS)


@dataclass(frozen=True)
class ProbeRow:
    """A clock probe (host and device clocks read together)."""

    device: str = text(MAX_NAME_CHARS)
    host_send_ns: int = whole()
    device_mono_ns: int = whole()
    device_wall_ns: int | None = whole()
    host_recv_ns: int = whole()


@dataclass(frozen=True)
class ExternalSourceRow:
    """An external power trace: where its CSV came from and how it was read."""

    trace_id: str = text(MAX_NAME_CHARS)
    device: str = text(MAX_NAME_CHARS)
    source_path: str | None = text(MAX_PATH_CHARS)
    raw_path: str | None = text(MAX_PATH_CHARS)
    mapping_json: str | None = text(MAX_MAPPING_CHARS)
    rows: int | None = whole()
    first_host_ns: int = whole()
    last_host_ns: int = whole()


@dataclass(frozen=True)
class ExternalTraceRow:
    """One reading of an external power meter, on the host's clock."""

    trace_id: str = text(MAX_NAME_CHARS)
    device: str = text(MAX_NAME_CHARS)
    host_t_ns: int = whole()
    power_w: float | None = number(low=None)


TABLES: dict[str, type[Any]] = {"runs": RunRow, "clock_probes": ProbeRow, "external_sources": ExternalSourceRow,
                                "external_traces": ExternalTraceRow}
KEYS = {"runs": ("device", "run_id"), "clock_probes": ("device", "host_send_ns"), "external_sources": ("trace_id",),
        "external_traces": ("trace_id", "host_t_ns")}  # what names a row in a message
NAMES = ("device", "run_id")  # columns that become part of a host path: plain names (untrusted.path_name)
FOLDERS = ("raw_dir", "run_dir", "source_path", "raw_path")  # absolute paths, when set
INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                 "UBIGINT", "UHUGEINT"}
NUMBER_TYPES = INTEGER_TYPES | {"FLOAT", "DOUBLE"}


def columns(cls: type[Any]) -> list[str]:
    """The columns of a table's row definition, in order."""
    return [f.name for f in dataclasses.fields(cls)]


def _bad_sql(name: str, hint: Any, metadata: typing.Mapping[str, Any]) -> str:
    """A SQL condition, true where the column `name` breaks its field's declaration."""
    args = typing.get_args(hint)
    kind = next(a for a in args if a is not type(None)) if args else hint
    col = '"' + name + '"'
    missing = "false" if type(None) in args else f"{col} IS NULL"
    if kind is int:
        low, high = metadata.get("range", (0, MAX_COUNT))
        bad = f"{col} NOT BETWEEN {low} AND {high}"
    elif kind is float:
        low = metadata.get("low", 0.0)
        bad = f"NOT isfinite({col})" + ("" if low is None else f" OR {col} < {low!r}")
    else:
        bad = f"length({col}) > {metadata.get('chars', MAX_NAME_CHARS)} OR contains({col}, chr(0))"
        if name in NAMES:
            bad += " OR NOT regexp_full_match(" + col + ", '[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}')"
        if name in FOLDERS:
            bad += f" OR NOT starts_with({col}, '/')"
    return f"({missing} OR coalesce({bad}, false))"


def _type_problem(kind: Any, column_type: str) -> str | None:
    if kind is int and column_type not in INTEGER_TYPES:
        return "not a whole-number column"
    if kind is float and column_type not in NUMBER_TYPES:
        return "not a number column"
    if kind is str and column_type != "VARCHAR":
        return "not a text column"
    return None


def check_store(con: DuckDBPyConnection, schema: str, store: str) -> None:
    """Every row edgebench reads of the store attached as `schema` (`store`: its file, for the
    message) checked against its table's definition; BadRecord naming the store, the table, the
    row and the field at the first that breaks it."""
    for table, cls in TABLES.items():
        have = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                "WHERE table_catalog = ? AND table_name = ?", [schema, table]).fetchall())
        if not have:
            if table == "runs":
                raise refused(store, "holds no `runs` table: not an edgebench results store")
            continue  # an older edgebench's store: none of these rows
        hints = typing.get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            kind = next((a for a in typing.get_args(hints[spec.name]) if a is not type(None)), hints[spec.name])
            problem = "missing" if spec.name not in have else _type_problem(kind, have[spec.name])
            if problem is not None:
                raise refused(store, f"table {table}: column {spec.name} is {problem}"
                                     + (f" ({have[spec.name]})" if spec.name in have else ""))
        names = columns(cls)
        bad = " OR ".join(_bad_sql(f.name, hints[f.name], f.metadata) for f in dataclasses.fields(cls))
        row = con.execute(f"SELECT {', '.join(chr(34) + n + chr(34) for n in names)} "
                          f"FROM {schema}.{table} WHERE {bad} LIMIT 1").fetchone()
        if row is None:
            continue
        record = dict(zip(names, row))
        where = f"{store} table {table} row " + " ".join(f"{k}={quote(record[k], 40)}" for k in KEYS[table])
        read_record(cls, record, where, CAPS, table)  # the field's own message, where it names one
        for name in NAMES:
            if name in record:
                try:
                    path_name(record[name], f"{table}.{name}")
                except ValueError as exc:
                    raise refused(where, str(exc)) from None
        folder = next((n for n in FOLDERS if isinstance(record.get(n), str) and not record[n].startswith("/")), None)
        if folder is not None:
            raise refused(where, f"{table}.{folder} is {quote(record[folder])}, not an absolute path")
        text_with_nul = next((n for n, v in record.items() if isinstance(v, str) and "\0" in v), "?")
        raise refused(where, f"{table}.{text_with_nul} holds a NUL character")
