"""The nanoVLM model: shapes, exact sizes, nanoVLM checkpoint layout, export, `edgebench models`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from edgebench.cli.models import models_command
from edgebench.model import CONFIG_NAMES, build_model, get_config
from edgebench.model.checkpoint import CheckpointError, from_pretrained, save_pretrained
from edgebench.model.config import NANOVLM_COMMITS, ConfigError, config_from_dict, parameter_count
from edgebench.model.vision_language_model import VisionLanguageModel


def _inputs(model: VisionLanguageModel, batch: int = 2, text: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    size = model.cfg.vit_img_size
    ids = torch.randint(0, model.cfg.lm_vocab_size, (batch, text), generator=g)
    images = torch.randn(batch, 3, size, size, generator=g)
    labels = ids.clone()
    labels[:, : text // 2] = -100
    return ids, images, labels


@pytest.fixture(scope="module")
def tiny() -> VisionLanguageModel:
    torch.manual_seed(0)
    return build_model("tiny").eval()


def test_tiny_loss_is_shifted_text_cross_entropy(tiny):
    ids, images, labels = _inputs(tiny)
    logits = tiny.logits(ids, images)
    assert logits.shape == (2, tiny.n_image_tokens + 12, tiny.cfg.lm_vocab_size) and tiny.n_image_tokens == 16
    text = logits[:, tiny.n_image_tokens :]
    expected = F.cross_entropy(text[:, :-1].reshape(-1, text.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)
    loss = tiny(ids, images, labels)
    assert loss.dim() == 0 and torch.allclose(loss, expected, atol=1e-5)
    prompt_changed = labels.clone()
    prompt_changed[:, : 12 // 2] = -100  # already ignored: same loss
    assert torch.equal(tiny(ids, images, prompt_changed), loss)


def test_decoder_is_causal_and_sees_the_image(tiny):
    ids, images, _ = _inputs(tiny)
    later = ids.clone()
    later[:, -1] = (later[:, -1] + 1) % tiny.cfg.lm_vocab_size
    before, after = tiny.logits(ids, images), tiny.logits(later, images)
    assert torch.allclose(before[:, :-1], after[:, :-1], atol=1e-5)
    assert not torch.allclose(before[:, -1], after[:, -1])
    assert not torch.allclose(tiny.logits(ids, images.flip(-1))[:, -1], before[:, -1])


def test_wrong_image_size_is_refused(tiny):
    ids, images, labels = _inputs(tiny)
    with pytest.raises(ValueError, match="images must be"):
        tiny(ids, images[:, :, :32, :32], labels)


@pytest.mark.parametrize("name,count", [("nanovlm-222m", 222_081_600), ("nanovlm-460m", 460_113_984)])
def test_real_sizes_exact_on_meta(name, count):
    with torch.device("meta"):
        model = VisionLanguageModel(get_config(name))
    assert sum(p.numel() for p in model.parameters()) == count == parameter_count(model.cfg)
    assert model.decoder.head.weight is model.decoder.token_embedding.weight
    ids = torch.zeros(1, 20, dtype=torch.long, device="meta")
    size = model.cfg.vit_img_size
    images = torch.zeros(1, 3, size, size, device="meta")
    assert model.logits(ids, images).shape == (1, model.n_image_tokens + 20, model.cfg.lm_vocab_size)
    assert model(ids, images, ids).shape == ()
    # v0.1 puts its 49 image tokens before the text; main places 17 tiles x (64 + a marker) inside it.
    assert model.n_image_tokens == {"nanovlm-222m": 49, "nanovlm-460m": 0}[name]
    assert model.cfg.image_positions == {"nanovlm-222m": 49, "nanovlm-460m": 17 * 65}[name]


def test_tiny_is_small_and_untied_heads_count_twice():
    with torch.device("meta"):
        model = VisionLanguageModel(get_config("tiny"))
        untied = VisionLanguageModel(dataclasses.replace(get_config("tiny"), lm_tie_weights=False))
    n = sum(p.numel() for p in model.parameters())
    assert n == parameter_count(model.cfg) < 5_000_000
    assert sum(p.numel() for p in untied.parameters()) == parameter_count(untied.cfg) == n + 512 * 192
    assert set(CONFIG_NAMES) == {"tiny", "micro", "nanovlm-222m", "nanovlm-460m"}


def test_micro_is_tiny_at_half_its_depth():
    """What the exported-program tests lower: tiny's every part and width, fewer blocks."""
    tiny, micro = get_config("tiny").to_dict(), get_config("micro").to_dict()
    differ = {k for k in tiny if tiny[k] != micro[k]}
    assert differ == {"vit_n_blocks", "lm_n_blocks", "vit_model_type", "lm_model_type"}
    assert (micro["vit_n_blocks"] + micro["lm_n_blocks"]) * 2 == tiny["vit_n_blocks"] + tiny["lm_n_blocks"]
    with torch.device("meta"):
        model = VisionLanguageModel(get_config("micro"))
    assert sum(p.numel() for p in model.parameters()) == parameter_count(model.cfg)


