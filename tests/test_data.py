"""Training data: the synthetic visual-QA task and folder datasets."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgebench.data.synthetic import (
    COLOURS,
    COUNT_WORDS,
    EOS_ID,
    IM_END_ID,
    NL_ID,
    PAD_ID,
    QUADRANTS,
    QUESTION_TYPES,
    TOKEN_ID,
    WORDS,
    decode,
    make_sample,
    synthetic_batches,
    to_torch,
)
from edgebench.model.config import get_config

TINY = get_config("tiny")
# tiny in nanoVLM main's layout: 128-px images as 2x2 tiles of 64 px plus a global view
SPLIT_TINY = dataclasses.replace(TINY, image_splitting=True, max_img_size=128, extra_token_amount=66).validate()


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
    assert batch["attention_mask"].shape == (2, 79) and batch["attention_mask"].dtype == np.int64
    # nanoVLM's ToTensor: [0, 1], no normalisation (the drawn background is ~40/255)
    assert 0.0 <= batch["images"].min() < 0.25 and 0.75 < batch["images"].max() <= 1.0
    assert next(synthetic_batches(TINY, 1, 16, 0, image_size=32))["images"].shape == (1, 3, 32, 32)
    tensors = to_torch(batch)
    assert tensors["input_ids"].dtype.is_floating_point is False and tuple(tensors["images"].shape) == (2, 3, 224, 224)
    with pytest.raises(ValueError, match="text_length"):
        next(synthetic_batches(TINY, 1, 6, 0))


def test_left_padded_with_a_mask_and_labels_only_on_the_answer():
    batch = next(synthetic_batches(TINY, 8, 16, seed=1))
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        words = decode(ids)
        first, start, end = words.index("<bos>"), words.index("<sep>") + 1, words.index("<eos>") + 1
        assert end == 16 and (mask[:first] == 0).all() and (mask[first:] == 1).all()  # padding on the left
        assert (ids[:first] == PAD_ID).all() and (labels[:start] == -100).all()
        assert (labels[start:] == ids[start:]).all() and labels[-1] == EOS_ID
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
            assert np.allclose(pixel * 255, COLOURS[obj["colour"]], atol=0.01), obj
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
    tokenizer.train_from_iterator(
        [" ".join(words)], trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<eos>"])
    )
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
    # v0.1's prompt: "Question : what colour is the ball ? Answer :" (10 tokens), answer, <eos>
    batch = next(folder_batches(folder, TINY, 2, 13, seed=0, image_size=16))
    assert batch["input_ids"].shape == (2, 13) and batch["images"].shape == (2, 3, 16, 16)
    assert (batch["attention_mask"][:, 0] == 0).all() and (batch["attention_mask"][:, 1:] == 1).all()
    dataset = FolderDataset(folder)
    for ids, labels, image in zip(batch["input_ids"], batch["labels"], batch["images"]):
        marked = labels != -100
        assert marked.sum() == 2  # the answer word and <eos>
        assert (labels[marked] == ids[marked]).all() and labels[marked][-1] == dataset.eos_id
        answer = dataset.tokenizer.id_to_token(int(labels[marked][0]))
        assert image.max() == 1.0 and image.min() == 0.0  # ToTensor: a pure colour is 1 in its channel
        red = image[0].mean() > image[2].mean()
        assert answer == ("red" if red else "blue")
    again = next(folder_batches(folder, TINY, 2, 13, seed=0, image_size=16))
    assert all(batch[k].tobytes() == again[k].tobytes() for k in batch)


def test_folder_images_split_as_nanovlm_main(tmp_path):
    from edgebench.data.folder import folder_batches

    cfg = SPLIT_TINY
    folder = _folder(tmp_path, GOOD)  # 20x10 images: long side to 128 -> 128x64 -> one row of two tiles
    batch = next(folder_batches(folder, cfg, 2, 40, seed=0))
    per_image = 1 + 2  # the global view, then tiles r1c1 and r1c2
    assert batch["images"].shape == (2 * per_image, 3, 64, 64)
    assert batch["input_ids"].shape == (2, cfg.sequence_length(40))
    for row in batch["input_ids"]:
        assert (row == cfg.image_token_id).sum() == per_image * cfg.n_image_tokens
        markers = [int(t) for t in row if t in (cfg.marker_token_id(0, 0), cfg.marker_token_id(1, 1),
                                                cfg.marker_token_id(1, 2), cfg.marker_token_id(2, 1))]
        assert markers == [cfg.marker_token_id(0, 0), cfg.marker_token_id(1, 1), cfg.marker_token_id(1, 2)]
    # A pure-colour image stays pure through the bicubic resize, the split and the global view.
    assert np.allclose(batch["images"].max(axis=(1, 2, 3)), 1.0) and np.allclose(batch["images"].min(), 0.0)


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
    with pytest.raises(DatasetError, match=r"data.jsonl:[12]: needs 12 tokens but text_length is 4"):
        next(folder_batches(folder, TINY, 1, 4, seed=1))


def test_tokenizer_is_tokenizer_option_else_the_datasets_else_the_one_beside_the_model(tmp_path):
    """--tokenizer (a file or its folder) first, the dataset folder's next, then the one beside the
    checkpoint's config.json (where Hugging Face saves it); none: one line naming where it looked."""
    from edgebench.data.folder import DatasetError, FolderDataset, find_tokenizer

    (tmp_path / "data").mkdir()
    data = _folder(tmp_path / "data", GOOD)
    model, mine = tmp_path / "model", tmp_path / "mine"
    model.mkdir()
    mine.mkdir()
    for folder in (model, mine):
        (folder / "tokenizer.json").write_bytes((data / "tokenizer.json").read_bytes())
    assert find_tokenizer(data, model) == data / "tokenizer.json"
    assert find_tokenizer(data, model, mine) == find_tokenizer(data, model, mine / "tokenizer.json") == \
        mine / "tokenizer.json"
    (data / "tokenizer.json").unlink()
    assert FolderDataset(data, checkpoint=model).tokenizer_path == model / "tokenizer.json"
    with pytest.raises(DatasetError) as err:
        FolderDataset(data, checkpoint=tmp_path / "bare-model")
    assert str(err.value) == (f"no tokenizer.json in {data} or beside the model's config.json in "
                              f"{tmp_path / 'bare-model'}; give --tokenizer PATH (the model's tokenizer.json or its "
                              "folder)")
    with pytest.raises(DatasetError, match=r"nothing.json: no such tokenizer file; give --tokenizer"):
        find_tokenizer(data, model, tmp_path / "nothing.json")
    (data / "tokenizer.json").symlink_to(mine / "tokenizer.json")  # a link out of the dataset folder
    with pytest.raises(DatasetError, match=r"tokenizer 'tokenizer.json' leads outside .*data"):
        FolderDataset(data, checkpoint=model)


