"""Clock probes: the host's wall clock around one read of the device's clocks.

A probe is {host_send_ns, device_mono_ns, device_wall_ns, host_recv_ns} (host times from
time.time_ns()); the results store fits the device's monotonic clock to host time from
them. The round trip includes starting Python on the device (tens of ms), so the
alignment is good to about half the shortest round trip.
"""

from __future__ import annotations

import json
import time
from typing import Any

from edgebench.devices.inventory import Device
from edgebench.devices.transport import Transport, TransportError


def probe_clock(transport: Transport, device: Device, package_dir: str, count: int = 5) -> list[dict[str, Any]]:
    """Takes `count` probes with the edgebench copy shipped in `package_dir` on the device."""
    argv = ["env", f"PYTHONPATH={package_dir}", device.python, "-m", "edgebench.telemetry.clock"]
    probes = []
    for _ in range(count):
        host_send = time.time_ns()
        result = transport.run(argv, timeout=30)
        host_recv = time.time_ns()
        if result.rc != 0:
            raise TransportError(f"{device.name}: clock probe failed: {result.stderr.strip()[-500:]}")
        pair = json.loads(result.stdout)
        probes.append({"host_send_ns": host_send, "device_mono_ns": pair["mono_ns"],
                       "device_wall_ns": pair["wall_ns"], "host_recv_ns": host_recv})
    return probes
