"""The ONNX Runtime exporter and backend, proven equal to eager torch on the tiny model.

Each method runs 10 steps through the real backend (`create(spec)`: the artifacts in ORT's
training API, the backend's own update) and through eager torch from the same initial
weights and batches, with the update the backend documents (one constant lr for every
parameter, global-norm clip 1.0). Exports are made once per session, in a session cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from edgebench.backends import UnsupportedBackend, create
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.runner.spec import RunSpec
from exporters.manifest import ExportRequest
from exporters.pipeline import ExportRefused, build_training_model, export

TEXT = 12  # short text keeps every export small (the synthetic task needs 11 tokens)
STEPS = 10
KEYS = ("input_ids", "images", "labels", "attention_mask")  # the model's inputs


def _export(method: str):
    return export(ExportRequest(model="tiny", method=method, backend="onnxruntime", text_length=TEXT))


def _batches(result, n: int = STEPS + 1) -> list[dict]:
    model = result.manifest["model"]
    cfg = types.SimpleNamespace(lm_vocab_size=model["lm_vocab_size"], vit_img_size=model["vit_img_size"])
    return [b for b, _ in zip(synthetic_batches(cfg, 1, TEXT, 0), range(n))]


def _backend(result, method: str, lr: float | None = None):
    spec = RunSpec(model="tiny", method=method, backend="onnxruntime", text_length=TEXT,
                   program=str(result.directory), lr=lr)
    backend = create(spec)
    backend.setup(spec, _batches(result, 1)[0])
    return backend


def _eager(result):
    """The model (peft LoRA where the method has it) the export was made from: same seed,
    build and trainable subset, so the same initial weights."""
    model, _, _ = build_training_model(ExportRequest.from_dict(result.manifest["request"]))
    return model


def _torch_optimizer(manifest, params, lr):
    """The torch optimizer the method names (Adam: torch.optim.Adam itself, which the export
    lowers to ORT's AdamW without weight decay)."""
    optimizer = manifest["method"]["knobs"]["optimizer"]
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=manifest["weight_decay"])


# Tolerance: measured within 2.1e-6 relative of eager over 10 steps for every method here
# (float32 kernels summing in another order; SGD is the loosest). 1e-5 leaves 5x headroom and
# stays ~100x below the smallest step-to-step loss change (4.6e-3 absolute, bitfit), so a
# wrong update, lr, clip, weight decay or trainable set fails.
BACKPROP = [(m, 1e-5) for m in ("sgd", "adam", "adamw", "freeze-vision", "bitfit", "lora")]


@pytest.mark.parametrize("method,rtol", BACKPROP)
def test_backprop_method_matches_eager(export_cache, method, rtol):
    result = _export(method)
    manifest = result.manifest
    backend = _backend(result, method)
    model = _eager(result)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _torch_optimizer(manifest, params, manifest["default_lr"])
    ort_losses, eager_losses = [], []
    for batch in _batches(result)[1:]:
        ort_losses.append(backend.step(batch))
        optimizer.zero_grad()
        loss = model(*(to_torch(batch)[k] for k in KEYS))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, manifest["max_grad_norm"])
        optimizer.step()
        eager_losses.append(loss.item())
    np.testing.assert_allclose(ort_losses, eager_losses, rtol=rtol)
    assert len(set(np.round(eager_losses, 3))) > 5  # the steps changed the model
    trained = backend.named_parameters()
    eager = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert set(trained) == set(eager) == set(manifest["trainable_parameters"])
    for name, value in trained.items():
        np.testing.assert_allclose(value, eager[name].detach().numpy(), rtol=1e-3, atol=1e-4, err_msg=name)


def test_lora_is_written_into_the_graph_with_peft_names(export_cache):
    """LoRA: adapters train, base weights are frozen params of the checkpoint, peft's names."""
    import onnx

    result = _export("lora")
    trainable, frozen = result.manifest["trainable_parameters"], result.manifest["frozen_parameters"]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert any(n.endswith(".base_layer.weight") for n in frozen)
    graph = onnx.load(result.directory / "training_model.onnx").graph
    buffers = {i.name for i in graph.input if i.name.endswith("_grad.accumulation.buffer")}
    assert buffers == {f"{n}_grad.accumulation.buffer" for n in trainable}  # gradients for adapters only
    assert "LoRA r=8" in result.manifest["lowering"]["trainable"]


