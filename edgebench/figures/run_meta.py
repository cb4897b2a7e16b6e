"""What a run was and where it ran: meta.json, one typed definition for its two writers and
every reader.

The Python supervisor (`runner/supervisor.py`) builds a `RunMeta` and writes `to_json()`; the
shell sweep (`runner/sweep.sh`, `write_meta`) prints the same keys (`tests/test_run_meta.py`
runs it and holds its record to them). Readers parse the record once, where meta.json is read
(ingest's `results/runfiles.read_run_dir`, `figures.run.figures_of_run_dir`, the live view, the
sweep, the host's held-out evaluations), and use attributes after that. docs/interfaces.md
points here.

`from_json` checks every field against its type: whole numbers in their range (byte counts and
clocks never negative; a NaN or a float is not a whole number), true/false, text of bounded
length, one of the named choices, and the nested records below field by field. A bad one raises
`untrusted.BadRecord`, one line naming the file (meta.json), the field (`spec.batch_size`,
`clock.start.mono_ns`) and the value. A key the record does not hold takes its default (records
written before a field existed: the previous edgebench wrote no `supervisor` from Python, no
`oom_kills_at_start` from the shell, no `native_worker`/`ran` for a Python run, no `readings`
before raw readings); a key it does not know is left out.

Four fields stay JSON objects (dicts) inside the model, each checked here to be a JSON object of
at most MAX_OBJECT_CHARS characters of JSON, with no NaN or infinity anywhere in it, and the
keys edgebench reads from it checked by kind:
- `spec`: the RunSpec as the run had it. Every RunSpec field it holds is checked against
  RunSpec's declared type (whole numbers never negative but `seed`, numbers finite and never
  negative, text, true/false, objects; null allowed: older specs); keys RunSpec does not know
  (an older or newer edgebench's) pass as they are. Readers read it with `.get` and defaults.
- `readings`: where the device read what it recorded (`figures.readings.READINGS_FIELDS`):
  `recorded_by`, `clock_ticks`, the `temperatures` names and `cgroup_cpu.cores` are checked
  here; the insides of `battery`, `rails` and `memory_cgroup` are read defensively by
  `figures.samples`/`figures.power`, which name a reading they cannot use as a figure gap.
- `native_worker`: bundle.json of the native worker that was deployed (its `files`, name ->
  sha256, checked as text; `figures.run.not_deployed` compares them with `ran`).
- `predicted`: the memory model's prediction as the worker recorded it (no reader takes a
  figure from it: the figures read the worker's `predicted` event).

The constructor checks nothing: a writer always writes its record, whatever it holds.

Standard library only: the device side (the supervisor) imports it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from edgebench.runner.spec import RunSpec
from edgebench.untrusted import BadRecord, printable, quote

MAX_COUNT = 2**63 - 1  # the store's BIGINT
MAX_TEXT_CHARS = 16_384  # a hostname, a path, a library's version: far less
MAX_ID_CHARS = 1_000  # a run id (the store's rule, untrusted.path_name, allows 200)
MAX_OBJECT_CHARS = 1 << 20  # a spec, the readings, bundle.json: a few KiB as edgebench writes them
MAX_DEPTH = 32  # nesting of a free-form object (edgebench's are 3 deep at most)
FIX = "it is not what edgebench writes (a damaged or foreign file): collect the run again, or move it aside"
JSONObject = dict[str, Any]


def _whole(low: int = 0, high: int = MAX_COUNT) -> Any:
    return field(default=None, metadata={"range": (low, high)})


def _text(chars: int = MAX_TEXT_CHARS) -> Any:
    return field(default=None, metadata={"chars": chars})


@dataclass(frozen=True)
class ClockPair:
    """A tight (monotonic, wall) pair of the device's clocks (`telemetry.clock.clock_pair`)."""

    mono_ns: int = _whole()  # the device's monotonic clock
    wall_ns: int = _whole()  # its wall clock (ns since the epoch) read between two monotonic reads
    uncertainty_ns: int | None = _whole()  # half the gap of those reads; None: a shell's pair


@dataclass(frozen=True)
class RunClock:
    """The clock pairs the host aligns the run's traces with (`results.alignment.from_meta`)."""

    start: ClockPair | None = None  # as the run started
    end: ClockPair | None = None  # as it ended; None until then (and for a run cut off)


@dataclass(frozen=True)
class DeviceFacts:
    """The device as the run saw it (`runner.facts.device_facts`; the shell's from uname and /proc)."""

    hostname: str | None = _text()
    arch: str | None = _text()  # uname -m
    platform: str | None = _text()  # Python's platform.platform(); None from a shell
    python: str | None = _text()  # the Python version; None: the shell ran it (no Python there)
    cpu_count: int | None = _whole(1, 1 << 20)  # the CPUs the OS counts
    cpu_affinity: int | None = _whole(0, 1 << 20)  # the CPUs the run may use; None: not read
    mem_total_bytes: int | None = _whole()  # MemTotal
    emulator: str | None = _text()  # the emulator the run's Python ran under (the arm64 lab's qemu)


