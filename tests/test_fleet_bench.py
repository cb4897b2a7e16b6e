"""bench's sweep as a function (edgebench.fleet.bench): the order of runs, the re-run budget and a
Ctrl-C between runs, without running a worker (run_local and the ingest are stand-ins)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgebench.devices.profiles import load_profile
from edgebench.fleet import bench


class Shown:
    """A display that keeps what each run's bar was told."""

    def __init__(self) -> None:
        self.stages: list[str] = []

    def __enter__(self) -> Shown:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def add(self, spec: Any) -> Shown:
        return self

    def stage(self, text: str) -> None:
        self.stages.append(text)

    def step(self, done: int) -> None:
        pass

    def ended(self, result: dict[str, Any]) -> None:
        self.stage(result["status"])


@pytest.fixture
def sweep_parts(tmp_path, monkeypatch):
    """Two specs, a run_local that writes a disturbed result.json, and the run dirs ingested."""
    ingested: list[Path] = []

    def run_local(spec, run_dir, on_progress=None, interrupts=None):
        run_dir.mkdir(parents=True)
        result = {"run_id": spec.run_id, "method": spec.method, "status": "ok", "cpu": {"disturbed": True}}
        (run_dir / "result.json").write_text(json.dumps(result))
        return result

    monkeypatch.setattr(bench, "run_local", run_local)
    monkeypatch.setattr(bench, "ingest_runs", lambda store, dirs, device: ingested.extend(dirs))
    profile = load_profile("local")
    specs = bench.bench_specs(["sgd", "adamw"], {"model": "tiny"}, profile, None)
    return specs, profile, tmp_path / "runs", ingested


def test_disturbed_runs_are_run_again_within_the_budget_and_everything_is_ingested(sweep_parts):
    specs, profile, runs, ingested = sweep_parts
    sweep = bench.run_bench(specs, profile, runs, runs / "store.duckdb", force=False, rerun_disturbed=1,
                            display=Shown(), log=print)
    assert [r["method"] for r in sweep.results] == ["sgd", "adamw", "sgd"]  # one re-run: the budget
    assert sweep.reruns == 1 and sweep.interrupted is None
    assert [d.name for d in ingested] == [r["run_id"] for r in sweep.results]


def test_a_ctrl_c_between_runs_stops_the_sweep_with_what_ran_ingested(sweep_parts, monkeypatch):
    specs, profile, runs, ingested = sweep_parts

    def export(spec, profile, on_stage):
        if spec.method == "adamw":
            raise KeyboardInterrupt
        return None

    monkeypatch.setattr(bench, "attach_program", export)
    shown = Shown()
    sweep = bench.run_bench(specs, profile, runs, runs / "store.duckdb", force=False, rerun_disturbed=0,
                            display=shown, log=print)
    assert sweep.interrupted == "Ctrl-C (SIGINT)"
    assert [r["method"] for r in sweep.results] == ["sgd"] and shown.stages == ["ok"]
    assert [d.name for d in ingested] == [specs[0].run_id]
