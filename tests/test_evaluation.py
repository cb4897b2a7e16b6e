"""Held-out evaluation and the cost to a target: the worker's raw counts, the host's figures
from them (edgebench.figures.learning, results.metrics), the held-out split, and the refusals
of what cannot be evaluated."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.figures.learning import TargetError, learning_figures, parse_target
from edgebench.figures.run import figures_of_run_dir
from edgebench.figures.run_events import StepEnd, events_of
from edgebench.fleet.local import run_local
from edgebench.methods.evaluate import evaluate_batch
from edgebench.model import build_model
from edgebench.model.config import get_config
from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store
from edgebench.runner.spec import RunSpec
from results_fixtures import FakeRun, eval_event, evaluated
from test_data import GOOD, _folder


def test_counts_are_the_models_own_loss_and_greedy_decodings_exact_match():
    torch.manual_seed(0)
    model = build_model("tiny")
    batch = to_torch(next(synthetic_batches(get_config("tiny"), 6, 32, seed=3)))
    counts = evaluate_batch(model, batch)
    with torch.no_grad():
        assert counts["loss_sum"] / counts["tokens"] == pytest.approx(float(model(**batch)), rel=1e-5)
    assert counts["samples"] == 6 and counts["tokens"] == int((batch["labels"][:, 1:] != -100).sum())
    # greedy decoding, token by token from each answer's start, against the count
    matched, decoded = 0, {k: v.clone() for k, v in batch.items()}
    with torch.no_grad():
        for row in range(6):
            labels = batch["labels"][row]
            start, last = int((labels != -100).nonzero()[0]), int((labels != -100).nonzero()[-1])
            ids = batch["input_ids"][row : row + 1, :start].clone()
            for position in range(start, last + 1):
                logits = model.logits(ids, batch["images"][row : row + 1],
                                      batch["attention_mask"][row : row + 1, :position])
                ids = torch.cat((ids, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
            matched += bool((ids[0, start:] == labels[start:last + 1]).all())
            # the same row with the model's own greedy answer as its answer: matched by definition
            decoded["input_ids"][row, start:last + 1] = decoded["labels"][row, start:last + 1] = ids[0, start:]
    assert counts["correct"] == matched
    assert evaluate_batch(model, decoded)["correct"] == 6


def test_target_is_the_first_evaluation_that_reaches_it_and_costs_the_steps_before_it():
    steps = [StepEnd(t_ns=i, step=i, duration_s=d) for i, d in enumerate((0.5, 0.25, 0.25, 1.0, 2.0))]
    evals = events_of([eval_event(0, 4.0, 0, 0), eval_event(2, 2.5, 4, 10), eval_event(4, 1.9, 9, 20),
                       eval_event(5, 1.5, 10, 30)], "events")
    events = [evals[0], *steps[:2], evals[1], *steps[2:4], evals[2], steps[4], evals[3]]
    got = learning_figures(events, "accuracy=0.9")
    assert got["eval_count"] == 4 and got["eval_time_s"] == pytest.approx(2.0)
    assert (got["eval_loss_first"], got["eval_loss_last"]) == (4.0, 1.5)
    assert (got["eval_accuracy_first"], got["eval_accuracy_last"]) == (0.0, 1.0)
    assert got["target_reached"] and got["steps_to_target"] == 4 and got["time_to_target_s"] == pytest.approx(2.0)
    assert learning_figures(events, "loss=2.5")["steps_to_target"] == 2
    missed = learning_figures(events, "loss=1.0")
    assert missed["target_reached"] is False and missed["time_to_target_s"] is None
    assert learning_figures(steps, None) == {"eval_count": 0, "eval_failed": None}


@pytest.mark.parametrize("text, said", [("acc=0.9", "one of accuracy, loss"), ("accuracy", "METRIC=VALUE"),
                                        ("loss=low", "'low' is not a number"), ("accuracy=1.5", "fraction")])
def test_a_target_that_cannot_be_evaluated_says_what_can(text, said):
    with pytest.raises(TargetError, match=said):
        parse_target(text)


def test_energy_to_target_is_the_joules_of_the_steps_before_it(tmp_path):
    run = FakeRun(power=lambda t: np.full_like(t, 2.0), steps=6, step_s=0.5)
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(evaluated(run, tmp_path, {0: 5.0, 3: 2.0}, "loss=2.0"), device="pi")
        (row,) = all_metrics(store)
    assert row["steps_to_target"] == 3 and row["time_to_target_s"] == pytest.approx(1.5)
    assert row["energy_to_target_j"] == pytest.approx(2.0 * 1.5, rel=0.02)  # 2 W for three 0.5 s steps


def test_a_run_evaluates_on_schedule_and_stops_at_its_target(tmp_path):
    spec = RunSpec(model="tiny", method="adamw", lr=3e-3, batch_size=2, steps=4, warmup_steps=1, eval_every=2,
                   eval_samples=4, run_id="scheduled")
    result = run_local(spec, tmp_path / "scheduled")
    events = [json.loads(line) for line in (tmp_path / "scheduled" / "events.jsonl").read_text().splitlines()]
    assert [e["after_steps"] for e in events if e["event"] == "eval"] == [0, 2, 4, 5]  # 1 warmup + 4 steps
    assert result["status"] == "ok" and result["eval_count"] == 4
    assert result["train_peak_rss_bytes_sampled"] > 0  # an evaluation this short may fall between two samples
    assert result["eval_peak_rss_bytes_sampled"] is None or result["eval_peak_rss_bytes_sampled"] > 0
    assert result["eval_loss_last"] < result["eval_loss_first"]
    stopped = run_local(RunSpec(**{**spec.to_dict(), "run_id": "stopped", "steps": 50, "target": "loss=100"}),
                        tmp_path / "stopped")
    assert stopped["status"] == "ok" and stopped["target_reached"] and stopped["steps_to_target"] == 0
    assert stopped["steps_done"] == 0  # reached before training: nothing more to pay
    again = figures_of_run_dir(tmp_path / "stopped")
    assert again is not None and again["steps_to_target"] == 0


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("method, backend, runtime", [
    ("sgd", "executorch", "python"), ("lora", "onnxruntime", "python"), ("sgd", "executorch", "native")])
def test_an_exported_programs_saved_weights_are_evaluated_on_the_host_as_eager_evaluates(method, backend, runtime,
                                                                                         tmp_path):
    """An exported program computes its loss only: the device saves its weights at each evaluation
    point (the Python worker, or the native one: edgebench/native/evaluation.cpp) and the host
    evaluates them with the model they were exported from. Same seed, same data: the counts are
    eager's own, point by point (the programs train as eager does)."""
    from edgebench.fleet.plan import attach_native
    from edgebench.results.heldout import evaluate_saved_weights
    from edgebench.runner.native import machine_arch
    from exporters.pipeline import export_for_spec

    shape = dict(model="tiny", method=method, batch_size=1, steps=2, warmup_steps=1, eval_every=2, eval_samples=4)
    eager = run_local(RunSpec(**shape, run_id="eager"), tmp_path / "eager")
    spec = RunSpec(**shape, backend=backend, runtime=runtime, run_id=backend)
    spec.program = export_for_spec(spec)
    assert attach_native(spec, machine_arch()) is None and spec.runtime == runtime  # the native worker and its plan
    exported = run_local(spec, tmp_path / backend)
    reference = [e for e in _events(tmp_path / "eager" / "events.jsonl") if e["event"] == "eval"]
    host = _events(tmp_path / backend / "heldout.jsonl")
    assert [e["after_steps"] for e in host] == [e["after_steps"] for e in reference] == [0, 2, 3]
    for mine, theirs in zip(host, reference):
        assert mine["evaluated_by"] == "host" and (mine["samples"], mine["tokens"]) == (theirs["samples"],
                                                                                      theirs["tokens"])
        assert mine["loss_sum"] == pytest.approx(theirs["loss_sum"], rel=1e-4)
    assert exported["status"] == eager["status"] == "ok" and exported["eval_count"] == 3
    assert exported["eval_loss_last"] == pytest.approx(eager["eval_loss_last"], rel=1e-4)
    # step 0's weights are the exported ones: nothing saved for them
    assert sorted(p.name for p in (tmp_path / backend).glob("eval-weights-*")) == [
        "eval-weights-000002.safetensors", "eval-weights-000003.safetensors"]
    if runtime == "native":  # saved in the model's shapes, as the program holds them (not flat)
        raw = (tmp_path / backend / "eval-weights-000002.safetensors").read_bytes()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        shapes = {name: list(p.shape) for name, p in build_model("tiny").named_parameters()}
        assert header and {name: h["shape"] for name, h in header.items()} == {name: shapes[name] for name in header}
    (tmp_path / backend / "eval-weights-000003.safetensors").unlink()
    (tmp_path / backend / "heldout.jsonl").unlink()
    assert evaluate_saved_weights(tmp_path / backend) == 3 and evaluate_saved_weights(tmp_path / backend) == 0
    again = _events(tmp_path / backend / "heldout.jsonl")
    assert [e["event"] for e in again] == ["eval", "eval", "eval_failed"] and "000003" in again[-1]["detail"]


