"""Exporters and the ExecuTorch / ONNX Runtime backends, proven equal to eager on the micro model
(conftest EXPORTED_MODEL; the ONNX Runtime details on tiny: tests/test_export_onnxruntime.py).

Exports are made once per session (a session-scoped cache directory) and shared.
The XNNPACK form runs on a small conv+linear stand-in by default (EDGEBENCH_FULL=1: the micro VLM).
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch

from conftest import EXPORTED_MODEL, FULL
from edgebench.backends import UnsupportedBackend, create
from edgebench.backends.program import BATCH_INPUTS
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.runner.spec import RunSpec
from exporters.executorch import lower_training_step, planned_memory_bytes_of_file
from exporters.manifest import ExportRequest, read_manifest
from exporters.pipeline import ExportRefused, build_training_model, export
from test_export_executorch import PatchEmbed  # the trainable patch-embed conv XNNPACK used to train wrong

TEXT = 12  # short text keeps every export small (the synthetic task needs 11 tokens)
STEPS = 10


def export_program(method: str, backend: str, delegate: str | None = None, batch_size: int = 1,
                   bf16: str = "rounded", weight_decay: float | None = None):
    """The exported-program tests' export (micro, text TEXT), shared through the session's cache."""
    return export(ExportRequest(model=EXPORTED_MODEL, method=method, backend=backend, delegate=delegate,
                                text_length=TEXT, batch_size=batch_size, bf16=bf16, weight_decay=weight_decay))


@pytest.fixture(scope="session")
def et_sgd(export_cache):
    """SGD's program as every device profile lowers it (XNNPACK): the program
    tests/test_export_methods.py and the CLI tests use too, lowered once."""
    return export_program("sgd", "executorch", "xnnpack")


def _eager(result):
    """The same initial model (seed, build, trainable subset) and batch the export was made from."""
    model, _, batch = build_training_model(ExportRequest.from_dict(result.manifest["request"]))
    return model, batch


def _train_side_by_side(module, reference, inputs, steps, lr=0.05):
    """Runs SGD steps in the ExecuTorch program and in eager torch, checking each step's loss."""
    from executorch.extension.training import get_sgd_optimizer

    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    sgd, losses = None, []
    for step in range(steps):
        loss = float(module.forward_backward("forward", inputs)[0])
        sgd = sgd or get_sgd_optimizer(module.named_parameters(), lr)
        sgd.step(module.named_gradients())
        optimizer.zero_grad()
        expected = reference(*inputs)
        expected.backward()
        optimizer.step()
        assert loss == pytest.approx(expected.item(), rel=1e-4), f"step {step}"
        losses.append(loss)
    return losses


def _et_module(result):
    from executorch.extension.training import _load_for_executorch_for_training

    return _load_for_executorch_for_training(str(result.directory / "model.pte"))


# ---------------------------------------------------------------- ExecuTorch


def test_executorch_sgd_matches_eager_losses_and_parameters(et_sgd):
    model, batch = _eager(et_sgd)
    inputs = tuple(to_torch(batch)[k] for k in BATCH_INPUTS)
    module = _et_module(et_sgd)
    losses = _train_side_by_side(module, model, inputs, STEPS)
    eager = dict(model.named_parameters())
    program = module.named_parameters()
    assert sorted(program) == sorted(eager)
    for name, value in program.items():
        torch.testing.assert_close(value, eager[name].detach(), rtol=1e-4, atol=1e-5, msg=name)
    first = float(module.forward_backward("forward", inputs)[0])
    assert first < losses[0]  # the program really trained


def _losses_by_backend(spec, cfg):
    """The losses of `spec.steps` steps on the same batches through the executorch and eager backends."""
    batches = [b for b, _ in zip(synthetic_batches(cfg, 1, TEXT, 0), range(spec.steps))]
    losses = {}
    for backend in ("executorch", "eager"):
        run = RunSpec(**{**spec.to_dict(), "backend": backend})
        instance = create(run)
        instance.setup(run, batches[0])
        losses[backend] = [instance.step(b) for b in batches]
        instance.close()
    return losses


def test_executorch_backend_matches_eager_backend(et_sgd):
    """The whole backend (runtime SGD, clip, lr groups, schedule) against the eager trainer."""
    spec = RunSpec(model=EXPORTED_MODEL, method="sgd", backend="executorch", text_length=TEXT,
                   warmup_steps=0, steps=4, program=str(et_sgd.directory))
    losses = _losses_by_backend(spec, _eager(et_sgd)[0].cfg)
    np.testing.assert_allclose(losses["executorch"], losses["eager"], rtol=1e-4)
    assert len(set(np.round(losses["eager"], 4))) == 4  # the steps changed the model


