"""Restricted draft vocabularies: the published d2t map, validated once, both directions built once on the host.

A drafter over Vd < V ids drafts draft id i for target id ids[i]. Checkpoints store d2t = ids - arange(Vd) (EAGLE-3's
convention; our DFlash checkpoints share it) and may store its inverse t2d, which is implied and not read.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .base import DrafterError


class DraftVocab(NamedTuple):
    """Both directions of a draft vocabulary (a pytree: it passes through jit as two arrays)."""

    ids: jax.Array  # [Vd] int32: the target id of each draft id, all distinct
    slots: jax.Array  # [V] int32: the draft id of each target id, -1 outside the draft vocabulary

    def d2t(self) -> np.ndarray:
        """The checkpoint tensor d2t [Vd] int64: target id = draft id + d2t[draft id]."""
        ids = np.asarray(self.ids, np.int64)
        return ids - np.arange(len(ids))


def from_ids(ids: np.ndarray, vocab_size: int, who: str) -> DraftVocab:
    """The vocabulary of target ids [Vd]; DrafterError (naming `who`) unless they are 1..V distinct ids of 0..V-1."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not 1 <= len(ids) <= vocab_size:
        raise DrafterError(f"{who} d2t must be a vector of 1..{vocab_size} entries (the target vocab), "
                           f"got shape {list(ids.shape)}")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise DrafterError(f"{who} d2t maps draft ids to target ids {int(ids.min())}..{int(ids.max())}, "
                           f"outside the target vocab 0..{vocab_size - 1}")
    if len(np.unique(ids)) != len(ids):
        raise DrafterError(f"{who} d2t maps {len(ids) - len(np.unique(ids))} draft ids onto target ids another "
                           "draft id already has")
    slots = np.full(vocab_size, -1, np.int32)
    slots[ids] = np.arange(len(ids), dtype=np.int32)
    return DraftVocab(jnp.asarray(ids, jnp.int32), jnp.asarray(slots))


def from_d2t(d2t: np.ndarray, vocab_size: int, who: str) -> DraftVocab:
    """The vocabulary of a checkpoint's d2t [Vd] (see from_ids for what is refused)."""
    d2t = np.asarray(d2t)
    if d2t.ndim != 1:
        raise DrafterError(f"{who} d2t must be a vector, got shape {list(d2t.shape)}")
    return from_ids(np.arange(len(d2t)) + d2t.astype(np.int64), vocab_size, who)


def most_frequent(token_counts: np.ndarray | None, size: int, vocab_size: int) -> DraftVocab:
    """The `size` most frequent target ids of token_counts [V] (ties: lower id) in id order, or, without counts,
    ids 0..size-1 (byte-level BPE vocabularies list frequent merges first)."""
    if token_counts is None:
        return from_ids(np.arange(size), vocab_size, "draft vocab")
    chosen = np.sort(np.argsort(-np.asarray(token_counts), kind="stable")[:size])
    return from_ids(chosen, vocab_size, "draft vocab")
