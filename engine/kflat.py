"""K-Flat timing: the target's verify latency and a drafter's draft latency as functions of K (the command that
runs and stores sweeps is experiments.bench.kflat).
A row per K: {k, verify_ms, draft_ms, cache_rows}. verify_ms times the engine's own step (target forward over
a block of K drafted tokens + the anchor at `context`, acceptance, top-5) after warm-up, blocking
on the result, best of --repeats; draft_ms times one `propose` of the drafter at that K (None without a drafter).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .cache import init_cache
from .decode import GenerationError, cache_len_for, verify_block
from .drafters import check_k, load_drafter
from .target import Target


def _best_ms(fn, repeats: int) -> float:
    """Fastest of `repeats` timed calls after a warm-up call (the minimum resists a busy machine)."""
    fn()  # warm-up (compiles)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times)


def _verify_inputs(target: Target, k: int, context: int, max_len: int | None) -> tuple[tuple, dict]:
    """verify_block's arguments (after the params) and static arguments for a block of K at a context length."""
    max_len = max_len or cache_len_for(context, 0, k + 1)
    args = (init_cache(target.cfg, 1, max_len, target.params["embed"].dtype), jnp.ones((1, k + 1), jnp.int32),
            jnp.asarray([context], jnp.int32), jnp.asarray([k], jnp.int32), jax.random.PRNGKey(0),
            jnp.float32(1.0), jnp.float32(1.0))
    return args, {"cfg": target.cfg, "capture": (), "greedy": True}


def verify_step(target: Target, k: int, context: int, max_len: int | None = None) -> Callable[[], None]:
    """One greedy verify step over K drafted tokens at a context length, as decode runs it: a callable that blocks
    on its result (each call donates the cache and keeps the one returned)."""
    (cache, *rest), static = _verify_inputs(target, k, context, max_len)
    state = {"cache": cache}

    def step():
        out, _, state["cache"] = verify_block(target.params, state["cache"], *rest, **static)
        jax.block_until_ready(out)
    return step


def verify_hlo(target: Target, k: int, context: int, max_len: int | None = None) -> str:
    """The compiled HLO text of verify_step's program (compiled again for this)."""
    args, static = _verify_inputs(target, k, context, max_len)
    return verify_block.lower(target.params, *args, **static).compile().as_text()


def verify_ms(target: Target, k: int, context: int, max_len: int, repeats: int = 5) -> float:
    """Best wall time of one greedy verify step over K drafted tokens at a context length."""
    return _best_ms(verify_step(target, k, context, max_len), repeats)


def draft_ms(target: Target, drafter, context: int, max_len: int, repeats: int = 5) -> float:
    """Best wall time of one propose() after a context of `context` tokens."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, target.cfg.vocab_size, context + 1).astype(np.int32)
    box = {"state": drafter.start([tokens], max_len)}
    if drafter.feature_layers:
        feats = jnp.zeros((len(drafter.feature_layers), 1, context, target.cfg.hidden_size), jnp.float32)
        box["state"] = drafter.extend(box["state"], feats, np.array([context], np.int32))
    token_list = [tokens.tolist()]

    def propose():
        _, box["state"] = drafter.propose(box["state"], token_list)  # proposals come back on the host
    return _best_ms(propose, repeats)


def measure_kflat(target: Target, ks: list[int], context: int, drafter_name: str | None = None,
                  repeats: int = 5, on_k: Callable[[int, int], None] | None = None,
                  on_row: Callable[[dict], None] | None = None, cache_rows: int | None = None) -> list[dict]:
    """Rows {k, verify_ms, draft_ms, cache_rows} for each K, all at one cache size so only K varies (verify cost
    grows with the cache: time at the size runs use). cache_rows: default the smallest bucket holding the context
    and the widest block. on_k(i, K) is called before the i-th K is compiled and timed (progress), on_row(row) as
    soon as its row is measured (to store it)."""
    if drafter_name and drafter_name != "ar":  # every K the drafter refuses stops here, before anything compiles
        drafter = load_drafter(drafter_name, target)
        for k in ks:
            check_k(k, drafter.max_k, drafter.name)
    max_len = cache_rows or cache_len_for(context, 0, max(ks) + 1)
    if context + max(ks) + 1 > max_len:
        raise GenerationError(f"a cache of {max_len} rows cannot hold context {context} and a block of K={max(ks)} "
                              f"(needs {context + max(ks) + 1}): use more cache rows, a shorter context or smaller K")
    rows = []
    for i, k in enumerate(ks):
        if on_k is not None:
            on_k(i, k)
        row = {"k": k, "verify_ms": verify_ms(target, k, context, max_len, repeats), "draft_ms": None,
               "cache_rows": max_len}
        if drafter_name and drafter_name != "ar":
            row["draft_ms"] = draft_ms(target, load_drafter(drafter_name, target, k=k), context, max_len, repeats)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
