"""Device profiles: one validated YAML per device kind (`device_profiles/*.yaml`).

A profile says what a device is (arch, RAM, cores, accelerators), what it can run
(backends, python), how to reach it by default (transport), what it can measure
(sensors), how to estimate power where it cannot (power_model) and how the lab
emulates it (emulation). A bad file fails loudly, naming the file, the field and the fix.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgebench.backends import BACKENDS
from edgebench.backends.support import device_reason
from edgebench.errors import EdgebenchError
from edgebench.methods.budget import DEFAULT_MARGIN, UNKNOWN_OS_SHARE, Budget, board_budget, mib
from edgebench.methods.device_speed import DeviceSpeed
from edgebench.telemetry.power import POWER_SOURCES
from edgebench.telemetry.rails import RAIL_TREES
from edgebench.untrusted import quote

REPO_PROFILES_DIR = Path(__file__).resolve().parents[2] / "device_profiles"


class ProfileError(EdgebenchError, ValueError):
    """A profile that cannot be found or does not validate; the message names the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Transport(_Strict):
    """How to reach the device; an inventory entry overrides any of these."""

    kind: Literal["local", "ssh", "adb"] = "ssh"
    host: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    key: str | None = None  # private key file; None: the ssh agent / default keys
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    serial: str | None = None  # adb serial
    connect_timeout_s: float = Field(default=10.0, gt=0)


class Power(_Strict):
    """Where measured power comes from (edgebench/telemetry/power.py says what each source reads)."""

    # none, auto (the first measured source the board has: telemetry.power.measured_power_source),
    # or a measured source of telemetry.power.POWER_SOURCES
    source: str = "none"
    rails: list[str] = Field(default_factory=list)  # ["*"]: every rail found
    total_rail: str | None = None  # one rail metering the whole input (VDD_IN); None: see rail_tree
    rail_tree: str | None = None  # the module's rail tree (telemetry/rails.py): power_w sums its roots
    battery_current_sign: Literal[-1, 1, "auto"] = "auto"  # auto: determined on the device (telemetry/battery.py)

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        if value not in ("none", "auto") and value not in POWER_SOURCES:
            raise ValueError(f"unknown power source {value!r}; use none, auto or one of {', '.join(POWER_SOURCES)}")
        return value

    @field_validator("rail_tree")
    @classmethod
    def _known_tree(cls, value: str | None) -> str | None:
        if value is not None and value not in RAIL_TREES:
            raise ValueError(f"unknown rail tree {value!r}; use one of {', '.join(RAIL_TREES)}, or leave it out "
                             "(power_w is then labelled 'sum of rails' unless a tree matches the rails)")
        return value

    @model_validator(mode="after")
    def _total_is_the_root(self) -> Power:
        if self.rail_tree and self.total_rail and RAIL_TREES[self.rail_tree].roots != [self.total_rail]:
            raise ValueError(f"total_rail {self.total_rail!r} is not the only root of rail_tree {self.rail_tree!r} "
                             f"({RAIL_TREES[self.rail_tree].roots}); remove total_rail")
        return self


class Sensors(_Strict):
    power: Power = Field(default_factory=Power)
    # thermal_zone*/type names or patterns, case-insensitive ("cpu-therm*" matches JetPack 5's CPU-therm and
    # JetPack 6's cpu-thermal); "*": all. On the device, a list matching none of the zones is an error naming them.
    thermal_zones: list[str] = Field(default_factory=list)
    throttle: Literal["none", "vcgencmd"] = "none"


class PowerModel(_Strict):
    """Linear idle-to-max model; only ever used for figures named *_est."""

    idle_w: float = Field(ge=0)
    max_w: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> PowerModel:
        if self.max_w < self.idle_w:
            raise ValueError(f"max_w ({self.max_w}) is below idle_w ({self.idle_w}); swap them")
        return self


class Emulation(_Strict):
    """Limits the lab's cgroups enforce for an emulated device of this kind."""

    memory_bytes: ByteSize
    cpus: float = Field(gt=0)


class OsMemory(_Strict):
    """What the board's firmware, kernel and services hold at idle, as a RAM size's
    `fixed + per_gib x GiB of RAM` (the kernel's page structures grow with the RAM), and the
    public measurement it comes from (methods.budget)."""

    fixed: ByteSize
    per_gib: ByteSize = ByteSize(0)
    source: str = Field(min_length=10)

    def bytes_for(self, ram_bytes: int) -> int:
        return int(self.fixed) + int(int(self.per_gib) * ram_bytes / 2**30)


