"""The native worker's C++ unit tests (edgebench/native/worker_tests.cpp), built by build.py as
CMake's edgebench-worker-tests target and run by ctest: the optimizers against steps worked
out by hand, the plan reader on good and bad plans (each error naming its line and key), the
thread pool's loops, the saved weights (safetensors) and the evaluation points. Linked against
the runtime and its thread pool only, not the kernels."""

from __future__ import annotations

import subprocess

from edgebench.native.build import cmake, unit_tests


def test_the_workers_cpp_unit_tests_pass(tmp_path):
    build = unit_tests(tmp_path / "build")
    done = subprocess.run([cmake("ctest"), "--test-dir", str(build), "--output-on-failure"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100% tests passed" in done.stdout, done.stdout
