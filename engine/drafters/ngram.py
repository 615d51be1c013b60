"""`ngram`: prompt-lookup drafting. Find the most recent earlier occurrence of the context's last
n-gram (longest n first) and propose the k tokens that followed it. Training-free, host-side."""

from __future__ import annotations

import numpy as np

from .base import Proposal, check_k

MAX_K = 64


class NgramDrafter:
    name = "ngram"
    feature_layers: tuple[int, ...] = ()
    checkpoint = None
    max_k = MAX_K

    def __init__(self, k: int = 8, max_ngram: int = 3, min_ngram: int = 1):
        self.k = check_k(k, MAX_K, self.name)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("ngram sizes must satisfy 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, prompts: list[np.ndarray], max_len: int) -> None:
        return None

    def extend(self, state, features, n_new: np.ndarray) -> None:
        return None

    def propose(self, state, tokens: list[list[int]]) -> tuple[Proposal, None]:
        """Each sequence's lookup on the host (no device work)."""
        proposal = Proposal.empty(len(tokens), self.k)
        for row, seq in enumerate(tokens):
            proposal.ids[row], proposal.n[row] = self.lookup(np.asarray(seq, dtype=np.int32))
        return proposal, None

    def lookup(self, ctx: np.ndarray) -> tuple[np.ndarray, int]:
        """(ids [k] padded with zeros, number of real proposals) continuing ctx."""
        out = np.zeros(self.k, np.int32)
        for n in range(min(self.max_ngram, len(ctx) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)  # starts 0..len-1-n
            hits = np.flatnonzero((windows == ctx[-n:]).all(axis=1))
            if hits.size:
                start = hits[-1] + n
                cont = ctx[start:start + self.k]
                out[:len(cont)] = cont
                return out, len(cont)
        return out, 0
