"""Which process of a run the kernel's OOM killer takes first.

A run fills its memory limit on purpose when it measures what fits, so an OOM kill is a
result the supervisor must record. The worker volunteers (oom_score_adj 1000: always the
first choice); the supervisor and the sweep shield themselves (-999: the last choice). The
shield matters because a killed worker's memory is freed only as it exits: a second charge in
that moment (an SSH status check on a 600 MiB device, say) made the kernel kill again, took
the sweep process, and lost the result. -999, not -1000: a supervisor alone over its limit can
still be killed rather than leave the device stuck.
"""

from __future__ import annotations

WORKER = 1000
SUPERVISOR = -999


def volunteer_for_oom_kill() -> bool:
    """This worker is the OOM killer's first choice (raising needs no privilege)."""
    return _set_own(WORKER)


def shield_from_oom_kill() -> bool:
    """This supervisor is the OOM killer's last choice. Lowering needs CAP_SYS_RESOURCE
    (root); without it nothing changes. The workers it starts inherit the value until they
    volunteer."""
    return _set_own(SUPERVISOR)


def _set_own(value: int) -> bool:
    """Whether /proc/self/oom_score_adj took the value (not on Linux, or not allowed: no)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(str(value))
        return True
    except OSError:
        return False
