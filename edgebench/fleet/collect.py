"""Collect: fetch finished and partial run directories, verified, resumable, idempotent.

The device lists every run file with its size and sha256; a file whose local copy
already matches is skipped; a download goes to `NAME.part` and resumes from its length
(traces are append-only), then is checked against the listed size and sha256 before it
replaces the local file. Runs land in `<local_root>/<device>/<run_id>/`; fresh clock
probes are taken, and every fetched run is ingested into the results store. Other hosts' sweeps
are left alone (each sweep's host.json: fleet.deploy; one without, an older edgebench's, is
collected), every sweep there is collected with `every` (--all).

The listing comes from the device and is not trusted: every sweep id, run id and file
name in it must be a plain file name (no `..`, no separator, not absolute); a run (or sweep)
that names another is refused, named, before anything of it is written, and the device's
other runs are collected. One collect at a time holds
`<local_root>/.collect.lock`; a second waits for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgebench.devices import connect
from edgebench.devices.device_scripts import listing
from edgebench.devices.device_scripts import sweeps as sweeps_script
from edgebench.devices.inventory import NO_HOST_RECORD, Device, get_device, host_identity
from edgebench.devices.labgrid import release_finished
from edgebench.devices.transport import Transport, TransportError
from edgebench.fleet import shell_sweep
from edgebench.fleet.clock import probe_clock
from edgebench.fleet.deploy import deployments
from edgebench.fleet.remote import run_program
from edgebench.results import runs_dir_for
from edgebench.runner.spec import WEIGHTS_DIR
from edgebench.untrusted import BadRecord, UnsafeName, inside, path_name, printable, quote

APPEND_ONLY = (".jsonl", ".log")
SHA256 = re.compile(r"[0-9a-f]{64}")


class HostileListing(TransportError):
    """The device listed a name that would leave the runs folder (or a malformed entry)."""


def check_listing(name: str, manifest: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The listing without what it may not name: a sweep or run whose id, a run with a file
    name that is not a plain file name, or whose size/sha256 is malformed, is left out, with
    why (by run id, or `sweep ID`); a listing without its `root`/`sweeps` mapping is refused
    whole (HostileListing, naming the device)."""

    def unsafe(value: Any, what: str) -> str | None:
        try:
            path_name(value, what)
        except UnsafeName:
            return f"the device's listing has {what} {quote(value)}, not a plain file name (no '..', '/', " \
                   "or leading '.'); nothing of it was written. Check the device's work directory"
        return None

    def run_problem(rid: Any, files: Any) -> str | None:
        if not isinstance(files, dict):
            return f"the device's listing has a malformed file list for run {quote(rid)}"
        for file_name, info in files.items():
            why = unsafe(str(file_name).removeprefix(f"{WEIGHTS_DIR}/"), "a file name")
            if why:
                return why
            if not (isinstance(info, dict) and isinstance(info.get("size"), int) and info["size"] >= 0
                    and isinstance(info.get("sha256"), str) and SHA256.fullmatch(info["sha256"])):
                return f"the device's listing has a malformed size/sha256 for {quote(file_name)}"
        return None

    if not isinstance(manifest, dict) or not isinstance(manifest.get("sweeps"), dict) \
            or not isinstance(manifest.get("root"), str):
        raise HostileListing(f"{name}: refused: the device's listing has no `root`/`sweeps` mapping; nothing was "
                             "written. Check the device's work directory (or the device itself) before collecting "
                             "again")
    kept: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for sweep_id, sweep in manifest["sweeps"].items():
        why = unsafe(sweep_id, "sweep id") or (None if isinstance(sweep, dict) and isinstance(sweep.get("runs"), dict)
                                               else "the device's listing has a malformed entry for it")
        if why:
            refused[f"sweep {printable(sweep_id, newlines=False, limit=80)}"] = why
            continue
        runs = {}
        for rid, files in sweep["runs"].items():
            why = unsafe(rid, "run id") or run_problem(rid, files)
            if why:
                refused[printable(rid, newlines=False, limit=80)] = why
            else:
                runs[rid] = files
        kept[sweep_id] = {**sweep, "runs": runs}
    return {**manifest, "sweeps": kept}, refused


