"""Every command, given bad input, ends with one line that names the problem and exit code 2:
never "internal error" (which is for edgebench's own bugs). Each leaf command of the CLI has
cases here; a command added without them fails the first test."""

from __future__ import annotations

import click
import pytest

from edgebench.cli import cli, main

NO_SUCH = "/nonexistent/edgebench-bad-input"


def _leaf_commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> set[str]:
    names: set[str] = set()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            names |= _leaf_commands(command, (*path, name))
        else:
            names.add(" ".join((*path, name)))
    return names


@pytest.fixture
def files(tmp_path):
    """A text file, an empty folder, a file of garbage JSON, a run directory whose meta.json is
    garbage and a meter CSV with a word for a reading, to hand where other things belong."""
    (tmp_path / "notes.txt").write_text("not what was asked for\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "spec.json").write_text("{not json")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "meta.json").write_text("{not json")
    (tmp_path / "meter.csv").write_text("time,watts\n1,lots\n")
    return {"text": str(tmp_path / "notes.txt"), "empty": str(tmp_path / "empty"), "json": str(tmp_path / "spec.json"),
            "run": str(tmp_path / "run"), "csv": str(tmp_path / "meter.csv")}


CASES = {
    "models": [["--load", NO_SUCH], ["--load", "{empty}"]],
    "methods": [["--bogus"]],
    "bench": [["--model", "no-such-model"], ["--methods", "bogus"], ["--steps", "abc"], ["--lr", "-1"],
              ["--lr", "nan"], ["--duration", "5x"], ["--duration", "200h"], ["--data", NO_SUCH], ["--data", "{empty}"],
              ["--tokenizer", "{text}"], ["--target", "speed=2"], ["--device", "no-such-board"],
              ["--batch-size", "0"], ["--text-length", "1"], ["--max-image-size", "100"], ["--save", "/proc/x"],
              ["--backend", "tflite"], ["--eval-fraction", "1.5"]],
    "predict": [["--device", "no-such-board"], ["--model", "no-such-model"], ["--method", "bogus"],
                ["--ram-bytes", "-5"], ["--headroom", "2"]],
    "devices check": [["no-such-board"]],
    "devices calibrate": [["no-such-board"]],
    "devices add": [["bad/name", "--host", "127.0.0.1"], ["ok-name", "--profile", "no-such-profile",
                                                         "--host", "127.0.0.1"], ["ok-name"]],
    "devices remove": [["no-such-board"]],
    "lab up": [["--memory", "lots"], ["--profile", "no-such-profile"], ["--arch", "mips"]],
    "lab down": [["--bogus"]],
    "lab status": [["--bogus"]],
    "deploy": [["--device", "no-such-board"], ["--device", "bad/name"], ["--spec", NO_SUCH],
               ["--device", "local", "--spec", "{json}"], ["--device", "local", "--program", "{empty}"]],
    "collect": [["--device", "no-such-board"]],
    "status": [["--device", "no-such-board"]],
    "sensors": [["--root", NO_SUCH], ["--seconds", "-1"], ["--sensors", "bogus"]],
    "ingest": [[NO_SUCH], ["{empty}"], ["{text}"], ["{empty}", "--device", "../up"], ["{run}"]],
    "import-trace": [["{text}", "--device", "pi", "--power-col", "watts"], [NO_SUCH, "--device", "pi"],
                     ["{text}", "--device", "pi", "--time-format", "fortnights", "--power-col", "x"],
                     ["{text}", "--device", "pi", "--tz", "Mars/Olympus", "--power-col", "x"],
                     ["{csv}", "--device", "pi"], ["{csv}", "--device", "pi", "--power-col", "watts"],
                     ["{csv}", "--device", "pi", "--power-col", "watts", "--power-unit", "kW"]],
    "report": [["--store", NO_SUCH], ["--store", "{text}"], ["--format", "docx"], ["--store", "{empty}"]],
    "live": [["--dir", NO_SUCH], ["--device", "no-such-board"], ["--root", "{empty}"],
             ["--root", "{empty}", "--run", "no-such-run"], ["--follow", "--run", "no-such-run"]],
    "export": [["--model", "no-such-model"], ["--method", "bogus"], ["--backend", "tflite"],
               ["--profile", "no-such-profile"], ["--device", "no-such-board"]],
}


def test_every_command_has_bad_input_cases():
    assert _leaf_commands() == set(CASES), "add bad-input cases for each new command here"


@pytest.mark.parametrize("command, args", [(c, a) for c, cases in CASES.items() for a in cases],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bad_input_is_one_line_and_exit_code_2(command, args, files, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a case writes lands in the repository
    argv = [*command.split(), *(a.format(**files) for a in args)]
    with pytest.raises(SystemExit) as ended:
        main(argv)
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
    assert ended.value.code == 2, f"edgebench {' '.join(argv)}: exit {ended.value.code}: {err}"
    said = [line for line in err.splitlines() if line.strip()]
    assert said and said[-1].startswith(("error:", "Error:", "Usage:")), err
