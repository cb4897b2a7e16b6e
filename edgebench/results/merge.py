"""Bringing another store's runs into this one (`edgebench ingest OTHER.duckdb`): an earlier
edgebench kept one store per working folder (./runs/edgebench.duckdb), so a person's runs
were spread over stores that `report` did not read together.

Each run is ingested again from the run directory (or raw copy) the other store names, so
its figures are made by this edgebench's figure modules; the device's clock probes and the
external power traces come across as rows. Runs this store already has are kept as they are.
Every row read from the other store is checked first (`results.store_rows`): one bad row
refuses the whole store (BadRecord naming the store, the table, the row and the field; exit 2),
and nothing of it is ingested.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgebench.results import OLDER_STORE
from edgebench.results.store import Store, StoreError
from edgebench.results.store_rows import ExternalSourceRow, ExternalTraceRow, check_store, columns

PROBE_COLUMNS = "device, host_send_ns, device_mono_ns, device_wall_ns, host_recv_ns"


RunKey = tuple[str, str]  # (device, run_id)


@dataclass
class Merged:
    ingested: list[RunKey] = field(default_factory=list)
    kept: list[RunKey] = field(default_factory=list)  # already in this store
    lost: dict[RunKey, str] = field(default_factory=dict)  # why it could not come across


def _run_keys(path: Path) -> set[RunKey]:
    with Store(path, read_only=True) as store:
        return {(r[0], r[1]) for r in store.con.execute("SELECT device, run_id FROM runs").fetchall()}


def merge_store(store: Store, other: Path) -> Merged:
    """Every run of `other` that `store` lacks, ingested from its files, with the clock probes
    and external traces of `other` that `store` lacks."""
    if other.resolve() == store.path.resolve():
        raise StoreError(f"{other}: that is the store being written; name another store to merge from")
    with Store(other, read_only=True):
        pass  # a DuckDB file with a `runs` table, or StoreError saying what it is
    quoted = str(other).replace("'", "''")  # ATTACH takes no parameters
    store.con.execute(f"ATTACH '{quoted}' AS other (READ_ONLY)")
    try:
        check_store(store.con, "other", str(other))  # every row read below, checked first: one bad, none comes
        runs = store.con.execute("SELECT device, run_id, raw_dir, run_dir FROM other.runs ORDER BY run_key").fetchall()
        store.con.execute(f"INSERT INTO clock_probes ({PROBE_COLUMNS}) SELECT {PROBE_COLUMNS} FROM other.clock_probes "
                          f"EXCEPT SELECT {PROBE_COLUMNS} FROM clock_probes")
        new_traces = ("SELECT trace_id FROM other.external_sources "
                      "WHERE trace_id NOT IN (SELECT trace_id FROM external_sources)")
        for table, row in (("external_traces", ExternalTraceRow), ("external_sources", ExternalSourceRow)):
            names = ", ".join(columns(row))
            store.con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM other.{table} "
                              f"WHERE trace_id IN ({new_traces})")
    finally:
        store.con.execute("DETACH other")
    merged = Merged()
    for device, run_id, raw_dir, run_dir in runs:
        key = (device, run_id)
        if store.runs(device=device, run_id=run_id):
            merged.kept.append(key)
            continue
        found = next((Path(d) for d in (raw_dir, run_dir) if d and (Path(d) / "meta.json").is_file()), None)
        if found is None:
            merged.lost[key] = f"its files are gone (looked in {raw_dir or run_dir})"
            continue
        try:
            store.ingest_run(found, device=device, expect_run_id=run_id)
        except (OSError, ValueError) as exc:
            merged.lost[key] = str(exc)
            continue
        merged.ingested.append(key)
    return merged


def older_store_note(used: Path) -> str | None:
    """What to say when ./runs/ holds an earlier edgebench's store with runs that `used` lacks."""
    if not OLDER_STORE.is_file() or (used.exists() and OLDER_STORE.resolve() == used.resolve()):
        return None
    try:
        missing = _run_keys(OLDER_STORE) - (_run_keys(used) if used.exists() else set())
    except (StoreError, OSError):
        return None  # unreadable or held by a writer: not this command's business
    if not missing:
        return None
    return (f"{OLDER_STORE}: this folder's store (an earlier edgebench's) has runs that {used} lacks: "
            f"{len(missing)}; bring them in with `edgebench ingest {OLDER_STORE}`")
