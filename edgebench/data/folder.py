"""A folder of images + a JSONL file of {"image", "question", "answer"} lines (host side).

A line may instead carry the_cauldron's shape, as nanoVLM's datasets do: {"images": [paths],
"texts": [{"user", "assistant"}, ...]} (edgebench.data.hf writes such folders from Hugging
Face datasets). Tokenised with a local `tokenizer.json` (the `tokenizers` library; see
`find_tokenizer` for where it is looked for) and batched like the synthetic task, in the
config's nanoVLM layout (edgebench.data.layout):

    v0.1   "Question: {user} Answer:" assistant <eos> of the first turn, the first image
           resized to vit_img_size (nanoVLM v0.1's VQADataset)
    main   ChatML turns, each assistant reply trained, with every image's string
           ("<image: i>" before each when there are several) first in the first user
           turn; each image resized (bicubic) so its long side is max_img_size (or up to
           it), cut into tiles plus a global view

Labels cover the answer and what ends it. Pixels are [0, 1], as nanoVLM's ToTensor
gives them. Every line is checked when the folder is opened, so a bad line stops a
run before it starts, with the file and line named: an image must be a path inside the
folder (edgebench.untrusted: no absolute path, no '..', no symlink leading out).
`check` reads every image before a run: its header first (a real image, at most
`pixel_limit` pixels: the model's own need, so a huge image is refused before it is
decoded), then its pixels (a truncated or damaged image is refused before the run).
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgebench.data.layout import IGNORE, Sample, assemble, image_ids, split_tiles
from edgebench.data.layout import batches as layout_batches
from edgebench.errors import EdgebenchError
from edgebench.untrusted import UnsafeName, regular_file

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage
    from tokenizers import Tokenizer

    from edgebench.model.config import VLMConfig

EOS_CANDIDATES = ("<eos>", "</s>", "<|endoftext|>", "<|im_end|>")
PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]")
# The most a dataset's files may hold (untrusted.regular_file): read whole, or decoded.
MAX_JSONL_BYTES = 2**30
MAX_TOKENIZER_BYTES = 64 * 2**20
MAX_IMAGE_FILE_BYTES = 256 * 2**20
# The largest image decoded: MODEL_PIXEL_FACTOR times the pixels the model sees of it (its
# long side resized to max_img_size, or to vit_img_size in v0.1's layout), at least
# MIN_PIXEL_LIMIT (a 16-megapixel photo, 48 MiB decoded).
MODEL_PIXEL_FACTOR = 16
MIN_PIXEL_LIMIT = 4096 * 4096


class DatasetError(EdgebenchError, ValueError):
    """Bad dataset input: a folder's file (and line), or a shape the synthetic task cannot fill;
    the message names it and the fix."""


@dataclass(frozen=True)
class Example:
    images: tuple[Path, ...]
    turns: tuple[tuple[str, str], ...]  # (user, assistant)
    where: str  # "file:line" (or the row it came from), for errors found later (e.g. an unreadable image)


def _find_jsonl(folder: Path) -> Path:
    """data.jsonl, or the folder's one *.jsonl: a regular file inside it (untrusted.regular_file)."""
    found = ["data.jsonl"] if (folder / "data.jsonl").exists() else sorted(p.name for p in folder.glob("*.jsonl"))
    if len(found) != 1:
        raise DatasetError(f"{folder}: expected data.jsonl or exactly one *.jsonl file, found {len(found)} (or a "
                           "Hugging Face dataset: a save_to_disk folder or parquet files)")
    try:
        path = regular_file(folder, found[0], "dataset file", MAX_JSONL_BYTES)
    except UnsafeName as exc:
        raise DatasetError(str(exc)) from None
    if path is None:  # a link to nowhere
        raise DatasetError(f"{folder / found[0]}: a link to a file that does not exist; put the dataset file there")
    return path


