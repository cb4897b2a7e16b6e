"""`edgebench runs rm | tag | ls` (issue 69): a bad or foreign run leaves the store, its rows and
files with it; a tag labels runs, and `report --tag` shows only those. Real DuckDB stores, built
from run directories as `ingest` builds them (results_fixtures.store_of)."""

from __future__ import annotations

import json

import duckdb
import pytest
from click.testing import CliRunner

from edgebench.cli import cli, main
from edgebench.results.store import Store
from results_fixtures import FakeRun, store_of

RUNS = {"pi": [FakeRun(run_id="a", method="adamw"), FakeRun(run_id="b", method="sgd")],
        "phone": [FakeRun(run_id="a", method="adamw"), FakeRun(run_id="d", method="lora")]}


@pytest.fixture
def store_path(tmp_path):
    return store_of(tmp_path / "store", RUNS)


def _run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input)


def _rows(path) -> dict[str, int]:
    """How many rows each table holds, the run's keys among them."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                for t in ("runs", "samples", "steps", "run_tags")}
    finally:
        con.close()


def _reported(path, *args) -> set[tuple[str, str]]:
    result = _run("report", "--store", str(path), "--json", *args)
    assert result.exit_code == 0, result.output
    return {(r["device"], r["run_id"]) for r in json.loads(result.output)["runs"]}


def test_rm_removes_the_rows_and_the_folder_and_the_report_no_longer_shows_it(store_path):
    run_dir = store_path.parent / "src" / "pi" / "b"
    with Store(store_path, read_only=True) as store:
        (key,) = [r["run_key"] for r in store.runs(device="pi", run_id="b")]
        assert store.con.execute("SELECT count(*) FROM samples WHERE run_key = ?", [key]).fetchall()[0][0] > 0
    assert run_dir.is_dir() and ("pi", "b") in _reported(store_path)
    assert _run("runs", "tag", "pi/b", "doomed", "--store", str(store_path)).exit_code == 0
    before = _rows(store_path)

    result = _run("runs", "rm", "--store", str(store_path), "b", "--yes")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "removed pi/b, deleted 1 folder(s)"
    assert not run_dir.exists() and (store_path.parent / "src" / "pi" / "a").is_dir()
    with Store(store_path, read_only=True) as store:
        assert not store.runs(device="pi", run_id="b")
        for table in ("samples", "steps"):
            assert store.con.execute(f"SELECT count(*) FROM {table} WHERE run_key = ?", [key]).fetchall()[0][0] == 0
    after = _rows(store_path)
    assert after["runs"] == before["runs"] - 1 and after["run_tags"] == 0
    assert 0 < after["samples"] < before["samples"] and 0 < after["steps"] < before["steps"]
    assert _reported(store_path) == {("pi", "a"), ("phone", "a"), ("phone", "d")}


def test_rm_asks_first_and_a_no_removes_nothing(store_path):
    before = _rows(store_path)
    result = _run("runs", "rm", "--store", str(store_path), "phone/d", input="n\n")
    assert result.exit_code == 0 and "Remove 1 run(s) (phone/d)" in result.output
    assert "nothing removed" in result.output
    assert _rows(store_path) == before and (store_path.parent / "src" / "phone" / "d").is_dir()
    no_terminal = _run("runs", "rm", "--store", str(store_path), "phone/d", input="")
    assert no_terminal.exit_code == 2 and "pass --yes; nothing removed" in no_terminal.output
    assert _rows(store_path) == before
    yes = _run("runs", "rm", "--store", str(store_path), "phone/d", input="y\n")
    assert yes.exit_code == 0 and "removed phone/d" in yes.output
    assert _rows(store_path)["runs"] == before["runs"] - 1


def test_an_unknown_or_ambiguous_id_exits_2_and_changes_nothing(store_path, capsys):
    before = _rows(store_path)
    for names, said in ((["b", "nosuch"], "no run 'nosuch'"), (["a"], "run 'a' is on 2 devices (phone/a, pi/a)"),
                        (["watch/b"], "no run 'watch/b'")):
        with pytest.raises(SystemExit) as ended:
            main(["runs", "rm", "--yes", "--store", str(store_path), *names])
        err = capsys.readouterr().err
        assert ended.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert said in err and str(store_path) in err and "nothing changed" in err
    assert _rows(store_path) == before and (store_path.parent / "src" / "pi" / "b").is_dir()
    with pytest.raises(SystemExit) as ended:
        main(["runs", "rm", "--yes", "--store", str(store_path.parent / "none.duckdb"), "b"])
    assert ended.value.code == 2 and "no results store here" in capsys.readouterr().err
    assert not (store_path.parent / "none.duckdb").exists()


def test_a_run_folder_that_links_outside_is_not_followed(store_path, tmp_path):
    """The run's folder replaced by a link to a folder outside the store's: the rows go, the
    link and what it points at stay; a run ingested from outside keeps its own folder too."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    run_dir = store_path.parent / "src" / "pi" / "a"
    for path in run_dir.iterdir():
        path.unlink()
    run_dir.rmdir()
    run_dir.symlink_to(outside, target_is_directory=True)
    foreign = FakeRun(run_id="far", method="sgd").write(tmp_path / "copied")
    with Store(store_path) as store:
        store.ingest_run(foreign, device="pi")

    result = _run("runs", "rm", "--yes", "--json", "--store", str(store_path), "pi/a", "far")
    assert result.exit_code == 0, result.output
    done = {d["run_id"]: d for d in json.loads(result.output)}
    stored = str(store_path.parent.resolve() / "src" / "pi" / "a")  # as ingest recorded it
    assert done["a"]["deleted"] == [] and "is a link" in done["a"]["kept"][stored]
    assert (outside / "precious.txt").read_text() == "keep me" and run_dir.is_symlink()
    assert (foreign / "meta.json").is_file()  # outside the store's folder: kept, its raw copy deleted
    assert done["far"]["deleted"] == [str(store_path.parent / "raw" / "pi" / "far")]
    assert "outside the store's folder" in done["far"]["kept"][str(foreign.resolve())]
    assert not (store_path.parent / "raw" / "pi" / "far").exists()
    assert _reported(store_path) == {("pi", "b"), ("phone", "a"), ("phone", "d")}


