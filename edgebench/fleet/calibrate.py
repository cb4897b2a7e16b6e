"""`edgebench devices calibrate`: the step-time model's rates measured on the device itself.

predict and deploy's preflight rank methods by a device's rates (methods.device_speed), which
differ between CPUs more than the methods differ, most of all for bf16 matmuls; a reference
x86 host's stand in for a board's until they are measured there, with the board's own Python
and torch, and stored in its inventory entry (inventory.MeasuredSpeed). A device without
Python (a phone), or whose Python has no torch, runs only the native worker, so the worker
measures them there as it spends time (native.rates), shipped with its rates programs as
deploy ships its assets: the device is measured as it is, not told to install torch first.
Measuring ships and runs programs on the device as deploy does, so it is the fleet's, not the
devices'.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from edgebench.devices.inventory import Device, MeasuredSpeed, edited_inventory, inventory_path
from edgebench.devices.profiles import Speed
from edgebench.errors import EdgebenchError
from edgebench.untrusted import printable

# `import torch` and measure() take seconds on a board, minutes under the arm64 lab's emulation;
# the native worker's rates a few seconds.
TIMEOUT_S = 900


class CalibrationError(EdgebenchError):
    """Rates that cannot be measured on a device; the message names it and the fix."""


def measure_on(device: Device, log: Callable[[str], None] = lambda _: None) -> MeasuredSpeed:
    """The device's rates, measured there by methods/device_speed.py's source under its python,
    or by the native worker on a device without one or whose python has no torch (`log` hears
    why, and the worker's build and shipping)."""
    from edgebench.devices import connect
    from edgebench.fleet.remote import run_program
    from edgebench.methods import device_speed

    if not device.has_python:
        return _measure_native(device, log, "it has no Python")
    with connect(device) as transport:
        found = run_program(transport, device, device_speed, timeout=TIMEOUT_S)
    if "missing" in found:
        why = f"{found['python']} has no {found['missing']}"
        log(f"{device.name}: {why}: measuring with the native worker, which runs without it")
        return _measure_native(device, log, why)
    return _checked(device, lambda: MeasuredSpeed(**found["speed"], cpu=found["cpu"], torch=found["torch"],
                                                  threads=found["threads"], measured_at=_now()))


def _checked(device: Device, make: Callable[[], MeasuredSpeed]) -> MeasuredSpeed:
    """The rates the device reported, held to MeasuredSpeed's ranges before anything is stored;
    a device reporting NaN, 0, inf, a string or a missing rate is refused, naming it."""
    from pydantic import ValidationError

    try:
        return make()
    except (ValidationError, KeyError, TypeError) as exc:
        what = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()) \
            if isinstance(exc, ValidationError) else f"{type(exc).__name__}: {exc}"
        raise CalibrationError(f"{device.name}: the rates it reported are not a measurement "
                               f"({printable(what, limit=300)}); nothing was stored. Run `edgebench devices calibrate` "
                               "again on a quiet device") from None


def _measure_native(device: Device, log: Callable[[str], None], why: str) -> MeasuredSpeed:
    """The native worker's rates on a device where torch cannot measure them (`why`): the worker
    bundle for the arch the device reports and the rates programs, shipped (cached,
    sha256-checked) to its workdir, then `sh run.sh --rates` there."""
    from edgebench.devices import connect
    from edgebench.devices.device_scripts import facts as facts_script
    from edgebench.fleet.deploy import ship_folders
    from edgebench.fleet.remote import run_program
    from edgebench.methods.device_speed import cpu_model
    from edgebench.native import rates
    from edgebench.native.build import NativeBuildError, bundle
    from edgebench.runner.native import bundle_facts

    with connect(device) as transport:
        facts = run_program(transport, device, facts_script, device.workdir)
        try:
            worker = bundle(facts["arch"], log=log)
        except NativeBuildError as exc:
            torch = f"; or give it torch: `edgebench devices check {device.name} --fix`" if device.has_python else ""
            raise CalibrationError(f"{device.name}: its rates are measured by the native worker ({why}), which "
                                   f"cannot be built for it: {exc}{torch}") from None
        log(f"{device.name}: rates programs (exported once)")
        remote_worker, remote_rates = ship_folders(
            transport, device, {worker: "native worker", rates.program(): "rates programs"}, facts["workdir"], log)
        log(f"{device.name}: measuring")
        done = transport.run(rates.command(remote_worker, remote_rates), timeout=TIMEOUT_S)
        cpuinfo = transport.run(["cat", "/proc/cpuinfo"]).stdout
    if done.rc != 0:
        raise CalibrationError(f"{device.name}: the native worker's rates mode failed (exit {done.rc}): "
                               f"{done.stderr.strip()[-1500:]}")
    found = rates.read(done.stdout, device.name)
    return _checked(device, lambda: MeasuredSpeed(
        **{k: found[k] for k in Speed.model_fields}, cpu=cpu_model(cpuinfo) or facts["arch"],
        executorch=bundle_facts(worker).get("executorch"), unmeasured=found["unmeasured"], threads=found["threads"],
        measured_at=_now()))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def store(name: str, speed: MeasuredSpeed, path: Path | None = None) -> None:
    """Writes the rates into `name`'s inventory entry, replacing earlier ones."""
    path = path or inventory_path()
    with edited_inventory(path) as devices:
        if name not in devices:
            raise CalibrationError(f"{name} is not in {path}, so its rates have nowhere to be stored; add it with "
                                   f"`edgebench devices add {name} --host HOST`")
        devices[name] = {**devices[name], "speed": speed.model_dump()}
