"""What the bench compares: a Contender generates for a bench row and returns an Outcome (ours and the peers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from engine import GenerationResult


@dataclass
class Outcome:
    """One counted generation (of one prompt, or of a group verified together: then token_ids holds one list
    per prompt): decode_s covers decode_tokens tokens (prefill excluded); wall_s includes prefill."""

    token_ids: list
    decode_s: float
    decode_tokens: int
    wall_s: float
    results: list[GenerationResult] = field(default_factory=list)


class Contender(Protocol):
    name: str
    k: int

    def warm_up(self, row: dict) -> None: ...

    def run(self, row: dict) -> Outcome: ...
