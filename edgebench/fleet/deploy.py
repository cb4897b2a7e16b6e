"""Deploy: check a device, ship edgebench and the specs, start the sweep detached.

On the device a sweep lives in `<workdir>/sweeps/<sweep_id>/`: `pkg/edgebench/` (this
package's own source, so the device runs exactly the host's code; no dependency is
installed there), `specs/NNN-<run_id>.json`, `host.json` (which host started it:
devices.inventory.HostIdentity), and what the runner writes: `runs/<run_id>/`,
`sweep.json`, `sweep.log`, `sweep.pid`. Programs, checkpoints, datasets and the native worker
are cached in `<workdir>/cache/`, checked by sha256 before each sweep (fleet/assets.py).
The sweep is started with setsid + nohup, so a dropped connection does not stop it.
One sweep runs on a device at a time: a deploy while one is alive there is refused.
Clock probes and a record of the deployment go to `<local_root>/<device>/`.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import edgebench
from edgebench.backends.support import device_reason
from edgebench.devices import connect, readiness
from edgebench.devices.device_scripts import facts as facts_script
from edgebench.devices.device_scripts import sweeps as sweeps_script
from edgebench.devices.inventory import Device, get_device, host_identity
from edgebench.devices.labgrid import interrupt_reservations, reserve
from edgebench.devices.transport import Transport, TransportError
from edgebench.errors import EdgebenchError
from edgebench.fleet import shell_sweep
from edgebench.fleet.assets import check_cache, folder_asset, plan_assets, ship_assets, ship_folder, unshipped_bytes
from edgebench.fleet.clock import probe_clock
from edgebench.fleet.plan import (
    attach_native,
    attach_program,
    device_budget,
    fit_by_shape,
    for_device,
)
from edgebench.fleet.remote import run_program
from edgebench.methods.budget import Budget, available_bytes
from edgebench.methods.device_speed import DeviceSpeed
from edgebench.runner.spec import RunSpec
from edgebench.runner.sweep import disk_needed_est
from edgebench.untrusted import printable

MIN_FREE_RAM = 200 * 2**20  # below this even importing torch fails
DISK_HEADROOM = 100 * 2**20  # traces of a long sweep


class PreflightError(EdgebenchError, RuntimeError):
    """The device cannot run the sweep; the message lists every problem with its fix."""


class DeviceBusy(PreflightError):
    """A sweep still runs on the device: two at once would share its memory and disturb each other."""


def check_idle(transport: Transport, device: Device) -> None:
    """Refuses (DeviceBusy) while a sweep process is alive on the device, as the device's own
    sweeps script sees it: a sweep started from another host, or whose host went away, counts."""
    states = run_program(transport, device, sweeps_script, device.workdir)
    running = [sid for sid, state in (states.items() if isinstance(states, dict) else ())
               if isinstance(state, dict) and state.get("alive") is True]
    if running:
        sweep = printable(running[0], newlines=False)[:80]
        raise DeviceBusy(f"{device.name}: sweep {sweep} is still running there (one sweep at a time); wait for it "
                         f"to end (`edgebench status --device {device.name}`) or stop it (on the device: kill -TERM "
                         f"$(cat {device.workdir}/sweeps/{sweep}/sweep.pid)), then deploy again")


@dataclass
class Deployment:
    device: str
    sweep_id: str
    sweep_dir: str
    run_ids: list[str]
    facts: dict[str, Any]
    probes: list[dict[str, Any]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # method -> why it was not deployed
    save_to: str | None = None  # where collect copies each run's trained weights (deploy --save)


def _tar_dir(directory: Path, arcname: str, dest: Path, compress: bool, files: list[str] | None = None) -> Path:
    """Writes a tar of a directory (or of `files`, paths relative to it), without caches, to
    `dest` (on disk: programs can be GBs)."""

    def skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if "__pycache__" in info.name or info.name.endswith(".pyc") else info

    with tarfile.open(dest, mode="w:gz" if compress else "w") as tar:
        if files is None:
            tar.add(directory, arcname=arcname, filter=skip_caches)
        for rel in files or []:
            tar.add(directory / rel, arcname=f"{arcname}/{rel}", recursive=False)
    return dest


def package_tarball(dest: Path) -> Path:
    """The edgebench package's own source (the device runs the host's code)."""
    return _tar_dir(Path(edgebench.__file__).resolve().parent, "edgebench", dest, compress=True)


def preflight(device: Device, facts: dict[str, Any], specs: list[RunSpec], payload_bytes: int) -> list[str]:
    """Every reason the device cannot run these specs, each with its fix (empty: go)."""
    problems: list[str] = []  # python and its libraries: devices.readiness.check, run beside this
    arch = facts["arch"]
    if arch != device.profile.arch and not device.lab:
        problems.append(f"the device reports arch {arch} but profile {device.profile.id} says "
                        f"{device.profile.arch}; fix `profile:` in the inventory entry")
    for backend in sorted({s.backend for s in specs}):
        if backend not in device.profile.backends:
            problems.append(f"backend {backend} is not among profile {device.profile.id}'s backends "
                            f"{device.profile.backends}; choose one of them")
        reason = device_reason(backend, arch, device=device.name)
        if reason:
            problems.append(f"backend {backend}: {reason}")
    for spec in specs:
        if spec.backend in ("executorch", "onnxruntime") and not spec.program:
            problems.append(f"{spec.run_id}: backend {spec.backend} needs an exported program; give "
                            "--program DIR (`edgebench export`)")
        if spec.program and not Path(spec.program).is_dir():
            problems.append(f"{spec.run_id}: program directory {spec.program} does not exist on this host")
    available = available_bytes(facts)
    if facts.get("mem_available_bytes") is None and not facts.get("cgroup_limit_bytes"):
        problems.append("the device's /proc/meminfo has no MemAvailable (Linux before 3.14): how much RAM a run "
                        "could take is unknown; run on a newer kernel")
    elif available < MIN_FREE_RAM:
        problems.append(f"only {available / 2**20:.0f} MiB of RAM is free; stop other programs on the device "
                        f"(at least {MIN_FREE_RAM / 2**20:.0f} MiB needed)")
    traces = disk_needed_est(specs)
    needed = payload_bytes * 2 + traces + DISK_HEADROOM
    if facts["disk_free_bytes"] < needed:
        problems.append(f"only {facts['disk_free_bytes'] / 2**20:.0f} MiB free on the disk of {facts['workdir']}; "
                        f"this sweep needs about {needed / 2**20:.0f} MiB (estimate: {payload_bytes * 2 / 2**20:.0f} "
                        f"MiB of code, programs, checkpoint and dataset, {traces / 2**20:.0f} MiB of traces); free "
                        "that much")
    return problems


def _ship_tar(transport: Transport, archive: Path, remote_dir: str) -> None:
    remote_archive = f"{remote_dir}.tar"
    transport.check(["mkdir", "-p", remote_dir])
    transport.put(archive, remote_archive)
    transport.check(["tar", "-xf", remote_archive, "-C", remote_dir])  # tar detects gzip itself
    transport.check(["rm", "-f", remote_archive])


def ship_folders(transport: Transport, device: Device, folders: dict[Path, str], workdir: str,
                 log: Callable[[str], None] = lambda _: None) -> list[str]:
    """The device paths of whole host folders (each named by what it is: "native worker"), cached
    and verified there as deploy's assets are: for what else runs on a device (calibrate's rates)."""
    assets = {str(folder): folder_asset(folder, what) for folder, what in folders.items()}
    found = check_cache(transport, device, workdir, assets)
    with tempfile.TemporaryDirectory(prefix="edgebench-ship-") as staging:
        return [ship_folder(transport, device, asset, workdir, Path(staging), _ship_tar, _tar_dir, log, found[local])
                for local, asset in assets.items()]


def _runnable(name: str, specs: list[RunSpec], refused: dict[str, str],
              why_not: Callable[[RunSpec], str | None]) -> list[RunSpec]:
    """The specs `why_not` lets through; the others' reasons go into `refused` (by method). None
    left: PreflightError listing every reason."""
    for spec in specs:
        why = why_not(spec)
        if why:
            refused[spec.method] = why
    specs = [spec for spec in specs if spec.method not in refused]
    if not specs:
        raise PreflightError(f"{name}: no method can run there:\n  - "
                             + "\n  - ".join(f"{m}: {why}" for m, why in refused.items()))
    return specs


def _fitting(name: str, specs: list[RunSpec], refused: dict[str, str], held_to: Budget,
             rates: Callable[[], DeviceSpeed], force: bool,
             log: Callable[[str], None]) -> tuple[list[RunSpec], list[str]]:
    """The memory preflight (fleet.plan.fit_by_shape): the specs left once a batch size that does
    not fit is dropped (its runs' reasons into `refused`, by method and batch), and the lines that
    refuse the whole sweep."""
    alone, whole = fit_by_shape(specs, held_to, rates, force, lambda line: log(f"{name}: {line}"))
    for spec in specs:
        if str(spec.run_id) in alone:
            refused[f"{spec.method}, batch {spec.batch_size}"] = alone[str(spec.run_id)]
    return [s for s in specs if str(s.run_id) not in alone], whole


def deploy_one(name: str, specs: list[RunSpec], local_root: Path,
               log: Callable[[str], None] = lambda _: None, save_to: str | None = None,
               force: bool = False, rerun_disturbed: int = 0) -> Deployment:
    """Preflight, ship and start one device's sweep; returns what was started. `force`: runs the
    memory model predicts do not fit go ahead (their meta.json records it). `rerun_disturbed`:
    the device's sweep runs a disturbed run again, that many extra runs at most (runner.sweep)."""
    device = get_device(name)
    specs = for_device(device.name, device.profile, specs)
    supervisor = "python" if device.has_python else "shell"
    refused: dict[str, str] = {}
    if not device.has_python:  # a Python run there is refused for that first, whatever its memory
        specs = _runnable(name, specs, refused,
                          lambda spec: shell_sweep.refusal(spec) if spec.backend != "executorch" else None)
    if not force:  # what the profile's RAM already rules out is refused before any export (minutes)
        specs, whole = _fitting(name, specs, refused, device_budget(device.profile, name, supervisor),
                                device.device_speed, force, log)
        if whole:
            raise PreflightError(f"{name} ({device.address}) cannot run this sweep:\n  - "
                                 + "\n  - ".join(f"{why}; or --force to run anyway" for why in whole))

    def exported(spec: RunSpec) -> str | None:
        return attach_program(spec, device.profile,
                              on_stage=lambda stage: log(f"{name}: export {spec.method}: {stage}"))

    specs = _runnable(name, specs, refused, exported)
    # Board farm: `reserve` holds the device's labgrid place from here (none for inventory devices).
    with reserve(device, log) as reservation, connect(device) as transport, \
            tempfile.TemporaryDirectory(prefix="edgebench-deploy-") as staging:
        log(f"{name}: preflight")
        check_idle(transport, device)
        facts = run_program(transport, device, facts_script, device.workdir)

        def native(spec: RunSpec) -> str | None:  # the native worker is built for the arch the device reports
            return attach_native(spec, facts["arch"], on_stage=lambda stage: log(f"{name}: {spec.method}: {stage}")) \
                or (None if device.has_python else shell_sweep.refusal(spec))

        specs = _runnable(name, specs, refused, native)
        package = package_tarball(Path(staging) / "pkg.tar.gz")
        assets = plan_assets(specs)
        found = check_cache(transport, device, facts["workdir"], assets)
        payload = package.stat().st_size + unshipped_bytes(assets, found)
        ready = readiness.check(device, transport, backends={readiness.need(s) for s in specs})
        problems = ready.messages() + preflight(device, facts, specs, payload)
        specs, whole = _fitting(name, specs, refused, device_budget(device.profile, name, supervisor, facts),
                                device.device_speed, force, log)
        problems += [f"{why}; or --force to run anyway" for why in whole]
        log(f"{name}: disk: {facts['disk_free_bytes'] / 2**20:.0f} MiB free; this sweep needs about "
            f"{(payload * 2 + disk_needed_est(specs) + DISK_HEADROOM) / 2**20:.0f} MiB (estimate)")
        if problems:
            raise PreflightError(f"{name} ({device.address}) cannot run this sweep:\n  - " + "\n  - ".join(problems))
        sweep_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        sweep = f"{facts['workdir']}/sweeps/{sweep_id}"
        log(f"{name}: shipping edgebench ({package.stat().st_size / 1024:.0f} KiB) to {sweep}")
        transport.check(["mkdir", "-p", f"{sweep}/specs", f"{sweep}/runs"])
        host = Path(staging) / "host.json"  # whose sweep it is: status and collect show this host's
        host.write_text(json.dumps(host_identity().record()) + "\n")
        transport.put(host, f"{sweep}/host.json")
        _ship_tar(transport, package, f"{sweep}/pkg")
        ship_assets(transport, device, specs, facts["workdir"], Path(staging), _ship_tar, _tar_dir, log, assets,
                    found)
        for index, spec in enumerate(specs):
            spec_file = Path(staging) / f"{index:03d}-{spec.run_id}.json"
            spec.save(spec_file)
            transport.put(spec_file, f"{sweep}/specs/{spec_file.name}")
            if not device.has_python:  # the shell sweep reads its runs from .env files
                env = spec_file.with_suffix(".env")
                env.write_text(shell_sweep.env_file(spec, spec_file.name))
                transport.put(env, f"{sweep}/specs/{env.name}")
        if device.has_python:
            _check_shipped_copy(transport, device, sweep)
            start = (
                f"cd {shlex.quote(sweep)} && S=$(command -v setsid || true); "
                f"PYTHONPATH={shlex.quote(sweep + '/pkg')} $S nohup {shlex.quote(device.python)} "
                f"-m edgebench.runner.sweep {shlex.quote(sweep)} --rerun-disturbed {int(rerun_disturbed)} "
                "> sweep.log 2>&1 < /dev/null & echo $! > sweep.pid"
            )
        else:
            if rerun_disturbed:
                log(f"{name}: --rerun-disturbed: not on a device without Python (its shell sweep does not judge "
                    "whether a run was disturbed); its runs are not re-run")
            transport.check(["ln", "-s", str(specs[0].native_worker), f"{sweep}/{shell_sweep.WORKER_LINK}"])
            start = shell_sweep.start_command(sweep)
        try:
            check_idle(transport, device)  # again: another deploy may have started one while this one shipped
        except DeviceBusy:
            transport.run(["rm", "-rf", sweep])
            raise
        with reservation.starting(sweep_id):  # the last moment to stop; from here the place stays held
            transport.check(["sh", "-c", start])
        log(f"{name}: sweep {sweep_id} started ({len(specs)} runs)")
        probes = probe_clock(transport, device, f"{sweep}/pkg",
                             worker=None if device.has_python else f"{sweep}/{shell_sweep.WORKER_LINK}")
    deployment = Deployment(name, sweep_id, sweep, [str(s.run_id) for s in specs], facts, probes, refused, save_to)
    _record(local_root / name, deployment)
    return deployment


def _check_shipped_copy(transport: Transport, device: Device, sweep: str) -> None:
    """The device must import the shipped copy, not another edgebench installed there."""
    out = transport.check(["env", f"PYTHONPATH={sweep}/pkg", device.python, "-c",
                           "import edgebench; print(edgebench.__file__)"]).strip()
    if not out.startswith(f"{sweep}/pkg/"):
        raise PreflightError(f"{device.name}: python imports edgebench from {out}, not the shipped copy in "
                             f"{sweep}/pkg; uninstall that copy on the device")


def _record(directory: Path, deployment: Deployment) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "clock_probes.jsonl", "a") as fh:
        for probe in deployment.probes:
            fh.write(json.dumps(probe) + "\n")
    with open(directory / "deployments.jsonl", "a") as fh:
        fh.write(json.dumps(dataclasses.asdict(deployment)) + "\n")


