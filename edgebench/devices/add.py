"""`edgebench devices add`'s work: a board's host key checked (and trusted), the board detected,
its profile proposed and chosen, its inventory entry written. The questions (trust this key?
which profile?) and the lines said on the way are the command's to ask and print: they come in
as callables, so this runs the same from a terminal, a script or a test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgebench.devices import connect, detect
from edgebench.devices.detect import BoardFacts, HostKey
from edgebench.devices.inventory import InventoryError, add_entry, inventory_path, read_inventory
from edgebench.devices.profiles import ProfileError, list_profiles, load_profile, resolve_profile
from edgebench.devices.profiles import Transport as TransportSettings
from edgebench.devices.readiness import ADB_LIMITS
from edgebench.devices.transport import TransportError
from edgebench.errors import EdgebenchError
from edgebench.untrusted import UnsafeName, path_name, printable


class AddError(EdgebenchError):
    """Why a board was not added (nothing written): one line that says the fix."""


@dataclass
class Added:
    """The board added: its inventory entry as written, what detection found, and the notes
    on where the board and its profile differ."""

    name: str
    entry: dict[str, Any]
    facts: BoardFacts
    notes: list[str]


def _gib(value: Any) -> str:
    return "-" if value is None or value < 0 else f"{value / 2**30:.2f}"


def add_board(name: str, *, host: str | None, serial: str | None, user: str | None, port: int | None,
              key: str | None, profile: str | None, fingerprint: str | None, known_hosts: str | None,
              python: str | None, workdir: str | None, root: str | None, yes: bool, say: Callable[[str], None],
              trust_key: Callable[[HostKey], bool], choose: Callable[[list[str], str], str]) -> Added:
    """Adds the board as `name`: `trust_key` is asked about an SSH key known_hosts does not list
    (unless `fingerprint` vouches for it), `choose` picks among the candidate profiles with the
    proposed one as default (unless --yes, or --profile named exactly one)."""
    try:
        path_name(name, "device name")  # names runs/<device>/: checked before the board is contacted
    except UnsafeName as exc:
        raise AddError(f"{exc}; pick another name") from None
    if (host is None) == (serial is None):
        raise AddError("give the board's address: --host HOST (SSH) or --serial SERIAL (adb)")
    if name in read_inventory():
        raise AddError(f"{inventory_path()} already has a device {name!r}; `edgebench devices remove {name}` first "
                       "or pick another name")
    candidates = resolve_profile(profile) if profile else []
    if profile and not candidates:
        raise AddError(f"unknown profile {profile!r}; known: {', '.join(list_profiles())}")
    entry: dict[str, Any] = {"kind": "adb", "serial": serial} if serial else {"kind": "ssh", "host": host}
    entry.update({k: v for k, v in (("port", port), ("user", user), ("key", key), ("known_hosts", known_hosts),
                                    ("python", python), ("workdir", workdir), ("root", root)) if v is not None})
    # Connection defaults come from the profile named, else the first candidate family's.
    defaults = load_profile(candidates[0]).transport if candidates else TransportSettings()
    settings = defaults.model_copy(update={k: v for k, v in entry.items() if k in TransportSettings.model_fields})
    if settings.kind == "ssh":
        if key and not Path(key).expanduser().exists():
            raise AddError(f"key file {key} does not exist; give --key the private key the board accepts")
        _check_host_key(settings, Path(known_hosts or "~/.ssh/known_hosts").expanduser(), fingerprint, say,
                        trust_key)
    facts = _probe(name, settings, workdir or "edgebench-work", root, python)
    say(_found(facts))
    if facts.mem_available_bytes is None:
        say(printable(f"note: {detect.no_mem_available(name)}", newlines=False))
    proposed = detect.propose_profiles(facts)
    candidates = candidates or proposed
    if not candidates:
        raise AddError(f"no profile matches {facts.board!r} ({facts.arch}); pass --profile (known: "
                       f"{', '.join(list_profiles())}) or write one (copy a device_profiles/*.yaml, "
                       "point $EDGEBENCH_PROFILES at its folder)")
    default = next((p for p in proposed if p in candidates), candidates[0])
    # Asked unless --yes, or --profile named exactly one.
    chosen = choose(candidates, default) if not yes and (len(candidates) > 1 or not profile) else default
    notes = _write_entry(name, entry, facts, chosen, python, say)
    say(printable(f"added {name} ({chosen}) to {inventory_path()}; its work dir: {facts.workdir}", newlines=False))
    return Added(name, entry, facts, notes)


def _check_host_key(settings: TransportSettings, kh_path: Path, fingerprint: str | None, say: Callable[[str], None],
                    trust_key: Callable[[HostKey], bool]) -> None:
    """The board's SSH host key: trusted already, vouched for by --trust-host-key, or trusted
    once `trust_key` says so (then added to known_hosts); a changed key is refused."""
    try:
        offered = detect.server_host_key(settings.host or "", settings.port, settings.connect_timeout_s)
    except TransportError as exc:
        raise AddError(str(exc)) from None
    state = detect.host_key_status(kh_path, offered)
    say(f"host key of {offered.host_spec}: {offered.algorithm} {offered.fingerprint}"
        + (f" (trusted in {kh_path})" if state == "trusted" else ""))
    if state == "changed":
        raise AddError(
            f"{offered.host_spec}: HOST KEY CHANGED — {kh_path} lists another key for it, so this "
            f"may be an interception. If the board was reinstalled, compare `{detect.keygen_hint(offered)}`"
            f" on it, then `ssh-keygen -R '{offered.host_spec}' -f {kh_path}` and run this again"
        )
    if state != "unknown":
        return
    if fingerprint is not None:
        if not detect.same_fingerprint(fingerprint, offered):
            raise AddError(
                f"{offered.host_spec} offers {offered.fingerprint}, not {fingerprint}: not trusted, "
                f"nothing written. Compare `{detect.keygen_hint(offered)}` on the board"
            )
    elif not trust_key(offered):
        raise AddError("host key not trusted: nothing written (--trust-host-key SHA256:... for scripts)")
    detect.trust(kh_path, offered)
    say(f"trusted: added to {kh_path}")


def _probe(name: str, settings: TransportSettings, workdir: str, root: str | None, python: str | None) -> BoardFacts:
    """What the board is, asked over its transport (the Pythons tried: --python's, else the usual)."""
    probe_device = detect.first_contact_device(name, settings, workdir, root)
    try:
        with connect(probe_device) as transport:
            return detect.probe(transport, probe_device, [python] if python else None)
    except TransportError as exc:
        extra = f". Note: {ADB_LIMITS}" if settings.kind == "adb" else ""
        raise AddError(f"{exc}{extra}") from None


def _found(facts: BoardFacts) -> str:
    """The board in one line: model, arch, RAM (and its memory cgroup's limit), cores, OS, Python."""
    ram, source = facts.ram()
    ram_text = f"{_gib(facts.ram_bytes)} GiB RAM" + (f" ({_gib(ram)} GiB: {source})" if source != "MemTotal" else "")
    return printable(f"found: {facts.board}, {facts.arch}, {ram_text}, {facts.cores} cores, "
                     f"{facts.os or (facts.android_model and 'Android ' + facts.android_release) or 'OS unknown'}"
                     + (f", {facts.l4t}" if facts.l4t else "")
                     + (f", python {facts.pythons[0][2]} ({facts.pythons[0][1]})" if facts.pythons
                        else ", no python found"), newlines=False)


def _write_entry(name: str, entry: dict[str, Any], facts: BoardFacts, chosen: str, python: str | None,
                 say: Callable[[str], None]) -> list[str]:
    """Writes the inventory entry for the chosen profile (with the board's RAM and cores where
    the profile's differ); returns the notes on those differences."""
    try:
        notes = detect.profile_mismatches(facts, chosen)
        chosen_profile = load_profile(chosen)
    except ProfileError as exc:
        raise AddError(str(exc)) from None
    if facts.arch and facts.arch != chosen_profile.arch:
        raise AddError(f"{name}: {notes[0]}; pick a profile for {facts.arch} with --profile")
    for note in notes:
        say(printable(f"note: {note}", newlines=False))
    entry["profile"] = chosen
    entry.update(detect.board_figures(facts, chosen_profile))
    if python is None and facts.python(chosen_profile.python) is None and facts.pythons:
        entry["python"] = facts.pythons[0][1]  # the profile's python does not run there; one that does
    if entry["kind"] == chosen_profile.transport.kind:  # the profile's own: left to it
        del entry["kind"]
    try:
        add_entry(name, entry)
    except InventoryError as exc:
        raise AddError(str(exc)) from None
    return notes
