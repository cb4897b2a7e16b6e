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
import os
import re

import pytest
from click.testing import CliRunner

from conftest import EXPORTED_MODEL
from edgebench.cli import cli
from test_export import TEXT

EXPORTED = ("--model", EXPORTED_MODEL, "--text-length", str(TEXT))


def run(*args: str, width: int | None = None) -> str:
    """`edgebench ARGS` in-process; with `width`, as a terminal that wide (its escape sequences removed)."""
    env = None if width is None else {"TTY_COMPATIBLE": "1", "COLUMNS": str(width)}
    result = CliRunner().invoke(cli, list(args), catch_exceptions=True, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"edgebench {' '.join(args)}: {type(result.exception).__name__}: {result.exception}"
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.output)


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
    width = 60 if backend == "eager" else None  # eager: in a terminal 60 columns wide
    out = run("bench", *EXPORTED, "--methods", "sgd", "--backend", backend, *runtime, "--steps", "1",
              "--warmup", "0", "--runs-dir", str(runs), width=width)
    assert f"{EXPORTED_MODEL} on local, batch 1, {backend}" in " ".join(out.split()) and "sgd" in out
    assert f"edgebench report --store {runs / 'edgebench.duckdb'}" in " ".join(out.split())
    if width:  # the last line wrapped at spaces: no word (the path, --store) broken by the terminal
        last = out[out.index("run directories under"):].splitlines()
        assert all(len(line) <= width or " " not in line for line in last), last
    report = run("report", "--store", str(runs / "edgebench.duckdb"))
    assert "sgd" in report and "local" in report
    if backend == "eager":  # the live view of the finished run: its last frame, then it leaves
        (run_dir,) = {p.parent for p in runs.rglob("result.json")}
        assert "sgd" in run("live", "--dir", str(run_dir), "--exit-when-done", "--hz", "30")


# ---- layouts: compact tables before cards, piped tables, prose wrapped at spaces -----------------
def _configurations(root):
    """23 configurations of one lab device: 8 methods x 3 backends (less one), with a prediction,
    the device's RAM, estimated energy, one oom, the frontier's star."""
    from results_fixtures import FakeRun, store_of

    methods = ["sgd", "adamw", "mezo", "lora", "lora+ckpt", "adamw+ckpt", "sgd+bf16", "adamw+bf16"]
    runs = [FakeRun(run_id=f"r{i}", method=method, backend=backend, rss_base=(200 + 7 * i) << 20,
                    step_s=0.1 + 0.01 * i, predicted_peak=(210 + 7 * i) << 20, power=None,
                    power_est=lambda t: 4.0 + 0 * t, status="oom" if i == 6 else "ok")
            for i, (method, backend) in enumerate((m, b) for m in methods
                                                  for b in ("eager", "onnxruntime", "executorch"))][:23]
    return store_of(root, {"lab-pi4": runs}, lambda run: {"device_ram_peak_bytes": run.rss_base + (40 << 20),
                                                          "device_ram_limit_bytes": 1 << 30})


@pytest.fixture(scope="module")
def configurations(tmp_path_factory):
    return _configurations(tmp_path_factory.mktemp("configurations"))


def _rows(lines, names):
    """The lines that are table rows: one per name, starting with it."""
    return [line for line in lines if line.split()[:1] and line.split()[0] in names]


def test_report_at_80_columns_is_one_table_of_every_configuration(configurations):
    """23 configurations at 80 columns: one header, 23 rows of names and figures (the compact table,
    its units in one line below it), the device's RAM and the prediction kept, power left out and said."""
    from edgebench.report.commands import report_command
    from layout_checks import in_terminal

    lines = in_terminal(report_command, ["--store", str(configurations)]).splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not any(line.startswith("#") for line in lines)  # no card
    (header,) = [line for line in lines if line.split()[:1] == ["method"]]
    assert header.split() == ["method", "backend", "status", "n", "peak", "est.", "err", "RAM", "t", "E", "loss"]
    rows = _rows(lines, {"sgd", "adamw", "mezo", "lora", "lora+ckpt", "adamw+ckpt", "sgd+bf16", "adamw+bf16"})
    assert len(rows) == 23 and all(re.search(r"\d+ +\d+ +[-+]\d.*% .* est ", row) for row in rows), rows
    assert "peak, est.: MiB; err, RAM: %; t: s/step; E: J/step" in lines  # the units, in one line
    assert "left out at this width: CO2e mg/step (est.), W (a wider window shows them; --json has every figure)" \
        in " ".join(line.strip() for line in lines)
    assert len(lines) < 60  # was 164 lines of cards


LEFT_OUT = "left out at this width: W (a wider window shows them; --json has every figure)"


