"""Output that fits its width (issue 69): piped, a command lays its output out for $COLUMNS, else
80 columns (edgebench.terminal.output_width), never rich's own 300 columns or a table's whole
rows; every line of `methods`, `predict`, `devices`, `devices check`, `report` (its study too),
`runs ls` and every command's `--help` is at most that wide, measured in terminal cells; a
method's name wraps after a `+`, never inside a word.

The commands run in-process through click's CliRunner, whose stdout is no terminal (as a pipe);
`--help` is each command's own help text as click lays it out for $COLUMNS (CliRunner pins
click's help to 80 columns); one real pipe (`edgebench methods | cat`, no $COLUMNS) checks the
default."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from rich.cells import cell_len

from edgebench.cli import cli

WIDTHS = (80, 120)
UNSET = {"TTY_COMPATIBLE": None, "TTY_INTERACTIVE": None, "FORCE_COLOR": None}  # no terminal, as piped


def too_wide(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if cell_len(line) > width]


def piped(args: list[str], width: int, ok: tuple[int, ...] = (0,), **env: str) -> str:
    """`COLUMNS=width edgebench ARGS | cat`, in-process."""
    result = CliRunner().invoke(cli, args, env={**UNSET, "COLUMNS": str(width), **env})
    assert result.exit_code in ok, result.output
    assert "\x1b[" not in result.output  # not laid out as a terminal's
    return result.output


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """23 configurations of one lab device (test_cli_terminal), and report_demo's evaluated
    store (three devices, a held-out target one method never reached, an oom)."""
    from report_demo import demo_store
    from test_cli_terminal import _configurations

    return (_configurations(tmp_path_factory.mktemp("configurations")),
            demo_store(tmp_path_factory.mktemp("evaluated")))


def _commands(stores, inventory):
    configurations, evaluated = stores
    return {
        "methods": (["methods"], {}),
        "predict": (["predict", "--device", "raspberry-pi-4-4gb", "--model", "tiny"], {}),
        "predict one": (["predict", "--ram-bytes", str(4 << 30), "--model", "tiny", "--method",
                         "lora-decoder+frozen-int4+bf16-weights+sr+ckpt+chunked-ce+view-by-view+flash-attn"], {}),
        "models": (["models"], {}),
        "devices": (["devices", "--no-check"], {"EDGEBENCH_INVENTORY": str(inventory)}),
        "devices check": (["devices", "check", "local"], {}),
        "report": (["report", "--store", str(configurations)], {}),
        "report --study": (["report", "--store", str(configurations), "--study"], {}),
        "report evaluated": (["report", "--store", str(evaluated)], {}),
        "report evaluated --study": (["report", "--store", str(evaluated), "--study"], {}),
        "runs ls": (["runs", "ls", "--store", str(configurations)], {}),
    }


@pytest.mark.parametrize("width", WIDTHS)
def test_every_line_of_piped_output_fits_columns(width, stores, tmp_path):
    """At COLUMNS=80 and 120, piped: no line wider (on main `methods` was 300 columns wide, a title
    line 896; `report` 975; `devices check` 332; `predict`'s last line 179)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("devices:\n  a-board-with-a-rather-long-name-for-its-table:\n"
                         f"    {{profile: raspberry-pi-4-4gb, host: 192.168.100.200, workdir: {tmp_path / 'w'}}}\n")
    wide = {}
    for name, (args, env) in _commands(stores, inventory).items():
        ok = (0, 1) if name == "devices check" else (0,)  # 1: this host lacks something a deploy needs
        out = piped(args, width, ok, **env)
        assert out.strip(), name
        wide.update({name: too_wide(out, width)} if too_wide(out, width) else {})
    assert not wide, wide


