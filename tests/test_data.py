"""Training data: the synthetic visual-QA task and folder datasets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgebench.data.synthetic import (
    COLOURS, COUNT_WORDS, EOS_ID, QUADRANTS, QUESTION_TYPES, WORDS, decode, make_sample, synthetic_batches, to_torch,
)
from edgebench.model.config import get_config

TINY = get_config("tiny")


def _take(gen, n):
    return [next(gen) for _ in range(n)]


def test_same_seed_same_bytes_other_seed_other_bytes():
    a = _take(synthetic_batches(TINY, 4, 16, seed=3), 3)
    b = _take(synthetic_batches(TINY, 4, 16, seed=3), 3)
    c = next(synthetic_batches(TINY, 4, 16, seed=4))
    for x, y in zip(a, b):
        assert all(x[k].tobytes() == y[k].tobytes() for k in x)
    assert a[0]["images"].tobytes() != c["images"].tobytes()


def test_batch_contract():
    batch = next(synthetic_batches(get_config("nanovlm-222m"), 2, 79, seed=0))
    assert batch["input_ids"].shape == (2, 79) and batch["input_ids"].dtype == np.int64
    assert batch["labels"].shape == (2, 79) and batch["labels"].dtype == np.int64
    assert batch["images"].shape == (2, 3, 224, 224) and batch["images"].dtype == np.float32
    assert -1.0 <= batch["images"].min() and batch["images"].max() <= 1.0
    assert next(synthetic_batches(TINY, 1, 16, 0, image_size=32))["images"].shape == (1, 3, 32, 32)
    tensors = to_torch(batch)
    assert tensors["input_ids"].dtype.is_floating_point is False and tuple(tensors["images"].shape) == (2, 3, 224, 224)
    with pytest.raises(ValueError, match="text_length"):
        next(synthetic_batches(TINY, 1, 6, 0))


def test_labels_mark_only_the_answer_for_the_models_shift():
    batch = next(synthetic_batches(TINY, 8, 16, seed=1))
    for ids, labels in zip(batch["input_ids"], batch["labels"]):
        words = decode(ids)
        start, end = words.index("<sep>") + 1, words.index("<eos>") + 1
        assert (labels[:start] == -100).all() and (labels[end:] == -100).all()
        assert (labels[start:end] == ids[start:end]).all() and labels[end - 1] == EOS_ID
    assert batch["input_ids"].max() < len(WORDS) <= TINY.lm_vocab_size


def test_every_question_type_with_answers_true_to_the_picture():
    rng = np.random.default_rng(0)
    size = 64
    kinds = set()
    for index in range(40):
        s = make_sample(rng, index, size)
        kinds.add(s["kind"])
        objects = s["objects"]
        for obj in objects:  # the pixel at the quadrant's centre has the object's colour
            row, col = divmod(obj["quadrant"], 2)
            pixel = s["image"][:, row * size // 2 + size // 4, col * size // 2 + size // 4]
            assert np.allclose((pixel + 1) * 127.5, COLOURS[obj["colour"]], atol=0.01), obj
        by_shape = {o["shape"]: o for o in objects}
        by_colour = {o["colour"]: o for o in objects}
        q, a = s["question"], s["answer"]
        if s["kind"] == "colour":
            assert a == [by_shape[q[4]]["colour"]]
        elif s["kind"] == "shape":
            assert a == [by_colour[q[4]]["shape"]]
        elif s["kind"] == "count":
            assert a == [COUNT_WORDS[len(objects) - 1]]
        else:
            assert a == list(QUADRANTS[by_colour[q[3]]["quadrant"]])
    assert kinds == set(QUESTION_TYPES)


def test_synthetic_and_configs_run_without_torch_or_pillow():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['PIL'] = None\n"
        "from types import SimpleNamespace as N\n"
        "from edgebench.data.synthetic import synthetic_batches\n"
        "from edgebench.model import get_config\n"
        "from edgebench.model.checkpoint import read_config\n"
        "assert get_config('tiny').vit_img_size == 64\n"
        "b = next(synthetic_batches(N(lm_vocab_size=64, vit_img_size=32), 2, 12, 0))\n"
        "print(b['images'].shape, 'torch' in sys.modules and sys.modules['torch'] is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(2, 3, 32, 32) False"


def test_tiny_model_learns_the_task():
    import torch

    torch.manual_seed(0)
    from edgebench.model import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steady timing when other work shares the cores
    try:
        model = build_model("tiny")
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
        batches = synthetic_batches(TINY, 8, 16, seed=0)
        losses = []
        for _ in range(60):
            loss = model(**to_torch(next(batches)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    # ln(512) = 6.2 at the start; learning the answers' words and <eos> takes it well below 2.
    assert losses[0] > 5.5 and np.mean(losses[-10:]) < 2.0, losses[::10]


# ---------------------------------------------------------------- folder datasets


def _folder(tmp_path: Path, lines: list[str]) -> Path:
    from PIL import Image
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    words = "what colour is the ball ? red blue how many two".split()
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<eos>"]))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    for name, colour in (("a.png", (255, 0, 0)), ("b.png", (0, 0, 255))):
        Image.new("RGB", (20, 10), colour).save(tmp_path / name)
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


GOOD = [json.dumps({"image": "a.png", "question": "what colour is the ball ?", "answer": "red"}),
        json.dumps({"image": "b.png", "question": "what colour is the ball ?", "answer": "blue"})]


def test_folder_batches_like_synthetic(tmp_path):
    from edgebench.data.folder import FolderDataset, folder_batches

    folder = _folder(tmp_path, GOOD)
    batch = next(folder_batches(folder, TINY, 2, 12, seed=0, image_size=16))
    assert batch["input_ids"].shape == (2, 12) and batch["images"].shape == (2, 3, 16, 16)
    dataset = FolderDataset(folder)
    for ids, labels, image in zip(batch["input_ids"], batch["labels"], batch["images"]):
        marked = labels != -100
        assert marked.sum() == 2  # the answer word and <eos>
        assert (labels[marked] == ids[marked]).all() and labels[marked][-1] == dataset.eos_id
        answer = dataset.tokenizer.id_to_token(int(labels[marked][0]))
        red = image[0].mean() > image[2].mean()
        assert answer == ("red" if red else "blue")
    again = next(folder_batches(folder, TINY, 2, 12, seed=0, image_size=16))
    assert all(batch[k].tobytes() == again[k].tobytes() for k in batch)


@pytest.mark.parametrize("bad,message", [
    (json.dumps({"image": "missing.png", "question": "what ?", "answer": "red"}), "image .*missing.png not found"),
    (json.dumps({"image": "a.png", "question": "what ?", "answer": "  "}), "'answer' is missing or empty"),
    ('{"image": "a.png", "question": ', "not valid JSON"),
])
def test_folder_errors_name_file_and_line(tmp_path, bad, message):
    from edgebench.data.folder import DatasetError, FolderDataset

    folder = _folder(tmp_path, [GOOD[0], bad])
    with pytest.raises(DatasetError, match=message) as err:
        FolderDataset(folder)
    assert f"{folder / 'data.jsonl'}:2:" in str(err.value)


def test_folder_text_too_long_names_line(tmp_path):
    from edgebench.data.folder import DatasetError, folder_batches

    folder = _folder(tmp_path, GOOD)
    with pytest.raises(DatasetError, match=r"data.jsonl:[12]: needs 8 tokens but text_length is 4"):
        next(folder_batches(folder, TINY, 1, 4, seed=1))