def test_compact_tables_before_cards_and_one_layout_for_every_section():
    """The full table while it fits; then the compact one (short headers, their units on one line);
    then without the figures a narrow window spares, named; cards only where no compact row fits;
    two sections always alike."""
    from rich.console import Console

    from edgebench.terminal import Field, Section, fitted_sections, wrapped

    ident = [Field("method", "method", lambda r: r["method"], True)]
    figures = [Field("peak MiB", "peak memory (MiB)", lambda r: r["peak"], short="peak", unit="MiB"),
               Field("step s", "time per step (s)", lambda r: r["t"], short="t", unit="s/step"),
               Field("W", "power (W)", lambda r: r["w"], short="P", unit="W", drop=1)]
    narrow = [{"method": m, "peak": "300", "t": "0.25", "w": "3.1"} for m in ("sgd", "adamw")]
    wide = [{"method": "lora+ckpt+bf16", "peak": "1,300 [1,200-1,400]", "t": "0.25 [0.2-0.3]", "w": "3.1 est"}]

    def shown(width):
        console = Console(width=width, record=True, color_system=None)
        for part in fitted_sections([Section("a", ident, figures, narrow), Section("b", ident, figures, wide)],
                                    width):
            console.print(part)
        return console.export_text().splitlines()

    layouts = {}
    for width in range(20, 90):
        lines = shown(width)
        assert max(len(line) for line in lines) <= width
        heads = [line.split() for line in lines if line.split()[:1] == ["method"]]
        cards = [line for line in lines if line.startswith("#")]
        assert (not heads and len(cards) == 3) or (len(heads) == 2 and heads[0] == heads[1] and not cards), lines
        layouts[width] = tuple(heads[0]) if heads else "cards"
        units = [line.rstrip() for line in lines if line.startswith(("peak: MiB", "left out"))]
        compact = layouts[width] not in ("cards", ("method", "peak", "MiB", "step", "s", "W"))
        assert units == (["peak: MiB; t: s/step; P: W"] * 2 if layouts[width] == ("method", "peak", "t", "P") else
                         ["peak: MiB; t: s/step", wrapped(LEFT_OUT, width).splitlines()[0]] * 2 if compact else
                         []), lines
    order = list(dict.fromkeys(layouts.values()))
    assert order == ["cards", ("method", "peak", "t"), ("method", "peak", "t", "P"),
                     ("method", "peak", "MiB", "step", "s", "W")], order


def _piped(*args, **env_vars):
    """`edgebench ARGS` with stdout a pipe, $COLUMNS only as `env_vars` give it."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TTY_COMPATIBLE", "FORCE_COLOR")} | env_vars
    out = subprocess.run([sys.executable, "-m", "edgebench.cli", *args], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_piped_output_is_plain_tables_never_cards(configurations, tmp_path):
    """Piped with a wide $COLUMNS, `report`, `report --study`, `predict` and `devices list` print
    whole table rows: no card, no row folded onto a second line, every study setting alike. Without
    $COLUMNS they are laid out for 80 (as a terminal that wide: the compact table, tests/test_output_width)."""
    names = {"sgd", "adamw", "mezo", "lora", "lora+ckpt", "adamw+ckpt", "sgd+bf16", "adamw+bf16"}
    narrow = _piped("report", "--store", str(configurations))
    assert max(len(line) for line in narrow) <= 80 and len(_rows(narrow, names)) == 23
    assert not any(line.startswith("#") for line in narrow)  # no card: the compact table

    def wide(*args, **env_vars):
        return _piped(*args, COLUMNS="400", **env_vars)

    report = wide("report", "--store", str(configurations))
    assert not any(line.startswith("#") for line in report)
    assert len(_rows(report, names)) == 23 and all(re.search(r"\d.*->", row) for row in _rows(report, names))
    assert sum(line.split()[:2] == ["method", "backend"] for line in report) == 1
    assert any(line.split()[:6] == ["method", "backend", "status", "n", "peak", "MiB"] for line in report)
    study = wide("report", "--store", str(configurations), "--study")
    assert not any(line.startswith("#") for line in study)
    heads = [line.split() for line in study if line.split()[:1] == ["method"]]
    assert len(heads) == 3 and heads[0] == heads[1] == heads[2]  # one per backend, all the same layout
    assert len(_rows(study, names)) == 23
    predicted = wide("predict", "--device", "raspberry-pi-4-4gb", "--model", "tiny")
    assert not any(line.startswith("#") for line in predicted)
    assert any(re.match(r"│? *sgd +│ *(yes|no) +│ *[\d,]+ +│", line) for line in predicted), predicted
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"devices:\n  box-with-a-long-name: {{profile: local, workdir: {tmp_path / 'w'}}}\n")
    devices = wide("devices", "--no-check", EDGEBENCH_INVENTORY=str(inventory))
    assert not any(line.startswith("#") for line in devices)
    assert any(line.split()[:1] == ["box-with-a-long-name"] and "local" in line for line in devices), devices


def test_prose_wraps_at_spaces_never_inside_a_word():
    """bench's last line: a command and its path stay whole at any width."""
    from edgebench.terminal import wrapped

    text = "run directories under /tmp/some/runs/; store /tmp/some/runs/edgebench.duckdb " \
           "(edgebench report --store /tmp/some/runs/edgebench.duckdb)"
    for width in (20, 40, 60, 80):
        lines = wrapped(text, width).splitlines()
        assert " ".join(lines) == text  # broken only at spaces
        assert all(len(line) <= width or " " not in line for line in lines)
        assert "--store" in " ".join(lines).split()