def test_planned_memory_in_manifest_is_the_programs(et_sgd):
    manifest = read_manifest(et_sgd.directory)
    pte = (et_sgd.directory / "model.pte").read_bytes()
    assert manifest["planned_memory_bytes"] == planned_memory_bytes_of_file(pte)
    inputs = sum(np.prod(i["shape"]) * (8 if i["dtype"] == "int64" else 4) for i in manifest["inputs"])
    assert manifest["planned_memory_bytes"] > inputs  # activations + gradients, not just the inputs
    info = manifest["files"]["model.pte"]
    assert info["bytes"] == len(pte)
    import hashlib

    assert info["sha256"] == hashlib.sha256(pte).hexdigest()
    assert manifest["versions"]["executorch"] and manifest["versions"]["torch"]
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "images", "labels", "attention_mask"]
    assert manifest["inputs"][0]["shape"] == [1, TEXT]
    lowering = manifest["lowering"]  # the exact lowering, as runs record it
    assert lowering["delegate"] == "xnnpack" and lowering["rewrites"]["use_linear"] > 0
    assert lowering["rewrites"]["xnnpack_partitions"] > 0
    stages = set(manifest["export_stages_s"])  # only the model's build where another export lowered it first
    assert stages == {"build model"} or stages >= {"torch.export", "joint graph", "to_edge", "to_executorch"}


def test_profile_shows_where_the_programs_step_goes(et_sgd):
    """`edgebench export --profile`: ETDump operators, eager's operators, memory split."""
    from exporters.profile import PROFILE, profile_export

    report = profile_export(et_sgd.directory, steps=1, warmup=0)
    et, eager = report["executorch"], report["eager"]
    names = [op["name"] for op in et["top_ops"]]
    assert any("GEMM" in n for n in names)  # the matmuls are measured: XNNPACK's, inside its delegate calls
    assert all(op["s_per_step"] >= 0 and op["calls_per_step"] > 0 for op in et["top_ops"])
    assert any(op["name"] in ("aten::mm", "aten::addmm", "aten::linear") for op in eager["top_ops"])
    assert et["lowering"] == et_sgd.manifest["lowering"]
    memory = et["memory"]
    assert memory["planned_arena"] == et_sgd.manifest["planned_memory_bytes"]
    assert memory["gradients"] == 4 * et_sgd.manifest["model"]["trainable_elements"]
    assert memory["planned_arena"] >= 2 * memory["gradients"]  # the plan holds trainable weights and gradients
    assert memory["peak_rss"] > memory["imports"] + memory["weights"]
    assert report["step_vs_eager"] > 0
    assert json.loads((et_sgd.directory / PROFILE).read_text())["key"] == et_sgd.manifest["key"]


def test_cache_hits_on_a_repeated_request(et_sgd, tmp_path):
    stages = []
    request = ExportRequest.from_dict(et_sgd.manifest["request"])
    again = export(request, on_stage=stages.append)
    assert again.cached and stages == [] and again.directory == et_sgd.directory
    copied = export(request, tmp_path / "out", on_stage=stages.append)
    assert copied.cached and stages == []
    assert (tmp_path / "out" / "model.pte").read_bytes() == (et_sgd.directory / "model.pte").read_bytes()
    assert export(request, tmp_path / "out").cached  # the out dir itself is recognised
    other = ExportRequest.from_dict({**request.to_dict(), "text_length": TEXT + 1})
    assert other.key() != request.key()


def test_methods_updating_between_calls_share_one_program(et_sgd):
    """adafactor updates between program calls as sgd does: its export links sgd's program
    (no second lowering) under a manifest of its own; lomo writes its update into the program."""
    stages = []
    adafactor = export(ExportRequest.from_dict({**et_sgd.manifest["request"], "method": "adafactor"}),
                       on_stage=stages.append)
    assert "to_edge" not in stages  # built (or cached, where another test exported it) without lowering again
    assert adafactor.manifest["program_key"] == et_sgd.manifest["program_key"]
    assert (adafactor.directory / "model.pte").stat().st_ino == (et_sgd.directory / "model.pte").stat().st_ino
    assert adafactor.manifest["lowering"]["optimizer"].startswith("torch.optim.Adafactor")
    assert adafactor.manifest["planned_memory_bytes"] == et_sgd.manifest["planned_memory_bytes"]
    # lomo's update is written into its program: another program (its export is tested in
    # tests/test_export_methods.py; here only that the key tells them apart)
    from edgebench.methods import parse_method
    from exporters.et_methods import program_knobs

    assert program_knobs(parse_method("lomo"), None) != program_knobs(parse_method("sgd"), None)
    assert program_knobs(parse_method("adafactor"), None) == program_knobs(parse_method("sgd"), None)
    assert program_knobs(parse_method("adamw-accum4"), None) != program_knobs(parse_method("adamw"), None)  # sums in it
    # weight decay shapes a program only where the update is in it (baked L2, decoupled's multiply)
    assert program_knobs(parse_method("sgd"), 0.1) == program_knobs(parse_method("sgd"), None)
    assert program_knobs(parse_method("fused-adamw"), 0.0) != program_knobs(parse_method("fused-adamw"), None)
    assert program_knobs(parse_method("fused-adamw"), 0.01) == program_knobs(parse_method("fused-adamw"), None)
    # Another device profile with the same delegate: its own export, the same program.
    other_device = {**et_sgd.manifest["request"], "method": "adamw", "profile": "some-other-board"}
    stages = []
    adamw = export(ExportRequest.from_dict(other_device), on_stage=stages.append)
    assert adamw.manifest["program_key"] == et_sgd.manifest["program_key"] and "to_edge" not in stages


