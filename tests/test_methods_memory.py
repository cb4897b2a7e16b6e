"""Methods' memory, measured in fresh processes (kernel peak RSS, ru_maxrss) on the same model
and batch, and the memory model's prediction against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgebench.figures.run import figures_of_run_dir
from edgebench.runner.spec import RunSpec

FULL = os.environ.get("EDGEBENCH_FULL") == "1"
# Checkpointing: a batch big enough that activations (not the ~300 MB runtime) separate the
# methods. Update-in-backward: batch 1, so gradients and state, not activations, make the gap.
TINY_SHAPE = {"batch_size": 16, "text_length": 32}
# Zeroth-order (restore records), frozen int8 under LoRA with checkpointing, bf16 weights with
# the update in backward, the last block alone (lastK): each term of the memory model has a
# real run behind it.
RUNS = {"adamw@16": ("adamw", 16), "adamw-ckpt@16": ("adamw-ckpt", 16), "adamw@1": ("adamw", 1),
        "fused-adamw@1": ("fused-adamw", 1), "lomo@1": ("lomo", 1), "mezo@1": ("mezo", 1),
        "lora+ckpt+frozen-int8@16": ("lora+ckpt+frozen-int8", 16), "lomo-sr@16": ("lomo-sr", 16),
        "all+last1@16": ("all+last1", 16)}
TOLERANCE = 0.10


def run_spec(out: Path, **fields) -> dict:
    """One RunSpec through `python -m edgebench.runner` (a fresh worker process)."""
    out.mkdir(parents=True, exist_ok=True)
    spec = RunSpec(warmup_steps=1, steps=fields.pop("steps", 2), threads=1, **fields)
    spec.save(out / "spec.json")
    subprocess.run([sys.executable, "-m", "edgebench.runner", str(out / "spec.json"), "--out", str(out / "run")],
                   check=True, capture_output=True, timeout=600)
    result = figures_of_run_dir(out / "run")
    assert result["status"] == "ok", result
    return result


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> dict[str, dict]:
    """The RUNS' results (nine fresh runner processes, about 45 s): its tests share one xdist
    group (conftest SHARED_FIXTURES), so one worker runs them all after building this once."""
    root = tmp_path_factory.mktemp("methods-memory")
    return {key: run_spec(root / key.replace("@", "-b").replace("+", "_"), model="tiny", method=method,
                          batch_size=batch, text_length=TINY_SHAPE["text_length"])
            for key, (method, batch) in RUNS.items()}


@pytest.mark.parametrize("method", ["adamw-ckpt", "all+last1"])
def test_checkpointing_and_sparse_backward_lower_peak(tiny_runs, method):
    assert tiny_runs[f"{method}@16"]["peak_rss_bytes_kernel"] < tiny_runs["adamw@16"]["peak_rss_bytes_kernel"]


@pytest.mark.parametrize("method", ["fused-adamw", "lomo"])
def test_update_in_backward_peaks_below_adamw(tiny_runs, method):
    assert tiny_runs[f"{method}@1"]["peak_rss_bytes_kernel"] < tiny_runs["adamw@1"]["peak_rss_bytes_kernel"]


@pytest.mark.parametrize("method", list(RUNS))
def test_predicted_peak_within_10_percent_on_tiny(tiny_runs, method):
    result = tiny_runs[method]
    measured, predicted = result["peak_rss_bytes_kernel"], result["predicted_peak_bytes_est"]
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)


_PROBE = """
import json, resource, sys, psutil, torch
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import make_trainer
from edgebench.model import build_model, get_config
torch.set_num_threads(1)
batch = to_torch(next(synthetic_batches(get_config("tiny"), {batch_size}, {text_length}, 0)))
base = psutil.Process().memory_info().rss
torch.manual_seed(0)
model = build_model("tiny")
if sys.argv[1] == "forward-only":
    with torch.no_grad():
        for _ in range(3):
            model(batch["input_ids"], batch["images"], batch["labels"])
else:
    trainer = make_trainer(sys.argv[1], model)
    for _ in range(3):
        trainer.step(batch)
