"""The lowest-memory methods inside an emulated device's memory limit (real sshd, real cgroup).

Reduced form (default): a 512 MiB device trains the tiny model with `qlora4` (int4 frozen
weights + LoRA) and `lomo-sr` (full-parameter bf16 weights, SGD in backward with stochastic
rounding); both must end `ok`, the loss must fall and the cgroup's peak stay under the limit.
EDGEBENCH_FULL=1: a 1 GiB device trains nanovlm-460m with qlora4 (one 512-px view per image,
--max-image-size 512) and nanovlm-222m with lomo-sr, the issue's targets (406 s on a loaded
2-core host; kernel peaks 973 and 952 MiB).
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from edgebench.cli import cli
from edgebench.devices import lab
from edgebench.figures.run import figures_of_run_dir
from edgebench.runner.spec import RunSpec
from lab_fixtures import lab_in, wait_for_sweep

pytestmark = [pytest.mark.lab, pytest.mark.slow]
FULL = os.environ.get("EDGEBENCH_FULL") == "1"
MEMORY = 2**30 if FULL else 512 * 2**20
SPECS = ([RunSpec(model="nanovlm-460m", method="qlora4", max_image_size=512, steps=3, warmup_steps=0),
          RunSpec(model="nanovlm-222m", method="lomo-sr", steps=3, warmup_steps=0)] if FULL else
         [RunSpec(method="qlora4", batch_size=4, steps=4, warmup_steps=0),
          RunSpec(method="lomo-sr", batch_size=4, steps=4, warmup_steps=0, lr=1e-2)])
TIMEOUT_S = 4 * 3600 if FULL else 600


def test_lowest_memory_methods_end_ok_inside_the_device_limit(tmp_path):
    spec_args = []
    for i, spec in enumerate(SPECS):
        spec.save(tmp_path / f"spec{i}.json")
        spec_args += ["--spec", str(tmp_path / f"spec{i}.json")]
    runs_dir = tmp_path / "runs"
    with lab_in(tmp_path, [lab.LabDevice("raspberry-pi-4-4gb", name="lab-lowmem", memory_bytes=MEMORY, cpus=1)]):
        runner = CliRunner()
        out = runner.invoke(
            cli, ["deploy", "--device", "lab-lowmem", *spec_args, "--runs-dir", str(runs_dir), "--json"]
        )
        assert out.exit_code == 0, out.output
        deployed = json.loads(out.output)["lab-lowmem"]
        wait_for_sweep("lab-lowmem", deployed["sweep_id"], TIMEOUT_S, poll_s=2)
        out = runner.invoke(cli, ["collect", "--store", str(runs_dir / "edgebench.duckdb"), "--runs-dir",
                                  str(runs_dir), "--json"])
        assert out.exit_code == 0, out.output
    for run_id, spec in zip(deployed["run_ids"], SPECS):
        run = runs_dir / "lab-lowmem" / run_id
        result = figures_of_run_dir(run)
        assert result["status"] == "ok", (spec.method, result)
        losses = [json.loads(line)["loss"] for line in (run / "events.jsonl").read_text().splitlines()
                  if '"step_end"' in line]
        assert len(losses) == spec.steps and losses[-1] < losses[0], (spec.method, losses)
        assert 0 < result["peak_rss_bytes_kernel"] <= MEMORY, (spec.method, result)
        assert result["cgroup_peak_bytes"] is None or result["cgroup_peak_bytes"] <= MEMORY, (spec.method, result)
