"""Methods: knob parsing, refusals, exact parameter counts, optimizer state sizes, MeZO's
bitwise restore, CG's line search, the memory model's shape, and the two CLI commands."""

from __future__ import annotations

import json

import pytest
import torch

from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import PRESETS, MethodError, make_trainer, memory, parse_method
from edgebench.model import build_model, get_config

ISSUE_PRESETS = {
    "sgd", "sgd-momentum", "adam", "adamw", "adamw-ckpt", "adamw-accum4", "adamw-bf16", "adafactor",
    "adamw-8bit", "adamw-4bit", "galore", "lomo", "adalomo", "fused-adamw", "lora", "lora-ckpt",
    "qlora", "freeze-vision", "bitfit", "mezo", "mezo-lora", "forward-grad", "cg",
}


def _batch(batch_size: int = 4, text_length: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    return to_torch(next(synthetic_batches(get_config("tiny"), batch_size, text_length, seed)))


def _tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("tiny")


def test_every_issue_preset_exists_and_parses():
    assert ISSUE_PRESETS <= set(PRESETS)
    for name in PRESETS:
        assert parse_method(name).name == name


def test_combination_merges_knobs():
    m = parse_method("lora+ckpt+bf16")
    assert (m.trainable, m.checkpointing, m.precision, m.optimizer) == ("lora", True, "bf16", "adamw")
    assert parse_method("adamw+accum4").accumulation == 4
    assert parse_method("mezo-lora+frozen-int8").frozen_dtype == "int8"


@pytest.mark.parametrize("text, reason", [
    ("mezo+ckpt", "nothing to checkpoint"),
    ("lomo+accum4", "cannot accumulate"),
    ("forward-grad+fused", "no backward pass"),
    ("sgd+adamw", "sets optimizer"),
    ("adamw+frozen-int8", "nothing is frozen"),
    ("lora+warp", "unknown method part"),
    ("adamww", "unknown method part 'adamww': did you mean 'adamw'?"),
    ("lora+", "empty method part"),
])
def test_impossible_combinations_are_refused_with_reason(text, reason):
    with pytest.raises(MethodError, match=reason):
        parse_method(text)


def _lora_count_from_config(cfg, r: int = 8) -> int:
    dv, iv, dl, il = cfg.vit_hidden_dim, cfg.vit_inter_dim, cfg.lm_hidden_dim, cfg.lm_inter_dim
    kv = dl // cfg.lm_n_heads * cfg.lm_n_kv_heads
    vit_block = (dv + 3 * dv) + (dv + dv) + (dv + iv) + (iv + dv)
    lm_block = 2 * dl + (dl + kv) * 2 + 2 * dl + 2 * (dl + il) + (il + dl)
    projector = dv * cfg.mp_pixel_shuffle_factor**2 + dl
    return r * (cfg.vit_n_blocks * vit_block + cfg.lm_n_blocks * lm_block + projector)


def test_lora_trainable_parameter_count_is_exact():
    trainer = make_trainer("lora", _tiny())
    counted = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    expected = _lora_count_from_config(get_config("tiny"))
    assert counted == expected
    assert memory.predict("tiny", "lora", 1, 16)["trainable_params"] == expected
    assert memory.predict("nanovlm-222m", "lora", 1, 16)["trainable_params"] == \
        _lora_count_from_config(get_config("nanovlm-222m"))


def test_freeze_vision_computes_no_vision_gradients():
    trainer = make_trainer("freeze-vision", _tiny())
    calls = {"vision": 0, "rest": 0}
    for name, param in trainer.model.named_parameters():
        part = "vision" if name.startswith("vision_encoder.") else "rest"
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p, part=part: calls.__setitem__(part, calls[part] + 1))
    trainer.step(_batch())
    assert calls["vision"] == 0 and calls["rest"] > 0
    assert all(p.grad is None and not p.requires_grad
               for n, p in trainer.model.named_parameters() if n.startswith("vision_encoder."))


def _lora_decoder_count_from_config(cfg, r: int = 8) -> int:
    dv, dl, il = cfg.vit_hidden_dim, cfg.lm_hidden_dim, cfg.lm_inter_dim
    kv = dl // cfg.lm_n_heads * cfg.lm_n_kv_heads
    lm_block = 2 * dl + (dl + kv) * 2 + 2 * dl + 2 * (dl + il) + (il + dl)
    return r * (cfg.lm_n_blocks * lm_block + dv * cfg.mp_pixel_shuffle_factor**2 + dl)