def test_two_processes_asking_for_one_export_build_it_once(tmp_path):
    """Two deploys (or test workers) at once: the second waits for the first's export and reuses it."""
    import subprocess
    import sys

    code = (
        "from exporters.manifest import ExportRequest; from exporters.pipeline import export; "
        f"print(export(ExportRequest(model='tiny', method='sgd', backend='onnxruntime', text_length={TEXT})).cached)"
    )
    env = {**os.environ, "EDGEBENCH_EXPORT_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    cached = sorted(proc.communicate(timeout=600)[0].split()[-1] for proc in procs)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert cached == ["False", "True"]  # built once
    # one export entry, and one set of artifacts in the shared store that SGD/Adam/AdamW link from
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")].count("programs") == 1
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]) == 2
    assert len([p for p in (tmp_path / "cache" / "programs").iterdir() if not p.name.startswith(".")]) == 1


# ONNX Runtime's subsets are checked in tests/test_export_onnxruntime.py; EDGEBENCH_FULL=1
# adds the ExecuTorch freeze-vision export (the frozen patch-embed conv).
SUBSETS = [("lora", "executorch")]
if FULL:
    SUBSETS += [("freeze-vision", "executorch")]


def _gradients(result, batch) -> dict[str, np.ndarray]:
    """Gradients after one forward-backward through the exported program, by parameter name."""
    module = _et_module(result)
    module.forward_backward("forward", tuple(to_torch(batch)[k] for k in BATCH_INPUTS))
    return {n: g.numpy() for n, g in module.named_gradients().items()}


@pytest.mark.parametrize("method,backend", SUBSETS)
def test_trainable_subset_gets_exactly_its_gradients(export_cache, method, backend):
    result = export_program(method, backend, "xnnpack")  # the default lowering, shared with the method tests
    model, batch = _eager(result)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert trainable and frozen
    assert set(result.manifest["trainable_parameters"]) == trainable
    grads = _gradients(result, batch)
    assert set(grads) == trainable
    assert all(np.isfinite(g).all() for g in grads.values())
    # Eager gradients for the same batch: the program differentiates the same function.
    model(*(to_torch(batch)[k] for k in BATCH_INPUTS)).backward()
    for name, param in model.named_parameters():
        if param.requires_grad:
            np.testing.assert_allclose(grads[name], param.grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=name)
    assert any(np.abs(g).sum() > 0 for g in grads.values())


@pytest.mark.parametrize("method", ["mezo", "mezo-lora"])
def test_executorch_mezo_forward_program_matches_eager_mezo(export_cache, method):
    """MeZO: forward-only program, weights as inputs, perturbed in place by the methods' trainer;
    XNNPACK (the default lowering) reads them as the inputs they are."""
    result = export_program(method, "executorch", "xnnpack")
    assert result.manifest["program"] == "forward-only"
    assert result.manifest["lowering"]["delegate"] == "xnnpack"
    assert "planned_memory_bytes" in result.manifest and result.manifest["planned_memory_bytes"] > 0
    spec = RunSpec(model=EXPORTED_MODEL, method=method, backend="executorch", text_length=TEXT,
                   warmup_steps=0, steps=3, program=str(result.directory))
    losses = _losses_by_backend(spec, _eager(result)[0].cfg)
    np.testing.assert_allclose(losses["executorch"], losses["eager"], rtol=1e-4)


def _xnnpack_model():
    if FULL:
        model, _, batch = build_training_model(ExportRequest(model=EXPORTED_MODEL, method="sgd", text_length=TEXT))
        return model, tuple(to_torch(batch)[k] for k in BATCH_INPUTS)

    torch.manual_seed(0)
    return PatchEmbed(), (torch.randn(2, 3, 16, 16), torch.tensor([1, 7]))