def deployments(name: str, local_root: Path) -> list[dict[str, Any]]:
    """This host's records of sweeps started on a device, oldest first.

    A run's directory on the device is `<sweep_dir>/runs/<run_id>` (e.g. for a live
    `tail -F` of its samples.jsonl over `connect(name).stream`).
    """
    path = local_root / name / "deployments.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def remote_run_dir(name: str, run_id: str, local_root: Path) -> str | None:
    """Where run `run_id` lives on device `name`, if this host deployed it."""
    for record in deployments(name, local_root):
        if run_id in record["run_ids"]:
            return f"{record['sweep_dir']}/runs/{run_id}"
    return None


def _device_lines(name: str, log: Callable[[str], None], lock: threading.Lock) -> Callable[[str], None]:
    """`log` for one of several devices deploying at once: a message's lines go out together (one
    device at a time, under `lock`), each starting with the device's name, so piped, the lines of
    two devices never run into one another."""

    def say(text: str) -> None:
        with lock:
            for line in text.splitlines() or [""]:
                log(line if line.startswith(f"{name}: ") else f"{name}: {line}")

    return say


def deploy_many(names: list[str], specs: list[RunSpec], local_root: Path,
                log: Callable[[str], None] = lambda _: None, save_to: str | None = None,
                force: bool = False, rerun_disturbed: int = 0) -> dict[str, Deployment | Exception]:
    """Deploys to every device at once (one thread each); a failure stays that device's. Every
    device busy: one DeviceBusy naming them all, as nothing started and there is nothing else to say."""
    lock = threading.Lock()

    def one(name: str) -> Deployment | Exception:
        try:
            return deploy_one(name, specs, local_root, _device_lines(name, log, lock), save_to, force, rerun_disturbed)
        except (PreflightError, TransportError, ValueError, OSError) as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        try:
            results = dict(zip(names, pool.map(one, names)))
        except KeyboardInterrupt:  # deploys not yet started stop and give their places back
            interrupt_reservations()
            raise
    busy = [r for r in results.values() if isinstance(r, DeviceBusy)]
    if busy and len(busy) == len(results):
        raise DeviceBusy("; ".join(map(str, busy)))
    return results