def test_folder_batches_read_the_tokenizer_beside_the_checkpoint(tmp_path):
    from edgebench.data.folder import folder_batches

    same = next(folder_batches(_folder(tmp_path, GOOD), TINY, 2, 13, seed=0, image_size=16))
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "tokenizer.json").rename(model / "tokenizer.json")
    beside = next(folder_batches(tmp_path, TINY, 2, 13, seed=0, image_size=16, checkpoint=model))
    assert all(beside[k].tobytes() == same[k].tobytes() for k in same)


# ---------------------------------------------------------------- Hugging Face datasets (the_cauldron's shape)


def _hf_dataset(root: Path, rows: list[dict], form: str) -> Path:
    """Rows written by the `datasets` library as nanoVLM users have them: save_to_disk or parquet."""
    import datasets
    from PIL import Image

    features = datasets.Features({"images": datasets.Sequence(datasets.Image()),
                                  "texts": [{"user": datasets.Value("string"), "assistant": datasets.Value("string"),
                                             "source": datasets.Value("string")}]})
    table = {"images": [[Image.new("RGB", (20, 10), colour) for colour in row["colours"]] for row in rows],
             "texts": [[{**turn, "source": "test"} for turn in row["texts"]] for row in rows]}
    dataset = datasets.Dataset.from_dict(table, features=features)
    folder = root / f"my-{form}"
    if form == "save_to_disk":
        dataset.save_to_disk(str(folder))
    else:
        (folder / "train").mkdir(parents=True)
        dataset.to_parquet(str(folder / "train" / "train-00000-of-00001.parquet"))
    _folder(root, GOOD)  # its tokenizer.json, the one a user puts beside the data
    (folder / "tokenizer.json").write_bytes((root / "tokenizer.json").read_bytes())
    return folder


COLOUR_ROWS = [{"colours": [(255, 0, 0)], "texts": [{"user": "what colour is the ball ?", "assistant": "red"}]},
               {"colours": [(0, 0, 255)], "texts": [{"user": "what colour is the ball ?", "assistant": "blue"}]}]


