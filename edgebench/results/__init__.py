"""Results: the DuckDB store, clock alignment, external traces, metrics, Pareto frontier.

Where a person's runs live by default: one folder per user (the XDG data folder), so
`report` sees every run of theirs from whatever folder they ran it in. `EDGEBENCH_STORE`
names another store file (its folder then holds the run directories); `--store` and
`--runs-dir` still choose per command.
"""

from __future__ import annotations

import os
from pathlib import Path

STORE_FILE = "edgebench.duckdb"
STORE_DEFAULT_HELP = "$EDGEBENCH_STORE, else $XDG_DATA_HOME/edgebench/edgebench.duckdb (~/.local/share/edgebench/)"
OLDER_STORE = Path("runs") / STORE_FILE  # where edgebench before the per-user store put it: per working folder


def default_store() -> Path:
    """The user's store: $EDGEBENCH_STORE, else edgebench.duckdb in the XDG data folder."""
    named = os.environ.get("EDGEBENCH_STORE")
    if named:
        return Path(named).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home).expanduser() / "edgebench" / STORE_FILE


def default_runs_dir() -> Path:
    """Run directories, deployment records and raw copies go beside the user's store."""
    return default_store().parent


def store_for(store: str | Path | None, runs_dir: str | Path | None) -> Path:
    """The store a command writes: --store, else the one inside an explicit --runs-dir, else the user's."""
    if store:
        return Path(store)
    return Path(runs_dir) / STORE_FILE if runs_dir else default_store()


def runs_dir_for(runs_dir: str | Path | None) -> Path:
    """The folder a command puts run directories in: --runs-dir, else beside the user's store."""
    return Path(runs_dir) if runs_dir else default_runs_dir()
