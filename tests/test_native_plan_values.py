"""The native plan's ranges (edgebench/native/plan.py PLAN_VALUES): the host's own limits, held
by write_plan to every line it writes and generated into the worker's plan_values.h, which its
C++ unit tests (worker_tests.cpp, tests/test_native_cpp.py) try every range of."""

from __future__ import annotations

import pytest

from edgebench.cli_types import MAX_SEED
from edgebench.methods.knobs import MAX_ACCUMULATION
from edgebench.native.build import plan_values_header
from edgebench.native.plan import PLAN_VALUES, Real, Whole, plan_problem
from edgebench.runner.spec import MAX_DURATION_S, MAX_STEPS, MAX_THREADS


def test_the_ranges_are_the_hosts():
    assert PLAN_VALUES["threads"] == (Whole(0, MAX_THREADS),)
    assert PLAN_VALUES["steps"] == (Whole(1, MAX_STEPS),)
    assert PLAN_VALUES["accumulation"] == (Whole(1, MAX_ACCUMULATION),)
    assert PLAN_VALUES["seed"] == (Whole(0, MAX_SEED),)
    assert PLAN_VALUES["duration_s"] == (Real(0.0, MAX_DURATION_S),)


def test_the_workers_header_holds_every_range():
    header = plan_values_header()
    for key in PLAN_VALUES:
        assert f'{{"{key}", {{' in header, key
    assert '{"threads", {rule::whole(0LL, 1024LL)}, false}' in header
    assert '{"group_lr", {rule::real(0.0, HUGE_VAL, true), rule::real(0.0, HUGE_VAL, true)}, false}' in header
    assert '{"input", {rule::text(), rule::text(), rule::whole(1LL, 2147483647LL)}, true}' in header


@pytest.mark.parametrize("line", ["threads 1025", "threads -1", "threads 4x", "accumulation 0", "accumulation 1025",
                                  "steps 1000001", "seed -1", f"seed {MAX_SEED + 1}", "group_lr 0.001 0",
                                  "group_lr nan 0.001", "group_lr 0.001", "duration_s 1e9", "clip inf",
                                  "batches ../x", "batches .", "eval_weights ../x 6 .safetensors",
                                  "eval_weights eval- 6 /x", "eval_weights eval- 21 .x", "input ids int64",
                                  "input ids int64 1 0", "param w 2 10", "threads 4 4"])
def test_a_line_the_worker_refuses_is_refused_here(line):
    assert plan_problem(line), line


@pytest.mark.parametrize("line", ["threads 0", "threads 1024", f"seed {MAX_SEED}", "group_lr 1e-05 0.00512",
                                  "eval_weights eval-weights- 6 .safetensors", "batches batches.bin",
                                  "input pixel_values float32 1 3 32 32", "param w 1 0", 'predicted {"a": 1}'])
def test_a_line_the_worker_reads_is_not(line):
    assert plan_problem(line) is None, line
