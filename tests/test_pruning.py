"""Pruned fine-tuning (edgebench.methods.pruning): the blocks' linear weights pruned by magnitude
or 2:4 before the first step, the zeros held through training, the masks counted by the memory
model; eager only, refused with the reason elsewhere."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from edgebench.backends.support import unsupported_reason
from edgebench.cli import cli
from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import MethodError, make_trainer, memory, parse_method, pruning
from edgebench.model import build_model, get_config


def test_prune_tokens_parse_and_what_cannot_hold_its_zeros_is_refused():
    assert parse_method("prune-magnitude").prune == "magnitude50"
    assert parse_method("sgd+prune30").prune == "magnitude30"
    assert parse_method("freeze-vision+prune2of4").prune == pruning.TWO_OF_FOUR
    for bad in ("prune0", "prune100", "prune007"):
        with pytest.raises(MethodError, match="pruneP: P is 1 to 99"):
            parse_method(bad)
    for refused in ("lora+prune50", "bitfit+prune50", "lomo+prune50", "mezo+prune50", "sgd+fused+prune50"):
        with pytest.raises(MethodError, match="pruning"):
            parse_method(refused)
    for backend in ("executorch", "onnxruntime"):
        assert "pruning" in unsupported_reason(parse_method("prune-2of4"), backend)
    assert unsupported_reason(parse_method("prune-2of4"), "eager") is None


def test_masks_zero_the_smallest_weights_exactly():
    torch.manual_seed(0)
    weight = torch.randn(8, 16)
    kept = pruning.mask_of(weight, pruning.magnitude(30))
    assert int((~kept).sum()) == 128 * 30 // 100
    assert weight.abs()[~kept].max() <= weight.abs()[kept].min()
    two_of_four = pruning.mask_of(weight, pruning.TWO_OF_FOUR).reshape(8, 4, 4)
    assert bool((two_of_four.sum(dim=2) == 2).all())
    groups = weight.abs().reshape(8, 4, 4)
    assert bool((groups.masked_fill(~two_of_four, float("inf")).amin(dim=2)
                 >= groups.masked_fill(two_of_four, -1.0).amax(dim=2)).all())  # the 2 largest kept
    with pytest.raises(ValueError, match="groups of 4"):
        pruning.mask_of(torch.randn(4, 6), pruning.TWO_OF_FOUR)


@pytest.mark.parametrize("text", ["prune-magnitude", "prune-2of4"])
def test_a_pruned_model_learns_with_its_zeros_held(text):
    """20 steps on tiny: the loss falls, every pruned weight is still exactly zero, the kept
    weights moved, and only the blocks' linears were pruned."""
    torch.manual_seed(0)
    cfg = get_config("tiny")
    trainer = make_trainer(text, build_model("tiny"), total_steps=20, fresh_weights=True)
    masks = {name: trainer.masks[p] for name, p in trainer.model.named_parameters() if p in trainer.masks}
    assert masks and all(".blocks." in name and name.endswith(".weight") for name in masks)
    assert "decoder.token_embedding.weight" not in masks
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if name in masks}
    batches = synthetic_batches(cfg, 4, 16, 0)
    losses = [trainer.step(to_torch(next(batches))) for _ in range(20)]
    assert sum(losses[-5:]) < sum(losses[:5]), losses
    for name, p in trainer.model.named_parameters():
        if name in masks:
            assert bool((p[~masks[name]] == 0).all()), name
            assert not torch.equal(p[masks[name]], start[name][masks[name]]), name
    share = sum(int((~m).sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
    assert share == pytest.approx(0.5, abs=0.01)


def test_the_memory_model_counts_a_byte_a_pruned_weight():
    trainer = make_trainer("prune-2of4", build_model("tiny"), total_steps=1, fresh_weights=True)
    counted = memory.predict("tiny", "prune-2of4", 1, 16)["prune_masks_bytes"]
    assert counted == sum(m.numel() for m in trainer.masks.values()) > 0
    assert memory.predict("tiny", "adamw", 1, 16)["prune_masks_bytes"] == 0


def test_methods_lists_the_sparse_update_and_pruning_presets():
    out = CliRunner().invoke(cli, ["methods", "--json"])
    assert out.exit_code == 0, out.output
    names = json.dumps(json.loads(out.output))
    assert "prune-2of4" in names and "prune-magnitude" in names and "sparse-update" in names
