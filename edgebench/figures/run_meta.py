"""What a run was and where it ran: meta.json, one typed definition for its two writers and
every reader.

The Python supervisor (`runner/supervisor.py`) builds a `RunMeta` and writes `to_json()`; the
shell sweep (`runner/sweep.sh`, `write_meta`) prints the same keys (`tests/test_run_meta.py`
runs it and holds its record to them). Readers parse the record once, where meta.json is read
(ingest's `results/runfiles.read_run_dir`, `figures.run.figures_of_run_dir`, the live view, the
sweep, the host's held-out evaluations), and use attributes after that. docs/interfaces.md
points here.

`from_json` checks every field against its type with the one checker of records
(`figures.records.read_record`): whole numbers in their range (byte counts and clocks never
negative; a NaN or a float is not a whole number), true/false, text of bounded length, one of
the named choices, and the nested records below field by field. A bad one raises
`untrusted.BadRecord`, one line naming the file (meta.json), the field (`spec.batch_size`,
`clock.start.mono_ns`) and the value. A key the record does not hold takes its default (records
written before a field existed: the previous edgebench wrote no `supervisor` from Python, no
`oom_kills_at_start` from the shell, no `native_worker`/`ran` for a Python run, no `readings`
before raw readings); a key it does not know is left out. This module declares the fields, their
caps and the keys read inside the free-form objects.

Four fields stay JSON objects (dicts) inside the model (`records.free_object`), each checked to
be a JSON object of at most MAX_OBJECT_CHARS characters of JSON, with no NaN or infinity
anywhere in it, and the keys edgebench reads from it (its `records.Keys` below) checked by kind:
- `spec`: the RunSpec as the run had it. Every RunSpec field it holds is checked against
  RunSpec's declared type (whole numbers never negative but `seed`, numbers finite and never
  negative, text, true/false, objects; null allowed: older specs); keys RunSpec does not know
  (an older or newer edgebench's) pass as they are. Readers read it with `.get` and defaults.
- `readings`: where the device read what it recorded (`figures.readings.READINGS_FIELDS`):
  `recorded_by`, `clock_ticks`, the `temperatures` names and `cgroup_cpu.cores` are checked
  by kind; the insides of `battery`, `rails` and `memory_cgroup` are read defensively by
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
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from edgebench.figures.records import MAX_COUNT, Caps, JSONObject, Keys, free_object, read_record, text, whole
from edgebench.runner.spec import RunSpec

MAX_TEXT_CHARS = 16_384  # a hostname, a path, a library's version: far less
MAX_ID_CHARS = 1_000  # a run id (the store's rule, untrusted.path_name, allows 200)
MAX_OBJECT_CHARS = 1 << 20  # a spec, the readings, bundle.json: a few KiB as edgebench writes them
MAX_DEPTH = 32  # nesting of a free-form object (edgebench's are 3 deep at most)
CAPS = Caps(text_chars=MAX_TEXT_CHARS, object_chars=MAX_OBJECT_CHARS, depth=MAX_DEPTH)

# The keys edgebench reads inside the free-form objects, by kind (each also may be null)
CGROUP_CPU = Keys({"path": str, "cores": float})
READINGS = Keys({"recorded_by": Literal["python", "shell"], "clock_ticks": int, "temperatures": dict[str, str],
                 "battery": JSONObject, "cgroup_cpu": CGROUP_CPU, "rails": JSONObject, "memory_cgroup": JSONObject},
                ranges={"clock_ticks": (1, 1_000_000)})
BUNDLE = Keys({"files": dict[str, str], "arch": str})
SPEC = Keys(dict(sorted(typing.get_type_hints(RunSpec).items())), ranges={"seed": (-MAX_COUNT - 1, MAX_COUNT)})
PREDICTED = Keys({})


@dataclass(frozen=True)
class ClockPair:
    """A tight (monotonic, wall) pair of the device's clocks (`telemetry.clock.clock_pair`)."""

    mono_ns: int = whole()  # the device's monotonic clock
    wall_ns: int = whole()  # its wall clock (ns since the epoch) read between two monotonic reads
    uncertainty_ns: int | None = whole()  # half the gap of those reads; None: a shell's pair


