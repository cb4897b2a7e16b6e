"""The results store: one DuckDB file with every run, sample, step, clock probe and
external power trace, plus the raw trace files kept beside it.

Samples are stored wide: one column per field the samplers wrote (`rss_bytes`,
`rail_vdd_in_w`, `temp_cpu_c`, ...); a field seen for the first time adds a column, so
devices with different sensors share one table. A run's device and run_id live once, in
`runs`; its sample and step rows carry only the run's small integer `run_key` (two text
columns on every one of millions of rows cost ~13% of the ingest). DuckDB parses
samples.jsonl straight into the table (millions of samples ingest in seconds), every value
checked meanwhile against the one definition of a sample line (`figures.run_samples`: a bad
one refuses the run before its raw copy is made). Device times stay as written
(monotonic ns); the views `samples_host` and `steps_host` place them on the host's
wall clock with each run's alignment (see alignment.py), recomputed whenever probes
for the device arrive.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from edgebench.errors import EdgebenchError
from edgebench.figures.run import HOST_EVALS
from edgebench.figures.run_events import Ended
from edgebench.figures.run_meta import RunMeta
from edgebench.figures.run_samples import INTEGER_SUFFIXES, bad_sample, check_sql, find_bad_line, keys_problem
from edgebench.results import default_store
from edgebench.results.alignment import Alignment, align_run
from edgebench.results.external import CsvMapping, read_power_csv
from edgebench.results.heldout import evaluate_saved_weights
from edgebench.results.runfiles import RunFiles, SampleScan, read_run_dir, read_steps, scan_samples
from edgebench.untrusted import BadRecord, UnsafeName, inside, path_name, printable

UNLIMITED_BYTES = 1 << 60  # cgroup "max" reads as ~2^63: no limit
NUMERIC_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                 "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE"}


@dataclass
class SampleCounts:
    """What ingesting one samples.jsonl found."""

    count: int = 0
    bad_lines: int = 0
    truncated_last_line: bool = False
    cgroup_limit_bytes: int | None = None

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    device VARCHAR, run_id VARCHAR, model VARCHAR, method VARCHAR, backend VARCHAR,
    status VARCHAR, detail VARCHAR, batch_size INTEGER, text_length INTEGER, image_size INTEGER,
    steps_done INTEGER, run_dir VARCHAR, raw_dir VARCHAR, meta_json VARCHAR, result_json VARCHAR,
    mem_total_bytes BIGINT, cgroup_limit_bytes BIGINT, device_ram_bytes BIGINT,
    samples_count BIGINT, samples_bad_lines BIGINT, samples_truncated BOOLEAN,
    events_bad_lines BIGINT, events_truncated BOOLEAN,
    align_source VARCHAR, align_offset_ns BIGINT, align_drift DOUBLE, align_ref_mono_ns BIGINT,
    align_probes_used INTEGER, align_probes_discarded INTEGER, align_max_error_ns BIGINT, align_note VARCHAR,
    ingested_at TIMESTAMP DEFAULT current_timestamp, run_key INTEGER, packing BOOLEAN, runtime VARCHAR,
    PRIMARY KEY (device, run_id)
);
CREATE TABLE IF NOT EXISTS samples (run_key INTEGER, t_ns BIGINT);
CREATE TABLE IF NOT EXISTS steps (
    run_key INTEGER, step BIGINT, phase VARCHAR,
    begin_ns BIGINT, end_ns BIGINT, duration_s DOUBLE, loss DOUBLE
);
CREATE TABLE IF NOT EXISTS clock_probes (
    device VARCHAR, host_send_ns BIGINT, device_mono_ns BIGINT, device_wall_ns BIGINT, host_recv_ns BIGINT,
    added_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS external_sources (
    trace_id VARCHAR PRIMARY KEY, device VARCHAR, source_path VARCHAR, raw_path VARCHAR, mapping_json VARCHAR,
    rows BIGINT, first_host_ns BIGINT, last_host_ns BIGINT, imported_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS external_traces (trace_id VARCHAR, device VARCHAR, host_t_ns BIGINT, power_w DOUBLE);
CREATE TABLE IF NOT EXISTS run_tags (
    device VARCHAR, run_id VARCHAR, tag VARCHAR, tagged_at TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (device, run_id, tag)
);
"""

