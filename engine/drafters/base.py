"""The drafter protocol every drafter implements, and the errors they raise.

The engine drives a drafter through one generation as
    state = drafter.start(prompt_ids, max_len)       # max_len: the target cache size
    state = drafter.extend(state, features, n_new)   # after prefill chunks and after each verify
    proposal, state = drafter.propose(state, tokens) # tokens = everything committed + the anchor
`extend` hands over the target features (outputs of `feature_layers`, [F, 1, T, H]) of block rows
whose first `n_new` are now verified; rows past n_new are garbage the drafter must not keep (its
context length grows by exactly n_new: rollback is never needed because rejected rows never enter).
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
    """A drafted block: ids [k] int32 of which the first n are real proposals; q [k] their drafter probability."""

    ids: np.ndarray
    n: int
    q: np.ndarray


class Drafter(Protocol):
    name: str
    k: int  # tokens drafted per step (0: no drafting)
    feature_layers: tuple[int, ...]  # target layers whose outputs extend() receives
    checkpoint: str | None  # where the weights came from (None: no weights)

    def start(self, prompt_ids: np.ndarray, max_len: int) -> Any: ...

    def extend(self, state: Any, features: jax.Array | None, n_new: int) -> Any: ...

    def propose(self, state: Any, tokens: list[int]) -> tuple[Proposal, Any]: ...


def check_k(k: int, max_k: int, name: str) -> int:
    """Validate a draft length."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= max_k:
        raise DrafterError(f"K for drafter {name!r} must be an integer in 1..{max_k}, got {k!r}")
    return int(k)
