"""Benchmark drafters on prompt suites, interleaved per prompt against the `ar` baseline, into the history.

    python -m experiments.bench --suite gsm8k,humaneval,mtbench --drafters ar,ngram,dflash,eagle3 --k 4,8,16 \
        [--split test|dev] [--limit N] [--max-new-tokens 128] [--temperature 0] [--db PATH] [--json] [--target PATH]
        [--dtype D] [--peers] [--batch 1,4,16] [--mesh DxM]

Named suites run on their sealed test slice by default (experiments.suites: the dev slice is for tuning); --limit N
takes the first N prompts of that slice. Every row and stored run says which slice it came from.

Every (drafter, K) first generates once from the first prompt untimed (XLA compiles, allocations). Then, for
each prompt in turn, `ar` runs first and every (drafter, K) after it, so slow drift of a shared machine hits
all contenders alike. A run that still compiled (a new cache-size bucket) is run again and only the second,
compile-free run counts: no timing below includes XLA compilation, which is reported apart as compile_s (the
seconds of XLA compilation the contender has caused so far: its warm-up and any repeated run). Every counted
run is stored in the history (source='bench', suite, split, prompt_id, category, lossless, comparison_group =
"bench-<session>/<suite>/<prompt id>", and baseline_run_id: the ar run of that group).

Per (suite, drafter, K) over the same n prompts:
- tau: mean over prompts of the run's tau (tokens emitted per verify step), as the drafter_comparison view;
- acceptance_rate: pooled accepted / drafted (None for ar);
- tok_per_s: pooled generated tokens / pooled decode seconds (prefill excluded);
- speedup: sum of ar decode seconds / sum of this drafter's decode seconds over the same prompts (with
  lossless greedy decoding both generate the same tokens, so it is the ratio of per-token latencies);
- draft_ms / verify_ms: mean milliseconds per decode step of drafting (one drafter call for the whole batch) and
  of verification (one target pass for the whole batch);
- lossless: greedy only (temperature 0): the token ids equal ar's on every prompt (None when sampling).
`ar` is always run (added first when missing) and has K 0. --peers adds transformers' PyTorch baselines
(experiments/bench/peers.py) into the same interleaved loop; see its docstring for their timing.

--batch B runs consecutive groups of B prompts (whole groups only) verified together (engine.decode_batch):
tok_per_s is then the batch's throughput (all its tokens over the time until its last sequence finished),
speedup is against `ar` at the same batch size, lossless is per sequence, and `x_ar1` is the throughput over
`ar`'s at batch 1: where K-Flat ends, batching and drafting compete for the same idle compute.

flat_x ("flat-K x") predicts the speedup on a flat-K profile, where verifying K+1 tokens costs what one `ar` step
costs (an accelerator's, not this CPU's): tau * (ar verify + ar draft) / (ar verify + draft), from this run's tau
and draft ms per step.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
import uuid
from pathlib import Path

import jax

from engine import (
    CheckpointError,
    DrafterError,
    GenerationError,
    MeshError,
    Target,
)
from engine import load_target as _load_target
from engine.tokenizer import default_template, parse_template
from storage import DEFAULT_PATH, HistoryError, drafter_label, open_history

from ..suites import SuiteError, load_suite, suite_label
from ..training import cards
from .contenders import (
    Contender,
    EngineContender,
    Outcome,
    fmt,
    groups_of,
    interleave,
    load_contenders,
    ms_per_token,
    prompt_rows,
    sequences,
    text_table,
)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def step_ms(outcomes: list[Outcome]) -> dict:
    """Mean draft_ms and verify_ms per decode step (None for outcomes without step traces, e.g. peers). A batch's
    longest-running sequence took part in every step, and each step's trace carries that step's shared times."""
    steps = [s for o in outcomes if o.results for s in max(o.results, key=lambda r: len(r.steps)).steps]
    if not steps:
        return {"draft_ms": None, "verify_ms": None}
    return {"draft_ms": statistics.fmean(s.draft_ms for s in steps),
            "verify_ms": statistics.fmean(s.verify_ms for s in steps)}


def summarize(suite: str, c: Contender, outcomes: list[Outcome], ref: list[Outcome], greedy: bool) -> dict:
    """The row of one (suite, contender) against the reference outcomes of the same prompts (see module doc)."""
    results = [r for o in outcomes for r in o.results]
    drafted = sum(r.stats["drafted"] for r in results)
    mspt = ms_per_token(outcomes)
    same = [a == b for o, r in zip(outcomes, ref, strict=True) for a, b in zip(sequences(o), sequences(r), strict=True)]
    return {
        "suite": suite, "drafter": c.name, "k": c.k, "batch": getattr(c, "batch", 1), "n": len(same),
        "checkpoint": getattr(getattr(c, "drafter", None), "checkpoint", None),
        "tau": statistics.fmean(r.stats["tau"] for r in results) if results else None,
        "acceptance_rate": sum(r.stats["accepted"] for r in results) / drafted if drafted else None,
        "tok_per_s": 1e3 / mspt if mspt else None, "ms_per_token": mspt,
        "speedup": _ratio(sum(o.decode_s for o in ref), sum(o.decode_s for o in outcomes)),
        "lossless": all(same) if greedy else None, "n_lossless": sum(same) if greedy else None,
        "n_generated": sum(len(o.token_ids) for o in outcomes),
        **step_ms(outcomes), "compile_s": getattr(c, "compile_s", None),
    }


def suite_table(rows: list[dict]) -> str:
    """The printed comparison of one suite; peer rows carry `ours_x` (how many times faster ours is)."""
    body = []
    for r in rows:
        check = "-" if r["lossless"] is None else f"{r['n_lossless']}/{r['n']}"
        body.append([drafter_label(r["drafter"], r.get("checkpoint")), r["k"], r.get("batch", 1), r["n"],
                     fmt(r["tau"]),
                     fmt(r["acceptance_rate"], ".3f"), fmt(r["tok_per_s"], ".1f"), fmt(r["speedup"], ".2f") + "x",
                     fmt(r.get("x_ar1"), ".2f") + "x", fmt(r.get("flat_x"), ".2f") + "x",
                     fmt(r.get("draft_ms"), ".1f"),
                     fmt(r.get("verify_ms"), ".1f"), check, fmt(r.get("compile_s"), ".1f"),
                     fmt(r.get("ours_x"), ".2f", "") + ("x" if r.get("ours_x") else "")])
    return text_table(["drafter", "K", "batch", "n", "tau", "accept", "tok/s", "speedup", "x ar1", "flat-K x",
                       "draft ms", "verify ms", "lossless", "compile s", "ours x"], body)


class _Recorder:
    """Collects outcomes per contender and stores engine runs in the history as they land."""

    def __init__(self, history, suite: str, session: str, greedy: bool, command: str = "") -> None:
        self.history, self.suite, self.session, self.greedy, self.command = history, suite, session, greedy, command
        self.outcomes: dict[int, list[Outcome]] = {}
        self.ref: dict[str, Outcome] = {}
        self.ref_ids: dict[tuple[str, str], str] = {}  # (group row id, prompt id) -> the stored ar run

    def __call__(self, row: dict, c: Contender, out: Outcome) -> None:
        self.outcomes.setdefault(id(c), []).append(out)
        if c.name == "ar" and isinstance(c, EngineContender):
            self.ref[row["id"]] = out
        if not out.results:  # peers are timed, not stored
            return
        ref = sequences(self.ref[row["id"]])
        is_ar = c.name == "ar" and isinstance(c, EngineContender)
        for result, member, want in zip(out.results, prompt_rows(row), ref, strict=True):
            lossless = want == result.token_ids if self.greedy else None
            run_id = self.history.write_run(
                result.to_dict(), prompt=member["prompt"], suite=self.suite, prompt_id=member["id"],
                category=member.get("category"), split=member.get("split"), source="bench", lossless=lossless,
                comparison_group=f"bench-{self.session}/{self.suite}/{row['id']}", command=self.command,
                baseline_run_id=None if is_ar else self.ref_ids.get((row["id"], member["id"])))
            if is_ar:
                self.ref_ids[(row["id"], member["id"])] = run_id


def scaling_rows(rows: list[dict]) -> None:
    """Set x_ar1 on every row: its throughput over ar's at batch 1 (when batch 1 ran); and flat_x (see
    flat_k_speedup) against ar at the row's batch size."""
    ours = [r for r in rows if not r.get("peer")]
    ar1 = next((r for r in ours if r["drafter"] == "ar" and r["batch"] == 1), None)
    ar = {r["batch"]: r for r in ours if r["drafter"] == "ar"}
    for r in rows:
        r["x_ar1"] = _ratio(r["tok_per_s"], ar1 and ar1["tok_per_s"])
        base = ar.get(r["batch"])
        r["flat_x"] = None if r.get("peer") or base is None else flat_k_speedup(r, base)