def find_tokenizer(folder: str | Path, checkpoint: str | Path | None = None,
                   tokenizer: str | Path | None = None) -> Path:
    """The tokenizer.json a run reads: `tokenizer` (--tokenizer: the file, or a folder holding
    it) when given, else the dataset folder's, else the one beside the checkpoint's config.json
    (where Hugging Face saves a model's). The same lookup on the host and on the device, where
    deploy has shipped each of them; a dataset's or checkpoint's tokenizer.json that links out
    of its folder is refused (edgebench.untrusted.inside)."""
    if tokenizer:
        path = Path(tokenizer) / "tokenizer.json" if Path(tokenizer).is_dir() else Path(tokenizer)
        if not path.is_file():
            raise DatasetError(f"{path}: no such tokenizer file; give --tokenizer the model's tokenizer.json "
                               "or the folder holding it")
        return path
    for where in (folder, checkpoint) if checkpoint else (folder,):
        try:
            found = regular_file(where, "tokenizer.json", "tokenizer", MAX_TOKENIZER_BYTES)
        except UnsafeName as exc:
            raise DatasetError(str(exc)) from None
        if found is not None:
            return found
    beside = f" or beside the model's config.json in {checkpoint}" if checkpoint else ""
    raise DatasetError(f"no tokenizer.json in {folder}{beside}; give --tokenizer PATH (the model's tokenizer.json "
                       "or its folder)")


def _special_id(tokenizer: Tokenizer, candidates: tuple[str, ...]) -> int | None:
    for token in candidates:
        token_id: int | None = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


