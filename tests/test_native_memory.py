"""The native worker's predicted memory (edgebench.native.memory): from its exported program,
within 10 % of the peak the kernel measures (the worker's own VmHWM), recorded with the run,
used by the fit preflight and by `predict --runtime native`. bench/native_memory.py measures
the same on tiny and nanovlm-222m."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgebench.cli import cli
from edgebench.fleet.plan import memory_refusals
from edgebench.methods import parse_method
from edgebench.methods.budget import SUPERVISOR_BYTES, Budget, board_budget, mib
from edgebench.methods.device_speed import REFERENCE
from edgebench.native.build import bundle
from edgebench.native.memory import RUNTIME_BYTES_EST, predict_for
from test_native import _native, _program, _spec

TARGET = 0.10


@pytest.fixture(scope="session")
def native_worker():
    return bundle()  # built once, cached on disk (test_native's fixture finds the same)


@pytest.mark.parametrize("method", ["sgd", "adamw", "lora", "mezo"])
def test_the_prediction_is_within_10_percent_of_the_kernel_peak_and_recorded(export_cache, native_worker, tmp_path,
                                                                             method):
    program = _program(method)
    result, _ = _native(_spec(method, program, steps=3), native_worker, tmp_path / "run", tmp_path / "plans")
    assert result["status"] == "ok", result["detail"]
    predicted = predict_for(program, parse_method(method))
    assert result["predicted_peak_bytes_est"] == predicted["peak_bytes"]  # the plan carried it, the worker echoed it
    measured = result["peak_rss_bytes_kernel"]
    print(json.dumps({"method": method, "predicted": predicted["peak_bytes"], "measured": measured}))
    assert abs(predicted["peak_bytes"] / measured - 1) <= TARGET, (predicted, measured)
    # not the runtime constant alone: the program's own parts are a share of it
    assert predicted["peak_bytes"] > max(RUNTIME_BYTES_EST.values())


def test_the_parts_follow_the_program_kind(export_cache):
    """Adam's two moments live in the worker beside a joint program; sgd has none; MeZO holds
    its trained weights and restore records instead of gradients; LoRA keeps its frozen weights
    mapped from the .pte."""
    sgd, adamw = (predict_for(_program(m), parse_method(m)) for m in ("sgd", "adamw"))
    lora, mezo = (predict_for(_program(m), parse_method(m)) for m in ("lora", "mezo"))
    manifest = json.loads((Path(_program("sgd")) / "manifest.json").read_text())
    trained = manifest["model"]["trainable_elements"]
    assert sgd["optimizer_state_bytes"] == 0 and adamw["optimizer_state_bytes"] == 8 * trained
    assert sgd["planned_arena_bytes"] == manifest["planned_memory_bytes"]
    assert mezo["weights_copy_bytes"] == 4 * trained and mezo["restore_records_bytes"] > 0
    assert mezo["load_transient_bytes"] == 0 and sgd["load_transient_bytes"] > 0
    assert lora["mapped_program_bytes"] > 0.9 * 4 * (manifest["model"]["parameters"] - lora_trained(lora))
    assert all(p["estimate"] is True for p in (sgd, adamw, lora, mezo))


def lora_trained(figures: dict) -> int:
    return figures["optimizer_state_bytes"] // 8  # lora trains with adamw: two fp32 moments a weight


def test_a_native_run_is_refused_by_its_own_prediction_once_exported(export_cache):
    program = _program("sgd")
    native = _spec("sgd", program, runtime="native")
    peak = predict_for(program, parse_method("sgd"))["peak_bytes"]
    def budget(nbytes: int) -> Budget:  # a board whose RAM less its supervisor leaves a run `nbytes`
        return board_budget("a board", nbytes + SUPERVISOR_BYTES["shell"], 0, "none", "shell", margin=0)

    refused, why = memory_refusals([native], budget(peak - 1), lambda: REFERENCE)
    assert refused == {"sgd": peak}
    assert "predict --runtime native" in why and f"the {mib(peak - 1)} a run may take on a board" in why
    assert memory_refusals([native], budget(peak), lambda: REFERENCE) == ({}, "")
    # before its program is exported there is nothing to read: the preflight waits for it
    assert memory_refusals([_spec("sgd", None, runtime="native")], budget(1), lambda: REFERENCE) == ({}, "")


def test_predict_runtime_native_refuses_a_method_the_worker_does_not_run():
    out = CliRunner().invoke(cli, ["predict", "--ram-bytes", str(2**30), "--model", "micro", "--method", "adafactor",
                                   "--runtime", "native", "--json"])
    assert out.exit_code == 2, out.output
    assert "does not run adafactor" in out.output and "--runtime python" in out.output


def test_predict_runtime_native_says_why_a_program_cannot_be_exported(tmp_path):
    from edgebench.devices.profiles import REPO_PROFILES_DIR

    yaml = (REPO_PROFILES_DIR / "local.yaml").read_text().replace("dtype: float32", "dtype: float16")
    (tmp_path / "halfling.yaml").write_text(yaml.replace("id: local", "id: halfling").replace("alias: local",
                                                                                              "alias: halfling"))
    out = CliRunner().invoke(cli, ["predict", "--device", str(tmp_path / "halfling.yaml"), "--model", "micro",
                                   "--method", "sgd", "--runtime", "native", "--json"])
    assert out.exit_code == 2, out.output
    assert "sgd: no native program for halfling (dtype float16: training programs are exported in float32" in out.output
