"""Axes as lists (issue 70): bench's and deploy's --lr, --weight-decay, --threads and
--batch-size take comma-separated values, the sweep runs their cross product with the methods,
the memory preflight holds per batch size, and the report keeps each combination a
configuration of its own, with each axis' effect in the study and the HTML report."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from edgebench.cli import cli
from edgebench.cli_types import FiniteNonNegative, FinitePositive, ListOf
from edgebench.fleet.commands.bench import bench
from edgebench.fleet.options import THREADS
from edgebench.fleet.plan import fit_by_shape, for_device, make_specs
from edgebench.methods.budget import board_budget
from edgebench.report.axes import axis_effects
from edgebench.results.aggregate import group_runs
from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store

FAST = ["--steps", "2", "--warmup", "0", "--text-length", "16"]


@pytest.mark.parametrize("kind, text, values", [
    (FinitePositive(), "0.01,0.001", (0.01, 0.001)),
    (FinitePositive(), " 1e-3 , 2e-3 ", (1e-3, 2e-3)),
    (FinitePositive(), "0.5", (0.5,)),
    (FiniteNonNegative(), "0,0.01", (0.0, 0.01)),
    (THREADS, "4,1,2", (4, 1, 2)),  # in the order given
])
def test_a_list_option_reads_each_value_as_one_value_is_read(kind, text, values):
    assert ListOf(kind).convert(text, None, None) == values


@pytest.mark.parametrize("kind, text, says", [
    (FinitePositive(), "0.01,-1", "'-1' is not a finite number more than 0"),
    (FinitePositive(), "0.01,nan", "'nan' is not a finite number"),
    (FinitePositive(), "0.01,,0.1", "an empty item"),
    (FinitePositive(), "0.01,", "an empty item"),
    (FinitePositive(), "0.1,0.1", "'0.1' is given twice;"),
    (FinitePositive(), "0.1,1e-1", "'1e-1' is given twice ('0.1' and '1e-1' are one value)"),
    (FiniteNonNegative(), "0,inf", "'inf' is not a finite number of 0 or more"),
    (THREADS, "1,0", "0 is not in the range 1<=x<=1024"),
    (THREADS, "1,2000", "2000 is not in the range"),
    (THREADS, "1,two", "'two' is not a valid integer"),
])
def test_a_list_option_refuses_a_bad_item_naming_it(kind, text, says):
    with pytest.raises(click.BadParameter) as refused:
        ListOf(kind).convert(text, None, None)
    assert says in refused.value.message and repr(text) in refused.value.message


def test_the_specs_are_the_cross_product_each_carrying_its_values():
    specs = make_specs(["sgd", "adamw", "sgd", "adamw"], model="tiny", lr=(0.01, 0.001), weight_decay=None,
                       threads=(1, 2), batch_size=(1,))
    assert len(specs) == 16  # (2 methods x 2 repeats) x 2 lr x 2 threads
    assert [(s.method, s.lr, s.threads, s.repeat) for s in specs[:4]] == [
        ("sgd", 0.01, 1, 0), ("adamw", 0.01, 1, 0), ("sgd", 0.01, 1, 1), ("adamw", 0.01, 1, 1)]
    assert {(s.lr, s.threads) for s in specs} == {(0.01, 1), (0.01, 2), (0.001, 1), (0.001, 2)}
    assert all(s.weight_decay is None and s.batch_size == 1 for s in specs)
    # one value each is one shape, as before the axes took lists
    assert [(s.method, s.lr, s.batch_size) for s in make_specs(["sgd"], lr=0.1, batch_size=4)] == [("sgd", 0.1, 4)]


def test_the_memory_preflight_refuses_a_batch_size_that_does_not_fit_and_only_it():
    from edgebench.devices.profiles import load_profile

    profile = load_profile("local")
    specs = for_device("local", profile, make_specs(["sgd"], model="tiny", batch_size=(1, 100_000_000), lr=(0.1, 0.2)))
    budget = board_budget("a board", 4 * 2**30, 0, "none", "python", margin=0)
    logged: list[str] = []
    alone, whole = fit_by_shape(specs, budget, profile.device_speed, False, logged.append)
    assert whole == [] and set(alone) == {s.run_id for s in specs if s.batch_size == 100_000_000}
    assert all("tiny, batch 100000000: predicted peak (estimate) sgd" in why and why.endswith("--force to run anyway")
               for why in alone.values())
    assert len(logged) == 1 and "refused (the other batch sizes run): tiny, batch 100000000" in logged[0]
    # one batch size asked for: the whole sweep is refused, as a single shape always was
    big = [s for s in specs if s.batch_size == 100_000_000]
    assert fit_by_shape(big, budget, profile.device_speed, False, logged.append)[0] == {}
    assert len(fit_by_shape(big, budget, profile.device_speed, False, logged.append)[1]) == 1
    # --force: nothing refused, each run that does not fit records it
    assert fit_by_shape(specs, budget, profile.device_speed, True, logged.append) == ({}, [])
    assert all(("forced" in s.extra) == (s.batch_size == 100_000_000) for s in specs)


def test_bench_runs_a_shape_that_fits_beside_one_refused_by_the_memory_preflight(tmp_path):
    out = CliRunner().invoke(bench, ["--methods", "sgd", "--batch-size", "1,100000000", "--json", *FAST,
                                     "--runs-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    results = json.loads(out.stdout)
    assert [(r["batch_size"], r["status"]) for r in results] == [(1, "ok"), (100_000_000, "unsupported")]
    assert "tiny, batch 100000000: predicted peak (estimate) sgd" in results[1]["detail"]
    assert "refused (the other batch sizes run)" in out.output
    # every batch size too big: refused before any run, each named
    out = CliRunner().invoke(bench, ["--methods", "sgd", "--batch-size", "100000000,200000000", *FAST,
                                     "--runs-dir", str(tmp_path / "none")])
    assert out.exit_code == 1 and "batch 100000000: predicted" in out.output and "batch 200000000: predicted" in \
        out.output
    assert not (tmp_path / "none").exists()


def test_bench_runs_the_grid_and_the_report_keeps_each_combination_apart(tmp_path):
    out = CliRunner().invoke(bench, ["--methods", "sgd", "--lr", "0.01,0.001", "--threads", "1,2", *FAST,
                                     "--runs-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    for k, (lr, threads) in enumerate([(0.01, 1), (0.01, 2), (0.001, 1), (0.001, 2)], 1):
        assert f"run {k} of 4: sgd, lr {lr}, threads {threads} (eager)" in out.output
    with Store(tmp_path / "edgebench.duckdb", read_only=True) as store:
        specs = [json.loads(r["meta_json"])["spec"] for r in store.runs()]
        rows = all_metrics(store)
    assert sorted((s["lr"], s["threads"], s["weight_decay"]) for s in specs) == [
        (0.001, 1, None), (0.001, 2, None), (0.01, 1, None), (0.01, 2, None)]
    groups = group_runs(rows)
    assert len(groups) == 4 and all(g["n"] == 1 for g in groups)  # four configurations, never repeats
    assert sorted(g["shape"] for g in groups) == ["lr 0.001, threads 1", "lr 0.001, threads 2",
                                                  "lr 0.01, threads 1", "lr 0.01, threads 2"]
    effects = axis_effects(groups)
    scaling = effects["threads"]
    assert sorted((r["lr"], r["threads"]) for r in scaling) == sorted((s["lr"], s["threads"]) for s in specs)
    for r in scaling:
        base = next(b for b in scaling if b["lr"] == r["lr"] and b["threads"] == 1)
        assert r["speedup"] == pytest.approx(base["step_time_median_s"] / r["step_time_median_s"])
        assert r["scaling_efficiency"] == pytest.approx(r["speedup"] / r["threads"])
    grids = effects["lr_weight_decay"]  # one per thread count: lr (rows) x weight decay (the default)
    assert len(grids) == 2 and all(g["lr"] == [0.001, 0.01] and g["weight_decay"] == [None] for g in grids)
    assert all(g["figure"] == "loss_last" and None not in sum(g["values"], []) for g in grids)
    assert effects["batch_size"] == []

    report = CliRunner().invoke(cli, [
        "report", "--store", str(tmp_path / "edgebench.duckdb"), "--study"], env={"COLUMNS": "200"})
    assert report.exit_code == 0, report.output
    assert "Threads: step time, throughput and energy against cores" in report.output
    assert "lr x weight decay: training loss, last step" in report.output
    html = tmp_path / "report.html"
    CliRunner().invoke(cli, [
        "report", "--store", str(tmp_path / "edgebench.duckdb"), "--format", "html", "--out", str(html)])
    page = html.read_text()
    assert 'id="axes"' in page and page.count('data-chart="axes-') == 6  # 4 thread charts, 2 heatmaps, no batch


def test_deploy_refuses_a_sweep_none_of_whose_batch_sizes_fit_naming_each_before_any_work(tmp_path, monkeypatch):
    """On a 512 MiB board neither batch size of nanovlm-222m fits: deploy names both and stops
    before exporting or connecting (192.0.2.1 is TEST-NET: never reached)."""
    from edgebench.fleet import deploy

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("devices:\n  zero: {profile: raspberry-pi-zero-2w, host: 192.0.2.1}\n")
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(inventory))
    specs = make_specs(["adamw"], model="nanovlm-222m", batch_size=(1, 2))
    with pytest.raises(deploy.PreflightError) as refused:
        deploy.deploy_one("zero", specs, tmp_path / "runs")
    lines = str(refused.value).splitlines()
    assert lines[0] == "zero (pi@192.0.2.1:22) cannot run this sweep:" and len(lines) == 3
    assert "nanovlm-222m, batch 1: predicted peak (estimate) adamw" in lines[1]
    assert "nanovlm-222m, batch 2: predicted peak (estimate) adamw" in lines[2]
    assert all(line.endswith("or --force to run anyway") for line in lines[1:])
