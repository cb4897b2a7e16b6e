"""bench/faults.py, the campaign of bad inputs and faults, runs to its end and counts nothing gone
wrong (issue 71: it had rotted into its own traceback once the store moved per user). By default
its quick form (a few cases of each kind); EDGEBENCH_FULL=1 runs every case."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FULL

FAULTS = Path(__file__).resolve().parents[1] / "bench" / "faults.py"
COUNT = re.compile(r"^([a-z0-9 ./]+): (\d+)$", re.MULTILINE)
TALLIES = {"cases", "run directories"}  # how much ran; every other count is of something gone wrong


@pytest.mark.slow
@pytest.mark.lab  # the full form brings a lab device up; both mount a tmpfs and make a memory cgroup
@pytest.mark.timeout(1300 if FULL else 600)
def test_faults_campaign_counts_nothing_gone_wrong():
    done = subprocess.run([sys.executable, str(FAULTS), *([] if FULL else ["--quick"])], capture_output=True,
                          text=True, timeout=1200 if FULL else 400)
    said = done.stdout + done.stderr
    counts = dict((name, int(n)) for name, n in COUNT.findall(done.stdout))
    assert counts.keys() > TALLIES and counts["cases"] >= 20, said
    assert {name: n for name, n in counts.items() if name not in TALLIES and n} == {}, said
    assert done.returncode == 0 and "Traceback" not in said, said