HOST_NS = "{t} + r.align_offset_ns + CAST(round(r.align_drift * ({t} - r.align_ref_mono_ns)) AS BIGINT)"
VIEWS = f"""
CREATE OR REPLACE VIEW samples_host AS
    SELECT r.device, r.run_id, s.*,
        CASE WHEN r.align_source = 'none' THEN NULL ELSE {HOST_NS.format(t='s.t_ns')} END AS host_t_ns
    FROM samples s JOIN runs r USING (run_key);
CREATE OR REPLACE VIEW steps_host AS
    SELECT r.device, r.run_id, s.*,
        CASE WHEN r.align_source = 'none' THEN NULL ELSE {HOST_NS.format(t='s.begin_ns')} END AS host_begin_ns,
        CASE WHEN r.align_source = 'none' THEN NULL ELSE {HOST_NS.format(t='s.end_ns')} END AS host_end_ns
    FROM steps s JOIN runs r USING (run_key);
"""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _duck_type(name: str, arrow_type: pa.DataType) -> str:
    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_null(arrow_type):
        return "BIGINT" if name.endswith(INTEGER_SUFFIXES) else "DOUBLE"
    return "VARCHAR"


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _profile_ram_bytes(device: str) -> int | None:
    """The device profile's RAM when the inventory knows the device (reports draw it as a line)."""
    from edgebench.devices.inventory import get_device

    try:
        return int(get_device(device).profile.ram_bytes)
    except ValueError:  # not in the inventory (or its profile is broken): RAM from the run itself
        return None


def _plain(values: Any) -> np.ndarray:
    """A fetched column as a plain array: nulls become NaN (numbers) or None (text)."""
    if not np.ma.isMaskedArray(values):
        return np.asarray(values)
    if not values.mask.any():
        return values.data
    if values.dtype.kind in "iuf":
        return np.ma.filled(values.astype(np.float64), np.nan)
    text = np.array(values.data, dtype=object)  # np.ma.filled(..., None) fills with the dtype's '?' instead
    text[np.ma.getmaskarray(values)] = None
    return text


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    return {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                                      [table]).fetchall()}


def _upgrade(con: duckdb.DuckDBPyConnection) -> None:
    """Brings a store written by an older edgebench to this layout, rows kept: the runs table
    gains `run_key`, `packing` and `runtime` (read back from each run's meta), and samples
    and steps keyed by device and run_id text get the run's key instead."""
    have = _columns(con, "runs")
    if not have or {"run_key", "packing", "runtime"} <= have and "device" not in _columns(con, "samples"):
        return
    con.execute("BEGIN TRANSACTION")
    con.execute("DROP VIEW IF EXISTS samples_host; DROP VIEW IF EXISTS steps_host")
    con.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS run_key INTEGER")
    con.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS packing BOOLEAN")
    con.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS runtime VARCHAR")
    con.execute("""UPDATE runs SET run_key = k.key FROM (SELECT device, run_id, row_number() OVER (
                       ORDER BY ingested_at, device, run_id) AS key FROM runs) k
                   WHERE runs.run_key IS NULL AND runs.device = k.device AND runs.run_id = k.run_id""")
    con.execute("""UPDATE runs
                   SET packing = coalesce(TRY_CAST(json_extract(meta_json, '$.spec.packing') AS BOOLEAN), false)
                   WHERE packing IS NULL""")
    con.execute("""UPDATE runs SET runtime = json_extract_string(meta_json, '$.runtime')
                   WHERE runtime IS NULL AND backend = 'executorch'""")
    for table in ("samples", "steps"):
        if "device" in _columns(con, table):
            con.execute(f"""CREATE TABLE _{table} AS SELECT r.run_key::INTEGER AS run_key, t.* EXCLUDE (device, run_id)
                            FROM {table} t JOIN runs r USING (device, run_id)""")
            con.execute(f"DROP TABLE {table}")
            con.execute(f"ALTER TABLE _{table} RENAME TO {table}")
    con.execute("COMMIT")


class StoreError(EdgebenchError, ValueError):
    """The store file cannot be used: damaged, foreign, or held by another writer too long."""


LOCK_WAIT_S = 60.0  # another edgebench writing (a collect, a bench ingest) holds DuckDB's file lock


DUCKDB_MAGIC = (8, b"DUCK")  # offset and bytes of a DuckDB file's magic