class Speed(_Strict):
    """The device's rates the step-time estimate weighs its terms by (methods.device_speed:
    `python -m edgebench.methods.device_speed` prints them on the device; `edgebench devices
    calibrate` stores an inventory device's own in its entry)."""

    # finite and within what any CPU shows (a device's report is not trusted: 0, inf or 1e300 would
    # rank every method as nan or say anything is instant)
    matmul_gflops: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    bf16_matmul_cost: float | None = Field(None, gt=0, le=1e3, allow_inf_nan=False)
    pass_ns: float = Field(gt=0, le=1e12, allow_inf_nan=False)
    normal_ns: float = Field(gt=0, le=1e9, allow_inf_nan=False)


class Export(_Strict):
    """Settings for the exporters (ExecuTorch / ONNX Runtime lowering)."""

    xnnpack: bool = True
    # How XNNPACK programs compute bf16 methods' values (exporters.manifest.BF16_MODES):
    # rounded to bf16 where eager rounds (eager's losses), or in fp32 unrounded (faster).
    bf16: Literal["rounded", "fp32"] = "rounded"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _fp32_needs_xnnpack(self) -> Export:
        if self.bf16 == "fp32" and not self.xnnpack:
            raise ValueError("export.bf16: fp32 is a choice of the XNNPACK lowering; set export.xnnpack: true "
                             "or export.bf16: rounded")
        return self


