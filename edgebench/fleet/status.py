"""What is running where: each device's sweeps, their state and their runs' statuses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgebench.devices.inventory import get_device
from edgebench.devices import connect
from edgebench.devices.transport import TransportError
from edgebench.fleet.device_scripts import sweeps
from edgebench.fleet.remote import run_program


def device_status(name: str) -> dict[str, Any]:
    """{"device", "sweeps": {sweep_id: {alive, state, runs, specs}}} or {"device", "error"}."""
    try:
        device = get_device(name)
        with connect(device) as transport:
            return {"device": name, "sweeps": run_program(transport, device, sweeps, device.workdir)}
    except (TransportError, ValueError, OSError) as exc:
        return {"device": name, "error": str(exc)}


def fleet_status(names: list[str]) -> list[dict[str, Any]]:
    """Asks every device at once."""
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return list(pool.map(device_status, names))
