"""A synthetic visual-QA task drawn with numpy: coloured shapes, short questions, short answers.

Runs on a device with numpy only (no torch, no pillow, no download). Same seed, same
bytes. Up to four shapes, each in its own quadrant, each with a different shape and
colour, so every question has exactly one answer:

    colour    "what colour is the circle ?"        -> "red"
    shape     "what shape is the red object ?"     -> "circle"
    count     "how many shapes are there ?"        -> "three"
    position  "where is the red circle ?"          -> "top left"

Text is tokenised with a small built-in word vocabulary (ids < 64), so it fits any
config's vocabulary. Pixels are in [0, 1], as nanoVLM's ToTensor gives them. The
sequence follows the config's nanoVLM revision (see edgebench.data.layout):

    v0.1   <bos> question <sep> answer <eos>            (the model puts the image first)
    main   <im_start> user <nl> IMAGE question <im_end> <nl> <im_start> assistant <nl>
           answer <im_end> <nl>                         (ChatML, nanoVLM's template)

where IMAGE is the global view and 4x4 tiles drawn at max_img_size, each behind its
marker token. Labels are -100 except on the answer and what ends it, and equal the
input ids there: the model shifts them itself (position t predicts token t+1).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from edgebench.data.folder import DatasetError
from edgebench.data.layout import Sample, assemble, image_ids, split_tiles
from edgebench.data.layout import batches as layout_batches

if TYPE_CHECKING:
    from edgebench.model.config import VLMConfig

COLOURS = {
    "red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 230),
    "yellow": (235, 215, 40), "purple": (150, 60, 200), "white": (245, 245, 245),
}
SHAPES = ("circle", "square", "triangle", "diamond")
COUNT_WORDS = ("one", "two", "three", "four")
QUADRANTS = (("top", "left"), ("top", "right"), ("bottom", "left"), ("bottom", "right"))
QUESTION_TYPES = ("colour", "shape", "count", "position")

SPECIALS = ("<pad>", "<bos>", "<sep>", "<eos>", "<im_start>", "<im_end>", "<nl>")
WORDS = SPECIALS + tuple(sorted(
    set(COLOURS) | set(SHAPES) | set(COUNT_WORDS) | {w for q in QUADRANTS for w in q}
    | {"what", "colour", "shape", "is", "the", "object", "how", "many", "shapes", "are", "there", "where", "?"}
    | {"user", "assistant"}
))
TOKEN_ID = {word: i for i, word in enumerate(WORDS)}
PAD_ID, BOS_ID, SEP_ID, EOS_ID, IM_START_ID, IM_END_ID, NL_ID = (TOKEN_ID[s] for s in SPECIALS)
LONGEST_QA = 8  # question + answer words: "where is the red circle ?" "top left" (or 7 + 1)
MAX_TOKENS = 1 + LONGEST_QA + 2  # <bos> question <sep> answer <eos>
MAX_CHAT_TOKENS = 3 + LONGEST_QA + 2 + 3 + 2  # ChatML turns around them
USER, ASSISTANT = [IM_START_ID, TOKEN_ID["user"], NL_ID], [IM_START_ID, TOKEN_ID["assistant"], NL_ID]
TURN_END = [IM_END_ID, NL_ID]

_BACKGROUND = (40, 40, 48)


def encode(words: list[str]) -> list[int]:
    return [TOKEN_ID[w] for w in words]


def decode(ids: Iterable[int]) -> list[str]:
    return [WORDS[int(i)] for i in ids]


def _shape_mask(shape: str, dy: np.ndarray, dx: np.ndarray, r: float) -> np.ndarray:
    """Pixels of `shape` (radius r) given offsets from its centre."""
    if shape == "circle":
        mask = dx * dx + dy * dy <= r * r
    elif shape == "square":
        mask = (np.abs(dx) <= r * 0.85) & (np.abs(dy) <= r * 0.85)
    elif shape == "diamond":
        mask = np.abs(dx) + np.abs(dy) <= r
    else:  # triangle, apex up: the half-width grows linearly from the apex to the base
        mask = (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    return np.asarray(mask)


def draw_scene(rng: np.random.Generator, size: int, objects: list[dict[str, Any]]) -> np.ndarray:
    """float32 [3, size, size] in [0, 1]: each object in its quadrant, jittered."""
    image = np.empty((3, size, size), dtype=np.float32)
    image[:] = (np.array(_BACKGROUND, dtype=np.float32) + rng.integers(-8, 9, 3)).reshape(3, 1, 1)
    half = size // 2
    for obj in objects:
        row, col = divmod(obj["quadrant"], 2)
        r = half * rng.uniform(0.28, 0.4)
        cy = row * half + half / 2 + rng.uniform(-0.08, 0.08) * half
        cx = col * half + half / 2 + rng.uniform(-0.08, 0.08) * half
        y0, x0 = row * half, col * half
        dy = np.arange(y0, y0 + half, dtype=np.float32)[:, None] + 0.5 - cy
        dx = np.arange(x0, x0 + half, dtype=np.float32)[None, :] + 0.5 - cx
        mask = _shape_mask(obj["shape"], dy, dx, r)
        region = image[:, y0 : y0 + half, x0 : x0 + half]
        for channel, value in enumerate(COLOURS[obj["colour"]]):
            region[channel][mask] = value
    return image * np.float32(1 / 255)


def make_sample(rng: np.random.Generator, index: int, size: int) -> dict[str, Any]:
    """One example; the question type cycles with `index` so every batch covers all types."""
    n = int(rng.integers(1, 5))
    colours = list(COLOURS)
    objects = [
        {"shape": SHAPES[s], "colour": colours[c], "quadrant": int(q)}
        for s, c, q in zip(rng.permutation(len(SHAPES))[:n], rng.permutation(len(colours))[:n],
                           rng.permutation(len(QUADRANTS))[:n])
    ]
    kind = QUESTION_TYPES[index % len(QUESTION_TYPES)]
    target = objects[int(rng.integers(n))]
    if kind == "colour":
        question, answer = ["what", "colour", "is", "the", target["shape"], "?"], [target["colour"]]
    elif kind == "shape":
        question, answer = ["what", "shape", "is", "the", target["colour"], "object", "?"], [target["shape"]]
    elif kind == "count":
        question, answer = ["how", "many", "shapes", "are", "there", "?"], [COUNT_WORDS[n - 1]]
    else:
        question = ["where", "is", "the", target["colour"], target["shape"], "?"]
        answer = list(QUADRANTS[target["quadrant"]])
    return {"kind": kind, "question": question, "answer": answer, "objects": objects,
            "image": draw_scene(rng, size, objects)}


def _samples(cfg: VLMConfig, seed: int, size: int) -> Iterator[Sample]:
    """Endless samples in the config's layout; `size` is the drawn image's side. Each is made and
    yielded in one expression, so this frame holds none of its pixels while it trains."""
    rng = np.random.default_rng(seed)
    index = 0
    while True:
        yield _in_layout(cfg, make_sample(rng, index, size), size)
        index += 1


def _in_layout(cfg: VLMConfig, s: dict[str, Any], size: int) -> Sample:
    """One drawn sample as the config's revision lays it out (main: the image's tiles and global
    view; the drawn 2,048-px image, 50 MB, goes when this returns)."""
    question, answer = encode(s["question"]), encode(s["answer"])
    if not getattr(cfg, "image_splitting", False):
        ids, labels = assemble([([BOS_ID, *question, SEP_ID], False), ([*answer, EOS_ID], True)])
        return Sample(ids, labels, s["image"][None])
    tile = cfg.vit_img_size
    factor = size // tile  # the global view: the whole image averaged down to one tile
    global_view = s["image"].reshape(3, tile, factor, tile, factor).mean(axis=(2, 4))
    ids, labels = assemble([(USER + image_ids(cfg, cfg.image_grid) + question + TURN_END + ASSISTANT, False),
                            (answer + TURN_END, True)])
    return Sample(ids, labels, split_tiles(s["image"], tile, global_view))


def synthetic_batches(cfg: VLMConfig, batch_size: int, text_length: int, seed: int,
                      image_size: int | None = None, packing: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches {"input_ids", "labels", "attention_mask"} int64 [B, W], "images" float32 [N, 3, S, S].

    v0.1 layout: W = text_length, N = B. main layout (`cfg.image_splitting`): W =
    cfg.sequence_length(text_length) and N = B * cfg.n_tiles (more with `packing`).
    `cfg` needs only `lm_vocab_size` and `vit_img_size` for v0.1's layout (any VLMConfig).
    `image_size` re-sizes the image (v0.1) or the tile (main).
    """
    splitting = getattr(cfg, "image_splitting", False)
    if splitting:
        cfg = cfg.with_image_size(image_size)
        size, width, need = cfg.vit_img_size * cfg.image_grid[0], cfg.sequence_length(text_length), MAX_CHAT_TOKENS
        vocabulary = cfg.image_token_id
    else:
        size, width, need, vocabulary = image_size or cfg.vit_img_size, text_length, MAX_TOKENS, cfg.lm_vocab_size
        if packing:
            raise DatasetError("packing needs image splitting (main's layout): v0.1 puts one image before each "
                               "row; drop --packing or use a main-layout model (nanovlm-460m)")
    if text_length < need + packing:
        raise DatasetError(f"text_length {text_length} is too short: the synthetic task needs {need + packing} "
                           f"tokens; use --text-length {need + packing} or more")
    if vocabulary < len(WORDS):
        raise DatasetError(f"lm_vocab_size {cfg.lm_vocab_size} leaves fewer base tokens than the synthetic "
                           f"vocabulary ({len(WORDS)} words); train this model on a dataset (--data)")
    if size < 8:
        raise DatasetError(f"image_size {size} is too small to draw shapes (need >= 8); use a larger image size")
    return layout_batches(_samples(cfg, seed, size), batch_size, width, PAD_ID, packing)


def to_torch(batch: dict[str, np.ndarray], device: str = "cpu") -> dict[str, Any]:
    """The same batch as torch tensors on `device` (torch imported only here)."""
    import torch

    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