@contextlib.contextmanager
def collect_lock(local_root: Path, log: Callable[[str], None] = lambda _: None) -> Iterator[None]:
    """Holds `<local_root>/.collect.lock` (a second collect waits), so two collects never
    write the same files or the store at once."""
    local_root.mkdir(parents=True, exist_ok=True)
    with open(local_root / ".collect.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another collect into {local_root} to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@dataclass
class Collected:
    device: str
    runs: dict[str, str] = field(default_factory=dict)  # run_id -> status (or "partial")
    files_fetched: int = 0
    bytes_fetched: int = 0
    ingested: list[str] = field(default_factory=list)
    not_ingested: dict[str, str] = field(default_factory=dict)  # run_id -> why
    refused: dict[str, str] = field(default_factory=dict)  # run_id -> why (a name that would leave its folder)
    probes: list[dict[str, Any]] = field(default_factory=list)
    released: str | None = None  # the sweep whose labgrid place was given back
    others: int = 0  # other hosts' sweeps left alone
    owners: dict[str, str] = field(default_factory=dict)  # run_id -> who started it, when not this host


def sha256_prefix(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        remaining = size
        while remaining > 0 and (chunk := fh.read(min(1 << 20, remaining))):
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def fetch_file(transport: Transport, remote: str, local: Path, size: int, sha256: str) -> int:
    """Brings `local` to exactly the listed size and sha256; returns bytes transferred."""
    if local.exists() and local.stat().st_size == size and sha256_prefix(local, size) == sha256:
        return 0
    part = local.with_name(local.name + ".part")
    if not part.exists() and local.exists() and local.suffix in APPEND_ONLY and local.stat().st_size < size:
        os.replace(local, part)  # an append-only trace grew: fetch only the new bytes
    for attempt in range(2):
        offset = part.stat().st_size if part.exists() and attempt == 0 else 0
        offset = min(offset, size)
        transport.get(remote, part, offset=offset)
        with open(part, "r+b") as fh:  # the file may have grown since it was listed
            fh.truncate(size)
        if part.stat().st_size == size and sha256_prefix(part, size) == sha256:
            os.replace(part, local)
            return size - offset
    part.unlink(missing_ok=True)
    raise TransportError(f"{transport.device.name}: {remote} does not match its listed size/sha256 after two "
                         "downloads (it was rewritten meanwhile?); run collect again")


def _fresh_probes(transport: Transport, device: Device, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Probes with the newest sweep's shipped package, or its worker on a device with no Python
    (none if nothing was deployed)."""
    sweeps = sorted(manifest["sweeps"])
    if not sweeps:
        return []
    sweep = f"{manifest['root']}/{sweeps[-1]}"
    return probe_clock(transport, device, f"{sweep}/pkg",
                       worker=None if device.has_python else f"{sweep}/{shell_sweep.WORKER_LINK}")


def collect_device(name: str, run_id: str | None = None, local_root: Path | None = None,
                   store_path: Path | None = None, log: Callable[[str], None] = lambda _: None,
                   every: bool = False) -> Collected:
    """Fetches one device's runs (or one run) of this host's sweeps (`every`: of every sweep there)
    into local_root (default: beside the user's store), then ingests them when a store is given;
    under the collect lock, fetch and ingest both."""
    local_root = runs_dir_for(local_root)
    with collect_lock(local_root, log):
        return _collect_device(name, run_id, local_root, store_path, log, every)


def _collect_device(name: str, run_id: str | None, local_root: Path, store_path: Path | None,
                    log: Callable[[str], None], every: bool) -> Collected:
    device = get_device(name)
    out = Collected(name)
    with connect(device) as transport:
        # Each sweep's state first: a sweep whose process is gone gets its final record there (its cut-off
        # run a result.json), so what is fetched says what status says. Board farm: the sweeps that had
        # ended before fetching give their labgrid place back after it.
        before = run_program(transport, device, sweeps_script, device.workdir)
        manifest = run_program(transport, device, listing, device.workdir, timeout=600)
        manifest, out.refused = check_listing(name, manifest)
        for what, why in out.refused.items():
            log(f"{name}: refused {what}: {why}")
        me = host_identity()
        whose = {sweep_id: me.whose(sweep.get("host")) for sweep_id, sweep in manifest["sweeps"].items()}
        if not every:  # other hosts' sweeps are theirs to collect (and probe with)
            theirs = {sweep_id for sweep_id, owner in whose.items() if owner not in (None, NO_HOST_RECORD)}
            out.others = len(theirs)
            manifest["sweeps"] = {sweep_id: s for sweep_id, s in manifest["sweeps"].items() if sweep_id not in theirs}
        for sweep_id, sweep in sorted(manifest["sweeps"].items()):
            states, owner = (sweep["state"] or {}).get("runs", {}), whose[sweep_id]
            for rid, files in sorted(sweep["runs"].items()):
                if run_id and rid != run_id:
                    continue
                if owner:
                    out.owners[rid] = owner
                local_dir = _local_path(name, local_root, f"{name}/{rid}")
                local_dir.mkdir(parents=True, exist_ok=True)
                if any(f.startswith(f"{WEIGHTS_DIR}/") for f in files):
                    (local_dir / WEIGHTS_DIR).mkdir(exist_ok=True)
                for file_name, info in files.items():
                    remote = f"{manifest['root']}/{sweep_id}/runs/{rid}/{file_name}"
                    got = fetch_file(transport, remote, _local_path(name, local_root, f"{name}/{rid}/{file_name}"),
                                     info["size"], info["sha256"])
                    if got:
                        out.files_fetched += 1
                        out.bytes_fetched += got
                try:
                    status = _local_status(local_dir)
                except BadRecord as exc:  # its result.json's end record: named, and the run not ingested
                    status, out.refused[rid] = None, str(exc)
                out.runs[rid] = status or f"partial ({states.get(rid, 'not started')})"
                log(f"{name}: {rid}: {out.runs[rid]}" + (f" ({out.owners[rid]})" if rid in out.owners else ""))
                if status:
                    _keep_weights(name, rid, local_dir, local_root, log)
        out.probes = _fresh_probes(transport, device, manifest)
        out.released = release_finished(device, before, log)
    _save_probes(local_root / name, out.probes)
    if run_id and run_id not in out.runs:
        mine = "" if every else " among this host's sweeps (--all: every host's)"
        raise TransportError(f"{name}: no run {run_id!r} on the device{mine}; `edgebench status --device {name}` "
                             "lists them")
    if store_path is not None:
        _ingest(out, local_root, store_path)
    return out


def _keep_weights(name: str, rid: str, run_dir: Path, local_root: Path, log: Callable[[str], None]) -> None:
    """A finished run's trained weights go where its `deploy --save` asked (SAVE/<run_id>/)."""
    weights = run_dir / WEIGHTS_DIR
    save_to = next((r.get("save_to") for r in deployments(name, local_root) if rid in r["run_ids"]), None)
    if save_to and (weights / "model.safetensors").is_file():
        shutil.copytree(weights, Path(save_to) / rid, dirs_exist_ok=True)
        log(f"{name}: {rid}: trained weights saved to {Path(save_to) / rid}")


def _local_path(name: str, local_root: Path, relative: str) -> Path:
    """Where a listed run or file lands under the runs folder; refused when a symlink there leads out."""
    try:
        return inside(local_root, relative, "collected path")
    except UnsafeName as exc:
        raise HostileListing(f"{name}: refused: {exc}; nothing more was written. Remove that link") from None


def _local_status(run_dir: Path) -> str | None:
    from edgebench.figures.run import status_of_run_dir

    return status_of_run_dir(run_dir)


def _save_probes(directory: Path, probes: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "clock_probes.jsonl", "a") as fh:
        for probe in probes:
            fh.write(json.dumps(probe) + "\n")


def _read_probes(directory: Path) -> list[dict[str, Any]]:
    path = directory / "clock_probes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _ingest(out: Collected, local_root: Path, store_path: Path) -> None:
    """Adds every probe (deploy-time and fresh) and every fetched run to the store."""
    from edgebench.results.store import Store

    with Store(store_path) as store:
        store.add_clock_probes(out.device, _read_probes(local_root / out.device))
        for rid in out.runs:
            try:
                store.ingest_run(local_root / out.device / rid, device=out.device, expect_run_id=rid)
                out.ingested.append(rid)
            except (UnsafeName, BadRecord) as exc:  # meta.json names another run or a path; a bad record
                out.refused[rid] = str(exc)
            except Exception as exc:  # a run that has not written meta.json yet is not an error
                out.not_ingested[rid] = f"{type(exc).__name__}: {exc}"
