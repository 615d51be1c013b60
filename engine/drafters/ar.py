"""`ar`: no drafting. Every verify step is a plain autoregressive target step (the baseline)."""

from __future__ import annotations

import numpy as np

from .base import Proposal


class ArDrafter:
    name = "ar"
    k = 0
    max_k = 0
    feature_layers: tuple[int, ...] = ()
    checkpoint = None

    def start(self, prompts: list[np.ndarray], max_len: int) -> None:
        return None

    def extend(self, state, features, n_new: np.ndarray) -> None:
        return None

    def propose(self, state, tokens: list[list[int]]) -> tuple[Proposal, None]:
        return Proposal.empty(len(tokens), 0), None
