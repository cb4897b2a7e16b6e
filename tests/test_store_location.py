"""One store per user: commands without --store find the same store from any folder
($XDG_DATA_HOME/edgebench, or $EDGEBENCH_STORE), and an earlier edgebench's per-folder store
(./runs/edgebench.duckdb) is pointed out and merged by `edgebench ingest`."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgebench.cli import _one_line, _user_errors, cli
from edgebench.results import default_store
from edgebench.results.store import Store
from results_fixtures import FakeRun, probes_for

HOST_EPOCH_NS = 1_790_000_000_000_000_000


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def refused(*args: str) -> str:
    """The one line `edgebench ARGS` ends with: an error of the user's input, never an internal one."""
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code != 0 and isinstance(result.exception, (SystemExit, *_user_errors())), result.exception
    return _one_line(result.exception) if not isinstance(result.exception, SystemExit) else result.output


def test_the_user_store_is_the_same_from_any_folder_and_moves_with_edgebench_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    user_store = tmp_path / "data" / "edgebench" / "edgebench.duckdb"
    assert default_store() == user_store
    for folder, run_id in (("a", "run-a"), ("b", "run-b")):  # a person's runs made in two folders
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        run_dir = FakeRun(run_id=run_id).write(tmp_path / folder / "copied")
        assert invoke("ingest", str(run_dir), "--device", "pi").exit_code == 0
    monkeypatch.chdir(tmp_path)
    out = invoke("report", "--json")
    assert out.exit_code == 0, out.output
    assert sorted(r["run_id"] for r in json.loads(out.output)["runs"]) == ["run-a", "run-b"]
    assert (user_store.parent / "raw" / "pi" / "run-a" / "meta.json").is_file()  # raw copies beside the store

    monkeypatch.setenv("EDGEBENCH_STORE", str(tmp_path / "elsewhere" / "mine.duckdb"))
    assert default_store() == tmp_path / "elsewhere" / "mine.duckdb"
    missing = refused("report")
    assert "mine.duckdb" in missing and "no results store" in missing


def test_an_earlier_per_folder_store_is_pointed_out_and_merged_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    run = FakeRun(run_id="old-run")
    offset = HOST_EPOCH_NS - run.mono0_ns
    with Store(tmp_path / "runs" / "edgebench.duckdb") as older:  # as edgebench kept it before, in ./runs/
        older.ingest_run(run.write(tmp_path / "runs"), device="pi")
        older.add_clock_probes("pi", probes_for(run, offset, 0.0, run.mono0_ns, [0, 2, 4], [1, 1, 1]))
        older.ingest_run(FakeRun(run_id="gone").write(tmp_path / "tmp"), device="pi", keep_raw=False)
        older_row = older.runs(run_id="old-run")[0]
    (tmp_path / "tmp" / "gone" / "meta.json").unlink()  # its files were deleted since
    with Store(default_store()) as mine:
        mine.ingest_run(FakeRun(run_id="new-run").write(tmp_path / "new"), device="pi")

    report = invoke("report", "--json")
    assert report.exit_code == 0
    assert "lacks: 2;" in report.stderr and "edgebench ingest runs/edgebench.duckdb" in report.stderr

    merged = invoke("ingest", "runs/edgebench.duckdb", "--json")
    assert merged.exit_code == 0, merged.output
    status = {d["run_id"]: d["status"] for d in json.loads(merged.output)}
    assert status["old-run"] == "ingested" and status["gone"].startswith("not brought in: its files are gone")
    with Store(default_store(), read_only=True) as mine:
        row = mine.runs(run_id="old-run")[0]
        assert row["align_source"] == older_row["align_source"] == "probes"  # its clock probes came too
        assert row["align_offset_ns"] == older_row["align_offset_ns"]
        assert sorted(r["run_id"] for r in mine.runs()) == ["new-run", "old-run"]

    again = invoke("ingest", "runs/edgebench.duckdb", "--json")
    assert {d["run_id"]: d["status"] for d in json.loads(again.output)}["old-run"] == "already in the store"
    with Store(default_store(), read_only=True) as mine:
        assert mine.con.execute("SELECT count(*) FROM clock_probes").fetchone()[0] == 3  # not twice
    quiet = invoke("report", "--json")
    assert "lacks: 1;" in quiet.stderr  # only the run whose files are gone is left out


def test_ingest_refuses_the_store_it_writes_and_a_file_that_is_no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with Store(default_store()):
        pass
    assert "the store being written" in refused("ingest", str(default_store()))
    (tmp_path / "notes.txt").write_text("not a store\n")
    foreign = refused("ingest", str(tmp_path / "notes.txt"))
    assert "notes.txt" in foreign and "not an edgebench results store" in foreign


def test_bench_checks_where_its_runs_go_before_any_run(tmp_path, edgebench_here):
    (tmp_path / "notes.txt").write_text("not a store")
    (tmp_path / "link.duckdb").symlink_to(tmp_path / "elsewhere.duckdb")
    for store, words in (("notes.txt", "not an edgebench results store"), ("link.duckdb", "a link")):
        done = edgebench_here("bench", "--methods", "sgd", "--steps", "1", "--store", store, "--runs-dir", "runs",
                              cwd=tmp_path)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "runs").exists() and not (tmp_path / "elsewhere.duckdb").exists()
