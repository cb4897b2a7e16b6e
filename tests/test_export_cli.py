"""`edgebench export` with the user's own data and learning rate (the options bench and deploy take)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from test_data import COLOUR_ROWS, GOOD, _folder, _hf_dataset


def test_export_checks_my_data_against_the_program_and_shows_the_lr(tmp_path, export_cache):
    (tmp_path / "data").mkdir()
    data = _folder(tmp_path / "data", GOOD)
    out = subprocess.run([sys.executable, "-m", "edgebench.cli", "export", "--backend", "onnxruntime",
                          "--data", str(data), "--lr", "0.01", "--json"],  # bench's ORT request: one export
                         capture_output=True, text=True, timeout=600, check=True)
    assert out.stderr == ""  # nothing but its own output
    got = json.loads(out.stdout)
    assert got["data"]["examples"] == 2 and 2 < got["data"]["longest_tokens"] <= 32 == got["data"]["text_length"]
    assert (got["lr"]["value"], got["lr"]["source"]) == (0.01, "--lr") and "run time" in got["lr"]["where"]
    assert [i["shape"] for i in got["inputs"] if i["name"] == "input_ids"] == [[1, 32]]


@pytest.mark.parametrize("form, where", [("folder", "data.jsonl:"), ("parquet", "train-00000-of-00001.parquet row")])
def test_export_refuses_data_longer_than_the_program_before_lowering(tmp_path, monkeypatch, form, where):
    from edgebench.cli import cli

    export_cache = tmp_path / "cache"  # its own: other workers add to the session's shared cache meanwhile
    export_cache.mkdir()
    monkeypatch.setenv("EDGEBENCH_EXPORT_CACHE", str(export_cache))
    monkeypatch.setenv("EDGEBENCH_CACHE", str(tmp_path / "converted"))
    (tmp_path / "data").mkdir()
    data = _folder(tmp_path / "data", GOOD) if form == "folder" else _hf_dataset(tmp_path / "data", COLOUR_ROWS, form)
    before = sorted(p.name for p in export_cache.iterdir())
    result = CliRunner().invoke(cli, ["export", "--data", str(data), "--text-length", "4", "--lr", "0.01"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert where in " ".join(result.output.split()) and "--text-length" in result.output
    assert sorted(p.name for p in export_cache.iterdir()) == before  # refused before any lowering
    result = CliRunner().invoke(cli, ["export", "--lr", "-1"])
    assert result.exit_code == 2 and "--lr" in result.output


def test_export_refuses_fp32_bf16_without_xnnpack_naming_the_fix(tmp_path, monkeypatch):
    """bf16 "fp32" is the XNNPACK lowering's choice: asked without it, a usage error (exit 2)
    before any lowering; the profile's fp32 choice gives way to --delegate none."""
    from edgebench.cli import cli
    from exporters.manifest import ExportRequest

    monkeypatch.setenv("EDGEBENCH_EXPORT_CACHE", str(tmp_path))
    result = CliRunner().invoke(cli, ["export", "--delegate", "none", "--bf16", "fp32"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "use delegate xnnpack (`edgebench export --delegate xnnpack`), or bf16 'rounded'" in " ".join(
        result.output.split())
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="bf16 'half': use one of rounded, fp32"):
        ExportRequest(bf16="half", delegate="xnnpack")
    assert ExportRequest(backend="onnxruntime", bf16="fp32").bf16 == "rounded"  # ORT runs no bf16 method


def test_export_piped_prints_a_line_per_stage_with_the_elapsed_time(tmp_path):
    """Off a terminal rich's bar draws nothing: each stage is a plain line instead, then the summary."""
    out = subprocess.run(
        [sys.executable, "-m", "edgebench.cli", "export", "--backend", "onnxruntime", "--model", "tiny"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "EDGEBENCH_EXPORT_CACHE": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert re.fullmatch(r"\[ +\d+\.\d s\] export onnxruntime for local: build model \(1/\d\)", lines[0]), lines
    done = next(i for i, line in enumerate(lines) if line.endswith("export onnxruntime for local: done"))
    assert done >= 4 and all(re.match(r"\[ +\d+\.\d s\] export onnxruntime", line) for line in lines[:done])
    assert "lowering               training graph" in out.stderr  # the summary, ONNX Runtime's lowering too


def test_export_out_is_a_copy_and_an_altered_program_is_never_served_from_cache(tmp_path, monkeypatch):
    """`export --out DIR` copies the cache's files (editing DIR never edits the cache), and a cached
    export is served only when its files have the sha256 recorded when written: a 0-byte or edited
    program (same size) is copied or exported again, and the command says so."""
    from edgebench.cli import cli

    monkeypatch.setenv("EDGEBENCH_EXPORT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["export", "--model", "tiny", "--out", str(out)]

    def export() -> str:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    assert "exported in" in export()
    entry = next(p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".") and p.name != "programs")
    assert (out / "model.pte").stat().st_ino != (entry / "model.pte").stat().st_ino
    program = (entry / "model.pte").read_bytes()
    with open(out / "model.pte", "r+b") as handle:  # edited in place, same size
        handle.write(b"tampered")
    assert (entry / "model.pte").read_bytes() == program  # the cache is untouched
    said = export()
    assert f"{out / 'model.pte'}: not the file the export wrote" in said and "(from cache)" in said
    assert (out / "model.pte").read_bytes() == program
    (out / "model.pte").write_bytes(b"")  # 0 bytes: never "from cache"
    (entry / "model.pte").write_bytes(b"")
    said = export()
    assert f"{entry / 'model.pte'}: not the file the export wrote" in said and "exported in" in said
    assert (out / "model.pte").read_bytes() == program == (entry / "model.pte").read_bytes()
    assert "from cache" in export()

