"""The inventory: the names users type (`jetson-orin`) mapped to a profile and an address.

A user file, `$EDGEBENCH_INVENTORY` or `~/.config/edgebench/inventory.yaml`:

    devices:
      jetson-orin:
        profile: jetson-orin-nano-8gb
        host: 192.168.1.20
        user: nvidia
        key: ~/.ssh/id_ed25519
      pixel:
        profile: pixel-8
        kind: adb
        serial: 3A1B2C3D

Any transport field of the profile (kind, host, port, user, key, known_hosts, serial,
connect_timeout_s) plus `python`, `workdir` and `root` can be set per device. `ram_bytes` and
`cores` are the board's own where its profile's differ (`edgebench devices add` writes them as
it detects them: a generic profile's, `linux-x86_64`, are stand-ins). `speed` holds the
step-time model's rates `edgebench devices calibrate` measured on the device (fleet/calibrate.py).
The name `local` always means this machine unless the file defines it.

A device's work dir is its entry's `workdir`, else its profile's, shared by every host using that
login (one sweep at a time there). Each sweep records the host that started it: `host-id` beside
the inventory file holds this host user's id, made once (host_identity).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import platform
import secrets
import socket
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError

from edgebench.devices.profiles import Profile, ProfileError, Speed, Transport, load_profile
from edgebench.errors import EdgebenchError
from edgebench.methods.device_speed import DeviceSpeed
from edgebench.untrusted import UnsafeName, path_name, printable


class InventoryError(EdgebenchError, ValueError):
    """An inventory file or entry that cannot be used; the message names it and the fix."""


def inventory_path() -> Path:
    return Path(os.environ.get("EDGEBENCH_INVENTORY") or "~/.config/edgebench/inventory.yaml").expanduser()


NO_HOST_RECORD = "an older edgebench (no host record)"


@dataclass(frozen=True)
class HostIdentity:
    """Which host user starts a sweep: deploy records it in the sweep (`host.json`), so `status` and
    `collect` on a device shared with other hosts leave their sweeps out (unless --all)."""

    id: str
    label: str  # user@hostname, for people: the id is what is compared

    def record(self) -> dict[str, str]:
        return {"id": self.id, "label": self.label}

    def whose(self, record: Any) -> str | None:
        """Who started a sweep, by its host record (as the device reports it: untrusted): None for
        this host; another host's label, printable; NO_HOST_RECORD for a sweep an older edgebench
        made, which counts as this host's (shown and collected, as every sweep was then)."""
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            return NO_HOST_RECORD
        if record["id"] == self.id:
            return None
        label = record.get("label")
        return printable(label if isinstance(label, str) else record["id"], newlines=False, limit=80)