@pytest.mark.parametrize("text", ["lora-decoder", "lora-decoder+frozen-int4+ckpt"])
def test_lora_decoder_adapts_the_decoder_and_projector_only(text):
    trainer = make_trainer(text, _tiny())
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n and n.startswith(("decoder.blocks.", "MP.")) for n in trained)
    assert not any(".lora_" in n for n, _ in trainer.model.vision_encoder.named_parameters())
    expected = _lora_decoder_count_from_config(get_config("tiny"))
    assert sum(p.numel() for n, p in trainer.model.named_parameters() if p.requires_grad) == expected
    assert memory.predict("tiny", text, 1, 16)["trainable_params"] == expected
    before = trainer.loss(_batch()).item()
    for _ in range(3):
        trainer.step(_batch())
    assert trainer.loss(_batch()).item() < before
    m = parse_method(text)
    assert m.adapts and m.vision_frozen and not parse_method("lora").vision_frozen
    # LoRA's lrs; the encoder runs forward only, so the model predicts less than LoRA everywhere
    lora = text.replace("lora-decoder", "lora")
    assert trainer.lr == make_trainer(lora, _tiny()).lr
    peaks = [memory.predict("nanovlm-460m", m, 1, 32)["peak_bytes"] for m in (text, lora)]
    assert peaks[0] < peaks[1]


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors, looking inside tensor subclasses (torchao)."""
    def size(t: torch.Tensor) -> int:
        if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            return sum(size(getattr(t, n)) for n in names)
        return t.numel() * t.element_size()

    return sum(size(v) for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor) and v.numel() > 1)


def test_8bit_adamw_state_is_about_a_quarter_of_fp32():
    batch = _batch()
    full = make_trainer("adamw", _tiny())
    full.step(batch)
    low = make_trainer("adamw-8bit", _tiny())
    low.step(batch)
    ratio = _state_bytes(low.optimizer) / _state_bytes(full.optimizer)
    assert 0.2 <= ratio <= 0.35, ratio
    predicted = (memory.predict("tiny", "adamw-8bit", 4, 16)["optimizer_state_bytes"]
                 / memory.predict("tiny", "adamw", 4, 16)["optimizer_state_bytes"])
    assert abs(predicted - ratio) < 0.05


def test_mezo_restores_weights_bitwise_after_perturbations():
    trainer = make_trainer("mezo", _tiny())
    batch = _batch()
    for seed in (1, 2, 3):
        before = [p.detach().clone() for p in trainer.params]
        grad, _ = trainer.estimate(batch, seed)
        assert grad != 0.0
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.params))
    before = [p.detach().clone() for p in trainer.params]
    trainer.step(batch)  # the update itself does change them
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.params))


def test_mezo_keeps_one_merged_restore_record_per_weight():
    """Weights larger than a chunk: each weight's chunk records become one record (kept apart,
    they pin heap holes between the chunks' temporaries), and undo restores bitwise."""
    from edgebench.methods.mezo import CHUNK

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1000, CHUNK // 1000 + 100), torch.nn.Linear(10, 10))
    trainer = make_trainer("mezo", model)
    before = [p.detach().clone() for p in trainer.params]
    record = []
    trainer._add(7, 1e-3, record)
    weights = [flat.data_ptr() for flat, _, _ in record]  # a weight with no fix-up has no record
    assert len(weights) == len(set(weights)) and set(weights) <= {p.data_ptr() for p in trainer.params}
    assert trainer.params[0].data_ptr() in weights
    assert any(int(indices.max()) >= CHUNK for _, indices, _ in record)  # offsets past the first chunk
    trainer._undo(7, 1e-3, record)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params))


def test_cg_line_search_never_accepts_a_loss_raising_step():
    trainer = make_trainer("cg", _tiny(), lr=50.0)  # first trials far too long: must backtrack
    backtracked = False
    for seed in range(6):
        batch = _batch(seed=seed)
        loss_before = trainer.step(batch)
        with torch.no_grad():
            loss_after = trainer.loss(batch).item()
        search = trainer.last_search
        assert loss_after <= loss_before + 1e-5
        if search["loss_after"] is not None:
            assert search["loss_after"] < loss_before
        backtracked |= search["trials"] > 1
    assert backtracked


