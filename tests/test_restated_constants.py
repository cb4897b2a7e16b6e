"""Constants restated in another language: the shell sweep (edgebench/runner/sweep.sh) restates a
few of the Python supervisor's and sweep's, the native worker (edgebench/native/plan.h) the
plan's format line and (common.h) the cap of an error's detail. Each is defined in Python; these
tests hold the other copy to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgebench.figures.run_events import MAX_TEXT_CHARS
from edgebench.figures.status import HOST_MEMORY_LOW_BYTES
from edgebench.runner import native, supervisor, sweep

SWEEP_SH = Path(sweep.__file__).with_name("sweep.sh")
PLAN_H = Path(native.__file__).parents[1] / "native" / "plan.h"
COMMON_H = PLAN_H.with_name("common.h")


def _shell_constant(name: str) -> int:
    """The value of `NAME=<integer>` at the start of a line of sweep.sh (exactly one such line)."""
    values = re.findall(rf"^{name}=(\d+)\b", SWEEP_SH.read_text(), flags=re.MULTILINE)
    assert len(values) == 1, (name, values)
    return int(values[0])


@pytest.mark.parametrize(("name", "python_value"), [
    ("GRACE_S", supervisor.GRACE_S),  # a stopped worker's time to end by itself before SIGKILL
    ("HOST_OOM_WAIT_S", sweep.HOST_OOM_WAIT_S),  # the next run's wait for memory after a host-wide OOM
    ("HOST_LOW_KB", HOST_MEMORY_LOW_BYTES / 1024),  # MemAvailable below this: the device's RAM ran out
])
def test_the_shell_sweep_states_the_python_value(name, python_value):
    assert _shell_constant(name) == python_value, f"sweep.sh's {name} differs from its Python definition"


def test_the_native_worker_reads_the_plan_format_python_writes():
    declared = re.findall(r'kPlanFormat = "([^"]*)"', PLAN_H.read_text())
    assert declared == [native.PLAN_FORMAT], "native/plan.h's kPlanFormat differs from runner.native.PLAN_FORMAT"


def test_the_native_workers_detail_cap_is_the_events_text_cap():
    """The native worker cuts an error's detail to MAX_DETAIL_CHARS bytes (common.cpp json_detail),
    so no detail it writes is longer than the host's typed event allows (run_events.MAX_TEXT_CHARS):
    a longer cap would make the host refuse the run's trace."""
    declared = re.findall(r"constexpr size_t MAX_DETAIL_CHARS = (\d+);", COMMON_H.read_text())
    assert [int(v) for v in declared] == [MAX_TEXT_CHARS], "native/common.h's MAX_DETAIL_CHARS differs"
