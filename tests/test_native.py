"""The native ExecuTorch worker (edgebench/native/worker.cpp): no Python, no torch in the
training process, the same losses as the Python ExecuTorch path, the same run directory.

Each native run goes through the real supervisor (its own process, result.json written);
the Python path it is compared with runs the ExecuTorch backend in this process on the same
batches (the worker's first batch is its setup example, as in the Python worker). Exports are
the ones the other export tests make (session cache).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import EXPORTED_MODEL, checkpoint_lr
from edgebench.backends import create
from edgebench.figures.run import HOST_EVALS, figures_of_run_dir
from edgebench.figures.run_events import read_events
from edgebench.figures.status import EXIT_ERROR
from edgebench.model import build_model
from edgebench.native import rates
from edgebench.native.build import bundle
from edgebench.native.plan import write_plan
from edgebench.results.heldout import evaluate_saved_weights
from edgebench.runner.native import WORKER
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import run_spec
from edgebench.runner.worker import batches_for
from test_export import TEXT, export_program

STEPS = 10
# Largest relative loss difference from the Python ExecuTorch path over 10 steps, measured
# (micro): sgd 1.9e-6, sgd-momentum 1.2e-6, adam 9.6e-8, adamw 1.9e-7, fused-adamw and lomo 0
# (the program updates itself; only the step's scalars are computed here). The update's sums run in another order
# than torch's kernels; a wrong clip, schedule, lr group or bias correction moves the loss by
# 1e-3 or more within three steps.
TOLERANCE = 1e-5


@pytest.fixture(scope="session")
def worker_bundle():
    return bundle()


def _program(method: str, batch_size: int = 1, delegate: str | None = "xnnpack") -> str:
    return str(export_program(method, "executorch", delegate, batch_size).directory)


def _spec(method: str, program: str, **fields) -> RunSpec:
    base = dict(model=EXPORTED_MODEL, method=method, backend="executorch", text_length=TEXT, warmup_steps=0,
                steps=STEPS, sample_hz=10.0, program=program, run_id=f"native-{method}", lr=checkpoint_lr(method))
    return RunSpec(**{**base, **fields})


def _native(spec: RunSpec, worker: Path, out: Path, cache: Path) -> tuple[dict, list[dict]]:
    spec = dataclasses.replace(spec, runtime="native", native_worker=str(worker),
                               native_plan=str(write_plan(spec, cache)))
    run_spec(spec, out)
    result = figures_of_run_dir(out)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()] \
        if (out / "events.jsonl").exists() else []
    typed = read_events(out / "events.jsonl")  # the native worker's trace holds to the one definition
    assert len(typed.events) == len(events) and typed.bad_lines == 0, (typed, events)
    return result, events


def _python_losses(spec: RunSpec) -> list[float]:
    batches = batches_for(spec)
    backend = create(spec)
    backend.setup(spec, next(batches))
    losses = [backend.step(next(batches)) for _ in range(spec.steps)]
    backend.close()
    return losses


def _losses(events: list[dict]) -> list[float]:
    return [e["loss"] for e in events if e.get("event") == "step_end"]


# sgd, sgd-momentum, adam and adamw share one program (the update runs between its calls);
# fused-adamw and lomo update inside theirs (all+bf16-weights too, its weights bf16); adamw-accum4
# sums 4 micro-batches' gradients.
PARITY = [("sgd", 1, "xnnpack"), ("adamw", 1, "xnnpack"), ("sgd-momentum", 1, "xnnpack"), ("adam", 1, "xnnpack"),
          ("fused-adamw", 1, "xnnpack"), ("lomo", 1, "xnnpack"), ("adamw-accum4", 4, "xnnpack"), ("lora", 1, None),
          ("all+bf16-weights", 1, "xnnpack")]


@pytest.mark.parametrize("method,batch_size,delegate", PARITY)
def test_native_worker_trains_as_the_python_executorch_path(export_cache, worker_bundle, tmp_path, method,
                                                             batch_size, delegate):
    spec = _spec(method, _program(method, batch_size, delegate), batch_size=batch_size)
    result, events = _native(spec, worker_bundle, tmp_path / "run", tmp_path / "plans")
    assert result["status"] == "ok", result["detail"]
    native, python = np.array(_losses(events)), np.array(_python_losses(spec))
    print(json.dumps({"method": method, "max_rel_loss_diff": float(np.max(np.abs(native - python) / python))}))
    np.testing.assert_allclose(native, python, rtol=TOLERANCE)
    assert native[-1] < native[0]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["runtime"] == result["runtime"] == "native"
    assert meta["native_worker"]["arch"] == os.uname().machine


# --weight-decay (issue 70): torch's L2 in the worker's SGD, SGD-momentum and Adam
# (optimizers.cpp), AdamW's decoupled decay at a non-default value, and the updating programs'
# (sgd+fused: L2 baked into the program; fused-adamw: decoupled, the worker's `hyper`), against
# the Python path, which tests/test_export_methods.py holds to eager's torch.optim.
DECAY = [("sgd", None), ("sgd-momentum", None), ("adam", 1e-3), ("adamw", 1e-3), ("sgd+fused", None),
         ("fused-adamw", 1e-3)]


@pytest.mark.parametrize("method,lr", DECAY)
def test_native_weight_decay_trains_as_the_python_executorch_path(export_cache, worker_bundle, tmp_path, method, lr):
    program = str(export_program(method, "executorch", "xnnpack", weight_decay=1.0).directory)
    spec = _spec(method, program, weight_decay=1.0, lr=lr or checkpoint_lr(method))
    result, events = _native(spec, worker_bundle, tmp_path / "run", tmp_path / "plans")
    assert result["status"] == "ok", result["detail"]
    native, python = np.array(_losses(events)), np.array(_python_losses(spec))
    print(json.dumps({"method": method, "max_rel_loss_diff": float(np.max(np.abs(native - python) / python))}))
    np.testing.assert_allclose(native, python, rtol=TOLERANCE)
    plan = next((tmp_path / "plans").rglob("plan.txt")).read_text().splitlines()
    assert f"weight_decay 1.0 {'decoupled' if 'adamw' in method else 'l2'}" in plan
    if "fused" not in method:  # one program for every decay: the decay is in play
        undecayed = np.array(_python_losses(dataclasses.replace(spec, weight_decay=0.0)))
        assert np.max(np.abs(undecayed - python) / python) > 1e-3


def test_native_run_is_small_and_torch_free(export_cache, worker_bundle, tmp_path):
    """SGD in the native worker: its peak RSS is the worker's alone (no Python, no torch mapped),
    well under the Python ExecuTorch worker's ~340 MB. The kernel's figure (the worker's own
    VmHWM) holds at least the program, whose weights it updates in place; the sampler, whose
    first samples may come before the program is loaded (a run of micro takes a few tens of
    ms), stays under it too."""
    program = _program("sgd")
    result, _ = _native(_spec("sgd", program, steps=3), worker_bundle, tmp_path / "run", tmp_path / "plans")
    assert result["status"] == "ok", result["detail"]
    pte_bytes = (Path(program) / "model.pte").stat().st_size
    assert pte_bytes < result["peak_rss_bytes_kernel"] < 64 * 2**20, (pte_bytes, result)
    assert 0 < result["peak_rss_bytes_sampled"] < 64 * 2**20, result


def test_meta_records_what_ran_and_a_worker_changed_after_deploy_is_an_error(export_cache, worker_bundle, tmp_path):
    """meta.json's `ran` holds the sha256 of every file the run started with, read as it started;
    a bundle whose launcher changed after it was built runs, but its figures are an error naming
    the file, not another worker's figures under the deployed one's name."""
    program = _program("sgd")
    _native(_spec("sgd", program, steps=1), worker_bundle, tmp_path / "run", tmp_path / "plans")
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    deployed = meta["native_worker"]["files"]
    assert {f"worker/{name}": digest for name, digest in deployed.items()}.items() <= meta["ran"].items()
    assert {"plan/plan.txt", "plan/batches.bin", "program/model.pte"} <= set(meta["ran"])
    changed = shutil.copytree(worker_bundle, tmp_path / "changed")
    with open(changed / "run.sh", "a") as fh:
        fh.write("# one line more\n")
    result, _ = _native(_spec("sgd", program, steps=1), changed, tmp_path / "run2", tmp_path / "plans")
    assert result["status"] == "error" and "run.sh had another sha256" in result["detail"], result["detail"]


def _one_batch(plan: Path, to: Path, steps: int) -> Path:
    """A copy of `plan` whose every step sees its first batch (one fixed batch: MeZO's few
    noisy steps then show whether it learns, as the varying synthetic batches do not)."""
    shutil.copytree(plan, to)
    data = (plan / "batches.bin").read_bytes()
    (to / "batches.bin").write_bytes(data[:len(data) // steps] * steps)
    return to


@pytest.mark.parametrize("method,lr", [("mezo", 1e-4), ("mezo-lora", None)])
def test_native_mezo_learns_on_the_forward_only_program(export_cache, worker_bundle, tmp_path, method, lr):
    """MeZO's perturbations come from the worker's own generator (splitmix64 + Box-Muller),
    not torch's, so its trajectory is its own: checked for learning and for repeatability.
    (Full MeZO at its default lr, 1e-3, does not fall on tiny in 20 steps in either worker.)"""
    spec = _spec(method, _program(method), steps=20, lr=lr)
    plan = _one_batch(write_plan(spec, tmp_path / "plans"), tmp_path / "fixed", 20)
    losses = []
    for out in ("a", "b"):
        result = run_spec(dataclasses.replace(spec, runtime="native", native_worker=str(worker_bundle),
                                              native_plan=str(plan)), tmp_path / out)
        assert result["status"] == "ok", result["detail"]
        losses.append(
            _losses([json.loads(line) for line in (tmp_path / out / "events.jsonl").read_text().splitlines()])
        )
    assert losses[0] == losses[1]  # same seed, same bytes
    assert np.mean(losses[0][-5:]) < np.mean(losses[0][:5]) - 0.05, losses[0]


def test_a_loss_rising_past_the_factor_is_diverged_natively(export_cache, worker_bundle, tmp_path):
    """The native worker applies the Python worker's rule (status.LossWatch): lomo at lr 1 takes
    micro's loss from 6.1 to 47 and 86 (finite) in its first steps."""
    result, events = _native(_spec("lomo", _program("lomo"), steps=8, lr=1.0), worker_bundle, tmp_path / "run",
                             tmp_path / "plans")
    assert result["status"] == "diverged", result
    (diverged,) = [e for e in events if e["event"] == "diverged"]
    last = [e for e in events if e["event"] == "step_end"][-1]
    assert diverged["step"] == last["step"] >= 1 and diverged["loss"] == last["loss"] and math.isfinite(last["loss"])
    assert f"at step {last['step']}: the mean of the last" in result["detail"], result["detail"]


