"""Clock probes: the host's wall clock around one read of the device's clocks.

A probe is {host_send_ns, device_mono_ns, device_wall_ns, host_recv_ns} (host times from
time.time_ns()); the results store fits the device's monotonic clock to host time from
them. One Python process on the device answers each probe line (the telemetry room's
`clock_pair`), so a round trip is a network round trip (~1 ms on a LAN or loopback),
not a Python start-up (tens to hundreds of ms on a busy device); the alignment is good to
about half the shortest round trip.
"""

from __future__ import annotations

import json
import time
from typing import Any

from edgebench.devices.inventory import Device
from edgebench.devices.transport import Transport, TransportError

ANSWER_EACH_LINE = (
    "import json, sys\n"
    "from edgebench.telemetry.clock import clock_pair\n"
    "for _ in sys.stdin:\n"
    "    print(json.dumps(clock_pair()), flush=True)\n"
)


# A device with no Python: the native worker reads the clocks (`--clock`: mono s, ns, wall s, ns),
# one process per probe line (a few ms more round trip than the Python answerer).
SHELL_ANSWER_EACH_LINE = 'while read -r _; do sh "$1/run.sh" --clock || exit 1; done'


def _pair(reply: str) -> dict[str, int]:
    if reply.lstrip().startswith("{"):
        pair: dict[str, int] = json.loads(reply)  # telemetry.clock.clock_pair's JSON
        return pair
    mono_s, mono_n, wall_s, wall_n = (int(x) for x in reply.split())
    return {"mono_ns": mono_s * 10**9 + mono_n, "wall_ns": wall_s * 10**9 + wall_n}


def probe_clock(transport: Transport, device: Device, package_dir: str, count: int = 10,
                worker: str | None = None) -> list[dict[str, Any]]:
    """Takes `count` probes with the edgebench copy shipped in `package_dir` on the device, or
    with the native worker bundle `worker` on a device with no Python."""
    if worker is not None:
        session = transport.interact(["sh", "-c", SHELL_ANSWER_EACH_LINE, "sh", worker])
    else:
        session = transport.interact(["env", f"PYTHONPATH={package_dir}", device.python, "-c", ANSWER_EACH_LINE])
    probes = []
    try:
        session.ask("warm-up", timeout=60)  # Python's start-up is not part of any probe
        for _ in range(count):
            host_send = time.time_ns()
            reply = session.ask("probe")
            host_recv = time.time_ns()
            try:
                pair = _pair(reply)
            except ValueError:
                raise TransportError(f"{device.name}: clock probe answered {reply[:200]!r}") from None
            probes.append({"host_send_ns": host_send, "device_mono_ns": pair["mono_ns"],
                           "device_wall_ns": pair["wall_ns"], "host_recv_ns": host_recv})
    finally:
        session.close()
    return probes
