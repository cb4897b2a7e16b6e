"""The divergence rule (edgebench.figures.status.LossWatch): one definition, which the native
worker's copy (edgebench/native/common.h) is held to by its constants here and by the same cases
in its C++ unit tests (worker_tests.cpp's loss_watch, run by tests/test_native_cpp.py)."""

from __future__ import annotations

import math
import re

import pytest

from edgebench.figures.run_end import RunEnd
from edgebench.figures.run_events import Diverged
from edgebench.figures.status import DIVERGED_FACTOR, DIVERGED_WINDOW, EXIT_DIVERGED, LossWatch, run_status
from edgebench.native.build import SOURCES


def first_diverged(losses: list[float]) -> int | None:
    watch = LossWatch()
    return next((step for step, loss in enumerate(losses) if watch.diverged(loss)), None)


# (losses, the step the run ends diverged at, None: it does not): worker_tests.cpp's loss_watch has the same
CASES = [
    ([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], None),  # learning
    ([1.0, 1.0, 1.0, 1.0, 1.0, 20.0, 1.0, 1.0], None),  # one spike: the mean of the last 5 stays at 4.8x
    ([1.0, 1.0, 1.0, 1.0, 1.0, 20.0, 20.0], 6),  # a second one: 8.6x
    ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 7),  # a steady rise: exactly 5x at step 6 is not past it
    ([1.0, 8.0], None),  # before the window fills, the mean of the losses so far: 4.5x
    ([1.0, 10.0], 1),  # 5.5x
    ([1.0, 2.0, math.nan], 2),
    ([math.inf], 0),
    ([1.0, -math.inf], 1),
]


@pytest.mark.parametrize("losses,step", CASES)
def test_the_rule(losses, step):
    assert first_diverged(losses) == step


def test_the_native_workers_rule_is_pythons():
    header = (SOURCES / "common.h").read_text()
    factor = re.search(r"constexpr double DIVERGED_FACTOR = ([0-9.eE+-]+);", header)
    window = re.search(r"constexpr size_t DIVERGED_WINDOW = (\d+);", header)
    assert factor and float(factor[1]) == DIVERGED_FACTOR
    assert window and int(window[1]) == DIVERGED_WINDOW
    assert "watch.diverged(loss)" in (SOURCES / "program.cpp").read_text()  # its step loop asks the rule


def test_the_status_says_why_the_run_diverged():
    end = RunEnd(exit_code=EXIT_DIVERGED)
    rising = run_status(end, [Diverged(t_ns=1, step=3, loss=662.1)])
    assert rising == ("diverged", f"loss 662.1 at step 3: the mean of the last {DIVERGED_WINDOW} losses rose past "
                                  f"{DIVERGED_FACTOR:g}x the first")
    assert run_status(end, [Diverged(t_ns=1, step=1, loss=math.nan)]) == \
        ("diverged", "non-finite loss nan at step 1")
