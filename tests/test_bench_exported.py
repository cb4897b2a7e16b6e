"""bench/exported.py's table from earlier runs' --json files (docs/measurements.md's table is printed so)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "exported.py"


def _row(preset: str, step: float, bf16: str | None = None) -> dict:
    return {"preset": preset, "runtime": "executorch", "bf16": bf16, "error": None, "step_s": step,
            "step_time_vs_eager": step, "peak_rss_vs_eager": 0.9, "export_time_s": 60.0, "export_cached": False,
            "planned_memory_bytes": 2**20, "max_loss_rel_diff": 1e-3 if bf16 or preset == "qlora" else 1e-7,
            "losses_comparable": True}


def _run(tmp_path: Path, name: str, rows: list[dict], rounds: int, model: str = "nanovlm-222m") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"model": model, "steps": 3, "warmup": 1, "text_length": 16, "rounds": rounds,
                                "rows": rows}))
    return str(path)


def _table(*files: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), "--from-json", *files, "--markdown"], capture_output=True,
                          text=True, timeout=120)


def test_a_later_runs_rows_of_a_preset_replace_the_earlier_ones_in_place(tmp_path):
    first = _run(tmp_path, "all.json", [_row("sgd", 1.2), _row("qlora", 1.9), _row("lora", 1.1)], rounds=1)
    again = _run(tmp_path, "bf16.json", [_row("qlora", 1.8), _row("qlora", 1.3, "fp32")], rounds=3)
    out = _table(first, again)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[:3] for r in rows] == [
        ["| sgd", "executorch", "1.20"], ["| qlora", "executorch", "1.80"], ["| qlora", "executorch fp32", "1.30"],
        ["| lora", "executorch", "1.10"]]
    assert rows[1].endswith("| step |") and rows[2].endswith("| - |")  # over the 1.5x target, and within it
    assert "(1 or 3 (per preset) interleaved round(s)" in out.stdout


def test_runs_of_another_model_or_shape_are_not_merged(tmp_path):
    first = _run(tmp_path, "all.json", [_row("sgd", 1.2)], rounds=1)
    other = _run(tmp_path, "tiny.json", [_row("sgd", 1.0)], rounds=1, model="tiny")
    out = _table(first, other)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"--from-json {other}: its model differ" in out.stderr
