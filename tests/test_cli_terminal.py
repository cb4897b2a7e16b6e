"""The terminal output of every command a user runs (no --json), once each with tiny inputs and
for each backend: the summary a person reads must not crash where the JSON for scripts does not
(`edgebench export --backend onnxruntime` once ended in `internal error: KeyError: 'delegate'`:
its summary read ExecuTorch's manifest keys).

Each command runs in-process through click; exports share the session's cache (conftest
`export_cache`) and the exported tests' model and text length, so their programs are the ones
tests/test_export_methods.py lowers (ExecuTorch's program key leaves out the method and the
device profile)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import EXPORTED_MODEL
from edgebench.cli import cli
from test_export import TEXT

EXPORTED = ("--model", EXPORTED_MODEL, "--text-length", str(TEXT))


def run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"edgebench {' '.join(args)}: {type(result.exception).__name__}: {result.exception}"
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    return result.output


@pytest.mark.parametrize("backend, method", [("executorch", "sgd"), ("onnxruntime", "adamw")])
def test_export_prints_its_summary_for_each_backend(backend, method, tmp_path, export_cache):
    out = run("export", "--device", "local", *EXPORTED, "--method", method, "--backend", backend,
              "--out", str(tmp_path / "out"))
    text = " ".join(out.split())
    assert str(tmp_path / "out") in text and "trainable parameters" in text and "lr " in text
    assert "lowering" in text
    if backend == "onnxruntime":
        assert "training graph (forward + backward)" in text and "no optimizer graph" in text
    else:
        assert "delegate" in text and "planned memory" in text
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["backend"] == backend


def test_methods_predict_models_and_sensors_print_their_tables():
    methods = run("methods")
    assert "adamw" in methods and "mezo" in methods and "backends" in methods
    predicted = run("predict", "--device", "raspberry-pi-4-4gb", "--model", "tiny")
    assert "sgd" in predicted and "est" in predicted
    one = run("predict", "--ram-bytes", str(4 << 30), "--model", "tiny", "--method", "lora+ckpt")
    assert "lora+ckpt" in one
    models = run("models")
    assert "tiny" in models and "nanovlm-222m" in models
    sensors = run("sensors", "--seconds", "0.2")
    assert "power" in sensors.lower()


@pytest.mark.parametrize("backend", ["eager", "onnxruntime", "executorch"])
def test_bench_and_report_print_their_tables_for_each_backend(backend, tmp_path, export_cache):
    runs = tmp_path / "runs"
    runtime = ["--runtime", "python"] if backend == "executorch" else []  # the native worker: test_native
    out = run("bench", *EXPORTED, "--methods", "sgd", "--backend", backend, *runtime, "--steps", "1",
              "--warmup", "0", "--runs-dir", str(runs))
    assert f"{EXPORTED_MODEL} on local, batch 1, {backend}" in " ".join(out.split()) and "sgd" in out
    assert f"edgebench report --store {runs / 'edgebench.duckdb'}" in " ".join(out.split())
    report = run("report", "--store", str(runs / "edgebench.duckdb"))
    assert "sgd" in report and "local" in report
    if backend == "eager":  # the live view of the finished run: its last frame, then it leaves
        (run_dir,) = {p.parent for p in runs.rglob("result.json")}
        assert "sgd" in run("live", "--dir", str(run_dir), "--exit-when-done", "--hz", "30")
