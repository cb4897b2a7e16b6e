"""A folder of images + a JSONL file of {"image", "question", "answer"} lines (host side).

Tokenised with a local `tokenizer.json` (the `tokenizers` library) and batched like
the synthetic task: `question answer <eos>`, labels on the answer (and <eos>) only.
Every line is checked when the folder is opened, so a bad line stops a run before
it starts, with the file and line named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

EOS_CANDIDATES = ("<eos>", "</s>", "<|endoftext|>", "<|im_end|>")
PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]")


class DatasetError(ValueError):
    """Bad dataset input; the message names the file (and line)."""


@dataclass(frozen=True)
class Example:
    image: Path
    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]  # includes <eos> when the tokenizer has one
    where: str  # "file:line", for errors found later (e.g. an unreadable image)


def _find_jsonl(folder: Path) -> Path:
    preferred = folder / "data.jsonl"
    if preferred.is_file():
        return preferred
    found = sorted(folder.glob("*.jsonl"))
    if len(found) != 1:
        raise DatasetError(f"{folder}: expected data.jsonl or exactly one *.jsonl file, found {len(found)}")
    return found[0]


def _special_id(tokenizer, candidates: tuple[str, ...]) -> int | None:
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


class FolderDataset:
    """Examples from `folder` (JSONL + images, paths relative to the folder)."""

    def __init__(self, folder: str | Path, tokenizer_path: str | Path | None = None,
                 jsonl: str | Path | None = None):
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise DatasetError(f"{self.folder}: no such dataset folder")
        tokenizer_path = Path(tokenizer_path) if tokenizer_path else self.folder / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise DatasetError(f"{tokenizer_path}: tokenizer.json not found (pass its path)")
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise DatasetError(f"{tokenizer_path}: not a readable tokenizer.json ({exc})") from exc
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.eos_id = _special_id(self.tokenizer, EOS_CANDIDATES)
        pad = _special_id(self.tokenizer, PAD_CANDIDATES)
        self.pad_id = pad if pad is not None else (self.eos_id or 0)
        self.jsonl = Path(jsonl) if jsonl else _find_jsonl(self.folder)
        self.examples = self._read(self.jsonl)
        if not self.examples:
            raise DatasetError(f"{self.jsonl}: no examples")

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _read(self, path: Path) -> list[Example]:
        examples = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise DatasetError(f"{where}: expected an object with image, question, answer")
            for key in ("image", "question", "answer"):
                if not isinstance(record.get(key), str) or not record[key].strip():
                    raise DatasetError(f"{where}: field {key!r} is missing or empty")
            image = self.folder / record["image"]
            if not image.is_file():
                raise DatasetError(f"{where}: image {image} not found")
            answer = self._encode(record["answer"])
            if not answer:
                raise DatasetError(f"{where}: the answer tokenises to nothing")
            eos = (self.eos_id,) if self.eos_id is not None else ()
            examples.append(Example(image, tuple(self._encode(record["question"])), tuple(answer) + eos, where))
        return examples

    def load_image(self, example: Example, size: int) -> np.ndarray:
        """float32 [3, size, size] in [-1, 1] (SigLIP normalisation)."""
        from PIL import Image

        try:
            with Image.open(example.image) as img:
                pixels = np.asarray(img.convert("RGB").resize((size, size), Image.BILINEAR), dtype=np.float32)
        except OSError as exc:
            raise DatasetError(f"{example.where}: cannot read image {example.image} ({exc})") from exc
        return pixels.transpose(2, 0, 1) * np.float32(1 / 127.5) - np.float32(1.0)

    def tokenize(self, example: Example, text_length: int) -> tuple[np.ndarray, np.ndarray]:
        n_prompt, n = len(example.prompt_ids), len(example.prompt_ids) + len(example.answer_ids)
        if n > text_length:
            raise DatasetError(f"{example.where}: needs {n} tokens but text_length is {text_length}")
        ids = np.full(text_length, self.pad_id, dtype=np.int64)
        labels = np.full(text_length, -100, dtype=np.int64)
        ids[:n] = example.prompt_ids + example.answer_ids
        labels[n_prompt:n] = example.answer_ids
        return ids, labels

    def batches(self, cfg, batch_size: int, text_length: int, seed: int,
                image_size: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Endless shuffled batches, the same dicts as `synthetic_batches`."""
        if self.vocab_size > cfg.lm_vocab_size:
            raise DatasetError(f"{self.jsonl}: the tokenizer has {self.vocab_size} tokens, "
                               f"more than the model's lm_vocab_size {cfg.lm_vocab_size}")
        size = image_size or cfg.vit_img_size
        rng = np.random.default_rng(seed)
        order: list[int] = []
        while True:
            batch = {"input_ids": np.empty((batch_size, text_length), dtype=np.int64),
                     "images": np.empty((batch_size, 3, size, size), dtype=np.float32),
                     "labels": np.empty((batch_size, text_length), dtype=np.int64)}
            for b in range(batch_size):
                if not order:
                    order = list(rng.permutation(len(self.examples)))
                example = self.examples[order.pop()]
                batch["input_ids"][b], batch["labels"][b] = self.tokenize(example, text_length)
                batch["images"][b] = self.load_image(example, size)
            yield batch


def folder_batches(folder: str | Path, cfg, batch_size: int, text_length: int, seed: int,
                   image_size: int | None = None, tokenizer_path: str | Path | None = None
                   ) -> Iterator[dict[str, np.ndarray]]:
    """`synthetic_batches`' counterpart for a folder dataset."""
    return FolderDataset(folder, tokenizer_path).batches(cfg, batch_size, text_length, seed, image_size)
