"""`edgebench devices`'s work: the inventory's devices as rows (profile, transport, arch, RAM,
cores) with, unless told not to contact them, whether each is reachable and ready; a bad
inventory entry is a row saying why. The command renders them as a table or JSON."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from edgebench.devices.inventory import Device, InventoryError, get_device, scan_devices

if TYPE_CHECKING:
    from edgebench.devices.readiness import Readiness


def readiness(device: Device) -> Readiness:
    """The device checked; a board farm's device is resolved again first, which checks its host key tag."""
    from edgebench.devices.readiness import Finding, Readiness, check

    if device.place:
        try:
            device = get_device(device.name)
        except InventoryError as exc:
            return Readiness(device.name, [Finding("reachable", "missing", str(exc))])
    return check(device)


def device_rows(contact: bool) -> list[dict[str, Any]]:
    """Every inventory device as a row, checked at once (a thread each) when `contact`; raises
    InventoryError where the inventory cannot be read at all."""
    found, bad = scan_devices()
    if contact:
        with ThreadPoolExecutor(max_workers=max(1, len(found))) as pool:
            states: list[Readiness | None] = list(pool.map(readiness, found))
    else:
        states = [None] * len(found)
    rows = []
    for d, r in zip(found, states):
        unreachable = next((f.detail for f in r.findings if f.item == "reachable"), None) if r else None
        rows.append({"name": d.name, "profile": d.profile.id, "transport": d.transport.kind, "address": d.address,
                     "arch": d.arch, "ram_bytes": int(d.profile.ram_bytes), "cores": d.profile.cores,
                     "backends": d.profile.backends, "lab": bool(d.lab), "labgrid_place": d.place,
                     "reachable": "not checked" if r is None else unreachable or "ok",
                     "readiness": "not checked" if r is None else r.summary(),
                     "problems": [] if r is None else r.messages()})
    rows += [{"name": name, "profile": None, "transport": None, "address": None, "arch": None, "ram_bytes": None,
              "cores": None, "backends": [], "lab": False, "reachable": f"bad inventory entry: {problem}",
              "readiness": "bad entry", "problems": [problem]} for name, problem in bad.items()]
    return rows