def test_heldout_part_of_a_folder_dataset_is_never_trained_on(tmp_path):
    from edgebench.data.folder import FolderDataset

    lines = [json.dumps({"image": "a.png", "question": f"what colour is the ball {'?' * i}", "answer": "red"})
             for i in range(1, 11)]
    folder = _folder(tmp_path, lines)
    parts = {}
    for part in ("train", "heldout"):
        data = FolderDataset(folder)
        data.hold_out(0.2, seed=7, part=part)
        parts[part] = {e.where for e in data.examples}
    assert len(parts["heldout"]) == 2 and len(parts["train"]) == 8 and not parts["train"] & parts["heldout"]
    (tmp_path / "one").mkdir()
    one = FolderDataset(_folder(tmp_path / "one", GOOD[:1]))
    with pytest.raises(ValueError, match="at least 2"):
        one.hold_out(0.1, seed=0, part="train")


@pytest.mark.parametrize("args, said", [
    (["--target", "acc=0.9"], "one of accuracy, loss"),
])
def test_bench_refuses_what_it_cannot_evaluate_before_any_run(args, said, tmp_path):
    from edgebench.fleet.commands.bench import bench

    result = CliRunner().invoke(bench, ["--model", "tiny", "--methods", "sgd", "--runs-dir", str(tmp_path / "r"),
                                        *args])
    assert result.exit_code == 2 and said in result.output, result.output
    assert not (tmp_path / "r").exists()


