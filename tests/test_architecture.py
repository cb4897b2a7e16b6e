"""The shape of the code (docs/architecture.md), checked: the device side never imports the
host side, no import circles, and one vocabulary for backends across the CLI."""

from __future__ import annotations

from pathlib import Path

import click
import grimp
import pytest
from importlinter.cli import lint_imports

from edgebench.backends import BACKENDS
from edgebench.cli import cli

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_of_pyproject_are_kept(monkeypatch):
    monkeypatch.chdir(REPO)
    assert lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True) == 0, \
        "an import breaks a contract in pyproject.toml [tool.importlinter]; run `.venv/bin/lint-imports`"


def test_no_module_imports_itself_through_a_circle():
    graph = grimp.build_graph("edgebench", "exporters", cache_dir=None)
    circles = sorted({tuple(sorted((module, imported)))
                      for module in graph.modules
                      for imported in graph.find_modules_directly_imported_by(module)
                      if graph.find_shortest_chain(importer=imported, imported=module)})
    assert circles == []


def _backend_choices(command: str) -> set[str]:
    option = next(p for p in cli.commands[command].params if p.name == "backend")
    assert isinstance(option.type, click.Choice)
    return set(option.type.choices)


@pytest.mark.parametrize("command", ["bench", "deploy"])
def test_commands_that_run_offer_exactly_the_backend_table(command):
    assert _backend_choices(command) == set(BACKENDS)


def test_export_offers_every_backend_but_eager_under_the_same_names():
    from exporters.manifest import EXPORT_BACKENDS

    assert _backend_choices("export") == set(EXPORT_BACKENDS) == set(BACKENDS) - {"eager"}


def test_bench_and_deploy_share_every_run_option():
    def options(name: str) -> set[str]:
        return {p.name for p in cli.commands[name].params}

    shared = options("bench") & options("deploy")
    for name in ("model", "methods", "backend", "steps", "warmup", "duration", "batch_size", "text_length",
                 "threads", "accelerator", "sample_hz", "timeout_s", "seed", "runs_dir", "as_json", "save"):
        assert name in shared, f"--{name.replace('_', '-')} is missing from bench or deploy"


def test_ruff_finds_nothing_in_the_repository():
    """The lint rules of pyproject.toml ([tool.ruff]) hold everywhere (a second or so)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_nothing_points_outside_the_repository():
    """A user's clone has only this repository: no file may send its reader to notes kept
    beside it (the team's shared folder)."""
    import re

    root = Path(__file__).resolve().parent.parent
    outside = re.compile(r"FIELD-NOTES|STYLE-EXAMPLES|ARCHITECTURE\.md|\.\./shared")
    found = [f"{path.relative_to(root)}:{n}" for pattern in ("*.py", "*.md", "*.toml", "*.sh", "*.yaml", "*.cpp")
             for path in root.rglob(pattern) if ".venv" not in path.parts and path.name != "test_architecture.py"
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert not found, found


def test_reaching_a_device_prints_no_library_warnings():
    """Importing the SSH transport (asyncssh, cryptography) in a fresh process prints nothing:
    cryptography's five DSA deprecation warnings used to precede every command that touches SSH."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "default", "-c", "import edgebench.devices.ssh"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