@dataclass(frozen=True)
class RunClock:
    """The clock pairs the host aligns the run's traces with (`results.alignment.from_meta`)."""

    start: ClockPair | None = None  # as the run started
    end: ClockPair | None = None  # as it ended; None until then (and for a run cut off)


@dataclass(frozen=True)
class DeviceFacts:
    """The device as the run saw it (`runner.facts.device_facts`; the shell's from uname and /proc)."""

    hostname: str | None = text()
    arch: str | None = text()  # uname -m
    platform: str | None = text()  # Python's platform.platform(); None from a shell
    python: str | None = text()  # the Python version; None: the shell ran it (no Python there)
    cpu_count: int | None = whole(1, 1 << 20)  # the CPUs the OS counts
    cpu_affinity: int | None = whole(0, 1 << 20)  # the CPUs the run may use; None: not read
    mem_total_bytes: int | None = whole()  # MemTotal
    emulator: str | None = text()  # the emulator the run's Python ran under (the arm64 lab's qemu)


@dataclass(frozen=True)
class OomKillsAtStart:
    """The kernel's OOM kill count where it can take the worker, read as the run started: a run
    whose sweep process died with its worker is told `oom` from it (devices/device_scripts/sweeps)."""

    file: str = text()  # the memory.events (or oom_control) file counted
    count: int = whole()  # its oom_kill counter then


@dataclass(frozen=True)
class RunMeta:
    """meta.json: what the run was (its spec), where it ran (the device, its libraries, the
    native worker and the files it started with), where its readings come from and its clock."""

    run_id: str | None = text(MAX_ID_CHARS)  # the device's id of the run (the store checks it as a name)
    supervisor: Literal["python", "shell"] | None = None  # which supervisor wrote it; None: written before
    runtime: Literal["native", "python"] | None = None  # an ExecuTorch run's worker; None: another backend
    spec: JSONObject = free_object(SPEC, empty=True)  # the RunSpec (see the module's docstring)
    device: DeviceFacts = field(default_factory=DeviceFacts)
    versions: dict[str, str] = field(default_factory=dict)  # library -> installed version (Python's)
    # bundle.json of the native worker; None: not a native run
    native_worker: JSONObject | None = free_object(BUNDLE)
    ran: dict[str, str] | None = None  # worker/<file>, plan/<file>, program/<file> -> sha256; None: not native
    # where each reading comes from; None until the sampler started
    readings: JSONObject | None = free_object(READINGS)
    clock: RunClock = field(default_factory=RunClock)
    # the memory model's prediction (the worker's `predicted` event)
    predicted: JSONObject | None = free_object(PREDICTED)
    oom_kills_at_start: OomKillsAtStart | None = None  # None: not read (a shell; no memory cgroup)
    # False for a record written before meta.json had `readings` (not a key of the file): its
    # figures are the ones its device made (`figures.run.run_figures`). Not written: a record
    # without it is written without `readings`, so it reads back the same.
    recorded_raw: bool = field(default=True, metadata={"json": False})

    @classmethod
    def from_json(cls, data: object, source: str) -> RunMeta:
        """The record `data` read from `source` (the file, for the message), every field checked;
        BadRecord naming the file and the field otherwise."""
        if isinstance(data, dict):  # one without `readings` was written before raw readings
            data = {**data, "recorded_raw": "readings" in data}
        return read_record(cls, data, source, CAPS)

    def to_json(self) -> dict[str, Any]:
        """The record as meta.json holds it: every field, by name (`readings` only where the record had it)."""
        out = dataclasses.asdict(self)
        del out["recorded_raw"]
        if not self.recorded_raw:
            del out["readings"]
        return out


# The JSON keys of meta.json: every writer writes all of them
KEYS = tuple(f.name for f in dataclasses.fields(RunMeta) if f.metadata.get("json", True))

def run_meta_of(data: dict[str, Any] | None, source: str) -> RunMeta:
    """meta.json's record read from `source` (RunMeta.from_json); an empty record for a run
    directory without one (None: not written yet, or not JSON)."""
    return RunMeta.from_json({} if data is None else data, source)

