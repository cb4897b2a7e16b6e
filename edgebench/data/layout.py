"""How samples become batches, laid out as nanoVLM lays them out (numpy only).

A sample is a token sequence, its labels and its images ([0, 1] pixels, as nanoVLM's
ToTensor gives them). In main's layout (`cfg.image_splitting`) the image is a global
view plus tiles, and the sequence carries one marker token and `mp_image_token_length`
placeholders per image where the chat template puts the image; in v0.1's layout the
single image is put before the text by the model. Batches are left-padded with an
attention mask (1 token, 0 padding), as nanoVLM's collators pad, or packed: several
samples per row, each followed by a masked padding token (nanoVLM's
ConstantLengthDataset), with every sample's tiles in row order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgebench.model.config import VLMConfig

IGNORE = -100


@dataclass
class Sample:
    ids: list[int]
    labels: list[int]  # the token where it is trained, IGNORE elsewhere (the model shifts)
    images: np.ndarray  # float32 [n, 3, S, S] in [0, 1]


def assemble(parts: Iterable[tuple[list[int], bool]]) -> tuple[list[int], list[int]]:
    """Concatenate (ids, trained) parts: labels equal the ids where trained, IGNORE elsewhere."""
    ids: list[int] = []
    labels: list[int] = []
    for part, trained in parts:
        ids += part
        labels += part if trained else [IGNORE] * len(part)
    return ids, labels


def image_ids(cfg: VLMConfig, grid: tuple[int, int]) -> list[int]:
    """main's image string: the global marker and view, then each tile's marker and tokens."""
    tokens = [cfg.image_token_id] * cfg.n_image_tokens
    ids = [cfg.marker_token_id(0, 0), *tokens]
    rows, cols = grid
    if rows * cols == 1:  # one tile is the global view itself
        return ids
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            ids += [cfg.marker_token_id(r, c), *tokens]
    return ids


def split_tiles(pixels: np.ndarray, tile: int, global_view: np.ndarray) -> np.ndarray:
    """[3, rows*tile, cols*tile] -> [1 + rows*cols, 3, tile, tile]: the global view, then tiles row by row.

    A single tile is the global view itself, as in nanoVLM.
    """
    _, height, width = pixels.shape
    rows, cols = height // tile, width // tile
    tiles = pixels.reshape(3, rows, tile, cols, tile).transpose(1, 3, 0, 2, 4)
    if rows * cols == 1:
        return tiles.reshape(1, 3, tile, tile)
    # written once into its place: no tiles copy beside the result (17 views of 512 px: 51 MB each)
    views = np.empty((1 + rows * cols, 3, tile, tile), dtype=pixels.dtype)
    views[0] = global_view
    views[1:].reshape(rows, cols, 3, tile, tile)[...] = tiles
    return views


def batches(samples: Iterator[Sample], batch_size: int, width: int, pad_id: int,
            packing: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Endless {"input_ids", "labels", "attention_mask"} int64 [B, width] and "images" [N, 3, S, S].

    Rows are left-padded. With `packing`, each row takes samples (each followed by a masked
    `pad_id` separator) while they fit, as nanoVLM's packing does.
    """
    pending: Sample | None = None
    while True:
        rows: list[list[Sample]] = []
        for _ in range(batch_size):
            row = [pending if pending is not None else next(samples)]
            pending = None
            used = len(row[0].ids) + packing
            while packing:
                candidate = next(samples)
                if used + len(candidate.ids) + 1 > width:
                    pending = candidate
                    break
                row.append(candidate)
                used += len(candidate.ids) + 1
            rows.append(row)
        batch = _collate(rows, width, pad_id, packing)
        del rows, row  # the samples' pixels go now, not while the batch trains
        yield batch
        del batch  # nor while the next one is made


def _collate(rows: list[list[Sample]], width: int, pad_id: int, packing: bool) -> dict[str, np.ndarray]:
    out = {"input_ids": np.full((len(rows), width), pad_id, dtype=np.int64),
           "labels": np.full((len(rows), width), IGNORE, dtype=np.int64),
           "attention_mask": np.zeros((len(rows), width), dtype=np.int64)}
    images = []
    for b, row in enumerate(rows):
        ids, labels, mask = [], [], []
        for sample in row:
            ids += sample.ids + ([pad_id] if packing else [])
            labels += sample.labels + ([IGNORE] if packing else [])
            mask += [1] * len(sample.ids) + ([0] if packing else [])
            images.append(sample.images)
        start = width - len(ids)
        out["input_ids"][b, start:], out["labels"][b, start:], out["attention_mask"][b, start:] = ids, labels, mask
    out["images"] = _one_array(images)
    return out


def _one_array(images: list[np.ndarray]) -> np.ndarray:
    """The images as one array: one contiguous image without a copy (17 views of 512 px: 51 MB),
    but with a fresh array's strides (a [None] view's new axis has stride 0, which ExecuTorch refuses)."""
    if len(images) == 1 and images[0].flags.c_contiguous:
        return images[0].reshape(-1).reshape(images[0].shape)
    return np.concatenate(images)
