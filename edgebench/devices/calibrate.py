"""`edgebench devices calibrate`: the step-time model's rates measured on the device itself.

predict and deploy's preflight rank methods by a device's rates (methods.device_speed), which
differ between CPUs more than the methods differ, most of all for bf16 matmuls; a reference
x86 host's stand in for a board's until they are measured there, with the board's own Python
and torch, and stored in its inventory entry (inventory.MeasuredSpeed).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from edgebench.devices.inventory import Device, MeasuredSpeed, inventory_path, read_inventory, write_inventory
from edgebench.errors import EdgebenchError

# `import torch` and measure() take seconds on a board, minutes under the arm64 lab's emulation.
TIMEOUT_S = 900


class CalibrationError(EdgebenchError):
    """Rates that cannot be measured on a device; the message names it and the fix."""


def measure_on(device: Device) -> MeasuredSpeed:
    """The device's rates, measured there by methods/device_speed.py's source under its python."""
    from edgebench.devices import connect
    from edgebench.fleet.remote import run_program
    from edgebench.methods import device_speed

    if not device.has_python:
        raise CalibrationError(
            f"{device.name} has no Python (`python: none`), and the native worker has no rates mode yet, so its rates "
            f"cannot be measured there and predict keeps a reference host's; install Python 3.10+ and torch on it, "
            f"set `python:` in its inventory entry, then calibrate again")
    with connect(device) as transport:
        found = run_program(transport, device, device_speed, timeout=TIMEOUT_S)
    if "missing" in found:
        raise CalibrationError(f"{device.name}: {found['python']} has no {found['missing']}, which the rates are "
                               f"measured with; `edgebench devices check {device.name} --fix` installs it")
    return MeasuredSpeed(**found["speed"], cpu=found["cpu"], torch=found["torch"], threads=found["threads"],
                         measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def store(name: str, speed: MeasuredSpeed, path: Path | None = None) -> None:
    """Writes the rates into `name`'s inventory entry, replacing earlier ones."""
    path = path or inventory_path()
    devices = read_inventory(path)
    if name not in devices:
        raise CalibrationError(f"{name} is not in {path}, so its rates have nowhere to be stored; add it with "
                               f"`edgebench devices add {name} --host HOST`")
    devices[name] = {**devices[name], "speed": speed.model_dump()}
    write_inventory(devices, path)