@pytest.mark.slow
def test_xnnpack_keeps_trainable_weights_out_and_matches_eager():
    from executorch.extension.training import _load_for_executorch_for_training_from_buffer

    model, inputs = _xnnpack_model()
    reference = copy.deepcopy(model)
    lowered = lower_training_step(model, inputs, delegate="xnnpack")
    assert lowered.delegated
    module = _load_for_executorch_for_training_from_buffer(lowered.buffer)
    _train_side_by_side(module, reference, inputs, 3)
    assert set(module.named_parameters()) == {n for n, _ in reference.named_parameters()}


# ---------------------------------------------------------------- early, clear refusals


def test_onnx_for_an_aarch64_profile_is_refused_early(export_cache):
    from edgebench.devices.profiles import load_profile
    from exporters.pipeline import request_from_profile

    profile = load_profile("raspberry-pi-5-8gb")
    request = request_from_profile(profile, model="tiny", method="sgd", backend="onnxruntime")
    stages = []
    with pytest.raises(ExportRefused, match=r"aarch64.*--enable_training_apis"):
        export(request, profile=profile, on_stage=stages.append)
    assert stages == []


@pytest.mark.parametrize("method,backend,why", [
    ("lomo", "onnxruntime", "optimizer lomo is not available on onnxruntime"),
    ("cg", "executorch", "line search"),
    ("forward-grad", "executorch", "--backend eager"),
])
def test_unsupported_method_backend_pair_is_refused_early(method, backend, why):
    stages = []
    with pytest.raises(ExportRefused, match=why):
        export(ExportRequest(model="tiny", method=method, backend=backend), on_stage=stages.append)
    assert stages == []


def test_backends_refuse_unsupported_pairs_and_devices(tmp_path):
    from edgebench.backends.support import device_reason

    spec = RunSpec(model="tiny", method="cg", backend="executorch", program=str(tmp_path))
    with pytest.raises(UnsupportedBackend, match="line search"):
        create(spec).setup(spec, {})
    reason = device_reason("onnxruntime", "aarch64")
    assert "no Linux aarch64 wheel" in reason and "--enable_training_apis" in reason
    assert device_reason("executorch", "aarch64") is None


def test_export_command_refuses_onnx_for_a_pi():
    from click.testing import CliRunner

    from edgebench.cli import cli

    out = CliRunner().invoke(cli, ["export", "--device", "raspberry-pi-5-8gb", "--backend", "onnxruntime"])
    assert out.exit_code != 0
    assert "aarch64" in out.output and "--enable_training_apis" in out.output


def test_methods_matrix_follows_the_backends_support():
    """`edgebench methods --json` lists where each preset runs and says why the others refuse it."""
    from click.testing import CliRunner

    from edgebench.cli import cli

    out = CliRunner().invoke(cli, ["methods", "--json"])
    assert out.exit_code == 0, out.output
    rows = {row["name"]: row for row in json.loads(out.output)}
    on = {b: {name for name, row in rows.items() if b in row["backends"]} for b in ("executorch", "onnxruntime")}
    assert {"sgd", "adamw", "lora", "mezo"} <= on["executorch"]
    assert {"sgd", "adamw", "freeze-vision", "lora", "mezo"} <= on["onnxruntime"]
    for refused in ("lomo", "adamw-ckpt", "galore"):
        assert refused not in on["onnxruntime"]
    assert "forward-grad" not in on["executorch"]
    assert {"lomo", "fused-adamw", "galore", "adamw-8bit"} <= on["executorch"]
    assert "line search" in rows["cg"]["refused"]["executorch"]
    assert all(set(row["backends"]) | set(row["refused"]) == {"eager", "executorch", "onnxruntime"}
               for row in rows.values())


def test_export_key_covers_every_module_the_export_imports(tmp_path):
    """The key hashes the export's import closure, computed: editing a module the export runs
    (here the LoRA writer and the optimizers, which a hand-kept list once left out) changes it;
    editing a module it never imports (the report renderer) does not."""
    import shutil
    from pathlib import Path

    from exporters.manifest import source_fingerprint

    repo = Path(__file__).resolve().parent.parent
    for package in ("edgebench", "exporters"):
        shutil.copytree(repo / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    original = source_fingerprint(tmp_path)
    assert source_fingerprint(repo) == original  # a copy hashes as the checkout does

    def edited(relative: str) -> str:
        path = tmp_path / relative
        before = path.read_text()
        path.write_text(before + "\n# edited\n")
        try:
            return source_fingerprint(tmp_path)
        finally:
            path.write_text(before)

    for module in ("exporters/lora.py", "edgebench/methods/optim.py", "edgebench/backends/et_optimizers.py",
                   "edgebench/methods/trainer.py", "edgebench/model/language_model.py"):
        assert edited(module) != original, module
    assert edited("edgebench/report/__init__.py") == original
