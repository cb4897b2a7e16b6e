"""Packing as a run option: `--packing` -> RunSpec.packing -> packed batches, recorded in meta.json.

Packing (several samples per row, each after a masked separator, as nanoVLM's
ConstantLengthDataset) needs main's layout and the eager backend; elsewhere it is refused
with the reason. Micro-batches (accumN) keep each row's own images.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.model import get_config
from edgebench.runner.spec import RunSpec

SPLIT_TINY = dataclasses.replace(get_config("tiny"), image_splitting=True, max_img_size=128,
                                 extra_token_amount=66).validate()  # 5 views of 64 px per image
TEXT = 200  # room for several samples per row


@pytest.fixture(scope="module")
def split_checkpoint(tmp_path_factory):
    from edgebench.model.checkpoint import save_pretrained
    from edgebench.model.vision_language_model import VisionLanguageModel

    torch.manual_seed(0)
    return str(save_pretrained(VisionLanguageModel(SPLIT_TINY), tmp_path_factory.mktemp("split-tiny")))


def test_packed_run_trains_on_packed_rows_and_records_it(tmp_path, split_checkpoint):
    from edgebench.runner.supervisor import run_spec
    from edgebench.runner.worker import batches_for

    spec = RunSpec(model="split-tiny", checkpoint=split_checkpoint, method="sgd", packing=True, batch_size=2,
                   text_length=TEXT, warmup_steps=0, steps=2, threads=1, run_id="packed")
    rows = next(batches_for(spec))["input_ids"]
    assert ((rows == SPLIT_TINY.marker_token_id(0, 0)).sum(axis=1) >= 2).all()  # several samples a row
    result = run_spec(spec, tmp_path)
    assert result["status"] == "ok", result.get("detail")
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["spec"]["packing"] is True
    unpacked = next(batches_for(dataclasses.replace(spec, packing=False)))["input_ids"]
    assert ((unpacked == SPLIT_TINY.marker_token_id(0, 0)).sum(axis=1) == 1).all()


def test_micro_batches_keep_each_rows_images():
    from edgebench.methods.trainer import split_batch

    batch = to_torch(next(synthetic_batches(SPLIT_TINY, 4, TEXT, seed=0, packing=True)))
    views = ((batch["input_ids"] == SPLIT_TINY.image_token_id).sum(1) // SPLIT_TINY.n_image_tokens).tolist()
    assert len(set(views)) > 1 or views[0] > SPLIT_TINY.n_tiles  # rows hold several images each
    starts = np.cumsum([0] + views)
    for i, micro in enumerate(split_batch(batch, 2, SPLIT_TINY)):
        rows = range(i, 4, 2)
        assert torch.equal(micro["input_ids"], batch["input_ids"][i::2])
        expected = torch.cat([batch["images"][starts[b]:starts[b + 1]] for b in rows])
        assert torch.equal(micro["images"], expected)


def test_program_micro_batches_split_as_eager():
    """ExecuTorch's accumN micro-batches (fixed shapes: the same views per row) are eager's."""
    from edgebench.backends.et_optimizers import first_micro_batch, split_inputs
    from edgebench.backends.program import BATCH_INPUTS
    from edgebench.methods.trainer import split_batch

    batch = to_torch(next(synthetic_batches(SPLIT_TINY, 4, 24, seed=0)))
    assert batch["images"].shape[0] == 4 * SPLIT_TINY.n_tiles
    eager = split_batch(batch, 2, SPLIT_TINY)
    program = split_inputs(tuple(batch[k] for k in BATCH_INPUTS), 2)
    for micro, inputs in zip(eager, program):
        assert all(torch.equal(micro[k], t) for k, t in zip(BATCH_INPUTS, inputs))
    assert all(torch.equal(eager[0][k], v) for k, v in first_micro_batch(batch, 2).items())


@pytest.mark.parametrize("args,why", [
    (["--model", "tiny"], "tiny puts one image before each row"),
    (["--model", "nanovlm-460m", "--backend", "onnxruntime"], "use --backend eager or drop --packing"),
])
def test_packing_refused_where_it_cannot_apply(args, why):
    from edgebench.cli import cli

    out = CliRunner().invoke(cli, ["bench", "--packing", "--steps", "1", *args])
    assert out.exit_code == 2, out.output
    assert why in out.output and "--packing" in out.output


@pytest.mark.parametrize("backend", ["executorch", "onnxruntime"])
def test_exported_backends_refuse_packing(tmp_path, backend):
    from edgebench.backends import UnsupportedBackend, create

    spec = RunSpec(model="nanovlm-460m", method="sgd", backend=backend, packing=True, program=str(tmp_path))
    with pytest.raises(UnsupportedBackend, match="packing"):
        create(spec).setup(spec, {})