def test_method_names_wrap_after_a_plus_never_inside_a_word():
    """predict's ranking at 80 columns: the longest combinations wrap at their `+`, so every line
    of the method column holds whole pieces (main folded `lora+ckpt+fro` / `zen-int8`)."""
    from edgebench.methods.knobs import PRESETS

    out = piped(["predict", "--device", "raspberry-pi-4-4gb", "--model", "tiny"], 80)
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    names = {r["method"] for r in _ranking()}
    pieces = {p for n in names for p in n.split("+")} | set(PRESETS)
    assert len([r for r in rows if r]) > len(names)  # some names took two lines
    for cell in filter(None, rows):
        assert all(p in pieces for p in cell.rstrip("+").split("+")), cell


def _ranking():
    import json

    result = CliRunner().invoke(cli, ["predict", "--device", "raspberry-pi-4-4gb", "--model", "tiny", "--json"])
    return json.loads(result.output)["methods"]


def _helps(width):
    """Every command's --help as click lays it out for COLUMNS=width (not under CliRunner, which
    pins it to 80): path -> text."""
    out = {}
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        def walk(command, ctx):
            out[ctx.command_path] = command.get_help(ctx)
            if isinstance(command, click.Group):
                for name, sub in command.commands.items():
                    walk(sub, click.Context(sub, info_name=name, parent=ctx))

        walk(cli, click.Context(cli, info_name="edgebench", **cli.context_settings))
    finally:
        os.environ.pop("COLUMNS") if old is None else os.environ.__setitem__("COLUMNS", old)
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_every_help_fits_columns(width):
    """Every command's --help, its examples (click's `\\b` blocks, never rewrapped) too: on main
    `devices --help` ran to 106 columns, `devices add` 104, `import-trace` 100."""
    helps = _helps(width)
    assert len(helps) > 15 and "edgebench devices add" in helps
    wide = {path: too_wide(text, width) for path, text in helps.items() if too_wide(text, width)}
    assert not wide, wide
    top = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": str(width)})
    assert top.exit_code == 0 and not too_wide(top.output, width)


def test_piped_without_columns_is_80_wide():
    """`edgebench methods | cat` with no $COLUMNS: laid out for 80 columns (main: 300)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
                                                              "FORCE_COLOR")}
    out = subprocess.run([sys.executable, "-m", "edgebench.cli", "methods"], capture_output=True, text=True,
                         env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and not too_wide(out.stdout, 80)
    assert "sgd" in out.stdout and "lora" in out.stdout


def test_output_width_is_columns_else_80():
    from edgebench.terminal import output_width

    assert output_width({}) == 80
    assert output_width({"COLUMNS": "132"}) == 132
    assert output_width({"COLUMNS": " 100 "}) == 100
    assert all(output_width({"COLUMNS": bad}) == 80 for bad in ("", "wide", "-5", "0", "12", "1e3"))


def test_a_name_wraps_after_its_plus_and_folds_only_a_longer_piece():
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from edgebench.terminal import Name, narrowed

    def shown(width, name):
        console = Console(width=width, record=True, color_system=None)
        console.print(Name(Text(name)))
        return console.export_text().splitlines()

    assert [line.rstrip() for line in shown(12, "lora+ckpt+frozen-int8")] == ["lora+ckpt+", "frozen-int8"]
    assert [line.rstrip() for line in shown(40, "lora+ckpt+frozen-int8")] == ["lora+ckpt+frozen-int8"]
    assert [line.rstrip() for line in shown(5, "mezo-lora+sr")] == ["mezo-", "lora+", "sr"]  # folded: no room
    table = Table(title="ranking")
    for header in ("method", "peak MiB (est.)", "step time x sgd (est.)"):
        table.add_column(header)
    table.add_row(Name(Text("lora-decoder+frozen-int4+bf16-weights+sr+ckpt")), "342", "0.56")
    console = Console(width=40, record=True, color_system=None)
    console.print(narrowed(table, 40))
    lines = console.export_text().splitlines()
    assert not too_wide("\n".join(lines), 40)
    method = [re.split("[│┃]", line)[1].strip() for line in lines if line.startswith("│")]
    assert all(p.endswith("+") for p in method[:-1]) and "".join(method) == \
        "lora-decoder+frozen-int4+bf16-weights+sr+ckpt", method