def flat_k_speedup(row: dict, ar: dict) -> float | None:
    """Predicted speedup over ar on a flat-K profile (an accelerator where verifying K+1 tokens costs what ar's
    one-token pass costs): tau * (ar verify + ar draft) / (ar verify + draft), with this run's tau and measured
    draft time per step (None without step times)."""
    if row["tau"] is None or ar.get("verify_ms") is None or row.get("verify_ms") is None:
        return None
    return row["tau"] * (ar["verify_ms"] + ar["draft_ms"]) / (ar["verify_ms"] + row["draft_ms"])


def peer_rows(rows: list[dict]) -> None:
    """Set ours_x on peer rows: the peer's ms/token over ours (ar for greedy, ngram at the same K for lookup)."""
    ours = {(r["drafter"], r["k"]): r for r in rows if not r.get("peer")}
    for r in rows:
        if r.get("peer"):
            mine = ours.get((r["peer"], r["k"]))
            r["ours_x"] = _ratio(r["ms_per_token"], mine and mine["ms_per_token"])


def bench_suite(label: str, prompts: list[dict], contenders: list[Contender], history, session: str,
                greedy: bool, progress=None, command: str = "") -> list[dict]:
    """Run the interleaved loop on one suite and return its rows (engine contenders first, then peers); every stored
    run records `command` (the bench command line), which experiments.bench.report prints above its table."""
    record = _Recorder(history, label, session, greedy, command)
    interleave(prompts, contenders, record, progress)
    ref = [record.ref[row["id"]] for row in prompts]
    split = "+".join(sorted({m.get("split") or "all" for row in prompts for m in prompt_rows(row)}))
    rows = []
    for c in contenders:
        row = {**summarize(label, c, record.outcomes[id(c)], ref, greedy), "split": split}
        if getattr(c, "peer_of", None):
            row["peer"] = c.peer_of
            row["speedup"] = _ratio(ms_per_token(ref), row["ms_per_token"])
        rows.append(row)
    peer_rows(rows)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="gsm8k", help="comma-separated suite names or JSONL paths")
    ap.add_argument("--drafters", default="ar,ngram")
    ap.add_argument("--k", default="4,8", help="comma-separated draft lengths (ar always runs at K 0)")
    ap.add_argument("--split", default="test", choices=["test", "dev"],
                    help="the slice of each named suite (test: sealed, for reported numbers; dev: for tuning)")
    ap.add_argument("--limit", type=int, default=None, help="first N prompts of each suite's slice")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--template", default=None, metavar="NAME=VALUE,...",
                    help="chat-template switches, e.g. enable_thinking=false (default: thinking off where the "
                         "template has it)")
    ap.add_argument("--db", default=DEFAULT_PATH)
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--peers", action="store_true", help="also time transformers' generate and prompt lookup")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch threads for --peers (default: torch's)")
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes: groups of prompts verified together")
    ap.add_argument("--mesh", default=None, metavar="DxM", help="shard over a data x model device mesh, e.g. 1x8")
    ap.add_argument("--json", action="store_true", help="one JSON row per (suite, drafter, K, batch) instead of tables")
    ap.add_argument("--update-cards", action="store_true",
                    help="record greedy batch-1 tau and speedup in each benched checkpoint's training.json "
                         "('measured': the app's default drafter on a machine without history)")
    return ap.parse_args(argv)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None, target: Target | None = None) -> int:
    """CLI entry; `target` lets a caller (tests, notebooks) pass an already loaded target."""
    from tqdm import tqdm

    a = parse_args(argv)
    try:
        ks, batches = [int(k) for k in _csv(a.k)], [int(b) for b in _csv(a.batch)]
        if not batches or min(batches) < 1:
            raise ValueError(f"--batch needs positive batch sizes, got {a.batch!r}")
        suites = {suite_label(name): load_suite(name, a.limit, split=a.split) for name in _csv(a.suite)}
        if not suites:
            raise SuiteError("--suite names no suite")
        history = open_history(a.db)
        target = target or _load_target(a.target, a.dtype, mesh=a.mesh)
        template = default_template(target.tokenizer) if a.template is None else parse_template(a.template)
        kw = dict(max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed, template=template)
        contenders, problems = load_contenders(target, _csv(a.drafters), ks, tuple(batches), **kw)
        if a.peers:
            from .peers import peer_contenders
            contenders += peer_contenders(target, ks, dtype=a.dtype, threads=a.torch_threads, **kw)
    except (SuiteError, HistoryError, GenerationError, CheckpointError, DrafterError, MeshError, RuntimeError,
            OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in problems:
        print(line, file=sys.stderr)
    session, greedy = uuid.uuid4().hex[:8], a.temperature == 0.0
    command = "python -m experiments.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    plan = {(label, b): (groups_of(prompts, b), [c for c in contenders if getattr(c, "batch", 1) == b])
            for label, prompts in suites.items() for b in batches}
    for (label, b), (groups, _) in plan.items():
        if not groups:
            problems.append(f"{label}: fewer than {b} prompts, so no batch of {b}")
    warm_ups = {b: len(cs) for (_, b), (g, cs) in plan.items() if g}  # each batch size warms up once
    total = sum(len(g) * len(cs) for g, cs in plan.values()) + sum(warm_ups.values())
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True) as bar:
        try:
            warm = set()
            for label in suites:
                bar.set_postfix_str(label)
                rows = []
                for b in batches:
                    groups, group_contenders = plan[(label, b)]
                    if not groups:
                        continue
                    if b not in warm:  # once per batch size: shapes do not depend on the suite
                        warm.add(b)
                        for c in group_contenders:
                            c.warm_up(groups[0])
                            bar.update()
                    rows += bench_suite(label, groups, group_contenders, history, session, greedy, bar, command)
                if rows:
                    scaling_rows(rows)
                    _print_suite(label, rows, a, target, problems, bar)
                    if a.update_cards and greedy:
                        update_cards(rows, a.max_new_tokens, command)
        except (GenerationError, HistoryError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


def update_cards(rows: list[dict], max_new_tokens: int, command: str = "") -> None:
    """Write each checkpoint row's measured tau and speedup (batch 1, greedy, with the bench command) into its
    training.json, replacing the row of the same suite, slice, K and device kind, and rewrite its model card."""
    device = jax.devices()[0].device_kind
    for r in rows:
        card_path = Path(r["checkpoint"] or "") / "training.json"
        if not r.get("checkpoint") or r.get("batch", 1) != 1 or not card_path.parent.is_dir():
            continue
        card = json.loads(card_path.read_text()) if card_path.is_file() else {}
        keep = [m for m in card.get("measured", [])
                if (m.get("suite"), m.get("split"), m.get("k"), m.get("device_kind"))
                != (r["suite"], r["split"], r["k"], device)]
        card["measured"] = keep + [{"suite": r["suite"], "split": r["split"], "k": r["k"], "n": r["n"], "tau": r["tau"],
                                    "speedup": r["speedup"], "lossless": r["lossless"], "device_kind": device,
                                    "max_new_tokens": max_new_tokens, "date": time.strftime("%Y-%m-%d"),
                                    "command": command}]
        card_path.write_text(json.dumps(card, indent=1))
        if "drafter" in card:
            cards.write_readme(card_path.parent)


def _print_suite(label: str, rows: list[dict], a: argparse.Namespace, target: Target, problems: list[str],
                 bar) -> None:
    if a.json:
        for r in rows:
            bar.write(json.dumps(r), file=sys.stdout)
        return
    mode = "greedy" if a.temperature == 0 else f"temperature {a.temperature:g}"
    head = (f"\n{label} ({rows[0]['split']} slice): {rows[0]['n']} prompts, max {a.max_new_tokens} new tokens, "
            f"{mode}, {target.name} {target.dtype}; speedup = sum ar decode s / sum decode s at the same batch "
            "(peers: ar ms/token / peer ms/token); draft/verify ms per decode step (one call for the whole batch "
            "each); compile s = XLA compilation, never timed in tok/s; flat-K x = tau * ar step / (ar verify + "
            "draft), the speedup if a verify cost one ar pass; ours x = peer ms/token / ours (ar for hf-generate, "
            "ngram at K for hf-prompt-lookup)")
    tail = "".join(f"\n{p}" for p in problems)
    bar.write(f"{head}\n{suite_table(rows)}{tail}", file=sys.stdout)
    sys.stdout.flush()