def test_an_accuracy_target_needs_short_answers(tmp_path):
    from edgebench.fleet.commands.bench import bench

    long_answer = " ".join(["red blue"] * 10)  # 20 tokens
    folder = _folder(tmp_path, [json.dumps({"image": "a.png", "question": "what colour is the ball ?",
                                            "answer": long_answer}), GOOD[1]])
    args = ["--model", "tiny", "--methods", "sgd", "--text-length", "64", "--data", str(folder),
            "--tokenizer", str(folder / "tokenizer.json"), "--runs-dir", str(tmp_path / "r")]
    result = CliRunner().invoke(bench, [*args, "--target", "accuracy=0.5"])
    assert result.exit_code == 2 and "answers up to 20 tokens" in result.output and "loss=" in result.output


def test_the_study_ranks_by_what_reaching_the_target_cost(tmp_path):
    from edgebench.results.aggregate import group_runs
    from edgebench.results.study import study_rows

    runs = {  # method: (peak MiB, step s, held-out loss after each evaluation)
        "sgd": (300, 0.2, {0: 5.0, 4: 3.0, 8: 2.0}),  # reaches loss 2 after 8 steps: 1.6 s
        "adamw": (400, 0.3, {0: 5.0, 4: 1.5}),  # after 4: 1.2 s, more memory
        "lora": (200, 0.1, {0: 5.0, 4: 4.0, 8: 3.5}),  # never: smallest and fastest per step, and no result
        "mezo": (250, 0.1, {0: 5.0, 4: 4.0, 8: 1.9}),  # after 8: 0.8 s
    }
    with Store(tmp_path / "s.duckdb") as store:
        for method, (mib, step_s, losses) in runs.items():
            run = FakeRun(run_id=method, method=method, rss_base=mib << 20, step_s=step_s, steps=8, warmup_steps=1)
            store.ingest_run(evaluated(run, tmp_path / "src", losses, "loss=2.0"), device="pi")
        rows, notes = study_rows(group_runs(all_metrics(store)), baseline="sgd")
    by = {r["method"]: r for r in rows}
    assert notes == [] and by["sgd"]["time_to_target_s"] == pytest.approx(1.6)
    assert by["adamw"]["steps_to_target"] == 4 and by["adamw"]["time_to_target_ratio"] == pytest.approx(1.2 / 1.6)
    assert by["mezo"]["time_to_target_ratio"] == pytest.approx(0.8 / 1.6)
    assert (by["lora"]["reached"], by["lora"]["time_to_target_s"], by["lora"]["on_frontier"]) == (0, None, False)
    # peak memory against time to the target: mezo (250 MiB, 0.8 s) beats sgd on both; adamw is faster than none
    assert {m for m, r in by.items() if r["on_frontier"]} == {"mezo"}
    assert by["sgd"]["energy_to_target_j"] is not None and by["mezo"]["energy_to_target_ratio"] == pytest.approx(
        by["mezo"]["energy_to_target_j"] / by["sgd"]["energy_to_target_j"])


