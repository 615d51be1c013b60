"""`ar`: no drafting. Every verify step is a plain autoregressive target step (the baseline)."""

from __future__ import annotations

import numpy as np

from .base import Proposal


class ArDrafter:
    name = "ar"
    k = 0
    feature_layers: tuple[int, ...] = ()
    checkpoint = None

    def start(self, prompt_ids: np.ndarray, max_len: int) -> None:
        return None

    def extend(self, state, features, n_new: int) -> None:
        return None

    def propose(self, state, tokens: list[int]) -> tuple[Proposal, None]:
        return Proposal(np.zeros(0, np.int32), 0, np.zeros(0, np.float32)), None
