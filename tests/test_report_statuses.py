"""Reports never fail on how runs ended (issue 71): every format, with and without the study,
renders a store holding one run of each status and a device and model where no run finished
(a run Ctrl-C'd before its first step is enough), and says what it could not show there."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from edgebench.figures.status import STATUSES
from edgebench.results.store import Store
from results_fixtures import FakeRun

UNFINISHED = re.compile(r"phone / tiny( / eager)?: no finished run")  # the study names the backend too


class StoppedEarly(FakeRun):
    """A run that ended before its first step: no step, no loss, no step time (a Ctrl-C during load)."""

    def events(self) -> list[dict]:
        return [e for e in super().events() if not e["event"].startswith("step")]

    def result(self) -> dict:
        return {**super().result(), "steps_done": 0, "last_step": None, "step_time_s": None, "loss_first": None,
                "loss_last": None, "detail": f"{self.status} before the first step"}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    """The board: a finished sgd run and one run of every other status beside it; the phone: one
    run of every status but ok (stopped before its first step) and one without result.json."""
    root = tmp_path_factory.mktemp("statuses")
    runs = {"board": [FakeRun(run_id=f"board-{s}", method="sgd" if s == "ok" else "adamw", status=s) for s in STATUSES],
            "phone": [StoppedEarly(run_id=f"phone-{s}", method="sgd", status=s) for s in STATUSES if s != "ok"]
            + [FakeRun(run_id="phone-no-result", method="sgd", status=None)]}
    with Store(root / "edgebench.duckdb") as store:
        for device, device_runs in runs.items():
            for run in device_runs:
                store.ingest_run(run.write(root / "src" / device), device=device)
    return root / "edgebench.duckdb"


@pytest.mark.parametrize("study", [False, True], ids=["plain", "study"])
@pytest.mark.parametrize("fmt", ["term", "html", "png", "csv", "json"])
def test_every_format_renders_every_status(edgebench_here, store_path, tmp_path, fmt, study):
    out = tmp_path / f"report.{fmt}"
    args = ["report", "--store", str(store_path), "--format", fmt, *(["--study", "--baseline", "sgd"] * study)]
    done = edgebench_here(*args, *(["--out", str(out)] if fmt != "term" else []), cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Traceback" not in said and "internal error" not in said
    assert UNFINISHED.search(said), said  # said beside what was written, or in the terminal's notes
    if fmt == "html":
        page = out.read_text()
        assert UNFINISHED.search(page) and "no finished run: no frontier to draw" in page
        assert "<script src=" not in page and "<link " not in page  # one offline file
        assert all(f"phone-{s}" in page for s in STATUSES if s != "ok")
    elif fmt == "png":
        assert len(list(out.glob("*.png"))) > len(STATUSES) and (out / "pareto_phone_tiny.png").stat().st_size
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out.read_text())))
        if study:
            assert {r["device"] for r in rows} == {"board", "phone"}
        else:
            assert {r["status"] for r in rows} == {*STATUSES, "incomplete"}
    elif fmt == "json":
        data = json.loads(out.read_text())
        if study:
            assert any(UNFINISHED.search(n) for n in data["notes"])
        else:
            assert {r["status"] for r in data["runs"]} == {*STATUSES, "incomplete"}
    else:
        assert all(s in said for s in STATUSES)