def host_identity() -> HostIdentity:
    """This host user's identity: the id in `host-id` beside the inventory file, made on first use
    (the first of several processes at once wins: the others read its id)."""
    path = inventory_path().with_name("host-id")
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".host-id.{secrets.token_hex(4)}")
            tmp.write_text(secrets.token_hex(8) + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        host_id = path.read_text().strip()
    except OSError as exc:
        raise InventoryError(f"{path}: this host's id cannot be kept there ({exc.strerror}); make the folder "
                             "writable or point $EDGEBENCH_INVENTORY to one") from None
    try:
        path_name(host_id, "host id")  # a folder of the device's work dir
    except UnsafeName as exc:
        raise InventoryError(f"{path}: {exc}; delete the file (a new id is made)") from None
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name: no $USER and no passwd entry
        user = str(os.getuid())
    return HostIdentity(host_id, f"{user}@{socket.gethostname()}")


class MeasuredSpeed(Speed):
    """The rates `edgebench devices calibrate` measured on the device itself, with when (UTC, ISO
    8601) and on what: they hold for that CPU, runtime and thread count. `torch`: the torch that
    measured them (methods.device_speed); None where the native worker did (native.rates): a
    device without Python, or whose Python has no torch. `executorch`: what that worker was built
    against; `unmeasured` says why a rate it could not take is None."""

    measured_at: str
    cpu: str
    torch: str | None = None
    executorch: str | None = None
    unmeasured: dict[str, str] = Field(default_factory=dict)
    threads: int = Field(ge=1)

    def measured_with(self) -> str:
        return f"torch {self.torch}" if self.torch else f"the native worker, executorch {self.executorch}"

    def rates(self) -> DeviceSpeed:
        why = "".join(f"; {name} unknown: {reason}" for name, reason in self.unmeasured.items())
        return DeviceSpeed(**self.model_dump(include=set(Speed.model_fields)),
                           source=f"this device's own, measured on {self.measured_at[:10]} ({self.cpu}, "
                                  f"{self.measured_with()}, {self.threads} threads{why})")


class InventoryEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: str
    kind: Literal["local", "ssh", "adb"] | None = None
    host: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    key: str | None = None
    known_hosts: str | None = None
    serial: str | None = None
    connect_timeout_s: float | None = Field(None, gt=0)
    python: str | None = None
    workdir: str | None = None
    lab: str | None = None  # the lab directory that registered this entry
    root: str | None = None  # board files (/proc, /sys, /etc) are read under this directory: emulated boards
    ram_bytes: ByteSize | None = None  # the board's own, over its profile's
    cores: int | None = Field(None, ge=1)  # likewise
    speed: MeasuredSpeed | None = None


NO_PYTHON = "none"  # `python: none`: the device has no Python (a phone over adb, a bare board)


@dataclass
class Device:
    """A device ready to connect to: its name, profile and merged transport settings."""

    name: str
    profile: Profile
    transport: Transport
    python: str
    workdir: str
    lab: str | None = None
    root: str | None = None  # where `devices check` reads board files; None: /
    place: str | None = None  # a labgrid place the device is reached through (devices/labgrid.py)
    coordinator: str | None = None  # ... on this labgrid coordinator
    speed: MeasuredSpeed | None = None  # its own rates, when `devices calibrate` measured them

    def device_speed(self) -> DeviceSpeed:
        """The rates the step-time estimate ranks methods by here: the device's own when
        calibrated, else its profile's (Profile.device_speed)."""
        return self.speed.rates() if self.speed else self.profile.device_speed()

    @property
    def has_python(self) -> bool:
        """False for `python: none`: only the native ExecuTorch worker runs there, under the
        shell sweep (edgebench/runner/sweep.sh), and the host talks to it with shell scripts."""
        return self.python != NO_PYTHON

    def native_only(self) -> str | None:
        """Why only the native ExecuTorch worker runs here, as the inventory tells it (no Python,
        or rates the worker measured because its Python has no torch), for predict to rank its
        runs; None where a Python with torch may run."""
        if not self.has_python:
            return f"{self.name} has no Python (`python: {NO_PYTHON}` in its inventory entry)"
        if self.speed is not None and self.speed.torch is None:
            return (f"{self.name}'s Python has no torch: `devices calibrate` measured its rates with the native "
                    "worker")
        return None

    @property
    def arch(self) -> str:
        """The arch its code runs as: a board's is its profile's; a lab device runs this
        host's python (x86_64 here), unless its python is the arm64 lab's emulated one."""
        if not self.lab:
            return self.profile.arch
        try:
            with open(self.python, "rb") as fh:
                emulated = b"edgebench arm64 lab" in fh.read(256)
        except OSError:
            emulated = False
        return "aarch64" if emulated else platform.machine()

    @property
    def address(self) -> str:
        t = self.transport
        if t.kind == "adb":
            return f"adb:{t.serial}"
        if t.kind == "local":
            return "local"
        return f"{t.user + '@' if t.user else ''}{t.host}:{t.port}"


def read_inventory(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The raw `devices` mapping (a missing file is an empty inventory)."""
    from edgebench.devices.yamlfile import read_yaml

    path = path or inventory_path()
    if not path.exists():
        return {}
    data = read_yaml(path, InventoryError) or {}
    devices = data.get("devices", {}) if isinstance(data, dict) else None
    if not isinstance(devices, dict):
        raise InventoryError(f"{path}: expected a mapping `devices: {{NAME: {{profile: ..., host: ...}}}}`")
    return devices


def read_section(key: str, path: Path | None = None) -> Any:
    """Another top-level section of the file, e.g. `labgrid:` (devices/labgrid.py); None if absent."""
    from edgebench.devices.yamlfile import read_yaml

    path = path or inventory_path()
    try:
        data = read_yaml(path, InventoryError) if path.exists() else None
    except InventoryError:
        return None  # read_inventory names the broken file
    return data.get(key) if isinstance(data, dict) else None


def write_inventory(devices: dict[str, dict[str, Any]], path: Path | None = None) -> None:
    """Replaces the file's devices (its other sections kept) at once: a temporary file of its
    own, then a rename, so a reader never sees half a file. Changes go through edited_inventory."""
    import tempfile

    import yaml

    path = path or inventory_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {key: read_section(key, path) for key in ("labgrid",) if read_section(key, path) is not None}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(yaml.safe_dump({**kept, "devices": devices}, sort_keys=True))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def edited_inventory(path: Path | None = None) -> Iterator[dict[str, dict[str, Any]]]:
    """The inventory's devices to change, read and written back under an exclusive lock (a file
    beside it), so several `devices add`, `lab up` or `devices calibrate` at once lose no entry.
    Written only when the block ends without an error."""
    path = path or inventory_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        devices = read_inventory(path)
        before = dict(devices)
        yield devices
        if devices != before:
            write_inventory(devices, path)


def make_device(name: str, entry: dict[str, Any], source: str = "inventory") -> Device:
    """Validates one entry and merges it over its profile's transport defaults."""
    try:
        path_name(name, "device name")  # runs/<device>/ on the host
    except UnsafeName as exc:
        raise InventoryError(f"{source}: {exc}; rename the entry") from None
    try:
        parsed = InventoryEntry.model_validate(entry)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: "
            + ("unknown field (check the spelling)" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()
        )
        raise InventoryError(f"{source}: device {name!r}: {problems}") from None
    try:
        profile = load_profile(parsed.profile)
    except ProfileError as exc:
        raise InventoryError(f"{source}: device {name!r}: profile: {exc}") from None
    own = parsed.model_dump(include={"ram_bytes", "cores"}, exclude_none=True)
    profile = profile.model_copy(update=own) if own else profile
    overrides = parsed.model_dump(include=set(Transport.model_fields), exclude_none=True)
    transport = profile.transport.model_copy(update=overrides)
    if transport.kind == "ssh" and not transport.host:
        raise InventoryError(f"{source}: device {name!r}: ssh needs `host:` (and usually `user:`, `key:`)")
    if transport.kind == "adb" and not transport.serial:
        raise InventoryError(f"{source}: device {name!r}: adb needs `serial:` (see `adb devices -l`)")
    return Device(
        name=name,
        profile=profile,
        transport=transport,
        python=parsed.python or profile.python,
        workdir=parsed.workdir or profile.workdir,
        lab=parsed.lab,
        root=parsed.root,
        speed=parsed.speed,
    )


def list_devices(path: Path | None = None) -> list[Device]:
    """Every inventory device, plus `local` when the file does not define it."""
    path = path or inventory_path()
    raw = read_inventory(path)
    devices = [make_device(name, entry, str(path)) for name, entry in sorted(raw.items())]
    if "local" not in raw:
        devices.insert(0, make_device("local", {"profile": "local"}, "built-in"))
    return devices


def scan_devices(path: Path | None = None) -> tuple[list[Device], dict[str, str]]:
    """Like list_devices, but a bad entry is reported by name instead of stopping the listing."""
    path = path or inventory_path()
    raw = read_inventory(path)
    devices, problems = [], {}
    for name, entry in sorted(raw.items()):
        try:
            devices.append(make_device(name, entry, str(path)))
        except InventoryError as exc:
            problems[name] = str(exc)
    if "local" not in raw:
        devices.insert(0, make_device("local", {"profile": "local"}, "built-in"))
    farm, farm_problems = _farm_devices(path, taken=set(raw) | {"local"})
    return devices + farm, {**problems, **farm_problems}


def get_device(name: str, path: Path | None = None) -> Device:
    """The device called `name`; an unknown name says where the inventory is."""
    path = path or inventory_path()
    raw = read_inventory(path)
    if name in raw:
        return make_device(name, raw[name], str(path))
    if name == "local":
        return make_device("local", {"profile": "local"}, "built-in")
    farm, problems = _farm_devices(path, only=name)
    if name in problems:
        raise InventoryError(problems[name])
    if farm:
        return farm[0]
    if "labgrid" in problems:
        raise InventoryError(f"no device {name!r} in {path}, and the board farm cannot be asked: {problems['labgrid']}")
    known = ", ".join(sorted(set(raw) | {"local"}))
    raise InventoryError(
        f"unknown device {name!r}; known: {known}. Add it to {path} with `edgebench devices add {name} --host HOST "
        "--user USER` (it detects the board and checks it), or start the lab with `edgebench lab up`"
    )


def _farm_devices(path: Path, taken: AbstractSet[str] = frozenset(), only: str | None = None) -> tuple[list[Device],
                                                                                             dict[str, str]]:
    """A labgrid board farm's places as devices, when a coordinator is configured (devices/labgrid.py;
    `only`: that place, its host key checked). Names in `taken` are the file's, which win."""
    from edgebench.devices import labgrid

    try:
        found, problems = labgrid.places(read_section("labgrid", path), str(path), only)
    except labgrid.FarmError as exc:
        return [], {"labgrid": str(exc)}
    devices = []
    for name, (coordinator, entry) in found.items():
        if name in taken:
            problems[name] = f"labgrid place {name} has the name of a device in {path}, which wins; rename one"
            continue
        try:
            device = make_device(name, entry, f"labgrid place {name} ({coordinator})")
        except InventoryError as exc:
            problems[name] = str(exc)
            continue
        device.place, device.coordinator = name, coordinator
        devices.append(device)
    return devices, problems


def add_entry(name: str, entry: dict[str, Any], path: Path | None = None) -> Device:
    """Validates and writes one entry (replacing one of that name); returns its Device."""
    path = path or inventory_path()
    device = make_device(name, entry, str(path))
    with edited_inventory(path) as raw:
        raw[name] = entry
    return device


def remove_entry(name: str, path: Path | None = None) -> dict[str, Any]:
    """Removes one entry and returns it; an unknown name says which names exist."""
    path = path or inventory_path()
    with edited_inventory(path) as raw:
        if name not in raw:
            raise InventoryError(f"no device {name!r} in {path}; known: {', '.join(sorted(raw)) or 'none'}")
        entry: dict[str, Any] = raw.pop(name)
    return entry
