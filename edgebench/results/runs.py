"""`edgebench runs rm` and `runs tag`'s work: naming stored runs, removing them (their rows in
every table of the store, in one transaction, then their folders under the store's folder)
and labelling them with tags (the `run_tags` table), which `report --tag` filters by.

A run is named by its run id, or as DEVICE/RUN_ID (how `ingest` and `collect` print it) where
two devices have a run of that id. Run ids and device names are plain file names
(edgebench.untrusted.path_name), so the first `/` splits the two.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TypedDict

import click

from edgebench.errors import EdgebenchError
from edgebench.results.store import Store
from edgebench.untrusted import printable

RunKey = tuple[str, str]  # (device, run_id)
TAG_CHARS = 40


class RunsError(EdgebenchError, click.ClickException):
    """An unknown or ambiguous run, or a tag that is no tag: one line, exit code 2."""

    exit_code = 2


class RemovedRun(TypedDict):
    """A run removed from the store: the folders deleted, the ones kept and why."""

    device: str
    run_id: str
    deleted: list[str]
    kept: dict[str, str]


def check_tag(tag: str) -> str:
    """`tag` when it is 1 to TAG_CHARS printable characters without spaces; else RunsError."""
    if not tag or len(tag) > TAG_CHARS or not tag.isprintable() or any(c.isspace() for c in tag):
        raise RunsError(f"tag {printable(repr(tag), newlines=False, limit=TAG_CHARS + 10)} is not a tag: "
                        f"1 to {TAG_CHARS} printable characters without spaces, e.g. bad-power")
    return tag


def resolve(store: Store, names: tuple[str, ...] | list[str]) -> list[RunKey]:
    """Each name (RUN_ID or DEVICE/RUN_ID) as the stored run it names, in order, once each; a
    name that matches no run, or runs of several devices, is RunsError (none resolved)."""
    stored = store.con.execute("SELECT device, run_id FROM runs ORDER BY device, run_id").fetchall()
    keys: list[RunKey] = []
    for name in names:
        device, _, run_id = name.rpartition("/")
        found = [(d, r) for d, r in stored if r == run_id and (not device or d == device)]
        shown = printable(repr(name), newlines=False, limit=80)
        if not found:
            raise RunsError(f"{store.path}: no run {shown}; `edgebench runs ls --store {store.path}` lists its "
                            "runs (RUN_ID, or DEVICE/RUN_ID); nothing changed")
        if len(found) > 1:
            raise RunsError(f"{store.path}: run {shown} is on {len(found)} devices "
                            f"({', '.join(f'{d}/{r}' for d, r in found)}); name one as DEVICE/RUN_ID; nothing changed")
        if found[0] not in keys:
            keys.append(found[0])
    return keys


def _tables_with(store: Store, columns: set[str]) -> list[str]:
    """The store's tables (views excluded) that have all these columns."""
    rows = store.con.execute("""SELECT c.table_name, list(c.column_name) FROM information_schema.columns c
        JOIN information_schema.tables t USING (table_catalog, table_schema, table_name)
        WHERE t.table_type = 'BASE TABLE' GROUP BY c.table_name ORDER BY c.table_name""").fetchall()
    return [name for name, have in rows if columns <= set(have)]


def _folders(store: Store, keys: list[RunKey]) -> dict[RunKey, list[str]]:
    """Each run's run directory and raw copy as the store recorded them."""
    out: dict[RunKey, list[str]] = {}
    for device, run_id in keys:
        (run_dir, raw_dir), = store.con.execute("SELECT run_dir, raw_dir FROM runs WHERE device = ? AND run_id = ?",
                                                [device, run_id]).fetchall()
        out[(device, run_id)] = list(dict.fromkeys(d for d in (run_dir, raw_dir) if d))
    return out


def remove_runs(store: Store, keys: list[RunKey]) -> list[RemovedRun]:
    """Deletes the runs' rows from every table that holds them (by run_key, or by device and
    run_id), all in one transaction, then each run's folders that lie under the store's
    folder (`_delete_folder`); the clock probes and external traces of the device stay."""
    folders = _folders(store, keys)
    by_key = _tables_with(store, {"run_key"})
    by_name = [t for t in _tables_with(store, {"device", "run_id"}) if t not in by_key]
    store.con.execute("BEGIN TRANSACTION")
    try:
        for device, run_id in keys:
            (run_key,), = store.con.execute("SELECT run_key FROM runs WHERE device = ? AND run_id = ?",
                                            [device, run_id]).fetchall()
            for table in by_key:  # `runs` last: the others find the key there no more
                if table != "runs":
                    store.con.execute(f'DELETE FROM "{table}" WHERE run_key = ?', [run_key])
            for table in [*by_name, "runs"]:
                store.con.execute(f'DELETE FROM "{table}" WHERE device = ? AND run_id = ?', [device, run_id])
        store.con.execute("COMMIT")
    except BaseException:
        store.con.execute("ROLLBACK")
        raise
    root = store.path.parent.resolve()
    done: list[RemovedRun] = []
    for (device, run_id), paths in folders.items():
        removed = RemovedRun(device=device, run_id=run_id, deleted=[], kept={})
        for path in paths:
            why = _delete_folder(root, store.path.resolve(), Path(path))
            if why is None:
                removed["deleted"].append(path)
            elif why:
                removed["kept"][path] = why
        done.append(removed)
    return done


def _delete_folder(root: Path, store_file: Path, path: Path) -> str | None:
    """Deletes `path` when it is a folder under `root` (the store's folder) reached through no
    link, and holds no store; None when deleted, "" when it is gone already, else why it stays."""
    if not path.is_absolute():
        return "not an absolute path"
    path = Path(os.path.normpath(path))
    if path == root or not path.is_relative_to(root):
        return f"outside the store's folder {root}"
    at = root
    for part in path.relative_to(root).parts:
        at = at / part
        if at.is_symlink():
            return f"{at} is a link; edgebench does not follow it out of the store's folder"
    if not path.exists():
        return ""
    if not path.is_dir():
        return "not a folder"
    if store_file.is_relative_to(path):
        return "it holds the store"
    shutil.rmtree(path)
    return None


def tag_runs(store: Store, keys: list[RunKey], tag: str, remove: bool = False) -> int:
    """Labels the runs with `tag` (or takes it off them: `remove`); how many runs changed."""
    changed = 0
    store.con.execute("BEGIN TRANSACTION")
    try:
        for device, run_id in keys:
            if remove:
                got = store.con.execute("DELETE FROM run_tags WHERE device = ? AND run_id = ? AND tag = ? RETURNING 1",
                                        [device, run_id, tag]).fetchall()
            else:
                got = store.con.execute("INSERT OR IGNORE INTO run_tags (device, run_id, tag) VALUES (?, ?, ?) "
                                        "RETURNING 1", [device, run_id, tag]).fetchall()
            changed += len(got)
        store.con.execute("COMMIT")
    except BaseException:
        store.con.execute("ROLLBACK")
        raise
    return changed