def test_predict_labels_estimates_and_orders_methods():
    adamw = memory.predict("nanovlm-222m", "adamw", 1, 32)
    assert adamw["estimate"] is True
    assert all(k.endswith("_bytes") for k, v in adamw.items() if isinstance(v, int) and k.endswith("bytes"))
    assert adamw["weights_bytes"] == 4 * 222_081_600  # nanoVLM v0.1, tied weight once
    assert adamw["optimizer_state_bytes"] == 2 * adamw["weights_bytes"]
    ckpt = memory.predict("nanovlm-222m", "adamw-ckpt", 1, 32)
    assert ckpt["activations_bytes"] < adamw["activations_bytes"] / 5
    assert memory.predict("nanovlm-222m", "adamw-8bit", 1, 32)["optimizer_state_bytes"] < \
        0.3 * adamw["optimizer_state_bytes"]
    assert memory.predict("nanovlm-222m", "mezo", 1, 32)["gradients_bytes"] == 0
    assert memory.predict("nanovlm-222m", "qlora", 1, 32)["weights_bytes"] < 0.35 * adamw["weights_bytes"]
    # the step's batch: nanovlm-460m's 17 views of 512 px in fp32 (main's image splitting)
    assert memory.predict("nanovlm-460m", "mezo-lora", 1, 32)["batch_bytes"] >= 17 * 3 * 512 * 512 * 4


@pytest.mark.parametrize("method", ["qlora4", "lora-decoder+frozen-int4", "freeze-vision+frozen-int4"])
def test_predicted_weights_are_the_streamed_builds_bytes(method):
    # int4 packs every frozen linear and, where it is frozen, the embedding the head shares
    from edgebench.methods.streaming import build_streamed

    model = build_streamed(parse_method(method), get_config("tiny"))
    tensors = {t.untyped_storage().data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    made = sum(t.numel() * t.element_size() for t in tensors.values())
    rotary = model.decoder.rotary_embd.inv_freq.nbytes  # a buffer the model counts nowhere
    assert memory.predict("tiny", method, 1, 16)["weights_bytes"] == made - rotary


def test_methods_and_predict_commands():
    from click.testing import CliRunner

    from edgebench.cli.methods import methods_command, predict_command

    listed = json.loads(CliRunner().invoke(methods_command, ["--json"]).output)
    assert {row["name"] for row in listed} == set(PRESETS)
    assert all("eager" in row["backends"] for row in listed)
    result = CliRunner().invoke(predict_command, ["--ram-bytes", str(2**30), "--model", "nanovlm-222m",
                                                  "--method", "adamw", "--json"])
    out = json.loads(result.output)
    assert out["fits_est"] is False and out["peak_bytes"] > 2**30
    refused = CliRunner().invoke(predict_command, ["--ram-bytes", "1", "--method", "mezo+ckpt"])
    assert refused.exit_code != 0 and "nothing to checkpoint" in refused.output


@pytest.mark.parametrize("text", ["sgd", "fused-adamw", "lomo", "all+bf16-weights+sr", "adamw-accum4", "cg",
                                  "mezo", "forward-grad"])
def test_a_given_batch_loses_its_images_exactly_when_the_method_reads_it_once(text):
    # The memory model leaves the pixels out of backward where Method.reads_batch_once says so.
    method = parse_method(text)
    trainer = make_trainer(method, _tiny(), total_steps=2)
    kept, given = _batch(), _batch()
    trainer.step(kept)
    trainer.step(given, consume=True)
    assert "images" in kept
    assert ("images" not in given) == method.reads_batch_once


def test_the_eager_backend_empties_a_batch_it_is_given():
    from edgebench.backends.eager import EagerBackend
    from edgebench.runner.spec import RunSpec

    spec = RunSpec(model="tiny", method="sgd", batch_size=2, text_length=16, steps=2, warmup_steps=0)
    batches = synthetic_batches(get_config("tiny"), 2, 16, 0)
    backend = EagerBackend()
    backend.setup(spec, next(batches))
    kept, given = next(batches), next(batches)
    backend.step(kept)
    backend.step(given, consume=True)
    assert set(kept) == {"input_ids", "labels", "attention_mask", "images"} and given == {}
