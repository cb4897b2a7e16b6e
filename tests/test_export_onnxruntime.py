"""The ONNX Runtime exporter and backend, proven equal to eager torch on the tiny model.

Each method runs through the real backend (`create(spec)`: the artifacts in ORT's training
API, the backend's own update) and through eager's own trainer (methods.trainer's
BackpropTrainer: global-norm clip, nanoVLM's lr groups, warmup + cosine schedule, torch.optim)
from the same initial weights and batches. Exports are made once per session, in a session
cache. The nanovlm-222m parity test is marked slow (its exports take about a minute).
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from conftest import checkpoint_lr
from edgebench.backends import UnsupportedBackend, create
from edgebench.backends.program import program_lr
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import optim, optimizers, parse_method
from edgebench.runner.spec import RunSpec
from exporters.manifest import ExportRequest
from exporters.pipeline import ExportRefused, build_training_model, export

TEXT = 12  # short text keeps every export small (the synthetic task needs 11 tokens)
STEPS = 10
KEYS = ("input_ids", "images", "labels", "attention_mask")  # the model's inputs


def _export(method: str, model: str = "tiny", text: int = TEXT):
    return export(ExportRequest(model=model, method=method, backend="onnxruntime", text_length=text))


def _batches(result, n: int = STEPS + 1) -> list[dict]:
    model, text = result.manifest["model"], result.manifest["request"]["text_length"]
    cfg = types.SimpleNamespace(lm_vocab_size=model["lm_vocab_size"], vit_img_size=model["vit_img_size"])
    return [b for b, _ in zip(synthetic_batches(cfg, 1, text, 0), range(n))]


def _backend(result, method: str, lr: float | None = None, total_steps: int = STEPS,
             weight_decay: float | None = None):
    """The backend as a run sets it up, its schedule `total_steps` long (warmup_steps + steps)."""
    request = result.manifest["request"]
    spec = RunSpec(model=request["model"], method=method, backend="onnxruntime", text_length=request["text_length"],
                   program=str(result.directory), lr=lr, warmup_steps=0, steps=total_steps,
                   weight_decay=weight_decay)
    backend = create(spec)
    backend.setup(spec, _batches(result, 1)[0])
    return backend


def _lr(result, method: str, lr: float | None) -> float:
    """The backbone lr the backend runs at (a fresh tiny model's default when `lr` is None)."""
    return program_lr(lr, parse_method(method), result.manifest, fresh_weights=True)


def _eager(result):
    """The model (peft LoRA where the method has it) the export was made from: same seed,
    build and trainable subset, so the same initial weights."""
    model, _, _ = build_training_model(ExportRequest.from_dict(result.manifest["request"]))
    return model


def _parity(result, method: str, lr: float | None, total_steps: int, steps: int, monkeypatch,
            weight_decay: float | None = None):
    """(ORT losses, eager losses, eager's global gradient norms before the clip, backend, eager model):
    `steps` steps of the backend, then of eager's BackpropTrainer, on the same batches (one
    after the other: ORT's threads still spinning after a call would slow torch's down)."""
    from edgebench.methods.trainer import BackpropTrainer

    batches = _batches(result, steps + 1)[1:]
    backend = _backend(result, method, lr, total_steps, weight_decay)
    ort_losses = [backend.step(batch) for batch in batches]
    model = _eager(result)
    trainer = BackpropTrainer(parse_method(method), model, _lr(result, method, lr), total_steps, weight_decay)
    norms: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(*args, **kwargs):
        norms.append(float(clip(*args, **kwargs)))
        return norms[-1]

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    eager_losses = [trainer.step(to_torch(batch)) for batch in batches]
    return np.array(ort_losses), np.array(eager_losses), norms, backend, model


# Tolerance: measured within 1.7e-6 relative of eager over 10 steps for every case here
# (float32 kernels summing in another order; SGD at its default lr is the loosest). 1e-5
# leaves headroom and is far below what the recipe's parts move: without the lr groups or the
# schedule the losses left eager's by 2e-2..7e-2 relative within these steps (the code before
# issue 29), so a wrong update, lr, group, schedule step, clip or weight decay fails.
RTOL = 1e-5
# The trained tensors after those steps, each as a whole: measured within 1.6e-4 relative
# (bitfit: small bias vectors that start at zero, where a few of Adam's elements with a ~0
# gradient take either sign of a full step, as rounding decides); a wrong lr, group or
# schedule step moves a tensor by > 1e-2.
WEIGHTS_RTOL = 1e-3
# (method, lr, schedule length): the recipe's optimizers with distinct lr groups (SGD's
# default 5e-2 is above the projector's 5.12e-3, so the groups would coincide: 2e-3 here),
# with warmup (100 steps: 3 warmup steps, 1/3 and 2/3 of the peak) and with most of a cosine
# (10 steps: warmup 1); then the other trainable subsets at a checkpoint's default lrs
# (conftest.checkpoint_lr).
RECIPE = [(m, lr, total) for m, lr in (("sgd", 2e-3), ("adam", None), ("adamw", None)) for total in (100, STEPS)]
SUBSETS = [(m, checkpoint_lr(m), 100) for m in ("sgd", "freeze-vision", "bitfit", "lora", "lora+last1")]


@pytest.mark.parametrize("method,lr,total_steps", RECIPE + SUBSETS)
def test_backprop_method_follows_eagers_recipe(export_cache, monkeypatch, method, lr, total_steps):
    result = _export(method)
    manifest = result.manifest
    ort, eager, norms, backend, model = _parity(result, method, lr, total_steps, STEPS, monkeypatch)
    # what is being checked is really in play: the clip cut every step's gradients, the lr moved
    assert min(norms) > optim.MAX_GRAD_NORM
    assert len({optim.lr_factor(s, total_steps) for s in range(STEPS)}) > 2
    if (method, lr, total_steps) in RECIPE:
        groups = optim.lr_groups(manifest["trainable_parameters"], _lr(result, method, lr))
        assert len({peak for _, peak, _ in groups}) == 2, groups
    np.testing.assert_allclose(ort, eager, rtol=RTOL)
    trained = backend.named_parameters()
    eager_params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert set(trained) == set(eager_params) == set(manifest["trainable_parameters"])
    for name, value in trained.items():
        expected = eager_params[name].detach().numpy()
        assert np.linalg.norm(value - expected) <= WEIGHTS_RTOL * np.linalg.norm(expected), name


# --weight-decay (issue 70) in the numpy update against eager's torch.optim: L2 for SGD and Adam
# (into the gradient after the clip, so into Adam's moments), AdamW's decoupled decay at a
# non-default value. wd 1: without it eager's losses move by more than 100x RTOL in these steps.
# The weights are compared too, but Adam's with L2: the attention's key bias has no gradient
# (softmax ignores it) but rounding's, and once L2 gives it one above Adam's eps each element
# takes full steps of the sign rounding chose, in either runtime (measured: 0.53 apart, the
# losses within RTOL, as the bias moves no loss).
@pytest.mark.parametrize("method", ["sgd", "adam", "adamw"])
def test_weight_decay_follows_eagers_torch_optim(export_cache, monkeypatch, method):
    result = _export(method)
    ort, eager, _, backend, model = _parity(result, method, None, STEPS, STEPS, monkeypatch, weight_decay=1.0)
    np.testing.assert_allclose(ort, eager, rtol=RTOL)
    eager_params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for name, value in backend.named_parameters().items() if method != "adam" else ():
        expected = eager_params[name].detach().numpy()
        assert np.linalg.norm(value - expected) <= WEIGHTS_RTOL * np.linalg.norm(expected), name
    undecayed = _parity(result, method, None, STEPS, STEPS, monkeypatch, weight_decay=0.0)[1]
    assert np.max(np.abs(undecayed - eager) / eager) > 100 * RTOL


# nanovlm-222m: SGD's lr for a checkpoint (5e-2) moves its loss by ~10% a step, and float32 rounding
# grows with it: measured 9.5e-6 relative over 6 steps (AdamW 1.3e-6). 5e-5 stays 70x below
# the smaller of the drifts this test is for (3.7e-3).
RTOL_222M = 5e-5


@pytest.mark.large
@pytest.mark.parametrize("method", ["sgd", "adamw"])
def test_nanovlm_222m_follows_eagers_recipe(export_cache, monkeypatch, method):
    """Issue 29's drifts, where they were seen: on nanovlm-222m (random init) ORT's AdamW
    losses left eager's at the second step (the projector's lr group) and its SGD losses at
    the fourth (the cosine schedule). Five steps of a five-step schedule have both parts in
    play, and the clip (222m's gradient norms are 19-73). SGD and AdamW share one export
    (about a minute); the reduced form and EDGEBENCH_FULL=1 are the same."""
    result = _export(method, model="nanovlm-222m", text=TEXT)
    ort, eager, norms, backend, model = _parity(result, method, checkpoint_lr(method), 5, 5, monkeypatch)
    assert min(norms) > optim.MAX_GRAD_NORM
    np.testing.assert_allclose(ort, eager, rtol=RTOL_222M)


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
def test_mezo_forward_only_matches_eager_mezo(export_cache, method):
    """MeZO: the eval graph on ORT's weights, perturbed in numpy, against the methods' eager
    MeZOTrainer given the same seeds and z (numpy's), both on the schedule. The
    losses agree to float32 forward rounding (~1e-6 relative); 1e-4 bounds it with headroom,
    while one wrong sign, eps or lr moves them by > 1e-3. lr 1e-4: at the default 1e-3 the
    tiny model's MeZO loss climbs after 6 steps and that chaos amplifies the rounding."""
    from edgebench.backends.numpy_updates import z_chunks
    from edgebench.methods.mezo import MeZOTrainer

    result = _export(method)
    assert result.manifest["program"] == "forward-only"
    assert set(result.manifest["files"]) == {"eval_model.onnx", "parameters.safetensors"}
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

    trainer = SharedZ(parse_method(method), model, lr, STEPS)
    seeds = np.random.default_rng(0)  # RunSpec.seed, as the backend draws them
    ort_losses, eager_losses = [], []
    for step, batch in enumerate(_batches(result)[1:]):
        ort_losses.append(backend.step(batch))
        seed = int(seeds.integers(0, 2**31 - 1))
        model.eval()
        projected, loss = trainer.estimate(to_torch(batch), seed)
        trainer._add(seed, -(lr * optim.lr_factor(step, STEPS)) * projected)  # MeZOTrainer.step's update
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


def test_numpy_mezo_takes_sgds_l2_decay_as_eagers_mezo():
    """--weight-decay on MeZO: the same estimate, and every weight also moves by -lr * wd * w
    (edgebench.methods.mezo's step, MeZO's code)."""
    from edgebench.backends.numpy_updates import NumpyMeZO

    start = np.random.default_rng(1).normal(size=(40, 30)).astype(np.float32)
    moved = {}
    for weight_decay in (0.0, 0.5):
        weight = start.copy()
        NumpyMeZO([weight], lr=0.1, weight_decay=weight_decay).step(lambda w=weight: float((w ** 2).sum()))
        moved[weight_decay] = weight - start
    np.testing.assert_allclose(moved[0.5] - moved[0.0], -0.1 * 0.5 * start, rtol=1e-4, atol=1e-6)


def test_numpy_mezo_steps_alike_on_one_thread_and_two():
    """Each chunk of z has its own stream, so the threads' order changes nothing: bitwise."""
    from edgebench.backends.numpy_updates import CHUNK, NumpyMeZO

    rng = np.random.default_rng(2)
    start = [rng.normal(0, 0.02, size=CHUNK + 4099).astype(np.float32), rng.normal(size=7).astype(np.float32)]
    after = []
    for threads in (1, 2):
        weights = [w.copy() for w in start]
        mezo = NumpyMeZO(weights, lr=0.1, threads=threads)
        losses = [mezo.step(lambda w=weights: float(w[0][::997].sum() + w[1].sum())) for _ in range(2)]
        after.append((weights, losses))
    assert after[0][1] == after[1][1]
    assert all(np.array_equal(a, b) for a, b in zip(after[0][0], after[1][0]))
    assert not np.array_equal(after[0][0][0], start[0])  # it trained


def test_no_optimizer_graph_and_one_set_of_artifacts_for_every_update(export_cache):
    """SGD, Adam and AdamW: no optimizer graph (its one lr cannot give nanoVLM's projector its
    own; ORT's SGD would hold a dead moment per weight), so their artifacts are one set, exported
    once and linked into each export; the eval graph is not loaded by backprop runs."""
    import onnx

    sgd, adam, adamw = _export("sgd"), _export("adam"), _export("adamw")
    for result in (sgd, adam, adamw):
        assert set(result.manifest["files"]) == {"training_model.onnx", "nominal_checkpoint", "parameters.safetensors"}
    weights = "parameters.safetensors"
    assert len({r.manifest["files"][weights]["sha256"] for r in (sgd, adam, adamw)}) == 1
    assert (sgd.directory / weights).stat().st_ino == (adamw.directory / weights).stat().st_ino
    assert [r.manifest["optimizer"] for r in (sgd, adam, adamw)] == ["sgd", "adam", "adamw"]
    assert [r.manifest["weight_decay"] for r in (sgd, adam, adamw)] == [0.0, 0.0, optimizers.ADAMW_WEIGHT_DECAY]
    assert "torch.optim.AdamW's update in numpy" in adamw.manifest["lowering"]["optimizer"]
    assert sgd.manifest["lowering"]["session_options"]["enable_cpu_mem_arena"] is False
    # The tied embedding / LM head gradient: two parts added into its buffer one by one.
    graph = onnx.load(sgd.directory / "training_model.onnx").graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    accumulators = [n for n in graph.node if n.op_type == "InPlaceAccumulatorV2"]
    assert not [n for n in accumulators if producer.get(n.input[1]) == "Sum"]
    assert [n for n in accumulators if n.input[0] == "decoder.token_embedding.weight_grad.accumulation.buffer"]


def test_backend_runs_without_torch(export_cache):
    """The device process: set up and stepped from numpy (SGD, AdamW and MeZO: the recipe's
    functions come from edgebench.methods.optim, which imports no torch), torch never imported."""
    programs = {m: str(_export(m).directory) for m in ("sgd", "adamw", "mezo")}
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


@pytest.mark.parametrize("method", ["bitfit", "mezo-lora"])
def test_weights_load_without_a_second_copy(export_cache, method):
    """The kernel's own peak (VmHWM, reset at each phase through clear_refs) over the backend's
    weights phase, in a fresh process: the weights once, where ORT's checkpoint load held its
    file and the weights together (2x)."""
    result = _export(method)
    model = result.manifest["model"]
    weights = (result.directory / "parameters.safetensors").stat().st_size
    script = f"""
import json, sys, types
from edgebench.runner.spec import RunSpec
from edgebench.backends import create
from edgebench.data.synthetic import synthetic_batches

def memory():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM")))
    return {{k: int(v.split()[0]) * 1024 for k, v in fields.items()}}

phases = []

def record(name):
    phases.append((name, memory()))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak starts again from here

cfg = types.SimpleNamespace(lm_vocab_size={model['lm_vocab_size']}, vit_img_size={model['vit_img_size']})
spec = RunSpec(model="tiny", method="{method}", backend="onnxruntime", text_length={TEXT},
               program="{result.directory}")
create(spec).setup(spec, next(synthetic_batches(cfg, 1, {TEXT}, 0)), on_phase=record)
print(json.dumps(phases))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    phases = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    before, after = ((phases["training session"], phases["weights + gradient buffers"]) if method == "bitfit"
                     else (phases["onnxruntime imported"], phases["weights"]))
    grown = after["VmHWM"] - before["VmRSS"]
    assert weights * 0.9 < grown < weights * 1.4, (grown, weights)


def test_a_weights_file_that_does_not_fit_is_refused(tmp_path):
    from safetensors.numpy import save_file

    from edgebench.backends.onnxruntime import read_parameters

    path = tmp_path / "parameters.safetensors"
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float16)}, str(path))
    with pytest.raises(ValueError, match="b is F16"):
        read_parameters(path)
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(path))
    assert read_parameters(path)["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match=r"a is F32 \[2, 3\]; its buffer is float32 \[3, 2\]"):
        read_parameters(path, {"a": np.zeros((3, 2), np.float32)})
    with pytest.raises(ValueError, match=r"lacks 1 weight\(s\) the program has, e.g. \['b'\]"):
        read_parameters(path, {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.float32)})
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="a is cut short"):
        read_parameters(path)


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
    state = api.CheckpointState.load_checkpoint(str(result.directory / "nominal_checkpoint"))
    api.Module(str(result.directory / "training_model.onnx"), state, None, session_options=options)
    nodes = onnx.load(tmp_path / "optimized.onnx").graph.node
    assert len(nodes) > 100 and not [n for n in nodes if n.name.endswith("_recompute")]