@pytest.mark.parametrize("method", ["mezo", "mezo-lora"])
def test_mezo_forward_only_matches_eager_mezo(export_cache, method, monkeypatch):
    """MeZO: the eval graph on ORT's weights, perturbed in numpy, against the methods' eager
    MeZOTrainer given the same seeds and z (numpy's) and the backend's constant lr. The
    losses agree to float32 forward rounding (~1e-6 relative); 1e-4 bounds it with headroom,
    while one wrong sign, eps or lr moves them by > 1e-3. lr 1e-4: at the default 1e-3 the
    tiny model's MeZO loss climbs after 6 steps and that chaos amplifies the rounding."""
    from edgebench.backends.numpy_updates import z_chunks
    from edgebench.methods import optim, parse_method
    from edgebench.methods.mezo import MeZOTrainer

    result = _export(method)
    assert result.manifest["program"] == "forward-only"
    assert set(result.manifest["files"]) == {"eval_model.onnx", "checkpoint"}
    lr = 1e-4
    backend = _backend(result, method, lr)
    assert backend.module is None  # no training session, no gradient buffers
    model = _eager(result)
    order = list(backend.named_parameters())  # the backend's z index per parameter
    names = {id(p): n for n, p in model.named_parameters()}

    class SharedZ(MeZOTrainer):
        def _z_chunks(self, seed, index, param):
            for part, z in z_chunks(seed, order.index(names[id(param)]), param.numel()):
                yield part, torch.from_numpy(z)

    monkeypatch.setattr(optim, "lr_factor", lambda step, total: 1.0)  # the backend's constant lr
    trainer = SharedZ(parse_method(method), model, lr, STEPS)
    seeds = np.random.default_rng(0)  # RunSpec.seed, as the backend draws them
    ort_losses, eager_losses = [], []
    for batch in _batches(result)[1:]:
        ort_losses.append(backend.step(batch))
        seed = int(seeds.integers(0, 2**31 - 1))
        model.eval()
        projected, loss = trainer.estimate(to_torch(batch), seed)
        trainer._add(seed, -lr * projected)
        eager_losses.append(loss)
    np.testing.assert_allclose(ort_losses, eager_losses, rtol=1e-4)
    assert abs(backend.mezo.projected_grad) > 0
    eager = dict(model.named_parameters())
    for name, value in backend.named_parameters().items():
        np.testing.assert_allclose(value, eager[name].detach().numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_numpy_mezo_restores_weights_bitwise():
    from edgebench.backends.numpy_updates import NumpyMeZO

    rng = np.random.default_rng(1)
    weights = [rng.normal(0, 0.02, size=(300, 70)).astype(np.float32), rng.normal(size=5).astype(np.float32)]
    before = [w.copy() for w in weights]
    mezo = NumpyMeZO(weights, lr=0.1)
    seen = []
    mezo.estimate(lambda: seen.append(weights[0].copy()) or float(weights[0].sum()), seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(weights, before))  # bitwise
    assert not np.array_equal(seen[0], before[0]) and not np.array_equal(seen[0], seen[1])  # it perturbed


def test_sgd_runs_without_an_optimizer_graph_and_adam_in_torch_mode(export_cache):
    """SGD: no optimizer graph (ORT's would hold a dead moment per weight); AdamW's graph in
    torch.optim.AdamW's mode; the eval graph is not loaded by backprop runs."""
    import onnx

    sgd, adam = _export("sgd"), _export("adam")
    assert "optimizer_model.onnx" not in sgd.manifest["files"]
    assert "eval_model.onnx" not in sgd.manifest["files"]
    node = next(n for n in onnx.load(adam.directory / "optimizer_model.onnx").graph.node
                if n.op_type == "AdamWOptimizer")
    assert {a.name: a.i for a in node.attribute}["adam_mode"] == 0
    assert adam.manifest["weight_decay"] == 0.0 and adam.manifest["optimizer"] == "adamw"
    assert sgd.manifest["lowering"]["session_options"]["enable_cpu_mem_arena"] is False
    # The tied embedding / LM head gradient: two parts added into its buffer one by one.
    graph = onnx.load(sgd.directory / "training_model.onnx").graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    accumulators = [n for n in graph.node if n.op_type == "InPlaceAccumulatorV2"]
    assert not [n for n in accumulators if producer.get(n.input[1]) == "Sum"]
    assert [n for n in accumulators if n.input[0] == "decoder.token_embedding.weight_grad.accumulation.buffer"]


def test_backend_runs_without_torch(export_cache):
    """The device process: set up and stepped from numpy (SGD and MeZO), torch never imported."""
    programs = {m: str(_export(m).directory) for m in ("sgd", "mezo")}
    model = _export("sgd").manifest["model"]
    script = f"""
import sys, json, types
from edgebench.runner.spec import RunSpec
from edgebench.backends import create
from edgebench.data.synthetic import synthetic_batches
cfg = types.SimpleNamespace(lm_vocab_size={model['lm_vocab_size']}, vit_img_size={model['vit_img_size']})
losses = {{}}
for method, program in {programs!r}.items():
    spec = RunSpec(model="tiny", method=method, backend="onnxruntime", text_length={TEXT}, program=program)
    batches = synthetic_batches(cfg, 1, {TEXT}, 0)
    backend = create(spec)
    backend.setup(spec, next(batches))
    losses[method] = [backend.step(next(batches)) for _ in range(3)]
print(json.dumps({{"torch": "torch" in sys.modules, "losses": losses}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["torch"] is False
    assert all(np.isfinite(v).all() and len(v) == 3 for v in report["losses"].values())


@pytest.mark.parametrize("method,why", [
    ("adamw-ckpt", "YieldOp"),
    ("sgd-momentum", "SGD and AdamW"),
    ("adamw-bf16", "float32 only"),
    ("qlora", "float32 only"),
    ("forward-grad", "--backend eager"),
])
def test_what_ort_cannot_express_is_refused_early(method, why):
    stages = []
    with pytest.raises(ExportRefused, match=why):
        export(ExportRequest(model="tiny", method=method, backend="onnxruntime"), on_stage=stages.append)
    assert stages == []


def test_at_least_eight_presets_run_on_onnxruntime():
    rows = _methods_json()
    expected = {"sgd", "adam", "adamw", "freeze-vision", "bitfit", "lora", "mezo", "mezo-lora"}
    assert expected <= {name for name, row in rows.items() if "onnxruntime" in row["backends"]}
    for refused in ("adamw-ckpt", "lomo", "galore", "forward-grad", "qlora"):
        assert "onnxruntime" not in rows[refused]["backends"] and rows[refused]["refused"]["onnxruntime"]


def _methods_json() -> dict:
    """`edgebench methods --json` as a user reads it: {preset: row}."""
    from click.testing import CliRunner

    from edgebench.cli.methods import methods_command

    out = CliRunner().invoke(methods_command, ["--json"])
    assert out.exit_code == 0, out.output
    return {row["name"]: row for row in json.loads(out.output)}


def test_backend_refuses_a_program_made_for_another_method(export_cache):
    result = _export("sgd")
    spec = RunSpec(model="tiny", method="lora", backend="onnxruntime", text_length=TEXT,
                   program=str(result.directory))
    with pytest.raises((ValueError, UnsupportedBackend), match="exported for method"):
        create(spec).setup(spec, _batches(result, 1)[0])


def test_ort_recompute_finds_nothing_to_recompute_in_training_artifacts(export_cache, tmp_path):
    """Why adamw-ckpt / lora-ckpt are refused on onnxruntime: asked to recompute everything it
    can, ORT 1.19's MemoryOptimizer leaves the artifacts' training graph unchanged."""
    import onnx

    from edgebench.backends.onnxruntime import session_options, training_api

    result = _export("sgd")
    config = tmp_path / "recompute.json"
    config.write_text('["Gelu+:1:-1", "FusedMatMul+:1:-1", "Softmax+:1:-1"]')
    options = session_options()
    options.add_session_config_entry("optimization.memory_optimizer_config", str(config))
    options.add_session_config_entry("optimization.enable_memory_probe_recompute_config", "1:1")
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    api = training_api()
    state = api.CheckpointState.load_checkpoint(str(result.directory / "checkpoint"))
    api.Module(str(result.directory / "training_model.onnx"), state, None, session_options=options)
    nodes = onnx.load(tmp_path / "optimized.onnx").graph.node
    assert len(nodes) > 100 and not [n for n in nodes if n.name.endswith("_recompute")]