@dataclass(frozen=True)
class OomKillsAtStart:
    """The kernel's OOM kill count where it can take the worker, read as the run started: a run
    whose sweep process died with its worker is told `oom` from it (fleet/device_scripts/sweeps)."""

    file: str = _text()  # the memory.events (or oom_control) file counted
    count: int = _whole()  # its oom_kill counter then


@dataclass(frozen=True)
class RunMeta:
    """meta.json: what the run was (its spec), where it ran (the device, its libraries, the
    native worker and the files it started with), where its readings come from and its clock."""

    run_id: str | None = _text(MAX_ID_CHARS)  # the device's id of the run (the store checks it as a name)
    supervisor: Literal["python", "shell"] | None = None  # which supervisor wrote it; None: written before
    runtime: Literal["native", "python"] | None = None  # an ExecuTorch run's worker; None: another backend
    spec: JSONObject = field(default_factory=dict)  # the RunSpec (see the module's docstring)
    device: DeviceFacts = field(default_factory=DeviceFacts)
    versions: dict[str, str] = field(default_factory=dict)  # library -> installed version (Python's)
    native_worker: JSONObject | None = None  # bundle.json of the native worker; None: not a native run
    ran: dict[str, str] | None = None  # worker/<file>, plan/<file>, program/<file> -> sha256; None: not native
    readings: JSONObject | None = None  # where each reading comes from; None until the sampler started
    clock: RunClock = field(default_factory=RunClock)
    predicted: JSONObject | None = None  # the memory model's prediction (the worker's `predicted` event)
    oom_kills_at_start: OomKillsAtStart | None = None  # None: not read (a shell; no memory cgroup)
    # False for a record written before meta.json had `readings` (not a key of the file): its
    # figures are the ones its device made (`figures.run.run_figures`). Not written: a record
    # without it is written without `readings`, so it reads back the same.
    recorded_raw: bool = field(default=True, metadata={"json": False})

    @classmethod
    def from_json(cls, data: object, source: str) -> RunMeta:
        """The record `data` read from `source` (the file, for the message), every field checked;
        BadRecord naming the file and the field otherwise."""
        where = printable(source, newlines=False, limit=300)
        if not isinstance(data, dict):
            raise BadRecord(f"{where}: the record is {quote(data)}, not a JSON object; {FIX}")
        meta = _record(cls, {**data, "recorded_raw": "readings" in data}, where, "")
        assert isinstance(meta, RunMeta)
        return meta

    def to_json(self) -> dict[str, Any]:
        """The record as meta.json holds it: every field, by name (`readings` only where the record had it)."""
        out = dataclasses.asdict(self)
        del out["recorded_raw"]
        if not self.recorded_raw:
            del out["readings"]
        return out


# The JSON keys of meta.json: every writer writes all of them
KEYS = tuple(f.name for f in dataclasses.fields(RunMeta) if f.metadata.get("json", True))

# The keys edgebench reads inside the free-form objects, by kind (each also may be null)
READINGS_KINDS: dict[str, Any] = {"recorded_by": Literal["python", "shell"], "clock_ticks": int,
                                  "temperatures": dict[str, str], "battery": JSONObject, "cgroup_cpu": JSONObject,
                                  "rails": JSONObject, "memory_cgroup": JSONObject}
READINGS_RANGES = {"clock_ticks": (1, 1_000_000)}
CGROUP_CPU_KINDS: dict[str, Any] = {"path": str, "cores": float}
BUNDLE_KINDS: dict[str, Any] = {"files": dict[str, str], "arch": str}
SPEC_RANGES = {"seed": (-MAX_COUNT - 1, MAX_COUNT)}


def run_meta_of(data: dict[str, Any] | None, source: str) -> RunMeta:
    """meta.json's record read from `source` (RunMeta.from_json); an empty record for a run
    directory without one (None: not written yet, or not JSON)."""
    return RunMeta.from_json({} if data is None else data, source)


# --- the checks ------------------------------------------------------------------------------

def _record(cls: type, data: object, where: str, prefix: str) -> Any:
    """An instance of the dataclass `cls` from the object `data`, each field checked."""
    if not isinstance(data, dict):
        raise BadRecord(f"{where}: {_named(prefix.rstrip('.'))} is {quote(data)}, not a JSON object; {FIX}")
    hints = _hints(cls)
    values = {}
    for spec in dataclasses.fields(cls):
        made = spec.default_factory is not dataclasses.MISSING
        value = data.get(spec.name)
        name = prefix + spec.name
        if value is None and (made or spec.name not in data):  # left out, or null where an object belongs
            if not made and type(None) not in typing.get_args(hints[spec.name]):
                raise BadRecord(f"{where}: {_named(name)} is missing; {FIX}")
            values[spec.name] = spec.default_factory() if made else spec.default  # type: ignore[operator]
            continue
        custom = _FREE_FORM.get(spec.name) if cls is RunMeta else None
        values[spec.name] = custom(value, where, name) if custom else \
            _checked(hints[spec.name], value, where, name, spec.metadata)
    return cls(**values)