@pytest.mark.parametrize("form", ["save_to_disk", "parquet"])
def test_hf_dataset_gives_the_batches_of_the_same_folder_dataset(tmp_path, form):
    """the_cauldron's images/texts rows, converted, batch byte for byte as the JSONL folder of the same data."""
    from edgebench.data.folder import folder_batches
    from edgebench.data.hf import convert, is_hf_dataset

    source = _hf_dataset(tmp_path, COLOUR_ROWS, form)
    assert is_hf_dataset(source) and not is_hf_dataset(tmp_path)
    converted = convert(source, tmp_path / "converted")
    for cfg, width in ((TINY, 13), (SPLIT_TINY, 40)):
        mine = next(folder_batches(converted, cfg, 2, width, seed=0))
        same = next(folder_batches(tmp_path, cfg, 2, width, seed=0))
        assert all(mine[k].tobytes() == same[k].tobytes() for k in same), cfg.image_splitting


def test_hf_rows_with_several_turns_and_images_train_every_answer(tmp_path):
    """main's layout: every image's string ("<image: i>" before each) and every assistant turn trained."""
    from edgebench.data.folder import FolderDataset, folder_batches
    from edgebench.data.hf import convert

    row = {"colours": [(255, 0, 0), (0, 0, 255)],
           "texts": [{"user": "what colour is the ball ?", "assistant": "red"},
                     {"user": "how many ?", "assistant": "two"}]}
    converted = convert(_hf_dataset(tmp_path, [row], "parquet"), tmp_path / "converted")
    cfg = SPLIT_TINY
    batch = next(folder_batches(converted, cfg, 1, 2 * cfg.image_positions, seed=0))
    assert batch["images"].shape[0] == 2 * 3  # two images, each a global view and two tiles
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    assert (ids == cfg.image_token_id).sum() == 2 * 3 * cfg.n_image_tokens
    tokenizer = FolderDataset(converted).tokenizer
    trained = [tokenizer.id_to_token(int(t)) for t in labels[labels != -100]]
    assert [w for w in trained if w in ("red", "blue", "two")] == ["red", "two"]
    # v0.1 takes the first image and the first turn, as nanoVLM v0.1's VQADataset.
    v01 = next(folder_batches(converted, TINY, 1, 13, seed=0))
    assert v01["images"].shape[0] == 1 and [tokenizer.id_to_token(int(t)) for t in v01["labels"][0]
                                            if t != -100][0] == "red"


@pytest.mark.parametrize("change,message", [
    (lambda rows: [{**rows[0], "texts": [{"user": "what ?", "assistant": ""}]}],
     r"row 0: texts\[0\] field 'assistant'"),
    (lambda rows: [{**rows[0], "colours": []}], r"row 0: field 'images' must be a non-empty list"),
])
def test_hf_dataset_errors_name_the_file_and_row(tmp_path, change, message):
    from edgebench.data.folder import DatasetError, FolderDataset
    from edgebench.data.hf import convert

    converted = convert(_hf_dataset(tmp_path, change(COLOUR_ROWS), "parquet"), tmp_path / "converted")
    with pytest.raises(DatasetError, match=message) as err:
        FolderDataset(converted)
    assert "train-00000-of-00001.parquet row 0" in str(err.value)


def test_hf_dataset_without_a_tokenizer_converts_and_reads_the_models(tmp_path):
    from edgebench.data.folder import FolderDataset
    from edgebench.data.hf import convert

    source = _hf_dataset(tmp_path, COLOUR_ROWS, "parquet")
    model = tmp_path / "model"
    model.mkdir()
    (source / "tokenizer.json").rename(model / "tokenizer.json")
    converted = convert(source, tmp_path / "converted")
    assert not (converted / "tokenizer.json").exists()
    assert len(FolderDataset(converted, checkpoint=model).examples) == 2


