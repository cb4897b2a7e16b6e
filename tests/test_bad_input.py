"""Every command, given bad input, ends with one line that names the problem and exit code 2:
never "internal error" (which is for edgebench's own bugs). Each leaf command of the CLI has
cases here; a command added without them fails the first test."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from edgebench.cli import cli, main
from edgebench.model import get_config
from test_data import GOOD, _folder

NO_SUCH = "/nonexistent/edgebench-bad-input"


def _leaf_commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> set[str]:
    names: set[str] = set()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            names |= _leaf_commands(command, (*path, name))
        else:
            names.add(" ".join((*path, name)))
    return names


ODD_WIDTH = get_config("tiny").lm_inter_dim | 1  # an MLP width int4 cannot pack (two values a byte)


def _checkpoint(folder: Path, **fields: int) -> None:
    """A real nanoVLM checkpoint of the tiny model (its config changed by `fields`)."""
    import dataclasses

    from edgebench.model.checkpoint import save_pretrained
    from edgebench.model.vision_language_model import VisionLanguageModel

    save_pretrained(VisionLanguageModel(dataclasses.replace(get_config("tiny"), **fields)), folder)


def _broken_dataset(folder: Path) -> None:
    """A dataset folder (tokenizer, images) whose data.jsonl has a line cut short."""
    folder.mkdir()
    _folder(folder, [GOOD[0], '{"image": "a.png", "question": '])


class _Files(dict[str, str]):
    """Paths by name, each made the first time a case names it (a checkpoint takes a second)."""

    def __init__(self, root: Path, makers: dict[str, Callable[[Path], object]]):
        super().__init__()
        self.root, self.makers = root, makers
        root.mkdir()

    def __missing__(self, name: str) -> str:
        path = self.root / name
        self.makers[name](path)
        self[name] = str(path)
        return self[name]


@pytest.fixture
def files(tmp_path):
    """A text file, an empty folder, a file of garbage JSON, a run directory whose meta.json is
    garbage and a meter CSV with a word for a reading, to hand where other things belong; a tiny
    checkpoint, one whose MLP width is odd, a checkpoint folder without config.json, a dataset
    folder whose data.jsonl is broken, an export folder of ONNX Runtime's, RunSpec files of an
    unknown field, of a list and of a command."""
    def folder_with(name: str, text: str) -> Callable[[Path], object]:
        return lambda path: (path.mkdir(), (path / name).write_text(text))

    return _Files(tmp_path / "files", {
        "text": lambda path: path.write_text("not what was asked for\n"),
        "empty": lambda path: path.mkdir(),
        "json": lambda path: path.write_text("{not json"),
        "run": folder_with("meta.json", "{not json"),
        "csv": lambda path: path.write_text("time,watts\n1,lots\n"),
        "checkpoint": _checkpoint,
        "odd_checkpoint": lambda path: _checkpoint(path, lm_inter_dim=ODD_WIDTH),
        "no_config": folder_with("model.safetensors", "weights without their config"),
        "broken_data": _broken_dataset,
        "ort_program": folder_with("manifest.json", json.dumps({"format": "edgebench-export/1",
                                                                "backend": "onnxruntime"})),
        "sgd_program": folder_with("manifest.json", json.dumps({
            "format": "edgebench-export/1", "backend": "executorch", "program": "forward-backward",
            "method": {"text": "sgd", "knobs": {"optimizer": "sgd", "grad_mode": "backprop", "trainable": "all"}}})),
        "spec_field": lambda path: path.write_text(json.dumps({"model": "tiny", "colour": "red"})),
        "spec_week": lambda path: path.write_text(json.dumps({"model": "tiny", "duration_s": 8 * 86400.0})),
        "spec_list": lambda path: path.write_text("[1]"),
        "spec_decay": lambda path: path.write_text(json.dumps({"model": "tiny", "weight_decay": -1})),
        "spec_command": lambda path: path.write_text(json.dumps({"model": "tiny", "command": ["true"]})),
    })


CASES = {
    "models": [["--load", NO_SUCH], ["--load", "{empty}"], ["--load", "{no_config}"]],
    "methods": [["--bogus"]],
    "bench": [["--model", "no-such-model"], ["--methods", "bogus"], ["--steps", "abc"], ["--lr", "-1"],
              ["--lr", "nan"], ["--duration", "5x"], ["--duration", "200h"], ["--data", NO_SUCH], ["--data", "{empty}"],
              ["--tokenizer", "{text}"], ["--target", "speed=2"], ["--device", "no-such-board"],
              ["--batch-size", "0"], ["--text-length", "1"], ["--max-image-size", "100"], ["--save", "/proc/x"],
              ["--backend", "tflite"], ["--eval-fraction", "1.5"], ["--model", "{no_config}"],
              ["--data", "{broken_data}"], ["--runs-dir", ""], ["--target="], ["--steps", "1", "--duration", "10s"],
              ["--seed", "99999999999999999999999"], ["--rerun-disturbed", "1000"], ["--eval-fraction", "nan"],
              ["--sample-hz", "inf"], ["--weight-decay", "-1"], ["--weight-decay", "nan"], ["--lr", "0.01,-1"],
              ["--lr", "0.1,1e-1"], ["--threads", "1,,2"], ["--threads", "1,0"], ["--batch-size", "1,x"],
              ["--weight-decay", "0,nan"], ["--methods", "sgd", "--batch-size", "100000000,200000000"]],
    "measure": [[], ["--", NO_SUCH], ["--", "{text}"], ["--", "no-such-program-edgebench"],
                ["--device", "no-such-board", "--", "true"], ["--timeout", "nan", "--", "true"],
                ["--runs-dir", "", "--", "true"], ["--store", "{empty}", "--", "true"], ["--batch-size", "0", "true"]],
    "predict": [["--device", "no-such-board"], ["--model", "no-such-model"], ["--method", "bogus"],
                ["--ram-bytes", "-5"], ["--ram-bytes", "1000000000", "--os-memory", "2GiB"], ["--ram-bytes", "9" * 26],
                ["--os-memory", "lots", "--ram-bytes", "1000"], ["--ram-bytes", "8000000000", "--model", "{no_config}"],
                ["--ram-bytes", "8000000000", "--model", "{odd_checkpoint}", "--method", "qlora4"]],
    "devices check": [["no-such-board"]],
    "devices calibrate": [["no-such-board"]],
    "devices add": [["bad/name", "--host", "127.0.0.1"], ["ok-name", "--profile", "no-such-profile",
                                                         "--host", "127.0.0.1"], ["ok-name"]],
    "devices remove": [["no-such-board"]],
    "lab up": [["--memory", "lots"], ["--memory", "100MiB"], ["--cpus", "nan"], ["--memory", "5PiB"],
               ["--profile", "no-such-profile"], ["--arch", "mips"]],
    "lab down": [["--bogus"]],
    "lab status": [["--bogus"]],
    "deploy": [["--device", "no-such-board"], ["--device", "bad/name"], ["--spec", NO_SUCH],
               ["--device", "local", "--spec", "{json}"], ["--device", "local", "--program", "{empty}"],
               ["--device", "local", "--backend", "executorch", "--program", "{empty}"],
               ["--device", "local", "--backend", "executorch", "--program", "{ort_program}"],
               ["--device", "local", "--backend", "executorch", "--program", "{sgd_program}", "--methods", "adamw"],
               ["--device", "local", "--spec", "{spec_field}"], ["--device", "local", "--spec", "{spec_list}"],
               ["--device", "local", "--spec", "{spec_week}"], ["--device", "local", "--spec", "{spec_decay}"],
               ["--device", "local", "--spec", "{spec_command}"],
               ["--device", "local", "--weight-decay", "inf"], ["--device", "local", "--batch-size", "2,2"],
               ["--device", "local", "--threads", "2,"]],
    "collect": [["--device", "no-such-board"]],
    "status": [["--device", "no-such-board"]],
    "sensors": [["--root", NO_SUCH], ["--seconds", "-1"], ["--seconds", "nan"], ["--sensors", "bogus"],
                ["--seconds", "0.1", "--sensors", "[1]"], ["--seconds", "0.1", "--sensors", '{"thermal_zones": 5}'],
                ["--seconds", "0.1", "--sensors", '{"power": "rapl"}']],
    "ingest": [[NO_SUCH], ["{empty}"], ["{text}"], ["{empty}", "--device", "../up"], ["{run}"]],
    "import-trace": [["{text}", "--device", "pi", "--power-col", "watts"], [NO_SUCH, "--device", "pi"],
                     ["{text}", "--device", "pi", "--time-format", "fortnights", "--power-col", "x"],
                     ["{text}", "--device", "pi", "--tz", "Mars/Olympus", "--power-col", "x"],
                     ["{csv}", "--device", "pi"], ["{csv}", "--device", "pi", "--power-col", "watts"],
                     ["{csv}", "--device", "pi", "--power-col", "watts", "--power-unit", "kW"]],
    "report": [["--store", NO_SUCH], ["--store", "{text}"], ["--format", "docx"], ["--store", "{empty}"],
               ["--carbon-intensity", "-1"], ["--carbon-intensity", "nan"]],
    "runs ls": [["--store", NO_SUCH], ["--store", "{text}"], ["--store", "{empty}"]],
    "runs rm": [[], ["--store", NO_SUCH, "run-a"], ["--store", "{text}", "run-a"], ["--store", "{empty}", "run-a"]],
    "runs tag": [["run-a"], ["run-a", "two words"], ["--store", NO_SUCH, "run-a", "t"],
                 ["--store", "{text}", "run-a", "t"]],
    "live": [["--dir", NO_SUCH], ["--hz", "nan"], ["--device", "no-such-board"], ["--root", "{empty}"],
             ["--root", "{empty}", "--run", "no-such-run"], ["--follow", "--run", "no-such-run"]],
    "export": [["--model", "no-such-model"], ["--weight-decay", "-1"], ["--method", "bogus"], ["--backend", "tflite"],
               ["--profile", "no-such-profile"], ["--device", "no-such-board"],
               ["--delegate", "none", "--bf16", "fp32"], ["--model", "{no_config}"], ["--data", "{broken_data}"],
               ["--text-length", "3"],
               ["--text-length", "5000"], ["--model", "{checkpoint}", "--image-size", "32"]],
}


# What the line says for cases whose message comes from deep in a run or an export: the value and
# where to fix it.
SAYS = {
    ("models", "--load", "{no_config}"): "config.json: missing",
    ("bench", "--model", "{no_config}"): "config.json: missing",
    ("bench", "--data", "{broken_data}"): "data.jsonl:2: not valid JSON",
    ("bench", "--lr", "0.01,-1"): "'--lr': '0.01,-1': '-1' is not a finite number more than 0",
    ("bench", "--lr", "0.1,1e-1"): "'--lr': '0.1,1e-1': '1e-1' is given twice ('0.1' and '1e-1' are one value)",
    ("bench", "--threads", "1,,2"): "'--threads': '1,,2': an empty item",
    ("bench", "--threads", "1,0"): "'--threads': '1,0': 0 is not in the range 1<=x<=1024",
    ("bench", "--batch-size", "1,x"): "'--batch-size': '1,x': 'x' is not a valid integer",
    ("bench", "--weight-decay", "0,nan"): "'--weight-decay': '0,nan': 'nan' is not a finite number of 0 or more",
    ("bench", "--methods", "sgd", "--batch-size", "100000000,200000000"): "batch 200000000: predicted peak",
    ("deploy", "--device", "local", "--batch-size", "2,2"): "'--batch-size': '2,2': '2' is given twice",
    ("deploy", "--device", "local", "--threads", "2,"): "'--threads': '2,': an empty item",
    ("predict", "--ram-bytes", "8000000000", "--model", "{odd_checkpoint}", "--method", "qlora4"):
        f"input features, this model has one of {ODD_WIDTH}; use frozen-int8",
    ("deploy", "--device", "local", "--backend", "executorch", "--program", "{ort_program}"):
        "a onnxruntime program, and --backend is executorch",
    ("deploy", "--device", "local", "--backend", "executorch", "--program", "{sgd_program}", "--methods", "adamw"):
        "was exported for method 'sgd', not 'adamw'; export it for this method",
    ("deploy", "--device", "local", "--spec", "{spec_field}"): "unknown field(s) ['colour']",
    ("deploy", "--device", "local", "--spec", "{spec_list}"): "RunSpec: a list, not an object",
    ("deploy", "--device", "local", "--spec", "{spec_command}"): "command: deploy runs edgebench's methods, not a",
    ("measure",): "give the command to measure after `--`",
    ("measure", "--", NO_SUCH): "no such program; give the command's path",
    ("measure", "--", "{text}"): "not executable by this user",
    ("measure", "--", "no-such-program-edgebench"): "no such program on PATH",
    ("measure", "--device", "no-such-board", "--", "true"): "measure runs the command on this host only",
    ("sensors", "--seconds", "0.1", "--sensors", "[1]"): "the sensors block is a list",
    ("sensors", "--seconds", "0.1", "--sensors", '{"thermal_zones": 5}'): "sensors.thermal_zones is 5",
    ("sensors", "--seconds", "0.1", "--sensors", '{"power": "rapl"}'): "sensors.power is a str",
    ("export", "--delegate", "none", "--bf16", "fp32"): "use delegate xnnpack",
    ("report", "--carbon-intensity", "-1"): "'--carbon-intensity': '-1' is not a finite number of 0 or more",
    ("runs", "rm", "--store", "{empty}", "run-a"): "no results store here; pass the store that holds the runs",
    ("runs", "tag", "run-a"): "give one or more runs, then the tag",
    ("runs", "tag", "run-a", "two words"): "'two words' is not a tag",
    ("export", "--model", "{no_config}"): "config.json: missing",
    ("export", "--data", "{broken_data}"): "data.jsonl:2: not valid JSON",
    ("export", "--text-length", "3"): "the synthetic task needs 11 tokens; use --text-length 11 or more",
    ("export", "--text-length", "5000"): "exceeds the model's lm_max_position_embeddings 1024; use a shorter "
                                         "--text-length",
    ("export", "--model", "{checkpoint}", "--image-size", "32"): "images are 64 px",
}


def test_every_command_has_bad_input_cases():
    assert _leaf_commands() == set(CASES), "add bad-input cases for each new command here"


@pytest.mark.parametrize("command, args", [(c, a) for c, cases in CASES.items() for a in cases],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bad_input_is_one_line_and_exit_code_2(command, args, files, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a case writes lands in the repository
    monkeypatch.setenv("EDGEBENCH_EXPORT_CACHE", str(tmp_path / "exports"))
    argv = [*command.split(), *(files[a[1:-1]] if a[1:-1].isidentifier() and a == f"{{{a[1:-1]}}}" else a
                                for a in args)]
    with pytest.raises(SystemExit) as ended:
        main(argv)
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
    assert ended.value.code == 2, f"edgebench {' '.join(argv)}: exit {ended.value.code}: {err}"
    said = [line for line in err.splitlines() if line.strip()]
    assert said and said[-1].startswith(("error:", "Error:", "Usage:")), err
    assert SAYS.get((*command.split(), *args), "") in said[-1], err


def test_each_message_checked_is_a_case():
    cases = {(*command.split(), *args) for command, lists in CASES.items() for args in lists}
    assert set(SAYS) <= cases
