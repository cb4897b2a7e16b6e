"""What is running where: each device's sweeps, their state and their runs' statuses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgebench.devices import connect
from edgebench.devices.inventory import get_device
from edgebench.devices.labgrid import place_status
from edgebench.devices.transport import TransportError
from edgebench.fleet.device_scripts import sweeps
from edgebench.fleet.remote import run_program


def device_status(name: str) -> dict[str, Any]:
    """{"device", "sweeps": {sweep_id: {alive, state, runs, specs}}} or {"device", "error"}; a board
    farm's device also has "place": who holds its labgrid place, since when, for which sweep."""
    row: dict[str, Any] = {"device": name}
    try:
        device = get_device(name)
        row.update(place_status(device))
        with connect(device) as transport:
            row["sweeps"] = run_program(transport, device, sweeps, device.workdir)
    except (TransportError, ValueError, OSError) as exc:
        row["error"] = str(exc)
    return row


def fleet_status(names: list[str]) -> list[dict[str, Any]]:
    """Asks every device at once."""
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return list(pool.map(device_status, names))


def stop_sweep(name: str, sweep_dir: str, timeout_s: float = 60) -> dict[str, Any]:
    """Sends the sweep SIGTERM (its running run ends `interrupted`, no further run starts)
    and waits until its process is gone; returns its state as `status` reads it."""
    import shlex
    import time

    device = get_device(name)
    sweep_id = sweep_dir.rstrip("/").rsplit("/", 1)[-1]
    with connect(device) as transport:
        pid_file = shlex.quote(f"{sweep_dir}/sweep.pid")
        transport.run(["sh", "-c", f'kill -TERM "$(cat {pid_file})" 2>/dev/null || true'], timeout=30)
        deadline = time.monotonic() + timeout_s
        while True:
            state: dict[str, Any] = run_program(transport, device, sweeps, device.workdir).get(sweep_id, {})
            if not state.get("alive") or time.monotonic() > deadline:
                return state
            time.sleep(0.5)
