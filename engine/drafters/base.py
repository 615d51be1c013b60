"""The drafter protocol every drafter implements, and the errors they raise.

The engine drives a drafter through one generation of a batch of B sequences as
    state = drafter.start(prompts, max_len)           # B prompt id arrays; max_len: the target cache size
    state = drafter.extend(state, features, n_new)    # after prefill chunks and after each verify
    proposal, state = drafter.propose(state, tokens)  # per sequence: everything committed + the anchor
`extend` hands over the target features (outputs of `feature_layers`, [F, B, T, H]) of T rows that start at
each sequence's context length; the first n_new[b] rows of sequence b are now verified, the rest are garbage
the drafter must not keep (a context grows by exactly n_new[b]: rollback is never needed because rejected rows
never enter). `propose` drafts the whole batch at once (model drafters: one device call). A sequence that has
finished rides along with n_new 0 and its drafts ignored. When the running ones fit a narrower width (no mesh;
engine.decode.next_width), the engine drops finished rows: a drafter with a state gives it a `take(rows)` method
returning the state of those batch rows only (rows [B'] int32, the survivors in their new order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import jax
import numpy as np


class DrafterError(ValueError):
    """A drafter that cannot be built or does not fit the target; the message says why."""


@dataclass
class Proposal:
    """Drafted blocks of a batch: ids [B, k] int32, of which the first n[b] of row b are real proposals
    (n [B] int32); q [B, k] their drafter probability."""

    ids: np.ndarray
    n: np.ndarray
    q: np.ndarray

    @classmethod
    def empty(cls, batch: int, k: int) -> Proposal:
        """No proposals yet: zero ids, n 0, q 1 (writable, for host-side drafters to fill)."""
        return cls(np.zeros((batch, k), np.int32), np.zeros(batch, np.int32), np.ones((batch, k), np.float32))


class Drafter(Protocol):
    name: str
    k: int  # tokens drafted per step (0: no drafting)
    max_k: int  # the largest k it drafts (0: ar)
    feature_layers: tuple[int, ...]  # target layers whose outputs extend() receives
    checkpoint: str | None  # where the weights came from (None: no weights)

    def start(self, prompts: list[np.ndarray], max_len: int) -> Any: ...

    def extend(self, state: Any, features: jax.Array | None, n_new: np.ndarray) -> Any: ...

    def propose(self, state: Any, tokens: list[list[int]]) -> tuple[Proposal, Any]: ...


def check_k(k: int, max_k: int, name: str) -> int:
    """Validate a draft length."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= max_k:
        raise DrafterError(f"K for drafter {name!r} must be an integer in 1..{max_k}, got {k!r}")
    return int(k)
