"""What is running where: each device's sweeps (this host's, or every host's), their state and their
runs' statuses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgebench.devices import connect
from edgebench.devices.device_scripts import sweeps
from edgebench.devices.inventory import NO_HOST_RECORD, get_device, host_identity
from edgebench.devices.labgrid import place_status
from edgebench.devices.transport import TransportError
from edgebench.fleet.remote import run_program


def device_status(name: str, every: bool = False) -> dict[str, Any]:
    """{"device", "sweeps": {sweep_id: {alive, state, runs, specs, host}}, "others"} or {"device",
    "error"}: this host's sweeps (and an older edgebench's, with no host record), `others` counting
    other hosts' left out; `every`: all of them. One this host did not start has its `owner`
    (devices.inventory.HostIdentity.whose). A board farm's device also has "place": who holds
    its labgrid place, since when, for which sweep."""
    row: dict[str, Any] = {"device": name}
    try:
        device = get_device(name)
        row.update(place_status(device))
        me = host_identity()
        with connect(device) as transport:
            found = run_program(transport, device, sweeps, device.workdir)
        row["sweeps"], row["others"] = {}, 0
        for sweep_id, sweep in found.items():
            owner = me.whose(sweep.get("host"))
            if owner not in (None, NO_HOST_RECORD) and not every:
                row["others"] += 1
            else:
                row["sweeps"][sweep_id] = {**sweep, "owner": owner} if owner else sweep
    except (TransportError, ValueError, OSError) as exc:
        row["error"] = str(exc)
    return row


def fleet_status(names: list[str], every: bool = False) -> list[dict[str, Any]]:
    """Asks every device at once."""
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return list(pool.map(lambda name: device_status(name, every), names))


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