def test_tag_then_report_filters_and_remove_untags(store_path):
    tagged = _run("runs", "tag", "--store", str(store_path), "pi/a", "d", "quiet-host")
    assert tagged.exit_code == 0 and "tagged 2 of 2 run(s) with 'quiet-host'" in tagged.output
    again = _run("runs", "tag", "--store", str(store_path), "--json", "d", "quiet-host")
    assert json.loads(again.output)["changed"] == 0  # already so
    assert _reported(store_path, "--tag", "quiet-host") == {("pi", "a"), ("phone", "d")}
    assert _reported(store_path, "--tag", "quiet-host", "--device", "pi") == {("pi", "a")}
    study = _run("report", "--store", str(store_path), "--tag", "quiet-host", "--study", "--json")
    assert study.exit_code == 0 and {r["method"] for r in json.loads(study.output)["rows"]} == {"adamw", "lora"}
    listed = _run("runs", "ls", "--store", str(store_path), "--tag", "quiet-host")
    assert listed.exit_code == 0 and listed.output.splitlines() == ["pi/a  adamw  ok  [quiet-host]",
                                                                    "phone/d  lora  ok  [quiet-host]"]

    untagged = _run("runs", "tag", "--store", str(store_path), "--remove", "pi/a", "quiet-host")
    assert untagged.exit_code == 0 and "untagged 1 of 1 run(s) from 'quiet-host'" in untagged.output
    assert _reported(store_path, "--tag", "quiet-host") == {("phone", "d")}
    _run("runs", "tag", "--store", str(store_path), "--remove", "d", "quiet-host")
    none = _run("report", "--store", str(store_path), "--tag", "quiet-host")
    assert none.exit_code != 0 and "no runs of tag 'quiet-host'" in " ".join(none.output.split())
    assert _reported(store_path) == {("pi", "a"), ("pi", "b"), ("phone", "a"), ("phone", "d")}


@pytest.mark.parametrize("tag", ["", "two words", "bell\x07", "x" * 41])
def test_a_tag_that_is_no_tag_is_refused(store_path, tag, capsys):
    with pytest.raises(SystemExit) as ended:
        main(["runs", "tag", "--store", str(store_path), "b", tag])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and "\x07" not in err
    assert _rows(store_path)["run_tags"] == 0


def test_tag_needs_a_run_and_a_tag(store_path):
    result = _run("runs", "tag", "--store", str(store_path), "quiet-host")
    assert result.exit_code == 2 and "edgebench runs tag RUN_ID... TAG" in result.output


def test_a_store_from_before_tags_reads_and_gains_the_table(store_path):
    """A store written before tags (no run_tags table): report --tag finds no run, read-only;
    tagging creates the table."""
    con = duckdb.connect(str(store_path))
    con.execute("DROP TABLE run_tags")
    con.close()
    none = _run("report", "--store", str(store_path), "--tag", "x")
    assert none.exit_code != 0 and "no runs of tag 'x'" in " ".join(none.output.split())
    assert _run("runs", "ls", "--store", str(store_path)).output.count("\n") == 4
    assert _run("runs", "tag", "--store", str(store_path), "b", "x").exit_code == 0
    assert _reported(store_path, "--tag", "x") == {("pi", "b")}
