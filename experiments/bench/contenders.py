"""What every bench compares: a Contender generates for a bench row and returns an Outcome (ours and the peers);
our engine as a contender, the interleaved loop over prompts, and the fixed-width tables they print."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from engine import CheckpointError, DrafterError, GenerationResult, Target, generate_batch, load_drafter
from engine.jit_stats import compile_seconds


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


MODEL_DRAFTERS_MISSING = "this engine has no implementation of it yet"


def prompt_rows(row: dict) -> list[dict]:
    """The prompt rows of a bench row: a group's members, or the row itself."""
    return row.get("rows", [row])


def groups_of(prompts: list[dict], batch: int) -> list[dict]:
    """Consecutive whole groups of `batch` prompts as bench rows (batch 1: the prompts themselves)."""
    if batch == 1:
        return prompts
    return [{"id": f"{prompts[i]['id']}+{batch}", "rows": prompts[i:i + batch]}
            for i in range(0, len(prompts) - batch + 1, batch)]


class EngineContender:
    """Our engine with one drafter over a group of `batch` prompts verified together; runs that compiled are
    repeated so compiles never count (their seconds add up in compile_s)."""

    def __init__(self, target: Target, drafter, batch: int = 1, **generate_kw) -> None:
        self.target, self.drafter, self.batch, self.kw = target, drafter, batch, generate_kw
        self.name, self.k, self.compile_s = drafter.name, drafter.k, 0.0

    def _generate(self, row: dict) -> list[GenerationResult]:
        before = compile_seconds()
        results = generate_batch(self.target, [r["prompt"] for r in prompt_rows(row)], self.drafter, **self.kw)
        self.compile_s += compile_seconds() - before
        return results

    def warm_up(self, row: dict) -> None:
        self._generate(row)

    def run(self, row: dict) -> Outcome:
        for _ in range(2):
            results = self._generate(row)
            if not any(r.stats["compiles"] for r in results):
                break
        ids = [r.token_ids for r in results]
        return Outcome(ids if "rows" in row else ids[0], max(r.stats["decode_s"] for r in results),
                       sum(r.stats["n_generated"] for r in results), max(r.stats["wall_s"] for r in results), results)


def interleave(prompts: list[dict], contenders: list[Contender],
               on_outcome: Callable[[dict, Contender, Outcome], None], progress=None) -> None:
    """For each prompt: every contender in order (the reference first), reporting each outcome as it lands."""
    for row in prompts:
        for c in contenders:
            on_outcome(row, c, c.run(row))
            if progress is not None:
                progress.update()


def sequences(o: Outcome) -> list[list[int]]:
    """An outcome's token ids per prompt."""
    return [r.token_ids for r in o.results] if o.results else [o.token_ids]


def ms_per_token(outcomes: list[Outcome]) -> float | None:
    """Pooled decode milliseconds per decoded token."""
    tokens = sum(o.decode_tokens for o in outcomes)
    return 1e3 * sum(o.decode_s for o in outcomes) / tokens if tokens else None


def fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width table: first column left-aligned, others right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    lines = []
    for cells in [headers, *rows]:
        lines.append("  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)
                               for i, (x, w) in enumerate(zip(cells, widths, strict=True))))
    return "\n".join(lines)


def load_contenders(target: Target, names: list[str], ks: list[int], batches: tuple[int, ...] = (1,),
                    **kw) -> tuple[list[EngineContender], list[str]]:
    """Engine contenders (per batch size: ar first, K 0) and one line per drafter that could not be loaded."""
    drafters, problems = [load_drafter("ar", target)], {}
    for name in dict.fromkeys(n for n in names if n != "ar"):
        for k in ks:
            try:
                drafters.append(load_drafter(name, target, k=k))
            except ModuleNotFoundError as e:
                problems.setdefault((name, f"{MODEL_DRAFTERS_MISSING} ({e.name} is missing)"), []).append(k)
            except (DrafterError, CheckpointError, OSError) as e:
                problems.setdefault((name, str(e)), []).append(k)
    lines = [f"drafter {name} unavailable at K={','.join(map(str, k_list))}: {why}"
             for (name, why), k_list in problems.items()]
    return [EngineContender(target, d, b, **kw) for b in batches for d in drafters], lines
