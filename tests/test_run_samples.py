"""samples.jsonl and another store's rows (issue 71: everything from outside is checked once,
against one typed definition): `figures.run_samples` is the one definition of a sample line;
the Python sampler's lines read back through it (the shell sweep's: tests/test_readings_parity.py);
a damaged line is one line naming samples.jsonl, the line, the key and the value, from the
figures' reader and from the store's DuckDB reader alike, and `edgebench ingest` stores nothing
of it. `results.store_rows` is the definition of each row read from another store: a hostile
store is refused whole, naming the store, the table, the row and the field."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import duckdb
import pytest

from edgebench.figures.readings import SAMPLE_KEY_PATTERNS, SAMPLE_KEYS
from edgebench.figures.run import figures_of_run_dir
from edgebench.figures.run_samples import KINDS, MAX_KEYS, PATTERNS, read_samples, sample_of
from edgebench.results.store import Store
from edgebench.telemetry.sampler import Sampler
from edgebench.untrusted import BadRecord
from results_fixtures import FakeRun
from test_untrusted import _confined, one_line_exit_2

GOOD = {"t_ns": 5, "rss_bytes": 100, "battery_status": "Full", "battery_current_ua": -5, "thermal_zone0_mc": -2000,
        "proc_stat_cpu": "cpu 1 2 3 4", "cpu0_freq_mhz": 1800, "rail_vdd_in_mw": 4500.5, "power_w": 1.5,
        "temp_cpu_c": 41.5, "cgroup_limit_bytes": None}
# (key, value, what the message says of it)
HOSTILE = [
    ("rss_bytes", 1.5, "sample.rss_bytes is 1.5, not a whole number 0 or more"),
    ("rss_bytes", "12", "sample.rss_bytes is '12', not a whole number 0 or more"),
    ("rss_bytes", -5, "sample.rss_bytes is -5, not a whole number 0 or more"),
    ("rss_bytes", True, "sample.rss_bytes is True, not a whole number"),
    ("rss_bytes", 2**64, "sample.rss_bytes is 18446744073709551616, not a whole number"),
    ("rss_bytes", 1e3, "sample.rss_bytes is 1000.0, not a whole number"),
    ("power_w", math.nan, "sample.power_w is nan, not a finite number"),
    ("power_w", math.inf, "sample.power_w is inf, not a finite number"),
    ("power_w", "1.5", "sample.power_w is '1.5', not a finite number"),
    ("rail_vdd_in_mw", -math.inf, "sample.rail_vdd_in_mw is -inf, not a finite number"),
    ("thermal_zone1_mc", [1], "sample.thermal_zone1_mc is [1], not a finite number"),
    ("gpu_load_pct", -1, "sample.gpu_load_pct is -1, not a finite number 0 or more"),
    ("battery_status", "x" * 65, "sample.battery_status holds 65 characters, more than the 64 it may"),
    ("battery_status", 5, "sample.battery_status is 5, not text of at most 64 characters"),
    ("proc_stat_cpu", "c" * 10_000, "sample.proc_stat_cpu holds 10,000 characters, more than the 4,096"),
    ("temp_cpu_c", {"a": 1}, "sample.temp_cpu_c is {'a': 1}, not null, true, false, a finite number or text"),
    ("temp_cpu_c", "y" * 5000, "sample.temp_cpu_c is 'yyy"),
    ("new_count", 0.5, "sample.new_count is 0.5, not a whole number from"),
    ("t_ns", 1.5, "sample.t_ns is 1.5, not a whole number 0 or more"),
    ("t_ns", None, "sample.t_ns is None, not a whole number 0 or more"),
]
IDS = [f"{key}-{str(value)[:12]}" for key, value, _ in HOSTILE]


# --- the writers ------------------------------------------------------------------------------

def test_every_key_the_readings_table_names_has_a_kind():
    """The keys figures.readings names (the writers' table, held to both writers by
    test_readings_parity) are the keys this definition gives a kind, no more and no fewer."""
    assert set(KINDS) == set(SAMPLE_KEYS) and set(PATTERNS) == set(SAMPLE_KEY_PATTERNS)


def test_the_python_samplers_lines_read_back_through_the_definition(tmp_path):
    out = tmp_path / "samples.jsonl"
    sampler = Sampler(out, os.getpid(), rate_hz=50).start()
    time.sleep(0.3)
    sampler.stop()
    raw = [json.loads(line) for line in out.read_text().splitlines()]
    read = read_samples(out)
    assert len(read.records) == len(raw) >= 2 and read.bad_lines == 0 and list(read.records) == raw


# --- damaged lines ----------------------------------------------------------------------------

@pytest.mark.parametrize("key,value,words", HOSTILE, ids=IDS)
def test_a_bad_value_is_named_by_its_key(key, value, words):
    with pytest.raises(BadRecord, match="^samples line 7: " + _escaped(words)):
        sample_of({**GOOD, key: value}, "samples line 7")
    assert sample_of(GOOD, "x") is GOOD  # null where a reading failed, unknown plain keys, both signs


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_keys_a_device_never_writes_are_refused_and_a_line_is_capped():
    with pytest.raises(BadRecord, match="sample key 'Bad Key' is not a plain name"):
        sample_of({**GOOD, "Bad Key": 1}, "x")
    with pytest.raises(BadRecord, match="sample.t_ns is missing"):
        sample_of({"rss_bytes": 1}, "x")
    with pytest.raises(BadRecord, match=f"more than the {MAX_KEYS} it may"):
        sample_of({**GOOD, **{f"k{i}": 1 for i in range(MAX_KEYS)}}, "x")


def _damaged_run(tmp_path: Path, line: dict, name: str = "r1") -> tuple[Path, int]:
    """A good run whose samples.jsonl holds `line` past DuckDB's type detection (the store's
    quick plan reads it): (the run, its line)."""
    run = FakeRun(run_id=name).write(tmp_path / "src")
    lines = (run / "samples.jsonl").read_text().splitlines()
    at = len(lines) - 2
    lines.insert(at, json.dumps(line))
    (run / "samples.jsonl").write_text("\n".join(lines) + "\n")
    return run, at + 1


@pytest.mark.parametrize("key,value,words", HOSTILE, ids=IDS)
def test_the_store_and_the_figures_refuse_the_same_line(tmp_path, key, value, words):
    """DuckDB reads the store's samples, Python the figures': both name the same line and key,
    and the store keeps nothing of the run (no row, no raw copy)."""
    run, line = _damaged_run(tmp_path, {**GOOD, "t_ns": FakeRun().mono0_ns + 10, key: value})
    with Store(tmp_path / "s" / "store.duckdb") as store:
        with pytest.raises(BadRecord, match=_escaped(f"{run / 'samples.jsonl'} line {line}: {words}")):
            store.ingest_run(run, device="pi")
        assert store.runs() == [] and store.con.execute("SELECT count(*) FROM samples").fetchone() == (0,)
    assert not (tmp_path / "s" / "raw").exists()
    with pytest.raises(BadRecord, match=_escaped(f"samples.jsonl line {line}: sample.{key}")):
        figures_of_run_dir(run)


def test_garbage_is_counted_and_a_good_run_beside_a_bad_one_goes_in(tmp_path):
    """A line that is not a JSON object is counted, as in events.jsonl; an unknown plain key
    is kept as a column."""
    bad, _ = _damaged_run(tmp_path, {"t_ns": 1, "rss_bytes": math.nan}, "bad")
    good = FakeRun(run_id="good", extra_fields={"new_reading_count": 3}).write(tmp_path / "src", garbage=True)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(BadRecord, match="sample.rss_bytes is nan"):
            store.ingest_run(bad, device="pi")
        store.ingest_run(good, device="pi")
        (row,) = store.runs()
        assert row["run_id"] == "good" and row["samples_bad_lines"] == 1 and row["samples_truncated"]
        assert store.con.execute("SELECT max(new_reading_count) FROM samples").fetchone() == (3,)
    assert read_samples(good / "samples.jsonl").bad_lines == 1
    lines = (good / "samples.jsonl").read_text()
    (good / "samples.jsonl").write_text("{}\n" + lines)  # no reading: counted by either reader
    assert read_samples(good / "samples.jsonl").bad_lines == 2
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(good, device="pi")
        assert store.runs()[0]["samples_bad_lines"] == 2


def test_ingest_of_a_ten_megabyte_reading_is_one_line_exit_2(tmp_path, memory_cgroup):
    """In a memory cgroup: the message names the key and its length, never the whole value."""
    run, line = _damaged_run(tmp_path, {**GOOD, "t_ns": FakeRun().mono0_ns + 10, "proc_stat_cpu": "c" * 10_000_000})
    done = _confined(["ingest", str(run), "--store", "s/store.duckdb"], tmp_path, memory_cgroup)
    one_line_exit_2(done, f"samples.jsonl line {line}: sample.proc_stat_cpu holds 10,000,000 characters")
    assert "c" * 100 not in done.stderr
    assert not (tmp_path / "s" / "raw").exists()


# --- another store ----------------------------------------------------------------------------

def _other_store(tmp_path: Path) -> Path:
    """A store with a run, a clock probe and an external trace, as another edgebench left it."""
    path = tmp_path / "other" / "edgebench.duckdb"
    with Store(path) as other:
        other.ingest_run(FakeRun(run_id="theirs").write(tmp_path / "runs"), device="pi")
        other.add_clock_probes("pi", [{"host_send_ns": 10, "device_mono_ns": 20, "host_recv_ns": 30}])
        other.con.execute("INSERT INTO external_sources (trace_id, device, source_path, raw_path, mapping_json, rows, "
                          "first_host_ns, last_host_ns) VALUES ('pi:m', 'pi', '/m.csv', '/r/m.csv', '{}', 1, 5, 5)")
        other.con.execute("INSERT INTO external_traces VALUES ('pi:m', 'pi', 5, 2.5)")
    return path


HOSTILE_STORE = [
    ("UPDATE runs SET raw_dir = 'relative/x', run_dir = NULL",
     "table runs row device='pi' run_id='theirs': runs.raw_dir is 'relative/x', not an absolute path"),
    ("UPDATE runs SET device = '../etc'",
     "table runs row device='../etc' run_id='theirs': runs.device '../etc' is not a safe file name"),
    ("UPDATE runs SET run_dir = '/' || repeat('x', 10000)",
     "table runs row device='pi' run_id='theirs': runs.run_dir holds 10,001 characters, more than the 4,096 it may"),
    ("INSERT INTO clock_probes (device, host_send_ns, device_mono_ns, host_recv_ns) VALUES ('pi', -5, 1, 2)",
     "table clock_probes row device='pi' host_send_ns=-5: clock_probes.host_send_ns is -5, not a whole number 0 or "
     "more"),
    ("UPDATE external_traces SET power_w = 'NaN'::DOUBLE",
     "table external_traces row trace_id='pi:m' host_t_ns=5: external_traces.power_w is nan, not a finite number"),
    ("UPDATE external_traces SET power_w = 1e308 * 10", "external_traces.power_w is inf, not a finite number"),
    ("UPDATE external_sources SET mapping_json = repeat('{', 100000)",
     "table external_sources row trace_id='pi:m': external_sources.mapping_json holds 100,000 characters"),
    ("ALTER TABLE external_traces ALTER power_w TYPE VARCHAR",
     "table external_traces: column power_w is not a number column (VARCHAR)"),
]


@pytest.mark.parametrize("sql,words", HOSTILE_STORE, ids=["raw_dir-relative", "device-path", "run_dir-long",
                                                          "probe-negative", "power-nan", "power-inf", "mapping-long",
                                                          "power-text"])
def test_a_hostile_store_is_refused_whole_naming_its_table_row_and_field(tmp_path, edgebench_here, sql, words):
    other = _other_store(tmp_path)
    clean = edgebench_here("ingest", str(other), "--store", "clean/store.duckdb", "--json", cwd=tmp_path)
    assert clean.returncode == 0 and "ingested" in clean.stdout, clean.stderr  # the same store, undamaged
    with duckdb.connect(str(other)) as con:
        con.execute(sql)
    done = edgebench_here("ingest", str(other), "--store", "mine/store.duckdb", cwd=tmp_path)
    one_line_exit_2(done, str(other), words)
    assert "x" * 100 not in done.stderr
    with Store(tmp_path / "mine" / "store.duckdb", read_only=True) as mine:  # nothing of it came across
        assert mine.runs() == []
        for table in ("clock_probes", "external_sources", "external_traces"):
            assert mine.con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table


# --- the readers one line at a time -----------------------------------------------------------

def test_the_live_view_leaves_a_bad_sample_out_and_says_why():
    from types import SimpleNamespace

    from edgebench.live.state import LiveState

    state = LiveState(source="pi:/runs/r1")
    good, bad = {"t_ns": 1, "rss_bytes": 1 << 20}, {"t_ns": 2, "rss_bytes": 1 << 40, "power_w": math.inf}
    state.apply(SimpleNamespace(meta=None, result=None, error=None, bad_lines=0, events=[], samples=[good, bad]))
    assert state.samples_seen == 1 and state.peak_rss_bytes == 1 << 20  # the bad line's RSS never shown
    assert state.follow_error is not None and \
        "pi:/runs/r1/samples.jsonl sample 2: sample.power_w is inf, not a finite number" in state.follow_error


def test_the_supervisors_memory_low_point_skips_a_line_its_sampler_never_writes(tmp_path):
    from edgebench.runner.supervisor import memory_low_point

    path = tmp_path / "samples.jsonl"
    lines = [{"t_ns": 1, "mem_available_bytes": 500, "cgroup_usage_bytes": 7},
             {"t_ns": 2, "mem_available_bytes": -5, "cgroup_usage_bytes": 9},  # not a size
             {"t_ns": 3, "mem_available_bytes": 600, "cgroup_usage_bytes": "8"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert memory_low_point(path) == {"mem_available_low_bytes": 500, "cgroup_usage_at_low_bytes": 7,
                                      "cgroup_limit_bytes": None}
