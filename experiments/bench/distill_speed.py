"""Throughput of the data engine (engine.continuous) at several slot counts, to choose --slots by measurement.

    python -m experiments.bench.distill_speed [--slots 32,48] [--prompts 240] [--max-prompt 176] [--max-new 192]
        [--target PATH]

Each slot count first compiles on a warm-up queue, then answers the same prompts (the v3 training mix); printed per
slot count: response tok/s over the whole queue, the tok/s until the queue ran dry (the steady state a long run
sees), and the seconds spent in prefill and in decoding. Run it on otherwise idle cores.
"""

from __future__ import annotations

import argparse
import time

import jax

from engine import continuous, load_target
from experiments.data.distill import STEPS_PER_CALL
from experiments.data.prompts import build_prompts

MIX = {"math": 0.42, "drill": 0.13, "code": 0.25, "sharegpt": 0.12, "chat": 0.08}


def timed(spent: dict, name: str, fn):
    """fn, its wall time (blocking on its result) added to spent[name]."""
    def call(*args, **kw):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args, **kw))
        spent[name] += time.perf_counter() - t0
        return out
    return call


def run_queue(target, queue: list, slots: int, cache_len: int, max_new: int) -> tuple[int, float, int, float]:
    """(response tokens, wall s, tokens finished when the queue ran dry, wall s until then) of one queue."""
    dry, count, t0 = {}, [0], time.perf_counter()

    def prompts():
        yield from enumerate(queue)
        dry.update(t=time.perf_counter() - t0, tokens=count[0])

    for _, response, _ in continuous.greedy_continuous(target, prompts(), max_new, slots=slots, cache_len=cache_len):
        count[0] += len(response)
    return count[0], time.perf_counter() - t0, dry["tokens"], dry["t"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", default="32,48")
    ap.add_argument("--prompts", type=int, default=240)
    ap.add_argument("--max-prompt", type=int, default=176)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--target", default=None, help="HF directory or .gguf (default: embedded SmolLM2-135M)")
    a = ap.parse_args(argv)
    target = load_target(a.target)
    ids = [x for x in (target.encode(r["prompt"]) for r in build_prompts(a.prompts * 2, a.seed, MIX))
           if len(x) <= a.max_prompt]
    cache_len = continuous.cache_len_for_queue(a.max_prompt, a.max_new, STEPS_PER_CALL)
    spent = {"prefill": 0.0, "decode": 0.0}
    continuous.prefill_slot = timed(spent, "prefill", continuous.prefill_slot)
    continuous.greedy_steps = timed(spent, "decode", continuous.greedy_steps)
    for slots in (int(s) for s in a.slots.split(",")):
        warm, queue = ids[:slots], ids[slots:slots + a.prompts]
        list(continuous.greedy_continuous(target, enumerate(warm), 16, slots=slots, cache_len=cache_len))
        spent.update(prefill=0.0, decode=0.0)
        tokens, wall, dry_tokens, dry_wall = run_queue(target, queue, slots, cache_len, a.max_new)
        print(f"slots {slots}, cache {cache_len} rows, {len(queue)} prompts ({sum(map(len, queue))} prompt tokens): "
              f"{tokens / wall:.1f} response tok/s overall, {dry_tokens / dry_wall:.1f} until the queue ran dry; "
              f"prefill {spent['prefill']:.1f} s, decode {spent['decode']:.1f} s of {wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
