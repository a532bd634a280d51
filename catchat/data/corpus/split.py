"""The train/eval split: each conversation's key (from the sha256 of its tokens) and the rule on it.

A conversation is held out when its 63-bit key < eval_fraction * 2^63, so the split is stable when
the corpus grows or is reordered, and the same text always lands on the same side. Conversations of
held-out works (catchat.data.corpus.holdout) are eval whatever their key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_KEY_SHIFT = 1  # split keys are the first 8 bytes of sha256 >> 1: 63 bits, fits int64
_KEY_SCALE = float(1 << 63)


def split_key(digest: bytes) -> int:
    """The split key of a conversation from the sha256 digest of its tokens (index column 2)."""
    return int.from_bytes(digest[:8], "big") >> _KEY_SHIFT


def split_mask(keys: np.ndarray, eval_fraction: float, held: np.ndarray | None = None) -> np.ndarray:
    """Boolean [N]: True for held-out (eval) conversations. `keys` are index column 2.

    `held` (boolean [N], optional): conversations of held-out works (catchat.data.corpus.holdout), eval
    whatever their key; the hash rule decides the others. Eval iff key < eval_fraction * 2^63. When
    eval_fraction > 0 and the others number >= 2, at least one of them is held out (the smallest
    key) and at least one stays in train (the largest)."""
    keys = np.asarray(keys, dtype=np.int64)
    if held is None or not held.any():
        return _hash_mask(keys, eval_fraction)
    mask = held.copy()
    mask[~held] = _hash_mask(keys[~held], eval_fraction)
    return mask


def _hash_mask(keys: np.ndarray, eval_fraction: float) -> np.ndarray:
    if eval_fraction <= 0 or keys.size == 0:
        return np.zeros(keys.shape, dtype=bool)
    mask = keys.astype(np.float64) < eval_fraction * _KEY_SCALE
    if keys.size >= 2:
        if not mask.any():
            mask[int(np.argmin(keys))] = True
        if mask.all():
            mask[int(np.argmax(keys))] = False
    return mask


@dataclass
class Split:
    """Conversation ids (rows of the index, in corpus order) of each side of the split."""

    train: np.ndarray  # int64 [n_train]
    eval: np.ndarray  # int64 [n_eval]
    considered: int  # conversations read (max_conversations cap applied)
    total: int  # conversations in the corpus
    note: str = ""  # says so when max_conversations capped the corpus
