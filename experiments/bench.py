"""Benchmark drafters on prompt suites, interleaved per prompt against the `ar` baseline, into the history.

    python -m experiments.bench --suite gsm8k,humaneval,mtbench --drafters ar,ngram,dflash,eagle3 --k 4,8,16 \
        [--limit N] [--max-new-tokens 128] [--temperature 0] [--db PATH] [--json] [--target PATH] [--dtype D] [--peers]

Every (drafter, K) first generates once from the first prompt untimed (XLA compiles, allocations). Then, for
each prompt in turn, `ar` runs first and every (drafter, K) after it, so slow drift of a shared machine hits
all contenders alike. A run that still compiled (a new cache-size bucket) is run again and only the second,
compile-free run counts. Every counted run is stored in the history (source='bench', suite, prompt_id,
category, lossless, comparison_group = "bench-<session>/<suite>/<prompt id>").

Per (suite, drafter, K) over the same n prompts:
- tau: mean over prompts of the run's tau (tokens emitted per verify step), as the drafter_comparison view;
- acceptance_rate: pooled accepted / drafted (None for ar);
- tok_per_s: pooled generated tokens / pooled decode seconds (prefill excluded);
- speedup: sum of ar decode seconds / sum of this drafter's decode seconds over the same prompts (with
  lossless greedy decoding both generate the same tokens, so it is the ratio of per-token latencies);
- lossless: greedy only (temperature 0): the token ids equal ar's on every prompt (None when sampling).
`ar` is always run (added first when missing) and has K 0. --peers adds transformers' PyTorch baselines
(experiments/peers.py) into the same interleaved loop; see its docstring for their timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine import CheckpointError, DrafterError, GenerationError, GenerationResult, Target, generate, load_drafter
from engine import load_target as _load_target
from storage import DEFAULT_PATH, HistoryError, open_history

from .suites import SuiteError, load_suite, suite_label

MODEL_DRAFTERS_MISSING = "this engine has no implementation of it yet"


@dataclass
class Outcome:
    """One counted generation: decode_s covers decode_tokens tokens (prefill excluded); wall_s includes prefill."""

    token_ids: list[int]
    decode_s: float
    decode_tokens: int
    wall_s: float
    result: GenerationResult | None = None


class Contender(Protocol):
    name: str
    k: int

    def warm_up(self, row: dict) -> None: ...

    def run(self, row: dict) -> Outcome: ...


class EngineContender:
    """Our engine with one drafter; runs that compiled are repeated so compiles never count."""

    def __init__(self, target: Target, drafter, **generate_kw) -> None:
        self.target, self.drafter, self.kw = target, drafter, generate_kw
        self.name, self.k = drafter.name, drafter.k

    def warm_up(self, row: dict) -> None:
        generate(self.target, row["prompt"], self.drafter, **self.kw)

    def run(self, row: dict) -> Outcome:
        for _ in range(2):
            result = generate(self.target, row["prompt"], self.drafter, **self.kw)
            if not result.stats["compiles"]:
                break
        s = result.stats
        return Outcome(result.token_ids, s["decode_s"], s["n_generated"], s["wall_s"], result)


def interleave(prompts: list[dict], contenders: list[Contender],
               on_outcome: Callable[[dict, Contender, Outcome], None], progress=None) -> None:
    """For each prompt: every contender in order (the reference first), reporting each outcome as it lands."""
    for row in prompts:
        for c in contenders:
            on_outcome(row, c, c.run(row))
            if progress is not None:
                progress.update()


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def ms_per_token(outcomes: list[Outcome]) -> float | None:
    """Pooled decode milliseconds per decoded token."""
    tokens = sum(o.decode_tokens for o in outcomes)
    return 1e3 * sum(o.decode_s for o in outcomes) / tokens if tokens else None


def summarize(suite: str, c: Contender, outcomes: list[Outcome], ref: list[Outcome], greedy: bool) -> dict:
    """The row of one (suite, contender) against the reference outcomes of the same prompts (see module doc)."""
    results = [o.result for o in outcomes if o.result is not None]
    drafted = sum(r.stats["drafted"] for r in results)
    mspt = ms_per_token(outcomes)
    same = [o.token_ids == r.token_ids for o, r in zip(outcomes, ref, strict=True)]
    return {
        "suite": suite, "drafter": c.name, "k": c.k, "n": len(outcomes),
        "tau": statistics.fmean(r.stats["tau"] for r in results) if results else None,
        "acceptance_rate": sum(r.stats["accepted"] for r in results) / drafted if drafted else None,
        "tok_per_s": 1e3 / mspt if mspt else None, "ms_per_token": mspt,
        "speedup": _ratio(sum(o.decode_s for o in ref), sum(o.decode_s for o in outcomes)),
        "lossless": all(same) if greedy else None, "n_lossless": sum(same) if greedy else None,
        "n_generated": sum(len(o.token_ids) for o in outcomes),
    }


def _fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width table: first column left-aligned, others right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    lines = []
    for cells in [headers, *rows]:
        lines.append("  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)
                               for i, (x, w) in enumerate(zip(cells, widths, strict=True))))
    return "\n".join(lines)


def suite_table(rows: list[dict]) -> str:
    """The printed comparison of one suite; peer rows carry `ours_x` (how many times faster ours is)."""
    body = []
    for r in rows:
        check = "-" if r["lossless"] is None else f"{r['n_lossless']}/{r['n']}"
        body.append([r["drafter"], r["k"], r["n"], _fmt(r["tau"]), _fmt(r["acceptance_rate"], ".3f"),
                     _fmt(r["tok_per_s"], ".1f"), _fmt(r["speedup"], ".2f") + "x", check,
                     _fmt(r.get("ours_x"), ".2f", "") + ("x" if r.get("ours_x") else "")])
    return text_table(["drafter", "K", "n", "tau", "accept", "tok/s", "speedup", "lossless", "ours x"], body)


def load_contenders(target: Target, names: list[str], ks: list[int], **kw) -> tuple[list[EngineContender], list[str]]:
    """Engine contenders (ar first, K 0) and one line per drafter that could not be loaded."""
    contenders, problems = [EngineContender(target, load_drafter("ar", target), **kw)], {}
    for name in dict.fromkeys(n for n in names if n != "ar"):
        for k in ks:
            try:
                contenders.append(EngineContender(target, load_drafter(name, target, k=k), **kw))
            except ModuleNotFoundError as e:
                problems.setdefault((name, f"{MODEL_DRAFTERS_MISSING} ({e.name} is missing)"), []).append(k)
            except (DrafterError, CheckpointError, OSError) as e:
                problems.setdefault((name, str(e)), []).append(k)
    lines = [f"drafter {name} unavailable at K={','.join(map(str, k_list))}: {why}"
             for (name, why), k_list in problems.items()]
    return contenders, lines


class _Recorder:
    """Collects outcomes per contender and stores engine runs in the history as they land."""

    def __init__(self, history, suite: str, session: str, greedy: bool) -> None:
        self.history, self.suite, self.session, self.greedy = history, suite, session, greedy
        self.outcomes: dict[int, list[Outcome]] = {}
        self.ref: dict[str, Outcome] = {}

    def __call__(self, row: dict, c: Contender, out: Outcome) -> None:
        self.outcomes.setdefault(id(c), []).append(out)
        if c.name == "ar" and isinstance(c, EngineContender):
            self.ref[row["id"]] = out
        if out.result is None:
            return
        lossless = self.ref[row["id"]].token_ids == out.token_ids if self.greedy else None
        self.history.write_run(out.result.to_dict(), prompt=row["prompt"], suite=self.suite, prompt_id=row["id"],
                               category=row.get("category"), source="bench", lossless=lossless,
                               comparison_group=f"bench-{self.session}/{self.suite}/{row['id']}")


def peer_rows(rows: list[dict]) -> None:
    """Set ours_x on peer rows: the peer's ms/token over ours (ar for greedy, ngram at the same K for lookup)."""
    ours = {(r["drafter"], r["k"]): r for r in rows if not r.get("peer")}
    for r in rows:
        if r.get("peer"):
            mine = ours.get((r["peer"], r["k"]))
            r["ours_x"] = _ratio(r["ms_per_token"], mine and mine["ms_per_token"])


