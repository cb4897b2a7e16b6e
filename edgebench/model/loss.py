"""Cross-entropy over the vocabulary without holding [T, vocab] logits (eager training only).

The plain loss materialises fp32 logits for every position (1,137 x 49,152 x 4 bytes =
223 MB on nanovlm-460m) and their gradient beside them. Here only the positions that have a
label are projected, a chunk of rows at a time, and each chunk's logits are recomputed in
backward (edgebench.model.recompute), so at most one chunk's logits exist at once. The boolean
row selection depends on the labels' values, so exported programs keep the plain loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from edgebench.model.recompute import recomputed, trains

IGNORE_INDEX = -100
CHUNK_ROWS = 256  # 256 x 49,152 fp32 logits = 48 MiB, plus their gradient in backward


def _chunk_loss(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), labels, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                          labels: torch.Tensor, chunk_rows: int = CHUNK_ROWS) -> torch.Tensor:
    """Mean cross-entropy of `head(hidden)` [..., vocab] against `labels` [...] (IGNORE_INDEX skipped).

    Equal to `F.cross_entropy(head(hidden).flatten(0, -2), labels.flatten(), ignore_index=-100)`
    (NaN when no position has a label, as there).
    """
    hidden = hidden.reshape(-1, hidden.size(-1))
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    hidden, labels = hidden[keep], labels[keep]
    total = hidden.new_zeros((), dtype=torch.float32)
    head_trains = trains(head)
    for start in range(0, labels.numel(), chunk_rows):
        rows = slice(start, start + chunk_rows)
        # a trained head is used by every chunk: its gradient must sum over them (shared)
        total = total + recomputed(_chunk_loss, head, hidden[rows], labels[rows],
                                   trains=head_trains, shared=head_trains)
    return total / labels.numel()
