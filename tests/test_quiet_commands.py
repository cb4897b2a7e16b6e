"""No third-party warning reaches a user's terminal: each command runs as a user runs it, in a
fresh process (import-time warnings included) without pytest's warning filters, and nothing on
its stderr may name a Warning. What edgebench silences, and why, is in edgebench/quiet.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

EDGEBENCH = str(Path(sys.executable).with_name("edgebench"))

# Imports the CLI once and prints every command's --help through click's main, recording each
# warning (the warnings module, as a user's default filters let it through) on stdout as JSON;
# anything else on stderr is left for the test to read.
HELP_WALK = r"""
import contextlib, io, json, warnings
with warnings.catch_warnings(record=True) as caught:
    import click
    from edgebench.cli import cli

    def paths(group, prefix=()):
        yield prefix
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from paths(command, (*prefix, name))
            else:
                yield (*prefix, name)

    walked = []
    for path in paths(cli):
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(args=[*path, "--help"], prog_name="edgebench", standalone_mode=False)
        walked.append([" ".join(path), code])
print(json.dumps({"walked": walked, "warnings": [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
                                                 for w in caught]}))
"""


def _user_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment without warning filters of pytest's or the shell's; its inventory
    holds one SSH board that is off (nothing listens on its port), so listing devices goes
    through the SSH client."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "known_hosts").write_text("")
    board = {"profile": "raspberry-pi-4-4gb", "host": "127.0.0.1", "port": port,
             "known_hosts": str(tmp_path / "known_hosts"), "connect_timeout_s": 5}
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump({"devices": {"pi": board}}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS" and not k.startswith("PYTEST")}
    env["EDGEBENCH_INVENTORY"] = str(tmp_path / "inventory.yaml")
    env["COLUMNS"] = "80"
    return env


def _warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Warning" in line]


def test_help_of_every_command_warns_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-c", HELP_WALK], env=_user_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    walked = dict(found["walked"])
    assert {"", "devices add", "devices check", "lab up", "export", "report", "bench"} <= set(walked)
    assert set(walked.values()) == {0}, walked
    assert found["warnings"] == [] and _warning_lines(done.stderr) == [], done.stderr


def test_commands_warn_nothing(tmp_path):
    """Each command a new user tries first, a tiny bench included (eager, one step), then the
    report of the temporary store it made."""
    runs = tmp_path / "runs"
    commands = [["bench", "--device", "local", "--model", "tiny", "--methods", "sgd", "--steps", "1", "--warmup", "0",
                 "--runs-dir", str(runs), "--store", str(runs / "edgebench.duckdb")],
                ["models"], ["methods"], ["predict", "--device", "raspberry-pi-4-4gb", "--model", "tiny"],
                ["sensors"], ["devices"], ["export", "--help"],
                # an export in its own process (a fresh cache): its progress bars' lock once left a
                # "leaked semaphore" warning behind
                ["predict", "--runtime", "native", "--model", "micro", "--method", "sgd", "--ram-bytes", str(2**30)]]
    env = {**_user_env(tmp_path), "EDGEBENCH_EXPORT_CACHE": str(tmp_path / "exports")}

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([EDGEBENCH, *argv], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:  # each is mostly its imports: two at a time
        results = dict(zip((" ".join(c[:3]) for c in commands), pool.map(run, commands)))
    results["report"] = run(["report", "--store", str(runs / "edgebench.duckdb")])
    failed = {name: r.stderr[-2000:] for name, r in results.items() if r.returncode != 0}
    assert not failed, failed
    assert "unreachable" in results["devices"].stdout  # the SSH client was loaded and tried
    warned = {name: _warning_lines(r.stderr) for name, r in results.items() if _warning_lines(r.stderr)}
    assert not warned, warned