class FolderDataset:
    """Examples from `folder` (JSONL + images, paths relative to the folder), tokenised with
    find_tokenizer(folder, checkpoint, tokenizer_path)."""

    def __init__(self, folder: str | Path, tokenizer_path: str | Path | None = None,
                 jsonl: str | Path | None = None, checkpoint: str | Path | None = None):
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise DatasetError(f"{self.folder}: no such dataset folder")
        self.tokenizer_path = find_tokenizer(self.folder, checkpoint, tokenizer_path)
        try:
            self.tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise DatasetError(f"{self.tokenizer_path}: not a readable tokenizer.json ({exc}); give --tokenizer "
                               "the model's tokenizer.json") from exc
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
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line_number = raw.count(b"\n", 0, exc.start) + 1
            raise DatasetError(f"{path}:{line_number}: not UTF-8 text (byte {exc.start}); a dataset's JSONL is one "
                               "JSON object per line") from None
        examples = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise DatasetError(f"{where}: expected an object with image, question, answer (or images, texts)")
            where = record.get("origin") or where
            names, turns = _images_and_turns(record, where)
            try:
                found = [(name, regular_file(self.folder, name, "image", MAX_IMAGE_FILE_BYTES)) for name in names]
            except UnsafeName as exc:
                raise DatasetError(f"{where}: {exc}") from None
            missing = [name for name, image in found if image is None]
            if missing:
                raise DatasetError(f"{where}: image {self.folder / missing[0]} not found")
            images = tuple(image for _, image in found if image is not None)
            for _, answer in turns:
                if not self._encode(answer):
                    raise DatasetError(f"{where}: the answer tokenises to nothing")
            examples.append(Example(images, turns, where))
        return examples

    def text(self, example: Example, cfg: VLMConfig) -> tuple[list[int], list[int]]:
        """The sample's text (ids, labels) in the config's layout, without the image string."""
        if not cfg.image_splitting:
            (question, answer), *_ = example.turns
            eos = [self.eos_id] if self.eos_id is not None else []
            return assemble([(self._encode(f"Question: {question} Answer:"), False),
                             (self._encode(answer) + eos, True)])
        parts = []
        for question, answer in example.turns:
            parts += [(self._encode("<|im_start|>user\n"), False),
                      (self._encode(f"{question}<|im_end|>\n<|im_start|>assistant\n"), False),
                      (self._encode(f"{answer}<|im_end|>\n"), True)]
        return assemble(parts)

    def _open(self, image: Path, where: str, cfg: VLMConfig) -> PILImage:
        """The image decoded as RGB (see `_image`)."""
        with _image(image, where, cfg) as img:
            return img.convert("RGB")

    def check(self, cfg: VLMConfig, text_length: int, packing: bool = False) -> None:
        """Before any run: the tokenizer fits the model, every sample's text fits text_length, and
        every image is within the pixel limit (read from its header first) and decodes whole (a
        truncated JPEG's header reads fine: refused here, naming the file, not mid-run)."""
        self._check_vocabulary(cfg)
        for example in self.examples:
            ids, _ = self.text(example, cfg)
            if len(ids) + packing > text_length:
                raise DatasetError(f"{example.where}: needs {len(ids) + packing} text tokens but --text-length is "
                                   f"{text_length}; raise --text-length or shorten the question and answer")
            for image in example.images:
                with _image(image, example.where, cfg) as img:
                    img.load()

    def _check_vocabulary(self, cfg: VLMConfig) -> None:
        if self.vocab_size > cfg.image_token_id:
            raise DatasetError(f"{self.jsonl}: the tokenizer has {self.vocab_size} tokens, more than the "
                               f"model's base vocabulary {cfg.image_token_id} (lm_vocab_size - extra_token_amount)")

    def load_image(self, example: Example, cfg: VLMConfig) -> np.ndarray:
        """v0.1: the first image, float32 [3, size, size] in [0, 1] (bilinear resize, then ToTensor),
        size = cfg.vit_img_size."""
        from PIL import Image

        size = cfg.vit_img_size
        image = self._open(example.images[0], example.where, cfg)
        return _to_array(image.resize((size, size), Image.Resampling.BILINEAR))

    def load_tiles(self, image: Path, where: str, cfg: VLMConfig) -> tuple[np.ndarray, tuple[int, int]]:
        """main: [n, 3, S, S] in [0, 1] (global view first) and the tile grid, as nanoVLM splits."""
        from PIL import Image

        img = self._open(image, where, cfg)
        tile = cfg.vit_img_size
        width, height = img.size
        long, short = max(width, height), min(width, height)
        target_long = cfg.max_img_size if cfg.resize_to_max_side_len else min(cfg.max_img_size,
                                                                              math.ceil(long / tile) * tile)
        target_short = max(tile, math.ceil(short * target_long / long / tile) * tile)
        size = (target_long, target_short) if width >= height else (target_short, target_long)
        resized = img.resize(size, Image.Resampling.BICUBIC)
        pixels = _to_array(resized)
        grid = (pixels.shape[1] // tile, pixels.shape[2] // tile)
        return split_tiles(pixels, tile, _to_array(resized.resize((tile, tile), Image.Resampling.BILINEAR))), grid

    def sample(self, example: Example, cfg: VLMConfig, text_length: int, packing: bool = False) -> Sample:
        ids, labels = self.text(example, cfg)
        if len(ids) + packing > text_length:  # packing adds a separator after each sample
            raise DatasetError(f"{example.where}: needs {len(ids) + packing} tokens but text_length is {text_length}")
        if not cfg.image_splitting:
            return Sample(ids, labels, self.load_image(example, cfg)[None])
        loaded = [self.load_tiles(path, example.where, cfg) for path in example.images]
        image: list[int] = []
        for index, (_, grid) in enumerate(loaded):
            image += (self._encode(f"<image: {index}>") if len(loaded) > 1 else []) + image_ids(cfg, grid)
        width = cfg.sequence_length(text_length)  # room for the text and one image at most
        if len(ids) + len(image) + packing > width:
            raise DatasetError(
                f"{example.where}: its {len(loaded)} images and text need {len(ids) + len(image) + packing} "
                f"positions but a row holds {width} (text_length + one image); raise --text-length"
            )
        prefix = len(self._encode("<|im_start|>user\n"))
        return Sample(ids[:prefix] + image + ids[prefix:], labels[:prefix] + [IGNORE] * len(image) + labels[prefix:],
                      np.concatenate([tiles for tiles, _ in loaded]))

    def longest_answer_tokens(self) -> int:
        return max(len(self._encode(answer)) for example in self.examples for _, answer in example.turns)

    def hold_out(self, fraction: float, seed: int, part: str) -> None:
        """Keeps only `part` ("train" or "heldout") of a seed-fixed split that holds out `fraction`
        of the examples (at least one, and at least one left to train on)."""
        count = len(self.examples)
        if count < 2:
            raise DatasetError(f"{self.jsonl}: {count} example; a held-out evaluation needs at least 2 "
                               "(one to train on, one held out)")
        held = int(min(count - 1, max(1, round(fraction * count))))
        out = set(np.random.default_rng(seed).permutation(count)[:held].tolist())
        self.examples = [e for i, e in enumerate(self.examples) if (i in out) == (part == "heldout")]

    def batches(self, cfg: VLMConfig, batch_size: int, text_length: int, seed: int,
                image_size: int | None = None, packing: bool = False) -> Iterator[dict[str, np.ndarray]]:
        """Endless shuffled batches, the same dicts as `synthetic_batches` (main: N varies with the images)."""
        self._check_vocabulary(cfg)
        cfg = cfg.with_image_size(image_size)
        if packing and not cfg.image_splitting:
            raise DatasetError("packing needs image splitting (main's layout): v0.1 puts one image before each row")
        rng = np.random.default_rng(seed)

        def samples() -> Iterator[Sample]:
            order: list[int] = []
            while True:
                if not order:
                    order = list(rng.permutation(len(self.examples)))
                yield self.sample(self.examples[order.pop()], cfg, text_length, packing)

        width = cfg.sequence_length(text_length) if cfg.image_splitting else text_length
        return layout_batches(samples(), batch_size, width, self.pad_id, packing)


def _images_and_turns(record: dict[str, Any], where: str) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    """A line's image paths and (user, assistant) turns, in either of the two shapes."""
    if "images" not in record and "texts" not in record:
        for key in ("image", "question", "answer"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise DatasetError(f"{where}: field {key!r} is missing or empty")
        return [record["image"]], ((record["question"], record["answer"]),)
    images, texts = record.get("images"), record.get("texts")
    if not isinstance(images, list) or not images or not all(isinstance(i, str) and i for i in images):
        raise DatasetError(f"{where}: field 'images' must be a non-empty list of image paths")
    if not isinstance(texts, list) or not texts:
        raise DatasetError(f"{where}: field 'texts' must be a non-empty list of {{user, assistant}} turns")
    for number, turn in enumerate(texts):
        for key in ("user", "assistant"):
            if not isinstance(turn, dict) or not isinstance(turn.get(key), str) or not turn[key].strip():
                raise DatasetError(f"{where}: texts[{number}] field {key!r} is missing or empty")
    return images, tuple((turn["user"], turn["assistant"]) for turn in texts)


def pixel_limit(cfg: VLMConfig) -> int:
    """The most pixels an image may have to be decoded for this model (see MODEL_PIXEL_FACTOR)."""
    side = cfg.max_img_size if cfg.image_splitting else cfg.vit_img_size
    return max(MIN_PIXEL_LIMIT, MODEL_PIXEL_FACTOR * side * side)


@contextlib.contextmanager
def _image(path: Path, where: str, cfg: VLMConfig) -> Iterator[PILImage]:
    """The opened image (header read, nothing decoded yet), refused unless Pillow reads it and it
    has at most pixel_limit(cfg) pixels; a decoding error inside names the file too."""
    from PIL import Image

    limit = pixel_limit(cfg)
    Image.MAX_IMAGE_PIXELS = limit  # Pillow's decompression-bomb check, from the model's need

    def too_large(size: str) -> DatasetError:
        return DatasetError(f"{where}: image {path} has {size} pixels; this model decodes at most "
                            f"{limit:,} ({MODEL_PIXEL_FACTOR}x its own input): make the image smaller")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, with its size
            with Image.open(path) as img:
                width, height = img.size
                if width * height > limit:
                    raise too_large(f"{width}x{height} = {width * height:,}")
                yield img
    except Image.DecompressionBombError:  # past twice the limit: Pillow refuses it while opening
        raise too_large(f"more than {2 * limit:,}") from None
    except OSError as exc:
        raise DatasetError(f"{where}: {path} is not an image Pillow reads ({exc}); use a JPEG, "
                           "PNG or another image format") from None


def _to_array(img: PILImage) -> np.ndarray:
    """ToTensor: uint8 HWC -> float32 CHW in [0, 1]."""
    return np.asarray(img, dtype=np.float32).transpose(2, 0, 1) * np.float32(1 / 255)


def folder_batches(folder: str | Path, cfg: VLMConfig, batch_size: int, text_length: int, seed: int,
                   image_size: int | None = None, tokenizer_path: str | Path | None = None,
                   packing: bool = False, checkpoint: str | Path | None = None) -> Iterator[dict[str, np.ndarray]]:
    """`synthetic_batches`' counterpart for a folder dataset."""
    return FolderDataset(folder, tokenizer_path, checkpoint=checkpoint).batches(cfg, batch_size, text_length, seed,
                                                                                 image_size, packing)