def nanovlm_layout(cfg) -> dict[str, tuple[int, ...]]:
    """nanoVLM's safetensors keys and shapes, written out from its module names."""
    vh, lh, hd = cfg.vit_hidden_dim, cfg.lm_hidden_dim, cfg.lm_hidden_dim // cfg.lm_n_heads
    patches = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
    keys = {
        "vision_encoder.patch_embedding.conv.weight": (vh, 3, cfg.vit_patch_size, cfg.vit_patch_size),
        "vision_encoder.patch_embedding.conv.bias": (vh,),
        "vision_encoder.patch_embedding.position_embedding": (1, patches, vh),
        "vision_encoder.layer_norm.weight": (vh,), "vision_encoder.layer_norm.bias": (vh,),
        "MP.proj.weight": (lh, vh * cfg.mp_pixel_shuffle_factor**2),
        "decoder.head.weight": (cfg.lm_vocab_size, lh),
        "decoder.norm.weight": (lh,),
        "decoder.rotary_embd.inv_freq": (hd // 2,),
    }
    for i in range(cfg.vit_n_blocks):
        p = f"vision_encoder.blocks.{i}."
        keys.update({p + "ln1.weight": (vh,), p + "ln1.bias": (vh,), p + "ln2.weight": (vh,), p + "ln2.bias": (vh,),
                     p + "attn.qkv_proj.weight": (3 * vh, vh), p + "attn.qkv_proj.bias": (3 * vh,),
                     p + "attn.out_proj.weight": (vh, vh), p + "attn.out_proj.bias": (vh,),
                     p + "mlp.fc1.weight": (cfg.vit_inter_dim, vh), p + "mlp.fc1.bias": (cfg.vit_inter_dim,),
                     p + "mlp.fc2.weight": (vh, cfg.vit_inter_dim), p + "mlp.fc2.bias": (vh,)})
    for i in range(cfg.lm_n_blocks):
        p = f"decoder.blocks.{i}."
        kv = hd * cfg.lm_n_kv_heads
        keys.update(
            {
                p + "norm1.weight": (lh,),
                p + "norm2.weight": (lh,),
                p + "attn.q_proj.weight": (lh, lh),
                p + "attn.k_proj.weight": (kv, lh),
                p + "attn.v_proj.weight": (kv, lh),
                p + "attn.out_proj.weight": (lh, lh),
                p + "mlp.gate_proj.weight": (cfg.lm_inter_dim, lh),
                p + "mlp.up_proj.weight": (cfg.lm_inter_dim, lh),
                p + "mlp.down_proj.weight": (lh, cfg.lm_inter_dim),
            }
        )
    return keys


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_state_dict_matches_nanovlm_layout(name):
    from edgebench.model.checkpoint import expected_keys

    with torch.device("meta"):
        model = VisionLanguageModel(get_config(name))
    layout = nanovlm_layout(model.cfg)
    assert expected_keys(model) == set(layout)
    state = model.state_dict()
    assert {k: tuple(state[k].shape) for k in layout} == layout


def test_save_load_round_trip_is_identical(tiny, tmp_path):
    save_pretrained(tiny, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert "decoder.head.weight" in stored and "decoder.token_embedding.weight" not in stored
    assert "decoder.rotary_embd.inv_freq" in stored
    loaded = from_pretrained(tmp_path)
    assert loaded.decoder.head.weight is loaded.decoder.token_embedding.weight
    ids, images, labels = _inputs(tiny)
    assert torch.equal(loaded.logits(ids, images), tiny.logits(ids, images))
    assert torch.equal(loaded(ids, images, labels), tiny(ids, images, labels))


def test_untied_head_is_stored_and_loaded_separately(tmp_path):
    torch.manual_seed(2)
    model = VisionLanguageModel(dataclasses.replace(get_config("tiny"), lm_tie_weights=False))
    save_pretrained(model, tmp_path)
    assert {"decoder.head.weight", "decoder.token_embedding.weight"} <= set(
        load_file(str(tmp_path / "model.safetensors"))
    )
    loaded = from_pretrained(tmp_path)
    assert loaded.decoder.head.weight is not loaded.decoder.token_embedding.weight
    ids, images, labels = _inputs(model)
    assert torch.equal(loaded(ids, images, labels), model(ids, images, labels))


def test_renamed_key_is_refused_by_name(tiny, tmp_path):
    save_pretrained(tiny, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["MP.projection.weight"] = tensors.pop("MP.proj.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        from_pretrained(tmp_path)
    assert "missing keys: MP.proj.weight" in str(err.value)
    assert "unexpected keys: MP.projection.weight" in str(err.value)
    result = CliRunner().invoke(models_command, ["--load", str(tmp_path)])
    assert result.exit_code == 2 and "MP.projection.weight" in result.output


def test_hand_built_nanovlm_checkpoint_loads(tmp_path):
    cfg = get_config("tiny")
    g = torch.Generator().manual_seed(1)
    tensors = {k: torch.randn(shape, generator=g) for k, shape in nanovlm_layout(cfg).items()}
    # nanoVLM v0.1's config.json field set: no mp_image_token_length, has lm_eos_token_id.
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_nanovlm_dict()))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = from_pretrained(tmp_path)
    assert torch.equal(model.decoder.token_embedding.weight, tensors["decoder.head.weight"])
    assert torch.equal(model.MP.proj.weight, tensors["MP.proj.weight"])
    assert torch.equal(model.decoder.rotary_embd.inv_freq, tensors["decoder.rotary_embd.inv_freq"])
    # The tied tensor under its other name loads too.
    tensors["decoder.token_embedding.weight"] = tensors.pop("decoder.head.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert torch.equal(from_pretrained(tmp_path).decoder.head.weight, tensors["decoder.token_embedding.weight"])


def test_main_config_fields_are_read():
    main_json = get_config("nanovlm-460m").to_nanovlm_dict()
    del main_json["lm_vocab_size"]  # derived from lm_base_vocab_size + extra_token_amount
    assert config_from_dict(main_json) == get_config("nanovlm-460m")
    with pytest.raises(ConfigError, match="lm_n_experts"):
        config_from_dict({**main_json, "lm_n_experts": 8})
    with pytest.raises(ConfigError, match="vlm_extra_tokens"):
        config_from_dict({**main_json, "vlm_extra_tokens": {"image_token": "<image>"}})
    with pytest.raises(ConfigError, match="lm_base_vocab_size"):
        config_from_dict({**main_json, "lm_vocab_size": 49152})


def test_hub_id_without_huggingface_hub_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(CheckpointError) as err:
        from_pretrained("lusxvr/nanoVLM-222M")
    assert "huggingface_hub is not installed" in str(err.value)
    assert "https://huggingface.co/lusxvr/nanoVLM-222M" in str(err.value) and "pass that folder" in str(err.value)


def test_image_size_changes_fresh_model_only(tmp_path):
    model = build_model("tiny", image_size=32)
    assert model.cfg.vit_img_size == 32 and model.n_image_tokens == 4
    with pytest.raises(ConfigError, match="mp_pixel_shuffle_factor"):
        build_model("tiny", image_size=40)
    save_pretrained(model, tmp_path)
    with pytest.raises(ValueError, match="32 px"):
        build_model(str(tmp_path), image_size=64)


def test_strict_export_of_the_loss(tiny):
    ids, images, labels = _inputs(tiny, batch=2, text=8)
    exported = torch.export.export(tiny, (ids, images, labels), strict=True)
    assert "decoder.rotary_embd.inv_freq" in exported.graph_signature.buffers
    assert not any(n.target == torch.ops.aten.view_as_complex.default for n in exported.graph.nodes)
    assert torch.allclose(exported.module()(ids, images, labels), tiny(ids, images, labels), atol=1e-6)


def test_models_json_lists_exact_counts():
    result = CliRunner().invoke(models_command, ["--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert set(rows) == set(CONFIG_NAMES)
    assert rows["nanovlm-222m"]["parameters"] == 222_081_600
    assert rows["nanovlm-460m"]["parameters"] == 460_113_984
    assert rows["nanovlm-222m"]["weights_bf16_bytes"] == 2 * 222_081_600
    assert rows["tiny"]["weights_fp32_bytes"] == 4 * rows["tiny"]["parameters"]
    # the real sequence: v0.1's 49 image tokens + 32; main's 17 x (64 + a marker) + 32
    assert (rows["nanovlm-222m"]["sequence_length"], rows["nanovlm-460m"]["sequence_length"]) == (81, 1137)
    assert rows["nanovlm-460m"]["image_tiles"] == 17 and rows["nanovlm-460m"]["image_tokens"] == 64
    table = CliRunner().invoke(models_command, [])
    assert "222,081,600" in table.output and "460,113,984" in table.output and "1,137" in table.output


def test_models_command_runs_through_the_edgebench_entry_point():
    """Registered on the real `edgebench` group: run as a user does, in a fresh process."""
    out = subprocess.run([sys.executable, "-m", "edgebench.cli", "models", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r["parameters"] for r in json.loads(out.stdout)}
    assert rows["nanovlm-222m"] == 222_081_600


# ---------------------------------------------------------------- fidelity to nanoVLM (issue 15)

FIXTURES = Path(__file__).parent / "fixtures" / "nanovlm"


def _split_tiny(**changes):
    """tiny in main's layout: 128-px images cut into 2x2 tiles of 64 px plus a global view."""
    return dataclasses.replace(get_config("tiny"), image_splitting=True, max_img_size=128, extra_token_amount=66,
                               **changes).validate()


def _nanovlm_config_class(revision: str):
    """nanoVLM's VLMConfig at `revision`, rebuilt from the fixture (field names, order, defaults)."""
    fixture = json.loads((FIXTURES / f"vlmconfig-{NANOVLM_COMMITS[revision][:8]}.json").read_text())
    assert fixture["commit"] == NANOVLM_COMMITS[revision] and fixture["revision"] == revision
    return dataclasses.make_dataclass(
        "VLMConfig",
        [(k, object, dataclasses.field(default_factory=lambda v=v: v)) for k, v in fixture["defaults"].items()],
    )


@pytest.mark.parametrize("cfg,revision", [
    (get_config("tiny"), "v0.1"), (get_config("nanovlm-222m"), "v0.1"),
    (get_config("nanovlm-460m"), "main"), (_split_tiny(), "main"),
])
def test_config_json_is_exactly_the_revisions_field_set(cfg, revision):
    nanovlm = _nanovlm_config_class(revision)
    written = cfg.to_nanovlm_dict()
    assert list(written) == [f.name for f in dataclasses.fields(nanovlm)]  # the same fields, in its order
    loaded = nanovlm(**json.loads(json.dumps(written)))  # what nanoVLM's from_pretrained does
    assert dataclasses.asdict(loaded) == written
    assert config_from_dict(written) == cfg  # and back, edgebench's own field inferred from the field set


def test_save_pretrained_keeps_edgebench_facts_beside_config_json(tmp_path):
    torch.manual_seed(0)
    model = VisionLanguageModel(dataclasses.replace(_split_tiny(), image_splitting=False))
    save_pretrained(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert "image_splitting" not in written and "mp_image_token_length" not in written  # v0.1 knows neither
    _nanovlm_config_class("v0.1")(**written)
    beside = json.loads((tmp_path / "edgebench.json").read_text())
    assert beside["image_splitting"] is False and beside["extra_token_amount"] == 66  # not v0.1 fields
    assert not set(beside) & set(written)
    assert from_pretrained(tmp_path).cfg == model.cfg


def test_split_layout_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = VisionLanguageModel(_split_tiny()).eval()
    save_pretrained(model, tmp_path)
    (tmp_path / "edgebench.json").unlink()  # a nanoVLM main folder has none: its field set says main
    loaded = from_pretrained(tmp_path)
    assert loaded.cfg == model.cfg
    ids, images, labels, mask = _split_inputs(model.cfg)
    assert torch.equal(loaded(ids, images, labels, mask), model(ids, images, labels, mask))


def test_tied_embedding_takes_the_heads_draw_as_in_nanovlm():
    """nanoVLM ties the head, then initialises: the shared tensor ends with the head's draw."""
    torch.manual_seed(5)
    tied = VisionLanguageModel(get_config("tiny"))
    torch.manual_seed(5)
    untied = VisionLanguageModel(dataclasses.replace(get_config("tiny"), lm_tie_weights=False))
    assert torch.equal(tied.decoder.token_embedding.weight, untied.decoder.head.weight)
    assert not torch.equal(tied.decoder.token_embedding.weight, untied.decoder.token_embedding.weight)
    assert torch.equal(tied.MP.proj.weight, untied.MP.proj.weight)  # drawn after the decoder: same stream


def test_dropout_is_built_where_configured_and_names_stay():
    plain = VisionLanguageModel(get_config("tiny"))
    assert not any(isinstance(m, torch.nn.Dropout) for m in plain.modules())
    model = VisionLanguageModel(dataclasses.replace(get_config("tiny"), lm_dropout=0.2, vit_dropout=0.2))
    dropouts = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout)]
    # per ViT block: attention weights, attention output, MLP output; per decoder block: two; after patches: one
    assert len(dropouts) == 2 * 3 + 4 * 2 + 1 and "vision_encoder.dropout" in dropouts
    assert set(model.state_dict()) == set(plain.state_dict())  # checkpoints stay strict-compatible
    ids, images, labels = _inputs(model)
    model.train()
    assert not torch.equal(model(ids, images, labels), model(ids, images, labels))
    model.eval()
    assert torch.equal(model(ids, images, labels), model(ids, images, labels))
    with pytest.raises(ConfigError, match="dropout"):
        dataclasses.replace(get_config("tiny"), lm_dropout=1.0).validate()


def _split_inputs(cfg, batch: int = 2, pad: int = 5, seed: int = 0):
    """Left-padded rows with cfg.n_tiles images each, placeholders after a 3-token prefix."""
    g = torch.Generator().manual_seed(seed)
    image = [cfg.marker_token_id(0, 0)] + [cfg.image_token_id] * cfg.n_image_tokens
    for r in (1, 2):
        for c in (1, 2):
            image += [cfg.marker_token_id(r, c)] + [cfg.image_token_id] * cfg.n_image_tokens
    rows = []
    for _ in range(batch):
        text = torch.randint(1, 60, (12,), generator=g).tolist()
        rows.append([0] * pad + text[:3] + image + text[3:])
    ids = torch.tensor(rows)
    mask = (torch.arange(ids.size(1)) >= pad).long().expand(batch, -1).clone()
    labels = ids.clone()
    labels[:, : -4] = -100
    images = torch.rand(batch * cfg.n_tiles, 3, cfg.vit_img_size, cfg.vit_img_size, generator=g)
    return ids, images, labels, mask


def test_split_layout_puts_each_tile_at_its_placeholders():
    torch.manual_seed(0)
    model = VisionLanguageModel(_split_tiny()).eval()
    ids, images, labels, mask = _split_inputs(model.cfg)
    assert (ids == model.cfg.image_token_id).sum() == images.size(0) * model.cfg.n_image_tokens
    tokens = model.decoder.token_embedding(ids)
    expected = tokens.clone()
    expected[ids == model.cfg.image_token_id] = model.MP(model.vision_encoder(images)).reshape(-1, tokens.size(-1))
    assert torch.allclose(model._embed(ids, images), expected)  # nanoVLM's masked assignment, as a gather
    loss = model(ids, images, labels, mask)
    assert not torch.allclose(model(ids, images.flip(0), labels, mask), loss)  # the order of tiles matters


def test_left_padding_with_the_mask_changes_nothing_but_padding():
    torch.manual_seed(0)
    model = VisionLanguageModel(_split_tiny()).eval()
    ids, images, labels, mask = _split_inputs(model.cfg, batch=1, pad=0)
    unpadded = model(ids, images, labels)
    padded = lambda pad_id: (torch.cat([torch.full((1, 6), pad_id), ids], 1),  # noqa: E731
                             torch.cat([torch.full((1, 6), -100), labels], 1),
                             torch.cat([torch.zeros(1, 6, dtype=torch.long), mask], 1))
    p_ids, p_labels, p_mask = padded(7)
    # RoPE sees only relative positions and the mask hides the padding: the same loss.
    assert torch.allclose(model(p_ids, images, p_labels, p_mask), unpadded, atol=1e-5)
    assert not torch.allclose(model(p_ids, images, p_labels), unpadded, atol=1e-5)  # unmasked padding is seen
    q_ids, _, _ = padded(9)
    assert torch.allclose(model(q_ids, images, p_labels, p_mask), model(p_ids, images, p_labels, p_mask), atol=1e-6)


def test_strict_export_of_the_split_layout():
    torch.manual_seed(0)
    model = VisionLanguageModel(_split_tiny()).eval()
    ids, images, labels, _ = _split_inputs(model.cfg)
    exported = torch.export.export(model, (ids, images, labels), strict=True)
    assert torch.allclose(exported.module()(ids, images, labels), model(ids, images, labels), atol=1e-6)


@pytest.mark.parametrize("cfg", [get_config("tiny"), _split_tiny()], ids=["v0.1", "main"])
def test_memory_model_follows_the_real_sequence(cfg):
    """The predicted activations are the tensors autograd saves, image tiles and markers included."""
    from edgebench.data.synthetic import synthetic_batches, to_torch
    from edgebench.methods import memory

    torch.manual_seed(0)
    model = VisionLanguageModel(cfg)
    batch = to_torch(next(synthetic_batches(cfg, 4, 32, 0)))
    saved: dict[int, int] = {}

    def keep(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(**batch)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    measured = sum(n for ptr, n in saved.items() if ptr not in weights)
    predicted = memory.predict(cfg, "adamw", 4, 32)
    assert predicted["sequence_length"] == batch["input_ids"].shape[1] + model.n_image_tokens
    assert predicted["image_tiles"] * 4 == batch["images"].shape[0]
    assert abs(predicted["activations_bytes"] - measured) < 0.05 * measured, (predicted["activations_bytes"], measured)


def test_predict_shows_the_real_sequence():
    from edgebench.cli.methods import predict_command

    args = ["--ram-bytes", str(8 * 2**30), "--model", "nanovlm-460m", "--method", "lora+ckpt+frozen-int8"]
    result = CliRunner().invoke(predict_command, [*args, "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert (figures["sequence_length"], figures["image_tiles"], figures["estimate"]) == (1137, 17, True)
    table = CliRunner().invoke(predict_command, args)
    assert "sequence: 1,137 decoder positions a sample (17 image(s)" in table.output and "estimates" in table.output