print(json.dumps({{"base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}))
"""


def _probe(what: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(**TINY_SHAPE), what],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_mezo_peak_close_to_a_forward_pass():
    """What MeZO adds over the imported runtime is at most 1.2x what a forward-only pass adds."""
    forward, mezo = _probe("forward-only"), _probe("mezo")
    assert mezo["peak"] - mezo["base"] <= 1.2 * (forward["peak"] - forward["base"]), (mezo, forward)


@pytest.mark.slow
def test_predicted_peak_within_10_percent_on_222m(tmp_path):
    """nanovlm-222m at batch 1; the reduced form runs one preset, EDGEBENCH_FULL=1 all of these."""
    methods = ["adamw", "adamw-ckpt", "fused-adamw", "lomo", "lora", "freeze-vision", "mezo",
               "lora+ckpt+frozen-int8"] if FULL else ["sgd"]
    for method in methods:
        result = run_spec(tmp_path / method, model="nanovlm-222m", method=method, batch_size=1,
                          text_length=32, steps=1)
        measured, predicted = result["peak_rss_bytes_kernel"], result["predicted_peak_bytes_est"]
        assert abs(predicted - measured) <= TOLERANCE * measured, (method, predicted, measured)


def test_predict_ranks_the_methods_that_fit_by_estimated_step_time():
    """Without --method: every preset and combination, the ones whose predicted peak fits the
    usable RAM first (fastest estimated step first), each figure labelled an estimate."""
    from click.testing import CliRunner

    from edgebench.cli.methods import predict_command

    result = CliRunner().invoke(predict_command, ["--ram-bytes", str(2 * 2**30), "--model", "nanovlm-222m", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    rows = out["methods"]
    fitting = [r for r in rows if r["fits_est"]]
    assert out["speed"]["source"].startswith("a reference x86 host")  # --ram-bytes names no device
    assert out["fits_est"] == [r["method"] for r in fitting] and 0 < len(fitting) < len(rows)
    assert rows[: len(fitting)] == fitting  # the ones that fit come first
    assert all(r["peak_bytes_est"] <= out["usable_bytes_est"] for r in fitting)
    assert all(r["peak_bytes_est"] > out["usable_bytes_est"] for r in rows[len(fitting):])
    times = [r["step_time_vs_sgd_est"] for r in fitting]
    known = [t for t in times if t is not None]  # bf16 methods: the reference rates leave them unknown
    assert times == sorted(known) + [None] * (len(times) - len(known)) and len(known) < len(times)
    assert "adamw" not in out["fits_est"] and "lora+ckpt+frozen-int8" in out["fits_est"]


def test_predict_reads_a_checkpoint_folders_config(tmp_path):
    """A user's checkpoint gets the prediction of the config it holds (its config.json; no weights read)."""
    from click.testing import CliRunner

    from edgebench.cli.methods import predict_command
    from edgebench.model.config import get_config

    (tmp_path / "config.json").write_text(json.dumps(get_config("tiny").to_nanovlm_dict()))
    args = ["--ram-bytes", str(2**30), "--method", "sgd", "--json"]
    mine = CliRunner().invoke(predict_command, [*args, "--model", str(tmp_path)])
    named = CliRunner().invoke(predict_command, [*args, "--model", "tiny"])
    assert mine.exit_code == 0, mine.output
    assert json.loads(mine.output)["peak_bytes"] == json.loads(named.output)["peak_bytes"] > 0


def test_step_time_estimate_orders_the_work():
    """The work model: checkpointing recomputes (slower), AdamW's update makes more passes than
    SGD's, LoRA skips weight gradients (faster), and MeZO over every weight pays for drawing its
    perturbation five times, over LoRA's few weights hardly at all; bf16 and memory-bound work
    weigh what the device's rates say."""
    from dataclasses import replace

    from edgebench.methods.device_speed import REFERENCE
    from edgebench.methods.steptime import relative_step_time
    from edgebench.model.config import get_config

    cfg = get_config("nanovlm-222m")
    rel = {m: relative_step_time(cfg, m, 1, 32, REFERENCE) for m in ("sgd", "adamw-ckpt", "adamw", "lora", "mezo",
                                                                       "mezo-lora")}
    assert rel["sgd"] == 1.0
    assert rel["adamw-ckpt"] > rel["adamw"] > rel["sgd"] > rel["lora"]
    assert rel["mezo"] > rel["mezo-lora"] and rel["mezo-lora"] < rel["sgd"]
    # a bf16 method: weighed by the device's bf16 matmul time, unknown without it
    assert relative_step_time(cfg, "adamw-bf16", 1, 32, REFERENCE) is None
    fast, even, slow = (relative_step_time(cfg, "adamw-bf16", 1, 32, replace(REFERENCE, bf16_matmul_cost=cost))
                        for cost in (0.25, 1.0, 40.0))
    assert fast < even < slow and even > rel["adamw"] and slow > 10  # autocast's casts cost passes too
    # narrower memory (a slower pass): the update-heavy method falls further behind SGD
    narrow = relative_step_time(cfg, "adamw", 1, 32, replace(REFERENCE, pass_ns=4 * REFERENCE.pass_ns))
    assert narrow > rel["adamw"]


def test_predict_ranks_what_a_model_can_take_and_names_what_it_cannot(tmp_path):
    """A checkpoint int4 cannot pack (an odd MLP width): the ranking goes on without the int4
    methods and says why each is left out."""
    import dataclasses

    from click.testing import CliRunner

    from edgebench.cli import cli
    from edgebench.model.checkpoint import save_pretrained
    from edgebench.model.config import get_config
    from edgebench.model.vision_language_model import VisionLanguageModel

    tiny = get_config("tiny")
    save_pretrained(VisionLanguageModel(dataclasses.replace(tiny, lm_inter_dim=tiny.lm_inter_dim | 1)), tmp_path)
    out = CliRunner().invoke(cli, ["predict", "--ram-bytes", str(8 << 30), "--model", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    ranked = json.loads(out.output)
    assert "even number of input features" in ranked["unavailable"]["qlora4"]
    assert {r["method"] for r in ranked["methods"]}.isdisjoint(ranked["unavailable"]) and len(ranked["methods"]) > 10


_DYNAMO_PROBE = """
import sys
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import make_trainer, memory
from edgebench.methods.trainer import build_model_for
from edgebench.model import get_config
memory.predict("tiny", sys.argv[1], 1, 16)  # the worker predicts before it builds
trainer = make_trainer(sys.argv[1], build_model_for(sys.argv[1], "tiny"), fresh_weights=True)
trainer.step(to_torch(next(synthetic_batches(get_config("tiny"), 1, 16, 0))))
print("torch._dynamo" in sys.modules)
"""


_TRAINED_HEAD_RECOMPUTED = "all+bf16-weights+sr+chunked-ce"  # its chunks share the head: torch's own checkpoint


@pytest.mark.parametrize("method", ["mezo-lora+frozen-int4", "lora-decoder+frozen-int4+bf16-weights+sr", "sgd",
                                    "lora-decoder+frozen-int4+bf16-weights+sr+ckpt+chunked-ce+view-by-view",
                                    _TRAINED_HEAD_RECOMPUTED])
def test_memory_model_knows_which_methods_import_torch_dynamo(method):
    # torch._dynamo costs 69 MiB of RSS; the memory model counts it where a step imports it
    from edgebench.methods import memory, parse_method
    from edgebench.model import get_config

    out = subprocess.run([sys.executable, "-c", _DYNAMO_PROBE, method], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    imported = out.stdout.split()[-1] == "True"
    parsed = parse_method(method)
    params = memory._params(tuple(sorted(get_config("tiny").to_dict().items())), parsed.trainable, parsed.frozen_dtype)
    assert imported == memory._imports_dynamo(parsed, [p for p in params if p.trainable])
    assert imported == (method in ("sgd", _TRAINED_HEAD_RECOMPUTED))