def bench_suite(label: str, prompts: list[dict], contenders: list[Contender], history, session: str,
                greedy: bool, progress=None) -> list[dict]:
    """Run the interleaved loop on one suite and return its rows (engine contenders first, then peers)."""
    record = _Recorder(history, label, session, greedy)
    interleave(prompts, contenders, record, progress)
    ref = [record.ref[row["id"]] for row in prompts]
    rows = []
    for c in contenders:
        row = summarize(label, c, record.outcomes[id(c)], ref, greedy)
        if getattr(c, "peer_of", None):
            row["peer"] = c.peer_of
            row["speedup"] = _ratio(ms_per_token(ref), row["ms_per_token"])
        rows.append(row)
    peer_rows(rows)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="gsm8k", help="comma-separated suite names or JSONL paths")
    ap.add_argument("--drafters", default="ar,ngram")
    ap.add_argument("--k", default="4,8", help="comma-separated draft lengths (ar always runs at K 0)")
    ap.add_argument("--limit", type=int, default=None, help="first N prompts of each suite")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default=DEFAULT_PATH)
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--peers", action="store_true", help="also time transformers' generate and prompt lookup")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch threads for --peers (default: torch's)")
    ap.add_argument("--json", action="store_true", help="one JSON row per (suite, drafter, K) instead of tables")
    return ap.parse_args(argv)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None, target: Target | None = None) -> int:
    """CLI entry; `target` lets a caller (tests, notebooks) pass an already loaded target."""
    from tqdm import tqdm

    a = parse_args(argv)
    try:
        ks = [int(k) for k in _csv(a.k)]
        suites = {suite_label(name): load_suite(name, a.limit) for name in _csv(a.suite)}
        if not suites:
            raise SuiteError("--suite names no suite")
        history = open_history(a.db)
        target = target or _load_target(a.target, a.dtype)
        kw = dict(max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed)
        contenders, problems = load_contenders(target, _csv(a.drafters), ks, **kw)
        if a.peers:
            from .peers import peer_contenders
            contenders += peer_contenders(target, ks, dtype=a.dtype, threads=a.torch_threads, **kw)
    except (SuiteError, HistoryError, GenerationError, CheckpointError, DrafterError, RuntimeError, OSError,
            ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in problems:
        print(line, file=sys.stderr)
    session, greedy = uuid.uuid4().hex[:8], a.temperature == 0.0
    total = sum(len(p) for p in suites.values()) * len(contenders) + len(contenders)
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True) as bar:
        try:
            bar.set_postfix_str("warm-up")
            first = next(iter(suites.values()))[0]
            for c in contenders:
                c.warm_up(first)
                bar.update()
            for label, prompts in suites.items():
                bar.set_postfix_str(label)
                rows = bench_suite(label, prompts, contenders, history, session, greedy, bar)
                _print_suite(label, rows, a, target, problems, bar)
        except (GenerationError, HistoryError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


def _print_suite(label: str, rows: list[dict], a: argparse.Namespace, target: Target, problems: list[str],
                 bar) -> None:
    if a.json:
        for r in rows:
            bar.write(json.dumps(r), file=sys.stdout)
        return
    mode = "greedy" if a.temperature == 0 else f"temperature {a.temperature:g}"
    head = (f"\n{label}: {rows[0]['n']} prompts, max {a.max_new_tokens} new tokens, {mode}, {target.name} "
            f"{target.dtype}; speedup = sum ar decode s / sum decode s (peers: ar ms/token / peer ms/token); "
            "ours x = peer ms/token / ours (ar for hf-generate, ngram at K for hf-prompt-lookup)")
    tail = "".join(f"\n{p}" for p in problems)
    bar.write(f"{head}\n{suite_table(rows)}{tail}", file=sys.stdout)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
