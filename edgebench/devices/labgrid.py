"""Devices from a labgrid board farm, and a place held for the whole length of a sweep.

Memory and power are whole-device figures, so two sweeps on one board spoil each other.
labgrid already arbitrates shared boards (a coordinator, exporters publishing each board's
resources, places that users acquire and release); edgebench uses it instead of a lock
of its own. Point edgebench at a coordinator with `$LG_COORDINATOR` (as for labgrid-client;
it wins) or the inventory's `labgrid:` section:

    labgrid:
      coordinator: farm.example.org:20408
      key: ~/.ssh/id_ed25519              # the key the boards accept (default: agent, ~/.ssh keys)
      known_hosts: ~/.ssh/known_hosts     # the boards' host keys (the default)

Every place whose resources include a `NetworkService` (address, username, port) becomes a
device of the place's name. Place tags: `edgebench-profile=ID` (required),
`edgebench-hostkey=SHA256:...` (a board whose key known_hosts lacks is trusted only if it
offers exactly this key; the key is then added to known_hosts), `edgebench-python=PATH`,
`edgebench-workdir=DIR`. Host keys are never trusted silently.

`reserve` acquires the place for a deploy, tags it `edgebench-sweep=ID` once the sweep
has started and releases it if the deploy fails or is interrupted before that; the
sweep then runs detached with the place held, and `release_finished` (collect) gives
it back once the sweep's process has ended. labgrid is imported only when a coordinator
is configured, so the inventory works without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from edgebench.devices.background_loop import background_loop
from edgebench.errors import EdgebenchError

PROFILE_TAG = "edgebench-profile"
HOSTKEY_TAG = "edgebench-hostkey"
PYTHON_TAG = "edgebench-python"
WORKDIR_TAG = "edgebench-workdir"
SWEEP_TAG = "edgebench-sweep"
DEFAULT_PORT = 20408
TIMEOUT_S = 15.0
INSTALL_HINT = "pip install 'edgebench[farm]' (labgrid==26.0.1)"


class FarmError(EdgebenchError, ValueError):
    """A coordinator, place or tag that cannot be used; the message names it and the fix."""


class PlaceHeld(FarmError):
    """The place is acquired already: the message says by whom, since when and for which sweep."""


class FarmDevice(Protocol):
    """What this module needs of an inventory Device (it does not import the inventory, which
    imports this module to list a farm's places)."""

    name: str
    place: str | None
    coordinator: str | None


class FarmSettings(BaseModel):
    """The inventory's `labgrid:` section (the coordinator may come from $LG_COORDINATOR)."""

    model_config = ConfigDict(extra="forbid")

    coordinator: str | None = None
    key: str | None = None
    known_hosts: str | None = None


def settings(section: Any, source: str) -> FarmSettings | None:
    """The farm settings, or None when no coordinator is configured (no labgrid needed then)."""
    try:
        parsed = FarmSettings.model_validate(section or {})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise FarmError(f"{source}: labgrid: {problems} (allowed: coordinator, key, known_hosts)") from None
    parsed.coordinator = os.environ.get("LG_COORDINATOR") or parsed.coordinator
    return parsed if parsed.coordinator else None


def _labgrid_client() -> Any:
    try:
        from labgrid.remote import client
    except ImportError:
        raise FarmError(f"a labgrid coordinator is configured but labgrid is not installed: {INSTALL_HINT}") from None
    root = logging.getLogger()
    if not any(isinstance(f, _QuietLabgrid) for f in root.filters):
        root.addFilter(_QuietLabgrid())
    return client


class _QuietLabgrid(logging.Filter):
    """labgrid's client logs a lost coordinator on the root logger (printed as `ERROR:root:...`);
    edgebench says it once, in its own words, so those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}labgrid{os.sep}" not in record.pathname


def _event_loop() -> asyncio.AbstractEventLoop:
    """One event loop in a daemon thread for every coordinator session: grpc's asyncio channels
    do not work from several loops at once (deploys run one thread per device)."""
    return background_loop("labgrid")


class Coordinator:
    """A short session with a labgrid coordinator, driven synchronously from any thread
    (labgrid's client is asyncio)."""

    def __init__(self, address: str, timeout_s: float = TIMEOUT_S):
        self.address = address if ":" in address else f"{address}:{DEFAULT_PORT}"
        self.timeout_s = timeout_s

    def __enter__(self) -> Coordinator:
        client = _labgrid_client()
        loop = _event_loop()

        async def start() -> Any:
            import grpc
            from labgrid.remote.generated import labgrid_coordinator_pb2_grpc as pb2_grpc

            session = client.ClientSession(self.address, loop)
            # One TCP connection per session: the coordinator tells clients apart by address:port, and
            # grpc would share one connection among this process's sessions (one thread per device).
            await session.channel.close()
            session.channel = grpc.aio.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
            session.stub = pb2_grpc.CoordinatorStub(session.channel)
            try:
                await session.start()
            except BaseException:
                await session.close()
                raise
            return session

        try:
            self.session = self._run(start())
        except (client.Error, OSError) as exc:
            raise FarmError(f"labgrid coordinator {self.address}: unreachable ({str(exc) or type(exc).__name__}); "
                            "check $LG_COORDINATOR or `labgrid: coordinator:` in the inventory and that "
                            "labgrid-coordinator runs there") from None
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._run(self.session.stop())
            self._run(self.session.close())
        except Exception:  # a session whose coordinator went away closes anyway
            pass

    def _run(self, awaitable: Any) -> Any:
        async def bounded() -> Any:
            return await asyncio.wait_for(awaitable, self.timeout_s)

        try:
            return asyncio.run_coroutine_threadsafe(bounded(), _event_loop()).result()
        except asyncio.TimeoutError:
            raise FarmError(f"labgrid coordinator {self.address}: no answer within {self.timeout_s:g} s; check "
                            "that labgrid-coordinator runs there") from None

    @property
    def identity(self) -> str:
        """Who acquires: labgrid's `host/user` ($LG_HOSTNAME, $LG_USERNAME override them)."""
        return f"{self.session.gethostname()}/{self.session.getuser()}"

    @property
    def places(self) -> dict[str, Any]:
        places: dict[str, Any] = self.session.places  # labgrid is untyped
        return places

    def place(self, name: str) -> Any:
        try:
            return self.session.places[name]
        except KeyError:
            raise FarmError(f"labgrid coordinator {self.address} has no place {name!r} (any more); "
                            "`labgrid-client places` lists them") from None

    def network_service(self, place: Any) -> dict[str, Any] | None:
        """The first NetworkService among the place's resources (address, username, port)."""
        for exporter, groups in sorted(self.session.resources.items()):
            for group, resources in sorted(groups.items()):
                for name, resource in sorted(resources.items()):
                    if resource.data.get("cls") == "NetworkService" and \
                            place.hasmatch((exporter, group, "NetworkService", name)):
                        args: dict[str, Any] = resource.args
                        return args
        return None

    def _call(self, method: str, request: Any) -> str | None:
        """Sends one request; returns the coordinator's refusal, or None when done."""
        import grpc

        async def call() -> None:
            await getattr(self.session.stub, method)(request)
            await self.session.sync_with_coordinator()

        try:
            self._run(call())
        except grpc.aio.AioRpcError as exc:
            self._run(self.session.sync_with_coordinator())
            return exc.details() or str(exc.code())
        return None

    def acquire(self, name: str) -> str | None:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        return self._call("AcquirePlace", pb2.AcquirePlaceRequest(placename=name))

    def release(self, name: str) -> str | None:
        """Releases the place only while this identity holds it (never someone else's)."""
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        return self._call("ReleasePlace", pb2.ReleasePlaceRequest(placename=name, fromuser=self.identity))

    def set_tags(self, name: str, tags: dict[str, str]) -> str | None:
        """Sets tags; an empty value removes the tag."""
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        return self._call("SetPlaceTags", pb2.SetPlaceTagsRequest(placename=name, tags=tags))


def _since(place: Any) -> str:
    """When the place last changed (acquiring changes it), in UTC."""
    return datetime.fromtimestamp(place.changed, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _entry(coordinator: Coordinator, place: Any, farm: FarmSettings) -> dict[str, Any] | None:
    """The inventory entry a place stands for, or None when it has no NetworkService (not an SSH board)."""
    service = coordinator.network_service(place)
    if service is None:
        return None
    tags = place.tags
    if PROFILE_TAG not in tags:
        raise FarmError(
            f"labgrid place {place.name} ({coordinator.address}): no {PROFILE_TAG} tag, so edgebench does "
            f"not know the board; `labgrid-client -p {place.name} set-tags {PROFILE_TAG}=raspberry-pi-5-8gb`"
            " (`ls device_profiles/` lists the ids)"
        )
    entry = {"profile": tags[PROFILE_TAG], "kind": "ssh", "host": service["address"],
             "port": int(service.get("port") or 22), "user": service.get("username"), "key": farm.key,
             "known_hosts": farm.known_hosts, "python": tags.get(PYTHON_TAG), "workdir": tags.get(WORKDIR_TAG)}
    return {k: v for k, v in entry.items() if v is not None}


def places(section: Any, source: str, only: str | None = None) -> tuple[dict[str, tuple[str, dict[str, Any]]],
                                                                         dict[str, str]]:
    """The configured coordinator's places that are SSH boards, as {name: (coordinator, inventory
    entry)}, and problems by place name; both empty when no coordinator is configured.

    With `only`, just that place, its host key checked: a board whose key known_hosts lacks is
    trusted only when it offers exactly the key the place's `edgebench-hostkey` tag names
    (otherwise SSH refuses it at connect time). FarmError when the coordinator cannot be asked."""
    farm = settings(section, source)
    if farm is None:
        return {}, {}
    found, problems, fingerprint = {}, {}, None
    with Coordinator(farm.coordinator or "") as coordinator:
        for name, place in sorted(coordinator.places.items()):
            if only is not None and name != only:
                continue
            try:
                entry = _entry(coordinator, place, farm)
            except FarmError as exc:
                problems[name] = str(exc)
                continue
            if entry is not None:
                found[name] = (coordinator.address, entry)
                fingerprint = place.tags.get(HOSTKEY_TAG) if name == only else None
    if only in found and fingerprint:
        try:
            _pin_host_key(only, found[only][1], fingerprint)
        except FarmError as exc:
            del found[only]
            problems[only] = str(exc)
    return found, problems


def _pin_host_key(name: str, entry: dict[str, Any], fingerprint: str) -> None:
    """Adds the board's key to known_hosts if it is not listed there and matches the tag's fingerprint."""
    import asyncssh

    host, port = entry["host"], entry["port"]
    known_hosts = Path(os.path.expanduser(entry.get("known_hosts") or "~/.ssh/known_hosts"))
    if known_hosts.exists() and asyncssh.read_known_hosts(str(known_hosts)).match(host, "", port)[0]:
        return  # listed: SSH checks the key at connect (and refuses a changed one)
    try:
        key = asyncio.run(asyncio.wait_for(asyncssh.get_server_host_key(host, port), TIMEOUT_S))
    except (OSError, asyncio.TimeoutError, asyncssh.Error):
        return  # unreachable: connecting says so
    host_spec = host if port == 22 else f"[{host}]:{port}"
    offered = key.get_fingerprint("sha256") if key is not None else "no key"
    if key is None or offered.removeprefix("SHA256:") != fingerprint.strip().removeprefix("SHA256:"):
        raise FarmError(f"{name} ({host_spec}) offers host key {offered}, but its labgrid place's {HOSTKEY_TAG} tag "
                        f"says {fingerprint}: not trusted (the connection may be intercepted). If the board was "
                        f"reinstalled, compare `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on it and update the "
                        f"tag: `labgrid-client -p {name} set-tags {HOSTKEY_TAG}=SHA256:...`")
    known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(" ".join([host_spec, *key.export_public_key("openssh").decode().split()[:2]]) + "\n")


# --- a place held for a sweep -----------------------------------------------------------------

_interrupted = threading.Event()  # set by a Ctrl-C: this process starts no more sweeps


@dataclass
class Reservation:
    """One deploy's hold on its device's place (nothing to hold for an inventory device)."""

    device: FarmDevice
    log: Callable[[str], None]
    held: bool = False
    kept: bool = False

    def _coordinator(self) -> Coordinator:
        return Coordinator(self.device.coordinator or "")

    def acquire(self) -> None:
        place = self.device.place
        with self._coordinator() as coordinator:
            refusal = coordinator.acquire(place or "")
            if refusal is not None:
                now = coordinator.place(place or "")
                if not now.acquired:
                    raise FarmError(f"{self.device.name}: labgrid refused to acquire place {place}: {refusal}")
                who = "you (" + now.acquired + ")" if now.acquired == coordinator.identity else now.acquired
                sweep = now.tags.get(SWEEP_TAG)
                doing = f" for edgebench sweep {sweep}" if sweep else ""
                if now.acquired != coordinator.identity:
                    then = f"; try again once it is released (`labgrid-client -p {place} show`)"
                elif sweep:
                    then = "; `edgebench collect` releases it once that sweep has ended"
                else:
                    then = f"; if no job of yours uses it, `labgrid-client -p {place} release`"
                raise PlaceHeld(f"{self.device.name}: labgrid place {place} is held by {who} since "
                                f"{_since(now)}{doing}: not deployed{then}")
        self.held = True
        self.log(f"{self.device.name}: acquired labgrid place {place}")

    @contextmanager
    def starting(self, sweep_id: str) -> Iterator[None]:
        """Wraps the command that starts the sweep: the last moment an interrupted deploy stops;
        once it has run, the place stays held (tagged with the sweep) until collect releases it."""
        if _interrupted.is_set():
            raise KeyboardInterrupt(f"{self.device.name}: deploy interrupted before the sweep started")
        yield
        self.kept = True
        if self.held:
            try:
                with self._coordinator() as coordinator:
                    refusal = coordinator.set_tags(self.device.place or "", {SWEEP_TAG: sweep_id})
            except FarmError as exc:
                refusal = str(exc)
            if refusal is not None:
                self.log(f"{self.device.name}: could not tag place {self.device.place} with the sweep ({refusal}); "
                         f"collect will not release it: `labgrid-client -p {self.device.place} release` when done")

    def release(self) -> None:
        if not self.held:
            return
        try:
            with self._coordinator() as coordinator:
                refusal = release_place(coordinator, self.device.place or "")
        except FarmError as exc:
            refusal = str(exc)
        if refusal is None:
            self.held = False
            self.log(f"{self.device.name}: released labgrid place {self.device.place}")
        else:
            self.log(f"{self.device.name}: could not release place {self.device.place} ({refusal}); "
                     f"`labgrid-client -p {self.device.place} release`")


def release_place(coordinator: Coordinator, place: str) -> str | None:
    """Removes the sweep tag, then releases (only if this identity holds the place)."""
    coordinator.set_tags(place, {SWEEP_TAG: ""})
    return coordinator.release(place)


@contextmanager
def reserve(device: FarmDevice, log: Callable[[str], None] = lambda _: None) -> Iterator[Reservation]:
    """Holds the device's place while a deploy runs (PlaceHeld when someone has it); gives it
    back unless the sweep was started (`Reservation.starting`)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt(f"{device.name}: not deployed: interrupted")
    reservation = Reservation(device, log)
    if device.place:
        reservation.acquire()
    try:
        yield reservation
    finally:
        if not reservation.kept:
            reservation.release()


def interrupt_reservations() -> None:
    """Ctrl-C while deploys run in threads (only the main thread sees it): from now on this
    process starts no sweep, so each deploy stops before its start command and gives its place
    back; sweeps already started keep theirs until collect sees them end."""
    _interrupted.set()


def place_status(device: FarmDevice) -> dict[str, Any]:
    """{"place": {name, coordinator, held_by, since, mine, sweep}} for a farm device, else {}."""
    if not device.place:
        return {}
    with Coordinator(device.coordinator or "") as coordinator:
        place = coordinator.place(device.place)
        held = place.acquired or None
        return {"place": {"name": place.name, "coordinator": coordinator.address, "held_by": held,
                          "since": _since(place) if held else None, "mine": held == coordinator.identity,
                          "sweep": place.tags.get(SWEEP_TAG) if held else None}}


def release_finished(
    device: FarmDevice, sweeps: dict[str, Any], log: Callable[[str], None] = lambda _: None
) -> str | None:
    """Releases the device's place if this host holds it for a sweep whose process had ended
    (`sweeps`: the device's sweeps as `devices.device_scripts.sweeps` lists them). Returns that
    sweep. A coordinator problem is logged, never fatal: the runs were fetched all the same."""
    if not device.place:
        return None
    try:
        with Coordinator(device.coordinator or "") as coordinator:
            place = coordinator.place(device.place)
            sweep: str | None = place.tags.get(SWEEP_TAG)
            if place.acquired != coordinator.identity or not sweep:
                return None
            state = sweeps.get(sweep)
            if state is None or state.get("alive"):
                return None  # still running (or not on this device: left for a person to judge)
            refusal = release_place(coordinator, device.place)
    except FarmError as exc:
        log(f"{device.name}: could not check its labgrid place: {exc}")
        return None
    if refusal is not None:
        log(f"{device.name}: could not release labgrid place {device.place}: {refusal}")
        return None
    log(f"{device.name}: sweep {sweep} has ended ({state.get('state')}): released labgrid place {device.place}")
    return sweep