def _check_is_duckdb(path: Path) -> None:
    """A file that exists must be a DuckDB database: DuckDB itself would try to download an
    extension for another format (e.g. sqlite_scanner for a SQLite file) or read garbage."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except (FileNotFoundError, IsADirectoryError):
        return  # a new store, or DuckDB's own error for a folder
    offset, magic = DUCKDB_MAGIC
    if head and head[offset:offset + len(magic)] != magic:
        kind = "a SQLite database" if head.startswith(b"SQLite format 3") else "damaged or not a DuckDB file"
        raise StoreError(f"{path}: {kind}, not an edgebench results store; pass the store `edgebench collect` or "
                         "`ingest` wrote (--store), or move this file away to start a new store there")


def check_location(path: Path) -> None:
    """Before any run: the store its runs go into can be written there: not a folder, not a link,
    not a file that is no store, and in a folder this user can write. (A store another process
    holds now is fine: ingest waits for it.)"""
    if path.is_symlink():
        raise StoreError(f"{path}: a link; pass the store's own path (--store), or another")
    if path.exists() and not path.is_file():
        raise StoreError(f"{path}: not a file; pass the path of a store file (e.g. {path}/edgebench.duckdb) to --store")
    _check_is_duckdb(path)
    folder = next(p for p in (path.absolute().parent, *path.absolute().parents) if p.exists())
    writable = os.access(path, os.W_OK) if path.exists() else folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise StoreError(f"{path if path.exists() else folder}: this user cannot write there; pass a --store it can "
                         "write")


def _connect(path: Path, read_only: bool, wait_s: float = LOCK_WAIT_S) -> duckdb.DuckDBPyConnection:
    """Opens the file, waiting while another process holds its lock; a damaged or foreign
    file is named as such."""
    import time

    _check_is_duckdb(path)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" in text.lower() and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            if "lock" in text.lower():
                raise StoreError(
                    f"{path}: another process has held the store for {wait_s:.0f} s ({text.splitlines()[0]}); "
                    "wait for it (a collect or bench still ingesting) and retry"
                ) from None
            if "not a valid DuckDB database" in text or "database file" in text.lower():
                raise StoreError(f"{path}: damaged or not a DuckDB results store ({text.splitlines()[0]}); "
                                 "pass another --store, or move this file away to start a new store") from None
            raise StoreError(f"{path}: cannot open the results store ({text.splitlines()[0]})") from None


class Store:
    """One DuckDB results file. Not safe for two writing processes at once (DuckDB's rule)."""

    def __init__(self, path: str | Path | None = None, read_only: bool = False, wait_s: float = LOCK_WAIT_S):
        """`wait_s`: how long to wait for another process's lock (a quick reader that can do
        without the store passes 0)."""
        self.path = Path(path) if path else default_store()
        if read_only and not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no results store here; run `edgebench collect` or "
                                    "`edgebench ingest RUN_DIR` first, or pass --store")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.con = _connect(self.path, read_only, wait_s)
        if read_only and "device" in _columns(self.con, "samples"):
            self.con.close()  # written by an older edgebench: upgraded once, then read
            with Store(self.path):
                pass
            self.con = _connect(self.path, read_only)
        if not read_only:
            _upgrade(self.con)
            self.con.execute(SCHEMA)
            self.con.execute(VIEWS)
        elif not self.has_table("runs"):
            self.con.close()
            raise StoreError(
                f"{self.path}: a DuckDB file but not an edgebench results store (no `runs` table); "
                "pass the store `edgebench collect` or `ingest` wrote (--store)"
            )

    @property
    def raw_root(self) -> Path:
        return self.path.parent / "raw"

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- ingest ---------------------------------------------------------------------
    def ingest_run(self, run_dir: str | Path, device: str | None = None, keep_raw: bool = True,
                   expect_run_id: str | None = None) -> str:
        """Loads a run directory; re-ingesting the same (device, run_id) replaces it. The device
        name and the run id (meta.json's, i.e. the device's) must be plain names
        (edgebench.untrusted): the raw copy lands in raw/<device>/<run_id>/. `expect_run_id`: the
        id the run was listed under (collect), which meta.json must agree with."""
        files = read_run_dir(run_dir)
        evaluate_saved_weights(files.path)  # an exported program's held-out evaluations, made here
        device = path_name(device or "local", "device name")
        run_id = path_name(files.run_id, f"{files.path / 'meta.json'}: run_id")
        if expect_run_id is not None and run_id != expect_run_id:
            raise UnsafeName(f"{files.path / 'meta.json'}: run_id {printable(repr(run_id))} is not the run "
                             f"{expect_run_id!r} the device listed it as; not ingested (check the device's run)")
        raw_dir = self._raw_dir(files.path, device, run_id) if keep_raw else None
        # One DuckDB thread: parallel appends leave partial row groups that the commit or the next
        # checkpoint merges again (~25% more CPU for the same store); readers sort by t_ns.
        self.con.execute("SET threads = 1")
        self.con.execute("SET preserve_insertion_order = false")
        pool, events_con = ThreadPoolExecutor(1), self.con.cursor()
        # events.jsonl is parsed on another core (its own DuckDB connection) while the samples go in
        events = pool.submit(read_steps, events_con, files.path / "events.jsonl")
        self.con.execute("BEGIN TRANSACTION")
        try:
            # Rows of a run go in with its `runs` row in one transaction: no runs row, nothing to delete
            # (skips scanning the whole samples table on a first ingest). A re-ingest keeps the run's key.
            run_key = self._run_key(device, run_id)
            if run_key is None:
                run_key = self.con.execute("SELECT coalesce(max(run_key), 0) + 1 FROM runs").fetchall()[0][0]
            else:
                for table in ("runs", "samples", "steps"):
                    self.con.execute(f"DELETE FROM {table} WHERE run_key = ?", [run_key])
            samples = self._insert_samples(files.path / "samples.jsonl", run_key)
            files.steps, files.events_counts = events.result()
            if files.result is not None:  # the figures, made here from the raw records (edgebench.figures)
                files.result = self._run_figures(files, run_key, shared_host=device == "local")
            self._insert_run_row(files, device, run_id, run_key, raw_dir, samples)
            self._insert_bulk("steps", files.steps, run_key)
            self._store_alignment(device, run_id, align_run(self.probes(device), files.meta))
            if raw_dir is not None:  # copied once every record of the run was checked: a refused run leaves none
                self._keep_raw(files.path, Path(raw_dir))
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            pool.shutdown()
            events_con.close()
            self.con.execute("RESET threads")
            self.con.execute("RESET preserve_insertion_order")
        return run_id

    def _raw_dir(self, run_dir: Path, device: str, run_id: str) -> str:
        """Where the run's trace files are kept beside the store: the run itself when it lives under it."""
        root = self.path.parent.resolve()
        if run_dir.resolve().is_relative_to(root):
            return str(run_dir.resolve())
        return str(inside(self.raw_root, f"{device}/{run_id}", "raw copy"))

    @staticmethod
    def _keep_raw(run_dir: Path, dest: Path) -> None:
        """Copies the trace files to `dest` (the raw copy), unless the run is there already."""
        if dest == run_dir.resolve():
            return
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("meta.json", "samples.jsonl", "events.jsonl", HOST_EVALS, "result.json"):
            if (run_dir / name).exists():
                shutil.copy2(run_dir / name, dest / name)

    def _column_types(self, table: str) -> dict[str, str]:
        return dict(self.con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                     "WHERE table_name = ?", [table]).fetchall())

    def _new_column_type(self, name: str, source_type: str, scan: SampleScan) -> str:
        """The store's type for a sample field seen for the first time (numbers by name: *_bytes BIGINT...)."""
        if source_type == "JSON" and name in scan.nested:
            return "VARCHAR"
        if source_type == "JSON":  # a key past DuckDB's detection sample: its first value decides
            got = self.con.execute(f"SELECT json_type({_quote(name)}) FROM {scan.source()} "
                                   f"WHERE {_quote(name)} IS NOT NULL LIMIT 1").fetchall()
            source_type = got[0][0] if got else "DOUBLE"
        if source_type == "BOOLEAN":
            return "BOOLEAN"
        if source_type in NUMERIC_TYPES:
            return "BIGINT" if name.endswith(INTEGER_SUFFIXES) else "DOUBLE"
        return "VARCHAR"

    def _run_figures(self, files: RunFiles, run_key: int, shared_host: bool) -> dict[str, Any]:
        """result.json's figures from the run's raw result, events and stored samples."""
        from edgebench.figures.run import run_events, run_figures
        from edgebench.figures.samples import raw_columns

        numbers, texts = raw_columns(files.meta.readings or {})
        columns = self._sample_columns(run_key, numbers, texts)
        events = run_events(files.path, files.events)  # the device's, checked as read_run_dir read them
        figures = run_figures(files.meta, files.result or {}, files.end, events, columns, shared_host)
        figures.update(events_truncated_last_line=files.events_counts.truncated_last_line,
                       events_bad_lines=files.events_counts.bad_lines)
        return figures

    def _run_key(self, device: str, run_id: str) -> int | None:
        row = self.con.execute("SELECT run_key FROM runs WHERE device = ? AND run_id = ?", [device, run_id]).fetchone()
        return None if row is None else row[0]

    def _insert_samples(self, path: Path, run_key: int) -> SampleCounts:
        """DuckDB reads samples.jsonl straight into `samples` (new fields add columns first);
        lines it cannot parse are counted and dropped. The file's key/value pairs are counted
        meanwhile (another core); when the quick plan did not store them all, the run's rows
        are read again with the full plan."""
        scan = scan_samples(self.con, path)
        if scan is None:
            return SampleCounts()
        with ThreadPoolExecutor(2) as pool:  # the values checked on another core while they go in
            checked = pool.submit(self._check_samples, scan)
            mentions = pool.submit(scan.key_mentions) if scan.checkable else None
            self._insert_scan(scan, run_key)
            got = self._tally(scan, run_key)
            checked.result()  # a bad value: BadRecord, and the run's transaction is rolled back
            if mentions is None or got[3] != mentions.result():
                self.con.execute("DELETE FROM samples WHERE run_key = ?", [run_key])
                scan = scan_samples(self.con, path, full=True)
                assert scan is not None  # None only for a missing or empty file: this one was read just now
                self._check_samples(scan)
                self._insert_scan(scan, run_key)
                got = self._tally(scan, run_key)
        count, unread, limit, _ = got
        if unread:
            self.con.execute("DELETE FROM samples WHERE run_key = ? AND t_ns IS NULL", [run_key])
        return SampleCounts(count, max(0, unread - int(scan.truncated_last_line)), scan.truncated_last_line,
                            int(limit) if limit is not None and limit < UNLIMITED_BYTES else None)

    def _check_samples(self, scan: SampleScan) -> None:
        """Every value of the keys `scan` reads, checked against the one definition of a sample
        line (figures.run_samples) before a row goes in: BadRecord naming the file, the line
        and the key otherwise."""
        keys = list(scan.columns)
        problem = keys_problem(keys)
        if problem is not None:
            raise bad_sample(str(scan.path), problem)
        con = self.con.cursor()  # its own connection: the check runs beside the insert
        try:
            row = con.execute(check_sql(scan.source(as_json=True), keys)).fetchone()
        finally:
            con.close()
        if row is not None:
            raise find_bad_line(scan.path, row[0], row[1])

    def _tally(self, scan: SampleScan, run_key: int) -> tuple[int, int, int | None, int]:
        """In one pass over the run's rows: samples read, lines unread (all NULL), the smallest
        cgroup limit, and how many key/value pairs of the file arrived (one per non-null cell)."""
        pairs = " + ".join(f"count({_quote(c)})" for c in scan.columns)
        limit = "min(cgroup_limit_bytes)" if "cgroup_limit_bytes" in scan.columns else "NULL"
        count, unread, smallest, arrived = self.con.execute(
            f"SELECT count(t_ns), count(*) - count(t_ns), {limit}, {pairs} FROM samples WHERE run_key = ?",
            [run_key]).fetchall()[0]
        return count, unread, smallest, arrived

    def _insert_scan(self, scan: SampleScan, run_key: int) -> None:
        existing = self._column_types("samples")
        for name, source_type in scan.columns.items():
            if name not in existing:
                existing[name] = self._new_column_type(name, source_type, scan)
                self.con.execute(f"ALTER TABLE samples ADD COLUMN {_quote(name)} {existing[name]}")
        select = []
        for name, source_type in scan.columns.items():
            col, target = _quote(name), existing[name]
            if source_type == "JSON" and target == "VARCHAR":
                select.append(f"CASE WHEN json_type({col}) = 'VARCHAR' THEN {col} ->> '$' ELSE CAST({col} AS VARCHAR) "
                              f"END AS {col}")
            elif source_type == "JSON":
                select.append(f"TRY_CAST({col} ->> '$' AS {target}) AS {col}")
            else:
                select.append(f"TRY_CAST({col} AS {target}) AS {col}")
        self.con.execute(f"INSERT INTO samples BY NAME SELECT {int(run_key)}::INTEGER AS run_key, {', '.join(select)} "
                         f"FROM {scan.source()}")

    def _insert_run_row(self, files: RunFiles, device: str, run_id: str, run_key: int, raw_dir: str | None,
                        samples: SampleCounts) -> None:
        meta, result = files.meta, files.result or {}
        spec = meta.spec
        limit = samples.cgroup_limit_bytes
        mem_total = meta.device.mem_total_bytes
        ram = min([v for v in (limit, mem_total, _profile_ram_bytes(device)) if v], default=None)
        detail = (
            result.get("detail") or "; ".join(e.detail if isinstance(e, Ended) and e.detail is not None else e.event
                                              for e in files.error_events) or None
        )
        row = {
            "device": device,
            "run_id": run_id,
            "run_key": run_key,
            "packing": bool(spec.get("packing")),
            "model": spec.get("model") if spec.get("checkpoint") else (result.get("model") or spec.get("model")),
            "method": result.get("method") or spec.get("method"),
            "backend": result.get("backend") or spec.get("backend"),
            "runtime": meta.runtime,  # executorch: native or python worker
            "status": result.get("status") or "incomplete",
            "detail": detail,
            "batch_size": _int_or_none(spec.get("batch_size")),
            # a measured command's (edgebench measure) text and images are its own: none of the spec's
            "text_length": None if spec.get("command") else _int_or_none(spec.get("text_length")),
            "image_size": None if spec.get("command") else _int_or_none(spec.get("image_size")),
            "steps_done": _int_or_none(result.get("steps_done")),
            "run_dir": str(files.path.resolve()),
            "raw_dir": raw_dir,
            "meta_json": json.dumps(meta.to_json()),  # the record as checked (figures.run_meta.RunMeta)
            "result_json": json.dumps(result, default=str) if files.result else None,
            "mem_total_bytes": mem_total,
            "cgroup_limit_bytes": limit,
            "device_ram_bytes": ram,
            "samples_count": samples.count,
            "samples_bad_lines": samples.bad_lines,
            "samples_truncated": samples.truncated_last_line,
            "events_bad_lines": files.events_counts.bad_lines,
            "events_truncated": files.events_counts.truncated_last_line,
        }
        names = ", ".join(row)
        self.con.execute(f"INSERT INTO runs ({names}) VALUES ({', '.join('?' * len(row))})", list(row.values()))

    def _insert_bulk(self, table: str, data: pa.Table, run_key: int) -> None:
        """One INSERT ... BY NAME from Arrow; new sample fields become new columns first."""
        existing = {name: dtype for name, dtype in self.con.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?", [table]).fetchall()}
        for col_field in data.schema:
            if col_field.name not in existing and col_field.name != "run_key":
                dtype = _duck_type(col_field.name, col_field.type)
                self.con.execute(f"ALTER TABLE {table} ADD COLUMN {_quote(col_field.name)} {dtype}")
                existing[col_field.name] = dtype
        select = ", ".join(f"TRY_CAST({_quote(n)} AS {existing[n]}) AS {_quote(n)}"
                           for n in data.column_names if n != "run_key")
        self.con.register("_incoming", data)
        try:
            self.con.execute(
                f"INSERT INTO {table} BY NAME SELECT {int(run_key)}::INTEGER AS run_key, {select} FROM _incoming"
            )
        finally:
            self.con.unregister("_incoming")

    # ---- clocks ---------------------------------------------------------------------
    def add_clock_probes(self, device: str, probes: Iterable[dict[str, Any]]) -> int:
        """Adds probes (host times from the host's time.time_ns()) and re-aligns the device's runs.

        A probe already stored (same host_send_ns and device_mono_ns) is not added twice.
        Returns how many were new.
        """
        rows = [(device, int(p["host_send_ns"]), int(p["device_mono_ns"]), _int_or_none(p.get("device_wall_ns")),
                 int(p["host_recv_ns"])) for p in probes]
        before: int = self.con.execute("SELECT count(*) FROM clock_probes WHERE device = ?", [device]).fetchall()[0][0]
        if rows:
            table = pa.table({name: [r[i] for r in rows] for i, name in enumerate(
                ("device", "host_send_ns", "device_mono_ns", "device_wall_ns", "host_recv_ns"))})
            self.con.register("_probes", table)
            self.con.execute("""INSERT INTO clock_probes BY NAME
                SELECT DISTINCT p.* FROM _probes p ANTI JOIN clock_probes c
                ON c.device = p.device AND c.host_send_ns = p.host_send_ns AND c.device_mono_ns = p.device_mono_ns""")
            self.con.unregister("_probes")
        self.realign(device)
        after: int = self.con.execute("SELECT count(*) FROM clock_probes WHERE device = ?", [device]).fetchall()[0][0]
        return after - before

    def probes(self, device: str) -> list[dict[str, Any]]:
        cur = self.con.execute("""SELECT host_send_ns, device_mono_ns, device_wall_ns, host_recv_ns
                                  FROM clock_probes WHERE device = ? ORDER BY host_send_ns""", [device])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]

    def realign(self, device: str) -> None:
        """Recomputes the alignment of every run of `device` from its current probes."""
        probes = self.probes(device)
        for run_id, meta_json in self.con.execute(
            "SELECT run_id, meta_json FROM runs WHERE device = ?", [device]
        ).fetchall():
            try:  # stored as checked since issue 71; a store from before may hold a record that is not
                meta = RunMeta.from_json(json.loads(meta_json), f"{self.path}: {device}/{run_id}'s stored meta.json")
            except BadRecord as exc:
                self._store_alignment(device, run_id, Alignment("none", note=str(exc)))
                continue
            self._store_alignment(device, run_id, align_run(probes, meta))

    def _store_alignment(self, device: str, run_id: str, a: Alignment) -> None:
        self.con.execute(
            """UPDATE runs SET align_source = ?, align_offset_ns = ?, align_drift = ?, align_ref_mono_ns = ?,
            align_probes_used = ?, align_probes_discarded = ?, align_max_error_ns = ?, align_note = ?
            WHERE device = ? AND run_id = ?""",
            [
                a.source,
                a.offset_ns,
                a.drift,
                a.ref_mono_ns,
                a.probes_used,
                a.probes_discarded,
                a.max_error_ns,
                a.note,
                device,
                run_id,
            ],
        )

    def alignment(self, device: str, run_id: str) -> Alignment:
        row = self.con.execute(
            """SELECT align_source, align_offset_ns, align_drift, align_ref_mono_ns, align_probes_used,
            align_probes_discarded, align_max_error_ns, align_note FROM runs WHERE device = ? AND run_id = ?""",
            [device, run_id],
        ).fetchall()
        if not row:
            raise KeyError(f"no run {run_id!r} on device {device!r} in {self.path}")
        return Alignment(*row[0])

    # ---- external traces ----------------------------------------------------------------
    def import_external_trace(self, csv_path: str | Path, device: str, mapping: CsvMapping,
                              trace_id: str | None = None) -> str:
        """Reads a meter's CSV onto the host timeline; re-importing the same trace_id replaces it."""
        csv_path = Path(csv_path)
        t_ns, power = read_power_csv(csv_path, mapping)
        trace_id = trace_id or f"{device}:{csv_path.stem}"
        raw = inside(self.raw_root, f"external/{trace_id.replace('/', '_').replace(':', '_')}{csv_path.suffix}",
                     "trace id")
        raw.parent.mkdir(parents=True, exist_ok=True)
        if csv_path.resolve() != raw.resolve():
            shutil.copy2(csv_path, raw)
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DELETE FROM external_sources WHERE trace_id = ?", [trace_id])
            self.con.execute("DELETE FROM external_traces WHERE trace_id = ?", [trace_id])
            self.con.execute(
                "INSERT INTO external_sources BY NAME SELECT ? AS trace_id, ? AS device, ? AS source_path, "
                "? AS raw_path, ? AS mapping_json, ? AS rows, ? AS first_host_ns, ? AS last_host_ns",
                [
                    trace_id,
                    device,
                    str(csv_path.resolve()),
                    str(raw),
                    json.dumps(mapping.to_dict()),
                    len(t_ns),
                    int(t_ns[0]),
                    int(t_ns[-1]),
                ],
            )
            self.con.register("_ext", pa.table({"trace_id": [trace_id] * len(t_ns), "device": [device] * len(t_ns),
                                                "host_t_ns": t_ns, "power_w": power}))
            self.con.execute("INSERT INTO external_traces BY NAME SELECT * FROM _ext")
            self.con.unregister("_ext")
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        return trace_id

    def external_covering(self, device: str, first_host_ns: int, last_host_ns: int) -> str | None:
        """The trace_id of an external trace on `device` spanning the whole host-time window."""
        row = self.con.execute(
            """SELECT trace_id FROM external_sources WHERE device = ? AND first_host_ns <= ?
            AND last_host_ns >= ? ORDER BY imported_at DESC LIMIT 1""",
            [device, first_host_ns, last_host_ns],
        ).fetchall()
        return row[0][0] if row else None

    def external_arrays(self, trace_id: str) -> tuple[np.ndarray, np.ndarray]:
        got = self.con.execute("SELECT host_t_ns, power_w FROM external_traces WHERE trace_id = ? ORDER BY host_t_ns",
                               [trace_id]).fetchnumpy()
        return np.asarray(got["host_t_ns"], dtype=np.int64), np.asarray(got["power_w"], dtype=np.float64)

    # ---- reading ------------------------------------------------------------------------
    def runs(
        self, device: str | None = None, model: str | None = None, run_id: str | None = None,
        tag: str | None = None,
    ) -> list[dict[str, Any]]:
        """Run rows (the `runs` table) matching the filters, oldest first; `tag`: only runs
        labelled so (`edgebench runs tag`; a store from before tags has none)."""
        where, args = [], []
        for column, value in (("device", device), ("model", model), ("run_id", run_id)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        if tag:
            if not self.has_table("run_tags"):
                return []
            where.append("(device, run_id) IN (SELECT device, run_id FROM run_tags WHERE tag = ?)")
            args.append(tag)
        sql = (
            "SELECT * FROM runs"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY ingested_at, device, run_id"
        )
        cur = self.con.execute(sql, args)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]

    def has_table(self, name: str) -> bool:
        """Whether the store has this table (one opened read-only keeps an older edgebench's layout)."""
        return bool(self.con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                                     [name]).fetchall()[0][0])

    def tags(self) -> dict[tuple[str, str], list[str]]:
        """Each tagged run's (device, run_id) and its tags, sorted."""
        if not self.has_table("run_tags"):
            return {}
        out: dict[tuple[str, str], list[str]] = {}
        for device, run_id, tag in self.con.execute(
                "SELECT device, run_id, tag FROM run_tags ORDER BY device, run_id, tag").fetchall():
            out.setdefault((device, run_id), []).append(tag)
        return out

    def sample_columns(self) -> list[str]:
        return [
            r[0]
            for r in self.con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples' "
                "ORDER BY ordinal_position"
            ).fetchall()
        ]

    def samples(self, device: str, run_id: str, columns: Iterable[str], texts: Iterable[str] = ()
                ) -> dict[str, np.ndarray]:
        """Sample columns of one run in time order: numbers (a column the store lacks reads as
        all-NaN) and text columns (None where absent)."""
        return self._sample_columns(self._run_key(device, run_id), columns, texts)

    def _sample_columns(self, run_key: int | None, columns: Iterable[str], texts: Iterable[str] = ()
                        ) -> dict[str, np.ndarray]:
        have = set(self.sample_columns())
        wanted = [c for c in columns if c != "t_ns"]
        words = [c for c in texts if c not in wanted and c != "t_ns"]
        select = ", ".join(["t_ns"] + [
            f"TRY_CAST({_quote(c)} AS DOUBLE) AS {_quote(c)}" if c in have else f"NULL::DOUBLE AS {_quote(c)}"
            for c in wanted] + [
            f"CAST({_quote(c)} AS VARCHAR) AS {_quote(c)}" if c in have else f"NULL::VARCHAR AS {_quote(c)}"
            for c in words])
        got = self.con.execute(f"SELECT {select} FROM samples WHERE run_key = ? ORDER BY t_ns", [run_key]).fetchnumpy()
        out = {c: _plain(got[c]) for c in ["t_ns", *wanted]}
        out.update({c: np.asarray([v for v in got[c].tolist()], dtype=object) for c in words})
        return out

    def steps(self, device: str, run_id: str) -> dict[str, np.ndarray]:
        """Steps of one run with device and host times (host times are null when unaligned)."""
        got = self.con.execute("""SELECT step, phase, begin_ns, end_ns, duration_s, loss, host_begin_ns, host_end_ns
            FROM steps_host WHERE device = ? AND run_id = ? AND begin_ns IS NOT NULL AND end_ns IS NOT NULL
            ORDER BY begin_ns, step""", [device, run_id]).fetchnumpy()
        return {k: _plain(v) for k, v in got.items()}