@pytest.mark.parametrize("method", ["lomo", "mezo", "all+bf16-weights"])
def test_each_kind_saves_its_trained_weights_at_evaluation_points(export_cache, worker_bundle, tmp_path, method):
    """The updating kind's weights are its program's outputs after the loss, the forward-only
    kind's the ones the worker holds (the joint kind's: tests/test_evaluation.py): saved after
    each point but the first, in the model's shapes (bf16 trained weights as BF16), and the
    host evaluates them all."""
    spec = _spec(method, _program(method), steps=3, eval_every=2, eval_samples=2)
    result, events = _native(spec, worker_bundle, tmp_path / "run", tmp_path / "plans")
    assert result["status"] == "ok", result["detail"]
    assert [e["after_steps"] for e in events if e["event"] == "eval_weights"] == [0, 2, 3]
    assert sorted(p.name for p in (tmp_path / "run").glob("eval-weights-*")) == [
        "eval-weights-000002.safetensors", "eval-weights-000003.safetensors"]
    raw = (tmp_path / "run" / "eval-weights-000003.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    shapes = {name: list(p.shape) for name, p in build_model(EXPORTED_MODEL).named_parameters()}
    assert header and {name: h["shape"] for name, h in header.items()} == {name: shapes[name] for name in header}
    assert {h["dtype"] for h in header.values()} == {"BF16" if "bf16" in method else "F32"}, header
    assert evaluate_saved_weights(tmp_path / "run") == 3
    host = [json.loads(line) for line in (tmp_path / "run" / HOST_EVALS).read_text().splitlines()]
    assert [e["event"] for e in host] == ["eval"] * 3, host
    assert host[2]["loss_sum"] != host[0]["loss_sum"]  # trained weights, not the exported ones


def test_python_only_optimizers_are_refused_natively(export_cache, tmp_path):
    from edgebench.backends.base import UnsupportedBackend

    with pytest.raises(UnsupportedBackend, match="adafactor.*--runtime python"):
        write_plan(_spec("adafactor", _program("sgd")), tmp_path)


def test_the_host_never_writes_a_plan_the_worker_refuses(export_cache, tmp_path):
    """A value past plan.py's PLAN_VALUES (here a RunSpec not checked as the options are) is
    refused as the plan is written, never shipped to a worker that would refuse it."""
    with pytest.raises(ValueError, match='the native worker would refuse its plan: threads: \'1025\''):
        write_plan(_spec("sgd", _program("sgd"), threads=1025), tmp_path)
    assert not (tmp_path / "native-plans").exists()


def _bad_run(tmp_path: Path, worker: Path, spec: RunSpec, plan: Path | None = None) -> dict:
    spec = dataclasses.replace(spec, runtime="native", native_worker=str(worker),
                               native_plan=str(plan or write_plan(spec, tmp_path / "plans")))
    run_spec(spec, tmp_path / "run")
    return figures_of_run_dir(tmp_path / "run")


def test_a_program_that_is_not_a_training_program_is_an_error(export_cache, worker_bundle, tmp_path):
    """The joint program's plan given MeZO's forward-only .pte: refused with the cause and fix."""
    spec = _spec("sgd", _program("sgd"))
    plan = write_plan(spec, tmp_path / "plans")
    result = _bad_run(tmp_path, worker_bundle, dataclasses.replace(spec, program=_program("mezo")), plan)
    assert result["status"] == "error"
    assert "export" in result["detail"] and "\n" not in result["detail"], result["detail"]


def test_inputs_of_the_wrong_shape_are_an_error(export_cache, worker_bundle, tmp_path):
    """A plan whose batches are longer than the program was exported for."""
    spec = _spec("sgd", _program("sgd"))
    bad = tmp_path / "bad-plan"
    shutil.copytree(write_plan(spec, tmp_path / "plans"), bad)
    text = (bad / "plan.txt").read_text()
    longer = {"input_ids": 8, "labels": 8, "attention_mask": 8}  # int64: 4 more tokens each
    for name in longer:
        text = text.replace(f"input {name} int64 1 {TEXT}", f"input {name} int64 1 {TEXT + 4}")
    (bad / "plan.txt").write_text(text)
    count = int(next(line.split()[1] for line in text.splitlines() if line.startswith("batch_count")))
    size = (bad / "batches.bin").stat().st_size + count * 4 * sum(longer.values())
    (bad / "batches.bin").write_bytes(b"\0" * size)
    result = _bad_run(tmp_path, worker_bundle, spec, bad)
    assert result["status"] == "error"
    assert "input_ids was exported as [1, 12], the batch is [1, 16]" in result["detail"], result["detail"]
    assert "export again" in result["detail"]


def _with_optimizer(tmp_path: Path, spec: RunSpec, name: str) -> Path:
    """sgd's plan with its `optimizer` line naming `name` (the descriptor's constants stay sgd's)."""
    plan = tmp_path / f"plan-{name}"
    shutil.copytree(write_plan(spec, tmp_path / "plans"), plan)
    lines = (plan / "plan.txt").read_text().splitlines()
    (plan / "plan.txt").write_text("\n".join(f"optimizer {name}" if text.startswith("optimizer ") else text
                                              for text in lines) + "\n")
    return plan


def test_the_worker_runs_every_optimizer_said_to_be_native_and_refuses_the_rest(export_cache, worker_bundle,
                                                                                  tmp_path):
    """Each optimizer whose descriptor says the native worker updates it between program calls
    trains a step there; one it does not have ends `unsupported`, named (methods/optimizers.py)."""
    from edgebench.methods.optimizers import OPTIMIZERS

    spec = _spec("sgd", _program("sgd"), steps=1)
    for name, opt in OPTIMIZERS.items():
        if opt.update_in_backward:  # its update is written into the program: no branch of the worker's
            continue
        result = _bad_run(tmp_path / name, worker_bundle, spec, _with_optimizer(tmp_path, spec, name))
        if opt.native:
            assert result["status"] == "ok", (name, result["detail"])
        else:
            assert result["status"] == "unsupported" and f"optimizer {name} is not in the native worker" in \
                result["detail"], (name, result["detail"])


def _edited(tmp_path: Path, spec: RunSpec, edits: dict[str, str]) -> tuple[Path, dict[str, int]]:
    """A copy of `spec`'s plan with the lines of `edits`' keys replaced, and each key's line number."""
    plan = tmp_path / "bad-plan"
    shutil.copytree(write_plan(spec, tmp_path / "plans"), plan)
    lines = (plan / "plan.txt").read_text().splitlines()
    numbers = {}
    for key, values in edits.items():
        numbers[key] = next(i for i, text in enumerate(lines, 1) if text.split()[0] == key)
        lines[numbers[key] - 1] = f"{key} {values}".strip()
    (plan / "plan.txt").write_text("\n".join(lines) + "\n")
    return plan, numbers


@pytest.mark.parametrize("line,bad,said", [("clip", "abc", '"abc" is not a number'),
                                           ("total_steps", "12x", '"12x" is not a whole number in 1..2000000'),
                                           ("group_lr", "", "has 0 values, needs 2")])
def test_a_plan_value_that_is_not_a_number_is_an_error_naming_its_line(export_cache, worker_bundle, tmp_path, line,
                                                                        bad, said):
    """Read whole, never as 0: a `clip` of "abc" would otherwise turn clipping off. The error
    names the file, the line and the key, and the run ends before it writes anything."""
    spec = _spec("sgd", _program("sgd"))
    plan, numbers = _edited(tmp_path, spec, {line: bad})
    result = _bad_run(tmp_path, worker_bundle, spec, plan)
    assert result["status"] == "error"
    said = f"plan.txt:{numbers[line]}: {line}: {said}"
    assert said in result["detail"] and "write the plan again" in result["detail"], result["detail"]
    assert not (tmp_path / "run" / "events.jsonl").exists()
    assert json.loads((tmp_path / "run" / "result.json").read_text())["end"]["exit_code"] == EXIT_ERROR


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("edits,key,said", [
    ({"threads": "100000"}, "threads", '"100000" is not a whole number in 0..1024'),
    ({"eval_every": "1", "eval_weights": "../x 6 .safetensors"}, "eval_weights",
     '"../x 6 .safetensors" would name a file outside its folder'),
])
def test_a_hand_edited_plan_out_of_range_is_refused_before_anything_is_written(export_cache, worker_bundle, tmp_path,
                                                                               edits, key, said):
    """The worker run by hand on a plan edited past its ranges (100000 threads once crashed it; an
    evaluation file name of ../x wrote beside the run directory): exit EXIT_ERROR, one line on
    stderr naming the plan file, the line, the key, the value and its range, nothing written."""
    spec = _spec("sgd", _program("sgd"), steps=2)
    plan, numbers = _edited(tmp_path, spec, edits)
    run = tmp_path / "work" / "run"
    run.mkdir(parents=True)
    before = _files(tmp_path)
    done = subprocess.run([str(worker_bundle / WORKER), str(plan / "plan.txt"), "--program", spec.program, "--out",
                           str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_ERROR and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.endswith("\n") and done.stderr.count("\n") == 1, done.stderr
    assert f"native worker: {plan / 'plan.txt'}:{numbers[key]}: {key}: {said}" in done.stderr, done.stderr
    assert _files(tmp_path) == before and not any(run.iterdir()) and set((tmp_path / "work").iterdir()) == {run}


def test_a_missing_library_is_an_error_naming_it(export_cache, worker_bundle, tmp_path):
    broken = tmp_path / "bundle"
    shutil.copytree(worker_bundle, broken)
    (broken / "lib" / "libexecutorch_backend_xnnpack.so").unlink()
    result = _bad_run(tmp_path, broken, _spec("sgd", _program("sgd")))
    assert result["status"] == "error"
    assert "libexecutorch_backend_xnnpack.so" in result["detail"] and "deploy again" in result["detail"]


def test_a_worker_built_for_another_arch_is_refused(export_cache, worker_bundle, tmp_path):
    other = tmp_path / "bundle"
    shutil.copytree(worker_bundle, other)
    facts = json.loads((other / "bundle.json").read_text())
    (other / "bundle.json").write_text(json.dumps({**facts, "arch": "aarch64"}))
    result = _bad_run(tmp_path, other, _spec("sgd", _program("sgd")))
    assert result["status"] == "error"
    assert "built for aarch64" in result["detail"] and "this device is" in result["detail"]
    # a binary the kernel cannot execute at all (no bundle.json to warn first): still an error
    (other / "bundle.json").unlink()
    (other / "edgebench-worker").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x02\x00\xb7\x00" + b"\0" * 44)
    result = _bad_run(tmp_path / "x", other, _spec("sgd", _program("sgd")))
    assert result["status"] == "error" and "could not be started" in result["detail"], result["detail"]


def test_a_worker_that_crashes_is_an_error(export_cache, worker_bundle, tmp_path):
    crashing = tmp_path / "bundle"
    shutil.copytree(worker_bundle, crashing)
    (crashing / "edgebench-worker").write_text(f"#!/bin/sh\nkill -{signal.SIGSEGV.value} $$\n")
    facts = json.loads((crashing / "bundle.json").read_text())  # deployed as such: bundle.json has its hash
    facts["files"]["edgebench-worker"] = hashlib.sha256((crashing / "edgebench-worker").read_bytes()).hexdigest()
    (crashing / "bundle.json").write_text(json.dumps(facts))
    result = _bad_run(tmp_path, crashing, _spec("sgd", _program("sgd")))
    assert result["status"] == "error" and "crashed (SIGSEGV)" in result["detail"], result["detail"]


def test_rates_mode_prints_every_rate(small_rates, worker_bundle, tmp_path):
    """`--rates`: every field methods.device_speed measures, positive and finite, taken by the
    worker; a rate it cannot take is null with why, never a number; no fp32 program is an error."""
    folder = rates.program()
    done = subprocess.run(rates.command(str(worker_bundle), str(folder)), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found = rates.read(done.stdout, "here")
    for name in ("matmul_gflops", "bf16_matmul_cost", "pass_ns", "normal_ns"):
        assert isinstance(found[name], float) and math.isfinite(found[name]) and found[name] > 0, (name, found)
    assert found["source"].startswith("measured by the native worker") and found["unmeasured"] == {}
    assert found["threads"] >= 1
    partial = tmp_path / "no-bf16"
    shutil.copytree(folder, partial)
    (partial / "bf16.pte").unlink()
    done = subprocess.run(rates.command(str(worker_bundle), str(partial)), capture_output=True, text=True)
    found = rates.read(done.stdout, "here")
    assert found["bf16_matmul_cost"] is None and "bf16.pte" in found["unmeasured"]["bf16_matmul_cost"]
    assert found["matmul_gflops"] > 0
    (partial / "fp32.pte").unlink()
    done = subprocess.run(rates.command(str(worker_bundle), str(partial)), capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "" and "fp32.pte" in done.stderr, (done.stdout, done.stderr)


def test_a_number_argument_that_is_not_a_number_is_a_usage_error(worker_bundle):
    """`--repeats abc` was once read as 0: now the worker ends with its usage exit code, naming the
    argument and the value."""
    done = subprocess.run([str(worker_bundle / WORKER), "--repeats", "abc"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_ERROR and done.stdout == "", (done.returncode, done.stdout)
    assert 'native worker: --repeats: "abc" is not a whole number' in done.stderr, done.stderr


def test_the_bundles_key_hashes_every_worker_source():
    """A source left out of SOURCE_FILES would leave a cached worker in place after an edit."""
    from edgebench.native import build

    sources = {path.name for path in build.SOURCES.iterdir() if path.suffix in (".cpp", ".h")}
    assert sources - {"worker_tests.cpp"} <= set(build.SOURCE_FILES)


def test_the_build_command_explains_itself_and_names_what_it_builds_for():
    command = [sys.executable, "-m", "edgebench.native.build"]
    shown = subprocess.run([*command, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "x86_64 or aarch64" in shown.stdout
    refused = subprocess.run([*command, "sparc"], capture_output=True, text=True)
    assert refused.returncode == 2 and "no native worker for sparc: it is built for x86_64, aarch64" in refused.stderr
