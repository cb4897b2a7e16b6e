"""Device RAM: the memory the device's limit applies to, from the kernel's counters.

A device of its own cgroup (a lab device, a local run in a cgroup of its own) is that
cgroup: its usage, page cache included, at its high-water mark against its limit. A board
is its whole memory: MemTotal - MemAvailable at its lowest (every process) against
MemTotal. The local host without a cgroup of the run's own is a host shared with others:
the same figure, labelled host-wide, and not compared across devices. The worker's kernel
RSS (`peak_rss_bytes_kernel`) is another figure: it counts shared library pages the cgroup
may not be charged for, and no page cache.
"""

from __future__ import annotations

from typing import Any

UNLIMITED_BYTES = 1 << 60  # a cgroup limit of "max" reads as ~2^63
CGROUP_RAM = "device RAM (its cgroup, page cache included)"
BOARD_RAM = "device RAM (MemTotal - MemAvailable)"
HOST_RAM = "host-wide RAM (MemTotal - MemAvailable, every process of this host)"
WORKER_RSS = "kernel RSS of the worker process"
# `what` of the figures that measure one device alone: only these are compared across devices
OWN_DEVICE = (CGROUP_RAM, BOARD_RAM)


def device_ram(cgroup_bytes: float | None, cgroup_limit: float | None, mem_total: float | None,
               mem_available: float | None, shared_host: bool = False) -> dict[str, Any] | None:
    """`{bytes, limit_bytes, what}`: the device's RAM in use against its limit (the module's
    docstring); None when neither accounting can be read. `shared_host`: the board is a host
    other people's work shares (the local device), so its figure is labelled host-wide."""
    if cgroup_bytes is not None and cgroup_limit and 0 < cgroup_limit < UNLIMITED_BYTES:
        return {"bytes": int(cgroup_bytes), "limit_bytes": int(cgroup_limit), "what": CGROUP_RAM}
    if mem_total and mem_available is not None:
        return {"bytes": int(mem_total - mem_available), "limit_bytes": int(mem_total),
                "what": HOST_RAM if shared_host else BOARD_RAM}
    return None


def prediction_error_pct(predicted: float | None, measured: float | None) -> float | None:
    """How far the memory model's predicted peak (`predicted_peak_bytes_est`) is from the worker's
    measured kernel peak: (predicted - measured) / measured in % (+: it predicted too much), so a
    report shows how far to trust a prediction for a run not yet made; None without either."""
    if not predicted or not measured:
        return None
    return 100.0 * (predicted - measured) / measured
