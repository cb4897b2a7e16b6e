"""Running the stand-alone programs of `devices/device_scripts/` on a device with `python -c`.

They use only the standard library, so they work before edgebench is shipped and on a
device where torch is missing (that is what preflight reports). Each prints one JSON object.
A device with no Python (`python: none`) runs each program's POSIX-shell twin (`NAME.sh`
beside `NAME.py`, after `common.sh`), which prints the same JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from edgebench.devices.inventory import Device
from edgebench.devices.transport import Transport, TransportError


def _source(program: ModuleType) -> Path:
    """A `device_scripts` module's file (each is a plain module, never a namespace package)."""
    if program.__file__ is None:
        raise TypeError(f"{program.__name__} has no source file to send")
    return Path(program.__file__)


def shell_twin(program: ModuleType) -> str:
    """The source `sh -c` runs for a `device_scripts` module on a device without Python: its
    `.sh` twin after `common.sh`."""
    path = _source(program)
    return (path.parent / "common.sh").read_text() + path.with_suffix(".sh").read_text()


def run_program(transport: Transport, device: Device, program: ModuleType, *args: str, timeout: float = 120) -> Any:
    """Runs a `device_scripts` module's source with the device's python (its shell twin on a
    device without one); returns its JSON."""
    path = _source(program)
    if not device.has_python:
        result = transport.run(["sh", "-c", shell_twin(program), "sh", *args], timeout=timeout)
        if result.rc != 0:
            raise TransportError(f"{device.name}: remote shell helper {path.stem}.sh failed (exit {result.rc}): "
                                 f"{result.stderr.strip()[-1500:]}")
        return json.loads(result.stdout)
    source = path.read_text()
    result = transport.run([device.python, "-c", source, *args], timeout=timeout)
    if result.rc in (126, 127) or (result.rc != 0 and "not found" in result.stderr):
        raise TransportError(
            f"{device.name}: python {device.python!r} cannot be run on the device ({result.stderr.strip()[-300:]}); "
            f"install Python 3.10+ there or set `python:` in the inventory entry (or the profile). Over adb the "
            f"`shell` user cannot run Termux's python: use SSH into Termux instead (see device_profiles/pixel-8.yaml)"
        )
    if result.rc != 0:
        raise TransportError(f"{device.name}: remote helper failed (exit {result.rc}): {result.stderr.strip()[-1500:]}")
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        name = path.stem
        shown = " ".join(result.stdout.split())[:200] or "nothing"
        raise TransportError(f"{device.name}: its {name} helper ({device.python} on the device) printed {shown!r}, not "
                             f"the JSON expected ({exc.msg} at line {exc.lineno} column {exc.colno}); something on "
                             "the device writes to stdout (a shell profile, a python wrapper): fix that, or set "
                             "`python:` in the inventory entry to a plain Python") from None