def _readings(value: object, where: str, name: str) -> JSONObject | None:
    readings = _known_keys(value, where, name, READINGS_KINDS, READINGS_RANGES)
    if readings is not None:
        _known_keys(readings.get("cgroup_cpu"), where, f"{name}.cgroup_cpu", CGROUP_CPU_KINDS, {})
    return readings


def _bundle(value: object, where: str, name: str) -> JSONObject | None:
    return _known_keys(value, where, name, BUNDLE_KINDS, {})


def _predicted(value: object, where: str, name: str) -> JSONObject | None:
    return _known_keys(value, where, name, {}, {})


def _named(name: str) -> str:
    """A field's name for a message (a key from the file may be anything)."""
    return printable(name, newlines=False, limit=120)


def _checked(hint: Any, value: object, where: str, name: str, metadata: typing.Mapping[str, Any]) -> Any:
    """`value` when it is of the declared type `hint`; BadRecord naming `name` otherwise."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in args:
        return None
    (kind,) = [a for a in args if a is not type(None)]
    bad = f"{where}: {_named(name)} is {quote(value)}"
    if kind is bool:
        if not isinstance(value, bool):
            raise BadRecord(f"{bad}, not true or false; {FIX}")
    elif kind is int:
        low, high = metadata.get("range", (0, MAX_COUNT))
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            bounds = "0 or more" if (low, high) == (0, MAX_COUNT) else f"from {low:,} to {high:,}"
            raise BadRecord(f"{bad}, not a whole number {bounds}; {FIX}")
    elif kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise BadRecord(f"{bad}, not a number 0 or more; {FIX}")
    elif kind is str:
        if not isinstance(value, str):
            raise BadRecord(f"{bad}, not text; {FIX}")
        chars = metadata.get("chars", MAX_TEXT_CHARS)
        if len(value) > chars:
            raise BadRecord(f"{where}: {_named(name)} holds {len(value):,} characters, more than the {chars:,} it may "
                            f"({quote(value, 40)}); {FIX}")
    elif typing.get_origin(kind) is Literal:
        if value not in typing.get_args(kind):
            raise BadRecord(f"{bad}, not one of {', '.join(typing.get_args(kind))}; {FIX}")
    elif dataclasses.is_dataclass(kind):
        return _record(typing.cast(type, kind), value, where, f"{name}.")
    elif typing.get_origin(kind) is dict:
        _, of = typing.get_args(kind)
        _object(value, where, name)
        assert isinstance(value, dict)
        if of is not Any:
            for key, item in value.items():
                _checked(of, item, where, f"{name}.{key}", {})
        _json_object(value, where, name)
    else:  # a field of a type this module does not check: a programming error, caught by its tests
        raise TypeError(f"{name}: no check for {kind!r}")
    return value


def _object(value: object, where: str, name: str) -> None:
    if not isinstance(value, dict):
        raise BadRecord(f"{where}: {_named(name)} is {quote(value)}, not a JSON object; {FIX}")


def _json_object(value: object, where: str, name: str) -> None:
    """BadRecord unless `value` is a JSON object of at most MAX_OBJECT_CHARS characters of JSON,
    MAX_DEPTH deep, without a NaN or an infinity anywhere in it (its keys' own checks come first:
    they name the field)."""
    _object(value, where, name)
    stack: list[tuple[object, str, int]] = [(value, name, 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise BadRecord(f"{where}: {_named(path)} is {item}, not a finite number; {FIX}")
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise BadRecord(f"{where}: {_named(path)} is nested more than {MAX_DEPTH} deep; {FIX}")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, f"{path}.{k}" if isinstance(item, dict) else f"{path}[{k}]", depth + 1) for k, v in pairs)
    size = len(json.dumps(value))
    if size > MAX_OBJECT_CHARS:
        raise BadRecord(f"{where}: {_named(name)} holds {size:,} characters of JSON, more than the "
                        f"{MAX_OBJECT_CHARS:,} it may; {FIX}")


def _known_keys(value: object, where: str, name: str, kinds: dict[str, Any],
                ranges: dict[str, tuple[int, int]]) -> JSONObject | None:
    """`value` (a JSON object or None) with the keys of `kinds` it holds checked by their kind."""
    if value is None:
        return None
    _object(value, where, name)
    assert isinstance(value, dict)
    for key, kind in kinds.items():
        if key in value:
            metadata = {"range": ranges[key]} if key in ranges else {}
            _checked(kind | None, value[key], where, f"{name}.{key}", metadata)
    _json_object(value, where, name)
    return value


def _spec(value: object, where: str, name: str) -> JSONObject:
    """The spec (a JSON object) with every RunSpec field it holds checked against its declared type."""
    if value is None:
        return {}
    _object(value, where, name)
    assert isinstance(value, dict)
    hints = _hints(RunSpec)
    for key in sorted(hints.keys() & value.keys()):
        metadata = {"range": SPEC_RANGES[key]} if key in SPEC_RANGES else {}
        _checked(hints[key] | None, value[key], where, f"{name}.{key}", metadata)
    _json_object(value, where, name)
    return value


_FREE_FORM = {"spec": _spec, "readings": _readings, "native_worker": _bundle, "predicted": _predicted}
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]
