"""Engine floor: our `ar` decode against transformers' PyTorch greedy generate, same prompt, same model, one process.

    python -m experiments.bench.engine_speed [--prompt TEXT] [--max-new-tokens 128] [--dtype float32|bfloat16|both]
        [--repeats 3] [--torch-threads 1,N] [--target PATH] [--json]

Each contender is warmed up once, then the contenders alternate `--repeats` times (the loop of
experiments.bench). transformers runs at each --torch-threads count (default 1 and all cores: on a busy shared
CPU its default thread count can be ~10x slower) and "vs HF" compares with its fastest row. ms/token is pooled
decode time per decoded token, prefill excluded (transformers: from its first generated token, see
experiments/bench/peers.py). Weight bandwidth = weight bytes x tokens/s, the gpt-fast figure, next to a numpy copy of
a 512 MiB array counted as bytes read + written per second (best of 1 thread and all cores); fraction = weight
bandwidth / copy bandwidth. For ours, "verify" is the time inside the target's verify step per decode step and
"host" the rest of the step (drafting, Python, tracing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine import load_drafter, load_target

from .contenders import EngineContender, Outcome, interleave, ms_per_token, text_table

DEFAULT_PROMPT = "Explain how a CPU cache works and why it makes programs faster."


def copy_bandwidth(nbytes: int = 512 << 20, repeats: int = 5, threads: int | None = None) -> float:
    """GB/s of a numpy copy (bytes read + written), best of `repeats`, split over `threads` threads."""
    threads = threads or 1
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(len(src)), threads)
    bounds = [(p[0], p[-1] + 1) for p in parts if len(p)]

    def copy(bound):
        np.copyto(dst[bound[0]:bound[1]], src[bound[0]:bound[1]])

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(copy, bounds))
            best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9


def _row(name: str, dtype: str, outcomes: list[Outcome], weight_bytes: int, copy_gb_s: float) -> dict:
    mspt = ms_per_token(outcomes)
    row = {"engine": name, "dtype": dtype, "n": len(outcomes), "tokens": sum(o.decode_tokens for o in outcomes),
           "ms_per_token": mspt, "tok_per_s": 1e3 / mspt, "weight_bytes": weight_bytes,
           "weight_gb_s": weight_bytes * 1e3 / mspt / 1e9, "copy_gb_s": copy_gb_s}
    row["bandwidth_fraction"] = row["weight_gb_s"] / copy_gb_s
    results = [r for o in outcomes for r in o.results]
    if results:
        steps = sum(r.stats["n_steps"] for r in results)
        decode_ms = 1e3 * sum(r.stats["decode_s"] for r in results)
        row["verify_ms_per_step"] = sum(r.stats["verify_ms"] for r in results) / steps
        row["host_ms_per_step"] = (decode_ms - sum(r.stats["verify_ms"] + r.stats["draft_ms"] for r in results)) / steps
    return row


def measure(prompt: str, max_new_tokens: int, dtypes: list[str], repeats: int, target_path: str | None,
            torch_threads: list[int]) -> list[dict]:
    """Rows for our ar at each dtype and for transformers at each torch thread count (float32, or bfloat16 when
    only that is asked); `ours_x` compares every row with the fastest transformers row."""
    from .peers import HFContender, load_hf_model, weight_bytes

    targets = {d: load_target(target_path, d) for d in dtypes}
    ours = [EngineContender(t, load_drafter("ar", t), max_new_tokens=max_new_tokens) for t in targets.values()]
    first = targets[dtypes[0]]
    hf_dtype = "bfloat16" if dtypes == ["bfloat16"] else "float32"
    model = load_hf_model(first, hf_dtype)
    peers = [HFContender(model, first, f"transformers generate ({n} thread{'s' if n > 1 else ''})", 0, "ar",
                         max_new_tokens, threads=n) for n in torch_threads]
    row = {"id": "prompt", "prompt": prompt}
    for c in ours + peers:
        c.warm_up(row)
    outcomes: dict[int, list[Outcome]] = {id(c): [] for c in ours + peers}
    interleave([row] * repeats, ours + peers, lambda _r, c, out: outcomes[id(c)].append(out))
    copy_gb_s = max(copy_bandwidth(threads=1), copy_bandwidth(threads=os.cpu_count()))
    rows = [_row("draftscope ar", d, outcomes[id(c)], t.weight_bytes, copy_gb_s)
            for (d, t), c in zip(targets.items(), ours, strict=True)]
    rows += [_row(c.name, hf_dtype, outcomes[id(c)], weight_bytes(model), copy_gb_s) for c in peers]
    best_hf = min(r["ms_per_token"] for r in rows[len(ours):])
    ref = outcomes[id(ours[0])][0].token_ids
    for r, c in zip(rows, ours + peers, strict=True):
        r["ours_x"] = best_hf / r["ms_per_token"]
        r["same_tokens_as_first_ar"] = outcomes[id(c)][0].token_ids == ref
    return rows


def table(rows: list[dict]) -> str:
    """The printed summary."""
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    body = [[r["engine"], r["dtype"], r["tokens"], f(r["ms_per_token"], ".1f"), f(r["tok_per_s"], ".1f"),
             f(r["ours_x"], ".2f") + "x", f(r.get("verify_ms_per_step"), ".1f"), f(r.get("host_ms_per_step"), ".2f"),
             f(r["weight_bytes"] / 1e6, ".0f"), f(r["weight_gb_s"], ".1f"), f(r["copy_gb_s"], ".1f"),
             f(r["bandwidth_fraction"], ".2f"), "yes" if r["same_tokens_as_first_ar"] else "no"]
            for r in rows]
    return text_table(["engine", "dtype", "tokens", "ms/token", "tok/s", "vs HF", "verify ms", "host ms", "MB",
                       "GB/s", "copy GB/s", "fraction", "same tokens"], body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "both"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-threads", default=f"1,{os.cpu_count()}", help="comma-separated torch thread counts")
    ap.add_argument("--target", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    dtypes = ["float32", "bfloat16"] if a.dtype == "both" else [a.dtype]
    try:
        threads = sorted({int(n) for n in a.torch_threads.split(",") if n.strip()})
        rows = measure(a.prompt, a.max_new_tokens, dtypes, a.repeats, a.target, threads)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(table(rows))
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; vs HF = the fastest transformers row's "
              "ms/token / this row's; verify/host ms per decode step; GB/s = weight bytes x tokens/s; copy GB/s = "
              "numpy copy, bytes read + written; same tokens = as the first ar row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
