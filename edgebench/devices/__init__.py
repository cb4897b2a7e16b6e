"""Devices: profiles (what a device kind is), the inventory (which devices this host knows),
transports (local, ssh, adb) and the emulated lab.

`connect(name_or_device)` is the one way to reach a device. The factory lives here, not in
`transport.py`, so the concrete transports can import their base without a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgebench.devices.inventory import Device
    from edgebench.devices.transport import Transport


def connect(device: str | Device) -> Transport:
    """A connected transport for a device name (from the inventory) or a Device."""
    from edgebench.devices.inventory import get_device
    from edgebench.devices.transport import LocalTransport, TransportError

    if isinstance(device, str):
        device = get_device(device)
    kind = device.transport.kind
    if kind == "local":
        return LocalTransport(device)
    if kind == "ssh":
        from edgebench.devices.ssh import SSHTransport

        return SSHTransport(device)
    if kind == "adb":
        from edgebench.devices.adb import AdbTransport

        return AdbTransport(device)
    raise TransportError(f"{device.name}: unknown transport kind {kind!r}")