def test_predict_says_its_figures_are_per_step_and_shows_what_reaching_a_target_took(tmp_path):
    from edgebench.cli.methods import predict_command

    with Store(tmp_path / "s.duckdb") as store:  # lora reaches loss=1.0 after 4 and after 6 steps; sgd never
        for i, (method, losses) in enumerate([("lora", {0: 5.0, 4: 1.0}), ("lora", {0: 5.0, 6: 0.9}),
                                              ("sgd", {0: 5.0, 8: 3.0})]):
            run = FakeRun(run_id=f"r{i}", method=method, steps=8, step_s=0.25)
            store.ingest_run(evaluated(run, tmp_path / "src", losses, "loss=1.0"), device="pi")
        other = FakeRun(run_id="other-model", method="lora", model="nanovlm-222m", steps=8)
        store.ingest_run(evaluated(other, tmp_path / "src", {0: 5.0, 2: 0.5}, "loss=1.0"), device="pi")
    args = ["--ram-bytes", str(4 << 30), "--store", str(tmp_path / "s.duckdb")]
    ranked = CliRunner().invoke(predict_command, args, env={"COLUMNS": "220"})
    assert ranked.exit_code == 0, ranked.output
    said = " ".join(ranked.output.split())
    assert "per-step estimates" in said and "to target (measured)" in said
    lora = next(line for line in ranked.output.splitlines() if line.split()[1:2] == ["lora"])
    assert "reached loss=1.0 in 5 steps, 1.25 s (n=2, batch 2)" in lora  # medians: 5 steps of 0.25 s
    sgd = next(line for line in ranked.output.splitlines() if line.split()[1:2] == ["sgd"])
    assert "loss=1.0 not reached within the cap (n=1, batch 2)" in sgd
    one = CliRunner().invoke(predict_command, [*args, "--method", "lora", "--json"])
    assert json.loads(one.output)["measured_to_target"] == [
        {"target": "loss=1.0", "batch_size": 2, "n": 2, "reached": 2, "steps": 5.0, "seconds": 1.25}]
    text = CliRunner().invoke(predict_command, [*args, "--method", "lora"], env={"COLUMNS": "220"}).output
    assert "lora: measured: reached loss=1.0 in 5 steps, 1.25 s (n=2, batch 2)" in text
    none = CliRunner().invoke(predict_command, ["--ram-bytes", str(4 << 30), "--store", str(tmp_path / "no.duckdb")],
                              env={"COLUMNS": "220"})
    assert none.exit_code == 0 and "to target" not in none.output and "per-step estimates" in none.output
    assert not (tmp_path / "no.duckdb").exists()  # read only: nothing made


def test_memory_while_evaluating_is_kept_apart_from_training():
    from edgebench.figures.learning import memory_apart

    evaluation = eval_event(2, 3.0, 0, 10 * 10**9)  # 10.0 s to 10.5 s
    t_ns = np.arange(0, 12 * 10**9, 5 * 10**8, dtype=np.int64)  # a sample every 0.5 s
    rss = np.where((t_ns >= 10 * 10**9) & (t_ns <= 10 * 10**9 + 5 * 10**8), 900.0, 300.0)
    rss[3] = 400.0
    columns = {"t_ns": t_ns, "rss_bytes": rss}
    assert memory_apart(events_of([evaluation], "events"), columns) == {"eval_peak_rss_bytes_sampled": 900,
                                                   "train_peak_rss_bytes_sampled": 400}
    assert memory_apart([], columns) == {}  # no evaluation: nothing to keep apart
