"""`predict --device D` predicts for the runtime that runs there: the native worker's runs on a
device whose inventory entry says it has no Python (`python: none`) or no torch (rates that
`devices calibrate` had the native worker measure), a torch process's elsewhere; --runtime wins."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from conftest import EXPORTED_MODEL
from edgebench.cli import cli

PI = {"profile": "raspberry-pi-4-4gb", "host": "10.0.0.9"}  # never contacted: predict reads the inventory only
RATES = {"matmul_gflops": 20.0, "bf16_matmul_cost": 3.5, "pass_ns": 2.5, "normal_ns": 30.0,
         "measured_at": "2026-01-02T03:04:05+00:00", "cpu": "Cortex-A72", "torch": "2.13.0", "threads": 4}
DEVICES = {"nopy": {**PI, "python": "none"},
           "notorch": {**PI, "speed": {**RATES, "torch": None, "executorch": "1.5.1"}},
           "torch": {**PI, "speed": RATES},
           "plain": PI}


def _predict(*args: str) -> dict:
    out = CliRunner().invoke(cli, ["predict", "--model", EXPORTED_MODEL, "--json", *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_predict_ranks_what_runs_on_the_device(tmp_path, monkeypatch, export_cache):
    path = tmp_path / "inventory.yaml"
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(path))
    path.write_text(yaml.safe_dump({"devices": DEVICES}))
    for name, says in (("nopy", "nopy has no Python (`python: none`"), ("notorch", "notorch's Python has no torch")):
        native = _predict("--device", name, "--method", "sgd")
        assert native["runtime"] == "native" and native["runtime_why"].startswith(says), native
        assert native["planned_arena_bytes"] > 0 and "sequence_length" not in native  # the worker's figures
        # a method the worker does not run is refused as it is under --runtime native
        refused = CliRunner().invoke(cli, ["predict", "--device", name, "--model", EXPORTED_MODEL,
                                           "--method", "adafactor"])
        assert refused.exit_code == 2 and "native ExecuTorch worker does not run adafactor" in refused.output
    table = CliRunner().invoke(cli, ["predict", "--device", "nopy", "--model", EXPORTED_MODEL, "--method", "sgd"],
                               env={"COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    assert table.stdout.startswith("runtime: native: nopy has no Python") and "planned arena" in table.stdout
    for name in ("torch", "plain"):
        torch = _predict("--device", name, "--method", "sgd")
        assert torch["runtime"] == "python" and torch["runtime_why"].startswith("the default") and \
            torch["sequence_length"] > 0
    # an explicit --runtime wins, ranking included
    asked = _predict("--device", "nopy", "--runtime", "python")
    assert asked["runtime"] == "python" and asked["runtime_why"] == "--runtime python" and asked["methods"]
    assert "adafactor" in [r["method"] for r in asked["methods"]]  # a torch process's methods, not the worker's
    assert _predict("--device", "torch", "--runtime", "native", "--method", "sgd")["runtime"] == "native"
