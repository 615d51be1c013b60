"""Plain-data records that cross every boundary unchanged: engine -> live view, storage, replay, export."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StepTrace:
    """One verify step. Block = [anchor, drafted...] at positions position..position+len(drafted).

    accepted: length of the accepted prefix of `drafted`; bonus: the target's token after it.
    p[i] / q[i]: target / drafter probability of drafted[i] (q is 1.0 for deterministic proposals
    without a model, e.g. n-gram). top5_ids[i] / top5_p[i]: the target's top-5 at block row i, for
    rows 0..len(drafted) (row i predicts the token after drafted[i-1]; the last row is the bonus
    row when everything was accepted). emitted: tokens this step added to the output (accepted
    drafts + bonus, cut at EOS or the token limit). Times are wall-clock, blocking on the device.
    state_rollback: block positions whose recurrent state was verified and then discarded (those past the anchor
    and the accepted drafts; the block is padded to K+1), 0 on a target without recurrent layers.
    """

    index: int
    position: int
    drafted: list[int]
    accepted: int
    bonus: int
    p: list[float]
    q: list[float]
    top5_ids: list[list[int]]
    top5_p: list[list[float]]
    emitted: list[int]
    draft_ms: float
    verify_ms: float
    drafted_text: list[str] = field(default_factory=list)
    bonus_text: str = ""
    top5_text: list[list[str]] = field(default_factory=list)
    state_rollback: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    """A finished generation: output, every step, and run-level statistics.

    stats keys: tau (mean tokens emitted per verify step, bonus included), acceptance_rate
    (accepted / drafted, None when nothing was drafted), tok_per_s (generated tokens over decode
    wall time, prefill excluded), wall_s (prefill + decode), prefill_ms, decode_s, n_steps,
    n_generated, n_prompt, drafted, accepted, draft_ms, verify_ms, stop_reason ("eos" | "length"),
    compiles (XLA compilations during this generation).
    """

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    steps: list[StepTrace]
    stats: dict
    settings: dict

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "prompt_ids": self.prompt_ids,
                "steps": [s.to_dict() for s in self.steps], "stats": self.stats, "settings": self.settings}