def test_hf_dataset_dict_and_damaged_files_are_refused_naming_the_fix(tmp_path):
    import datasets

    from edgebench.data.folder import DatasetError
    from edgebench.data.hf import convert

    split = _hf_dataset(tmp_path, COLOUR_ROWS, "save_to_disk")
    datasets.DatasetDict({"train": datasets.load_from_disk(str(split))}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "dict" / "tokenizer.json").write_bytes((split / "tokenizer.json").read_bytes())
    with pytest.raises(
        DatasetError, match=r"a DatasetDict of splits train; pass one split's folder, e.g. .*dict/train"
    ):
        convert(tmp_path / "dict", tmp_path / "out")
    parquet = _hf_dataset(tmp_path, COLOUR_ROWS, "parquet")
    (parquet / "train" / "train-00000-of-00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match=r"train-00000-of-00001.parquet: not a readable parquet file"):
        convert(parquet, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()  # nothing half-written


def test_hf_dataset_without_the_cauldrons_columns_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from edgebench.data.folder import DatasetError
    from edgebench.data.hf import convert

    pq.write_table(pa.table({"image": [b"x"], "caption": ["red"]}), tmp_path / "captions.parquet")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"captions.parquet: no images or texts column \(found image, caption\)"):
        convert(tmp_path, tmp_path / "out")


# ---------------------------------------------------------------- nanoVLM main's layout


def test_synthetic_split_layout_as_nanovlm_main():
    cfg = SPLIT_TINY
    batch = next(synthetic_batches(cfg, 2, 24, seed=0))
    assert batch["images"].shape == (2 * cfg.n_tiles, 3, 64, 64) and cfg.n_tiles == 5
    assert batch["input_ids"].shape == (2, cfg.sequence_length(24)) == (2, 5 * 17 + 24)
    for b, (ids, labels) in enumerate(zip(batch["input_ids"], batch["labels"])):
        words = [WORDS[i] if i < len(WORDS) else i for i in ids]
        start = words.index("<im_start>")
        assert words[start:start + 3] == ["<im_start>", "user", "<nl>"]  # ChatML, the image first in the turn
        image = list(ids[start + 3:start + 3 + cfg.image_positions])
        expected = []
        for marker in [(0, 0), (1, 1), (1, 2), (2, 1), (2, 2)]:
            expected += [cfg.marker_token_id(*marker)] + [cfg.image_token_id] * cfg.n_image_tokens
        assert image == expected
        assert list(ids[-2:]) == [IM_END_ID, NL_ID] and (labels[-2:] == ids[-2:]).all()
        assert (labels[: -4] == -100).all() and not (labels[-4:-2] == -100).all()  # the answer, then its end
        # the global view is the whole picture at tile size; the tiles, read row by row, are the picture
        tiles = batch["images"][b * 5:(b + 1) * 5]
        picture = tiles[1:].reshape(2, 2, 3, 64, 64).transpose(2, 0, 3, 1, 4).reshape(3, 128, 128)
        assert np.allclose(tiles[0], picture.reshape(3, 64, 2, 64, 2).mean(axis=(2, 4)), atol=1e-6)
    with pytest.raises(ValueError, match="too short"):
        next(synthetic_batches(cfg, 1, 16, 0))


def test_packing_fills_rows_with_masked_separators():
    cfg = SPLIT_TINY
    batch = next(synthetic_batches(cfg, 2, 200, seed=0, packing=True))
    per_row = (batch["input_ids"] == cfg.marker_token_id(0, 0)).sum(axis=1)
    assert (per_row >= 2).all() and batch["images"].shape[0] == per_row.sum() * cfg.n_tiles
    for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
        starts = np.flatnonzero(ids == TOKEN_ID["<im_start>"])[::2]  # each sample opens with its user turn
        assert (mask[starts[1:] - 1] == 0).all() and (ids[starts[1:] - 1] == PAD_ID).all()  # separators
        assert (labels[mask == 0] == -100).all() and mask[-1] == 0 and ids[-1] == PAD_ID  # the last one too
    unpacked = next(synthetic_batches(cfg, 2, 200, seed=0))
    assert (unpacked["input_ids"] == cfg.marker_token_id(0, 0)).sum() == 2
    with pytest.raises(ValueError, match="packing needs image splitting"):
        next(synthetic_batches(TINY, 1, 16, 0, packing=True))


def test_split_batches_train_the_split_model():
    import torch

    from edgebench.model.vision_language_model import VisionLanguageModel

    torch.manual_seed(0)
    model = VisionLanguageModel(SPLIT_TINY)
    for packing in (False, True):
        batch = to_torch(next(synthetic_batches(SPLIT_TINY, 2, 200, seed=0, packing=packing)))
        loss = model(**batch)
        loss.backward()
        assert torch.isfinite(loss) and 5.0 < loss.item() < 7.5  # ~ln(512) before training


def _hf_path_rows(root: Path, paths: list[str]) -> Path:
    """A parquet dataset whose images are stored as paths ({bytes: null, path}), one row each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / "by-path"
    folder.mkdir()
    _folder(root, GOOD)
    (folder / "tokenizer.json").write_bytes((root / "tokenizer.json").read_bytes())
    texts = [[{"user": "what colour is the ball ?", "assistant": "red"}]] * len(paths)
    pq.write_table(pa.table({"images": [[{"bytes": None, "path": p}] for p in paths], "texts": texts}),
                   folder / "train.parquet")
    return folder


@pytest.mark.parametrize("outside", ["absolute", "dotdot", "symlink"])
def test_hf_image_path_outside_the_folder_is_refused_before_anything_is_copied(tmp_path, monkeypatch, outside):
    """A row's {bytes: null, path} naming a host file (absolute, ../) is refused with the file, row
    and field named; a link out of the folder is refused naming it before any file is read (the
    folder's digest would read its target); nothing of it lands in the dataset cache."""
    from edgebench.data.folder import DatasetError
    from edgebench.fleet.assets import as_folder_dataset

    secret = tmp_path / "secret.png"
    secret.write_bytes(b"not for the cache")
    secret.chmod(0o600)
    path = {"absolute": str(secret), "dotdot": "../../../../../../" + str(secret).lstrip("/"),
            "symlink": "link.png"}[outside]
    folder = _hf_path_rows(tmp_path, ["a.png", path])
    (folder / "a.png").write_bytes((tmp_path / "a.png").read_bytes())
    if outside == "symlink":
        (folder / "link.png").symlink_to(secret)
    monkeypatch.setenv("EDGEBENCH_CACHE", str(tmp_path / "cache"))
    refusal = r"link.png: a link to .*, outside the dataset folder" if outside == "symlink" else \
        r"train.parquet row 1: images\[0\] field 'path' .*(inside|outside)"
    with pytest.raises(DatasetError, match=refusal):
        as_folder_dataset(folder)
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert cached == []  # not the secret, not the good row's image, no partial folder


def test_hf_image_inside_the_folder_keeps_its_restrictive_mode_in_the_cache(tmp_path, monkeypatch):
    from edgebench.data.folder import FolderDataset
    from edgebench.fleet.assets import as_folder_dataset

    folder = _hf_path_rows(tmp_path, ["private/a.png"])
    (folder / "private").mkdir()
    (folder / "private" / "a.png").write_bytes((tmp_path / "a.png").read_bytes())
    (folder / "private" / "a.png").chmod(0o600)
    (folder / "train.parquet").chmod(0o600)
    monkeypatch.setenv("EDGEBENCH_CACHE", str(tmp_path / "cache"))
    out = as_folder_dataset(folder)
    image = out / "images" / "000000-0"
    assert image.read_bytes() == (folder / "private" / "a.png").read_bytes()
    assert image.stat().st_mode & 0o077 == 0 and (out / "data.jsonl").stat().st_mode & 0o077 == 0
    assert len(FolderDataset(out).examples) == 1


def test_preflight_decodes_every_image_so_a_truncated_jpeg_is_refused_naming_it(tmp_path):
    """A truncated JPEG's header reads fine; the preflight decodes it whole and names the file."""
    import io

    from PIL import Image

    from edgebench.data.folder import DatasetError, FolderDataset

    folder = _folder(tmp_path, GOOD)
    jpeg = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").save(jpeg, "JPEG")
    (folder / "b.png").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    with pytest.raises(DatasetError, match=r"data.jsonl:2: .*b.png is not an image Pillow reads \(image file is "
                                           "truncated"):
        FolderDataset(folder).check(TINY, 32)


def test_a_binary_jsonl_is_refused_naming_the_file_and_line(tmp_path):
    from edgebench.data.folder import DatasetError, FolderDataset

    folder = _folder(tmp_path, GOOD)
    (folder / "data.jsonl").write_bytes((GOOD[0] + "\n").encode() + b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(DatasetError, match=r"data.jsonl:2: not UTF-8 text \(byte \d+\)"):
        FolderDataset(folder)


@pytest.mark.parametrize("model", ["tiny", "nanovlm-460m"])
def test_a_yielded_batch_is_the_only_hold_on_its_pixels(model):
    # A trainer that is given the batch (Trainer.step's consume) frees the pixels after the
    # forward pass only if the generators keep nothing of them while it trains.
    batches = synthetic_batches(get_config(model), 1, 64, 0)
    batch = next(batches)
    pixels = batch.pop("images")
    owner = pixels if pixels.base is None else pixels.base
    assert sys.getrefcount(owner) == (2 if owner is pixels else 3)  # this test's names, and the view's base