class Profile(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    name: str
    alias: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")  # short name: lab devices are `lab-<alias>`
    arch: Literal["x86_64", "aarch64"]
    ram_bytes: ByteSize
    # What the OS holds at idle (methods.budget): a run gets the RAM less that, its supervisor
    # and the margin, and one predicted to need more is refused before it starts (--force runs it)
    os_memory: OsMemory | None = None
    memory_margin: float = Field(DEFAULT_MARGIN, ge=0, lt=0.5)  # share of RAM
    cores: int = Field(ge=1)
    accelerators: list[Literal["cuda"]] = Field(default_factory=list)
    backends: list[str]
    python: str = "python3"
    # relative: under the device user's home; shared by every host using that login (one sweep at a
    # time there), whose sweeps each record the host that started it (devices.inventory.host_identity)
    workdir: str = "edgebench-work"
    transport: Transport = Field(default_factory=Transport)
    sensors: Sensors = Field(default_factory=Sensors)
    power_model: PowerModel | None = None
    emulation: Emulation
    export: Export = Field(default_factory=Export)
    # The rates the step-time estimate weighs its terms by: `measure` takes them on this host
    # when needed (the local profile); unset, a reference x86 host's rates stand in and the bf16
    # methods' estimate is unknown (their speed differs most between CPUs).
    speed: Speed | Literal["measure"] | None = None
    source: str | None = Field(None, exclude=True)  # the file it came from

    def device_speed(self) -> DeviceSpeed:
        """The rates the step-time estimate uses for this device: this host's, measured, for
        `measure`; the profile's own; else a reference host's, bf16 unknown (methods.device_speed)."""
        from edgebench.methods.device_speed import REFERENCE, host_speed

        if self.speed == "measure":
            return host_speed()
        if self.speed is None:
            return REFERENCE
        return DeviceSpeed(**self.speed.model_dump(), source=f"profile {self.id}")

    def os_idle(self, ram_bytes: int | None = None) -> tuple[int, str]:
        """What the OS holds at idle with `ram_bytes` of RAM (default: the profile's), and whence:
        the profile's figure, or where it names none, a share of the RAM standing in (estimate)."""
        ram = int(ram_bytes or self.ram_bytes)
        if self.os_memory is None:
            return int(ram * UNKNOWN_OS_SHARE), (f"estimate: profile {self.id} names no idle figure, "
                                                 f"{UNKNOWN_OS_SHARE:.0%} of RAM stands in")
        return self.os_memory.bytes_for(ram), f"profile {self.id}'s idle figure"

    def budget(self, where: str, ram_bytes: int | None = None, supervisor: str = "python") -> Budget:
        """What a run may take on a board of this profile with `ram_bytes` of RAM (default: the
        profile's), the device not asked (methods.budget)."""
        ram = int(ram_bytes or self.ram_bytes)
        return board_budget(where, ram, *self.os_idle(ram), supervisor, self.memory_margin)

    @model_validator(mode="after")
    def _os_below_ram(self) -> Profile:
        held, _ = self.os_idle()
        if held >= int(self.ram_bytes):
            raise ValueError(f"os_memory: {mib(held)} at idle is not less than ram_bytes ({mib(self.ram_bytes)}); "
                             "give the OS's idle footprint, e.g. {fixed: 150MiB, per_gib: 16MiB, source: ...}")
        return self

    @field_validator("backends")
    @classmethod
    def _backends_unique(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one backend, e.g. [eager]")
        unknown = [b for b in value if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _backends_fit_arch(self) -> Profile:
        for backend in self.backends:
            reason = device_reason(backend, self.arch, device=f"a {self.arch} device")
            if reason:
                raise ValueError(f"backends: {backend}: {reason}; or remove it from the list")
        return self


def _detect_local(data: dict[str, Any]) -> dict[str, Any]:
    """Fills `auto` fields from this machine (the `local` profile)."""
    import psutil

    data = dict(data)
    if data.get("arch") == "auto":
        machine = platform.machine().lower()
        data["arch"] = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if data.get("ram_bytes") == "auto":
        data["ram_bytes"] = psutil.virtual_memory().total
    if data.get("cores") == "auto":
        data["cores"] = os.cpu_count() or 1
    if data.get("python") == "auto":
        data["python"] = sys.executable  # the host's own interpreter, with its libraries
    if data.get("backends") == "auto":
        data["backends"] = [b for b in BACKENDS if device_reason(b, data["arch"]) is None]
    return data


def profile_dirs() -> list[Path]:
    """`$EDGEBENCH_PROFILES` dirs (os.pathsep-separated) first, then the repo's."""
    extra = [Path(p) for p in os.environ.get("EDGEBENCH_PROFILES", "").split(os.pathsep) if p]
    return extra + [REPO_PROFILES_DIR]


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid device profile"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; remove it or fix its spelling (see device_profiles/local.yaml)"
        elif err["type"] == "missing":
            msg = "required field is missing; add it"
        elif err["type"] in ("byte_size", "byte_size_unit"):
            msg += "; write bytes or a size like 8GiB, 512MiB"
        lines.append(
            f"  {field}: {msg} (got {quote(err.get('input'))})" if err["type"] != "missing" else f"  {field}: {msg}"
        )
    return "\n".join(lines)


def parse_profile(data: Any, source: str = "<profile>") -> Profile:
    """Validates a profile mapping; `source` names it in errors."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a YAML mapping of fields, got {type(data).__name__}")
    try:
        profile = Profile.model_validate(_detect_local(data))
    except ValidationError as exc:
        raise ProfileError(_format_errors(source, exc)) from None
    profile.source = source
    return profile


def find_profile(name_or_path: str | os.PathLike[str]) -> Path:
    """A path to a YAML file, or a profile id looked up in `profile_dirs()`."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile file")
        return path
    for directory in profile_dirs():
        candidate = directory / f"{text}.yaml"
        if candidate.is_file():
            return candidate
    matches = resolve_profile(text)
    if len(matches) == 1:
        return find_profile(matches[0])
    if matches:
        raise ProfileError(f"profile {text!r} could mean {', '.join(matches)}; name one of them")
    raise ProfileError(f"unknown device profile {text!r}; known: {', '.join(list_profiles())}")


# Words people use for a family of boards that are not in its profile ids.
FAMILY_WORDS = {"rpi": "pi", "raspberrypi": "pi", "android": "pixel", "termux": "pixel", "phone": "pixel"}


def resolve_profile(name: str) -> list[str]:
    """The profile ids a name can mean: an id or a profile's `alias` exactly, else every id
    holding all of the name's words (`jetson-orin` -> both Jetson Orin profiles)."""
    ids = list_profiles()
    if name in ids:
        return [name]
    for pid in ids:
        try:
            if load_profile(pid).alias == name:
                return [pid]
        except ProfileError:
            continue
    words = [FAMILY_WORDS.get(w, w) for w in name.lower().split("-") if w]
    return [pid for pid in ids if words and set(words) <= set(pid.split("-"))]


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """Loads and validates a profile by id (`raspberry-pi-5-8gb`) or file path."""
    from edgebench.devices.yamlfile import read_yaml

    path = find_profile(name_or_path)
    profile = parse_profile(read_yaml(path, ProfileError), str(path))
    if profile.id != path.stem:
        raise ProfileError(f"{path}: id: {quote(profile.id)} differs from the file name; rename one to match")
    return profile


def list_profiles() -> list[str]:
    """Profile ids found in `profile_dirs()`, first directory wins, sorted."""
    names: set[str] = set()
    for directory in profile_dirs():
        if directory.is_dir():
            names.update(p.stem for p in directory.glob("*.yaml"))
    return sorted(names)
