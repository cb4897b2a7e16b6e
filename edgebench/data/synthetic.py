"""A synthetic visual-QA task drawn with numpy: coloured shapes, short questions, short answers.

Runs on a device with numpy only (no torch, no pillow, no download). Same seed, same
bytes. Up to four shapes, each in its own quadrant, each with a different shape and
colour, so every question has exactly one answer:

    colour    "what colour is the circle ?"        -> "red"
    shape     "what shape is the red object ?"     -> "circle"
    count     "how many shapes are there ?"        -> "three"
    position  "where is the red circle ?"          -> "top left"

Text is tokenised with a small built-in word vocabulary (ids < 64), so it fits any
config's vocabulary. The sequence is `<bos> question <sep> answer <eos> <pad>...`;
labels are -100 except on the answer and <eos>, and equal the input ids there: the
model shifts them itself (position t predicts token t+1).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

COLOURS = {
    "red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 230),
    "yellow": (235, 215, 40), "purple": (150, 60, 200), "white": (245, 245, 245),
}
SHAPES = ("circle", "square", "triangle", "diamond")
COUNT_WORDS = ("one", "two", "three", "four")
QUADRANTS = (("top", "left"), ("top", "right"), ("bottom", "left"), ("bottom", "right"))
QUESTION_TYPES = ("colour", "shape", "count", "position")

SPECIALS = ("<pad>", "<bos>", "<sep>", "<eos>")
WORDS = SPECIALS + tuple(sorted(
    set(COLOURS) | set(SHAPES) | set(COUNT_WORDS) | {w for q in QUADRANTS for w in q}
    | {"what", "colour", "shape", "is", "the", "object", "how", "many", "shapes", "are", "there", "where", "?"}
))
TOKEN_ID = {word: i for i, word in enumerate(WORDS)}
PAD_ID, BOS_ID, SEP_ID, EOS_ID = (TOKEN_ID[s] for s in SPECIALS)
MAX_TOKENS = 1 + 6 + 1 + 2 + 1  # <bos> longest question <sep> longest answer <eos>

# SigLIP normalisation: mean 0.5, std 0.5 per channel, i.e. pixels mapped to [-1, 1].
_BACKGROUND = (40, 40, 48)


def encode(words: list[str]) -> list[int]:
    return [TOKEN_ID[w] for w in words]


def decode(ids) -> list[str]:
    return [WORDS[int(i)] for i in ids]


def _shape_mask(shape: str, dy: np.ndarray, dx: np.ndarray, r: float) -> np.ndarray:
    """Pixels of `shape` (radius r) given offsets from its centre."""
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return (np.abs(dx) <= r * 0.85) & (np.abs(dy) <= r * 0.85)
    if shape == "diamond":
        return np.abs(dx) + np.abs(dy) <= r
    # triangle, apex up: the half-width grows linearly from the apex to the base
    return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)


def draw_scene(rng: np.random.Generator, size: int, objects: list[dict]) -> np.ndarray:
    """float32 [3, size, size] in [-1, 1]: each object in its quadrant, jittered."""
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
    return image * np.float32(1 / 127.5) - np.float32(1.0)


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


def tokenize(question: list[str], answer: list[str], text_length: int) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and labels [text_length]: labels mark the answer and <eos> only."""
    prompt = [BOS_ID, *encode(question), SEP_ID]
    target = [*encode(answer), EOS_ID]
    ids = np.full(text_length, PAD_ID, dtype=np.int64)
    labels = np.full(text_length, -100, dtype=np.int64)
    ids[: len(prompt) + len(target)] = prompt + target
    labels[len(prompt) : len(prompt) + len(target)] = target
    return ids, labels


def synthetic_batches(cfg, batch_size: int, text_length: int, seed: int,
                      image_size: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches {"input_ids" [B,T] int64, "images" [B,3,H,W] float32, "labels" [B,T] int64}.

    `cfg` needs only `lm_vocab_size` and `vit_img_size` (any VLMConfig).
    """
    size = image_size or cfg.vit_img_size
    if text_length < MAX_TOKENS:
        raise ValueError(f"text_length {text_length} is too short: the synthetic task needs {MAX_TOKENS} tokens")
    if cfg.lm_vocab_size < len(WORDS):
        raise ValueError(f"lm_vocab_size {cfg.lm_vocab_size} is below the synthetic vocabulary ({len(WORDS)} words)")
    if size < 8:
        raise ValueError(f"image_size {size} is too small to draw shapes (need >= 8)")
    rng = np.random.default_rng(seed)
    index = 0
    while True:
        ids = np.empty((batch_size, text_length), dtype=np.int64)
        labels = np.empty((batch_size, text_length), dtype=np.int64)
        images = np.empty((batch_size, 3, size, size), dtype=np.float32)
        for b in range(batch_size):
            sample = make_sample(rng, index, size)
            ids[b], labels[b] = tokenize(sample["question"], sample["answer"], text_length)
            images[b] = sample["image"]
            index += 1
        yield {"input_ids": ids, "images": images, "labels": labels}


def to_torch(batch: dict[str, np.ndarray], device: str = "cpu") -> dict[str, Any]:
    """The same batch as torch tensors on `device` (torch imported only here)."""
    import torch

    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
