"""The attention mask reaches the model everywhere: padding is never attended to.

A row left-padded (as nanoVLM's collators pad) gives, with its mask, the loss of the same
row alone; without the mask its tokens attend to the padding and the loss moves. Checked on
the tiny model in nanoVLM main's layout (image tiles inside the text), where left padding
shifts every position by the same amount, so rotary attention sees the same distances and
the two losses agree to float rounding. (In v0.1's layout the image comes before the
padding, so padding changes the image-to-text distances, in nanoVLM v0.1 as here.)

Eager: the model, and the trainers with their own loss call (backprop, forward-mode, CG)
through its `step`. Exported: ONNX Runtime and ExecuTorch programs made for the padded and
the unpadded width, stepped through the real backends; the ExecuTorch pair runs with
EDGEBENCH_FULL=1 (two exports), its reduced form checks the shared tiny export against eager
on a padded batch.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from conftest import FULL
from edgebench.backends.program import BATCH_INPUTS
from edgebench.data.synthetic import MAX_CHAT_TOKENS, PAD_ID, synthetic_batches, to_torch
from edgebench.model import get_config

PADS = 5
# The unpadded row's text length: the synthetic task's longest sample fills it exactly.
TEXT = MAX_CHAT_TOKENS
SPLIT_TINY = dataclasses.replace(get_config("tiny"), image_splitting=True, max_img_size=64,
                                 extra_token_amount=66).validate()


def _row_and_padded() -> tuple[dict, dict]:
    """(a row that fills its width, the same row left-padded by PADS), numpy batches of one."""
    row = next(b for b, _ in zip(synthetic_batches(SPLIT_TINY, 1, TEXT, seed=0), range(20))
               if b["attention_mask"].all())
    fill = {"input_ids": PAD_ID, "labels": -100, "attention_mask": 0}
    padded = {k: np.concatenate([np.full((1, PADS), v, dtype=np.int64), row[k]], axis=1) for k, v in fill.items()}
    padded["images"] = row["images"]
    return row, padded


def _unmasked(batch: dict) -> dict:
    return {**batch, "attention_mask": np.ones_like(batch["attention_mask"])}


def _model():
    from edgebench.model.vision_language_model import VisionLanguageModel

    torch.manual_seed(0)
    return VisionLanguageModel(SPLIT_TINY).eval()


def test_padded_row_has_the_loss_of_the_row_alone():
    row, padded = _row_and_padded()
    model = _model()
    with torch.no_grad():
        alone, masked, unmasked = (model(*(to_torch(b)[k] for k in BATCH_INPUTS)).item()
                                   for b in (row, padded, _unmasked(padded)))
    assert masked == pytest.approx(alone, rel=1e-6)  # measured: equal to the last bit
    assert abs(unmasked - alone) > 1e-3 * alone  # measured 6.3228 vs 6.2666: the pads were attended to


@pytest.mark.parametrize("method", ["sgd", "forward-grad", "cg"])  # MeZO calls Trainer.loss, as sgd does
def test_every_trainer_masks_the_padding(method):
    """Each trainer's step (its loss before the update) on the padded row equals its step on
    the row alone, from the same weights; the padded row without its mask does not."""
    from edgebench.methods import make_trainer

    row, padded = _row_and_padded()
    base = _model()
    losses = []
    for batch in (row, padded, _unmasked(padded)):
        torch.manual_seed(1)  # the trainers' own draws (MeZO's seeds, forward-grad's tangents)
        trainer = make_trainer(method, copy.deepcopy(base), total_steps=10)
        losses.append(trainer.step(to_torch(batch)))
    alone, masked, unmasked = losses
    assert masked == pytest.approx(alone, rel=1e-5)
    assert abs(unmasked - alone) > 1e-3 * alone


# ---------------------------------------------------------------- exported programs


@pytest.fixture(scope="module")
def split_checkpoint(tmp_path_factory):
    """The tiny model in main's layout as a nanoVLM checkpoint folder (what exports read)."""
    from edgebench.model.checkpoint import save_pretrained

    return str(save_pretrained(_model(), tmp_path_factory.mktemp("split-tiny")))


def _program_losses(checkpoint: str, backend: str) -> tuple[float, float, float]:
    """First-step losses (before any update) of the backend on: the row alone (program for
    its width), the padded row and the padded row unmasked (program for the padded width)."""
    from edgebench.backends import create
    from edgebench.runner.spec import RunSpec
    from exporters.manifest import ExportRequest
    from exporters.pipeline import export

    row, padded = _row_and_padded()
    losses = []
    for text, batch in ((TEXT, row), (TEXT + PADS, padded), (TEXT + PADS, _unmasked(padded))):
        result = export(ExportRequest(model=checkpoint, method="sgd", backend=backend, text_length=text))
        assert {i["name"]: i["shape"] for i in result.manifest["inputs"]}["attention_mask"] == \
            list(batch["attention_mask"].shape)
        spec = RunSpec(model="split-tiny", checkpoint=checkpoint, method="sgd", backend=backend,
                       text_length=text, program=str(result.directory))
        instance = create(spec)
        instance.setup(spec, batch)
        losses.append(instance.step(batch))
        instance.close()
    return tuple(losses)


def _check_program(checkpoint: str, backend: str) -> None:
    alone, masked, unmasked = _program_losses(checkpoint, backend)
    print(json.dumps({"backend": backend, "alone": alone, "padded_masked": masked, "padded_unmasked": unmasked}))
    eager = _model()
    row, _ = _row_and_padded()
    with torch.no_grad():
        expected = eager(*(to_torch(row)[k] for k in BATCH_INPUTS)).item()
    assert alone == pytest.approx(expected, rel=1e-5)  # the program is the model
    assert masked == pytest.approx(alone, rel=1e-5)
    assert abs(unmasked - alone) > 1e-3 * alone


def test_onnxruntime_program_masks_the_padding(export_cache, split_checkpoint):
    _check_program(split_checkpoint, "onnxruntime")


@pytest.mark.slow
def test_executorch_program_masks_the_padding(export_cache, split_checkpoint):
    if FULL:
        _check_program(split_checkpoint, "executorch")
        return
    # Reduced: the tiny SGD export the ExecuTorch tests share, on a padded batch with and
    # without its mask, against eager with the same mask.
    from edgebench.backends.executorch import TrainingProgram
    from exporters.manifest import ExportRequest
    from exporters.pipeline import build_training_model
    from test_export import TEXT as SHARED_TEXT
    from test_export import export_program

    result = export_program("sgd", "executorch", "xnnpack")  # et_sgd's program
    model, _, _ = build_training_model(ExportRequest.from_dict(result.manifest["request"]))
    batch = next(b for b, _ in zip(synthetic_batches(model.cfg, 1, SHARED_TEXT, 0), range(20))
                 if not b["attention_mask"].all())
    losses = []
    for feed in (batch, _unmasked(batch)):
        inputs = tuple(to_torch(feed)[k] for k in BATCH_INPUTS)
        with torch.no_grad():
            expected = model(*inputs).item()
        losses.append(TrainingProgram(str(result.directory / "model.pte")).forward_backward(inputs))
        assert losses[-1] == pytest.approx(expected, rel=1e-5)
    assert abs(losses[0] - losses[1]) > 1e-3 * losses[0]
