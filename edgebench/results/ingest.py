"""`edgebench ingest`'s work: run directories and other stores brought into a store, one
line each for the command (results/commands.py) to print or give as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict, final

import click

from edgebench.results.store import Store


@final  # no other keys: `"merged_from" in line` tells the two apart
class IngestedRun(TypedDict):
    """A run directory ingested: its row's figures that say whether its files were whole."""

    device: str
    run_id: str
    status: str
    samples_count: int
    samples_bad_lines: int
    samples_truncated: bool
    align_source: str


@final
class MergedRun(TypedDict):
    """A run of another store: ingested, already here, or not brought in (and why)."""

    merged_from: str
    device: str
    run_id: str
    status: str


def ingest_paths(store_path: Path | None, paths: tuple[Path, ...], device: str) -> list[IngestedRun | MergedRun]:
    """Each run directory ingested as the runs of `device` (re-ingesting replaces), each other
    store's runs this store lacks brought in. A run directory that cannot be read is refused
    as click's error: its message is the whole story."""
    done: list[IngestedRun | MergedRun] = []
    with Store(store_path) as store:
        for path in paths:
            if path.is_file():
                done += _merged(store, path)
                continue
            try:
                run_id = store.ingest_run(path, device=device)
            except (FileNotFoundError, ValueError) as exc:
                raise click.ClickException(str(exc)) from exc
            row = store.runs(device=device, run_id=run_id)[0]
            done.append(IngestedRun(device=row["device"], run_id=row["run_id"], status=row["status"],
                                    samples_count=row["samples_count"], samples_bad_lines=row["samples_bad_lines"],
                                    samples_truncated=row["samples_truncated"], align_source=row["align_source"]))
    return done


def _merged(store: Store, other: Path) -> list[MergedRun]:
    """One line per run of another store: ingested, already here, or lost (and why)."""
    from edgebench.results.merge import merge_store

    merged = merge_store(store, other)
    lines = [(key, "ingested") for key in merged.ingested] + [(key, "already in the store") for key in merged.kept]
    lines += [(key, f"not brought in: {why}") for key, why in merged.lost.items()]
    return [MergedRun(merged_from=str(other), device=device, run_id=run_id, status=status)
            for (device, run_id), status in lines]
