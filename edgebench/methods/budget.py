"""What a run may take on a device: one definition for `predict --device`, the memory preflight
of `bench` and `deploy`, the lab's emulated boards, the reports and `live`.

A board's RAM is shared. Its firmware, kernel and services hold part of it at idle; the sweep's
own supervisor (Python) or sampler (a POSIX shell) runs beside the worker; and a margin stays
free for what no process peak counts (page tables, kernel stacks, the allocator's slack). A run
may take the rest:

    budget = RAM - the OS at idle - the supervisor - the margin

The OS at idle is what the device reports where it is asked (deploy's preflight, `bench` on this
host: RAM less what a new process could have now, page cache counted as free), else the figure
its profile gives for that RAM (`os_memory`, naming its public source). A lab device holds that
figure resident inside its cgroup, so what fits the lab fits the board it names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MiB = 2**20
# The sweep's own process beside the worker, resident: the Python supervisor (sampler threads,
# psutil; 37 MiB RSS of `python -m edgebench.runner` measured during a tiny run, 2026-12-07), or
# the shell sweep's sh and its short-lived tools (2 MiB VmHWM of a busybox/dash sh).
SUPERVISOR_BYTES = {"python": 40 * MiB, "shell": 4 * MiB}
SUPERVISOR_WORDS = {"python": "the Python supervisor", "shell": "the shell sampler"}
# Share of RAM kept free beyond the predicted peak: a profile's `memory_margin` unless it sets its own.
DEFAULT_MARGIN = 0.03
# Where a profile names no idle figure of its own (and the device is not asked): this share of
# its RAM stands in for the OS, labelled as such.
UNKNOWN_OS_SHARE = 0.15


def mib(n: float) -> str:
    return f"{n / MiB:,.0f} MiB"


@dataclass(frozen=True)
class Budget:
    """The parts of a device's RAM and what is left for a run (`bytes`)."""

    where: str
    ram_bytes: int
    os_bytes: int
    os_source: str
    supervisor: str  # a key of SUPERVISOR_BYTES
    margin_bytes: int

    @property
    def supervisor_bytes(self) -> int:
        return SUPERVISOR_BYTES[self.supervisor]

    @property
    def bytes(self) -> int:
        return max(0, self.ram_bytes - self.os_bytes - self.supervisor_bytes - self.margin_bytes)

    def text(self) -> str:
        """`the 755 MiB a run may take on lab-pi4 (1,024 MiB RAM less 202 MiB for its OS at idle
        (...), 40 MiB for the Python supervisor, 31 MiB margin)`."""
        return (f"the {mib(self.bytes)} a run may take on {self.where} ({mib(self.ram_bytes)} RAM less "
                f"{mib(self.os_bytes)} for its OS at idle ({self.os_source}), {mib(self.supervisor_bytes)} for "
                f"{SUPERVISOR_WORDS[self.supervisor]}, {mib(self.margin_bytes)} margin)")

    def record(self) -> dict[str, Any]:
        """What a run records of the budget it was held to (meta.json's spec, `extra.budget`)."""
        return {**asdict(self), "supervisor_bytes": self.supervisor_bytes, "budget_bytes": self.bytes}


def board_budget(where: str, ram_bytes: int, os_bytes: int, os_source: str, supervisor: str = "python",
           margin: float = DEFAULT_MARGIN) -> Budget:
    """The budget of a device with `ram_bytes` of RAM whose OS holds `os_bytes` at idle."""
    if supervisor not in SUPERVISOR_BYTES:
        raise ValueError(f"supervisor {supervisor!r}: one of {', '.join(SUPERVISOR_BYTES)}")
    return Budget(where, int(ram_bytes), max(0, int(os_bytes)), os_source, supervisor, int(ram_bytes * margin))


def available_bytes(facts: dict[str, Any]) -> int:
    """What a new run could take now (facts from devices/device_scripts/facts.py): MemAvailable, and inside
    a memory cgroup its limit less what its processes hold (its usage less its page cache, which
    the kernel reclaims before it refuses a run), the lower of the two. 0 when neither is known
    (no MemAvailable before Linux 3.14, no limit)."""
    figures = [] if facts.get("mem_available_bytes") is None else [int(facts["mem_available_bytes"])]
    limit = facts.get("cgroup_limit_bytes")
    if limit:
        held = (facts.get("cgroup_usage_bytes") or 0) - (facts.get("cgroup_cache_bytes") or 0)
        figures.append(int(limit) - max(held, 0))
    return max(min(figures, default=0), 0)


def reported_budget(where: str, ram_bytes: int, available_bytes: int, supervisor: str = "python",
                    margin: float = DEFAULT_MARGIN) -> Budget:
    """The budget from what the device reports now: what a new process could have
    (`available_bytes`: MemAvailable, or within its memory cgroup, the limit less what is not
    page cache); the rest of `ram_bytes` is its OS and whatever else runs there."""
    source = (f"{mib(available_bytes)} available, as the device reported it" if available_bytes <= ram_bytes else
              f"the device reported {mib(available_bytes)} available, more than this RAM: the RAM bounds it")
    return board_budget(where, ram_bytes, ram_bytes - min(available_bytes, ram_bytes), source, supervisor, margin)
