"""The speculative decoding loop: draft -> verify -> accept -> commit, one StepTrace per verify step.

The prompt's last token is the first anchor: prefill covers prompt[:-1], so every generated token
comes out of a verify step (with `ar`, a block of just the anchor). The target cache holds every
committed token except the anchor; after a step it grows by accepted + 1 and the bonus becomes the
next anchor. Shapes are static per (K, cache bucket): blocks are padded to max(K, 1) + 1 tokens.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Generator, Iterator
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import jit_stats
from .cache import init_cache
from .drafters.ar import ArDrafter
from .drafters.base import Drafter
from .model import forward
from .target import Target
from .trace import GenerationResult, StepTrace
from .verify import accept_greedy, accept_sampling, target_probs

PREFILL_CHUNK = 64
CACHE_BUCKET = 256
TOP = 5


class GenerationError(ValueError):
    """Bad generation input (empty or oversize prompt, bad limits); the message says what to change."""


@partial(jax.jit, static_argnames=("cfg", "capture", "greedy"), donate_argnames=("cache",))
def verify_block(params, cache, block, start, n_drafted, key, temperature, top_p, *, cfg, capture, greedy):
    """Target forward over blocks [B, K+1] at `start` [B], then acceptance per sequence.

    Returns (n_acc [B], bonus [B], p [B, K], top5_ids [B, K+1, 5], top5_p [B, K+1, 5]), features, cache.
    """
    logits, feats, cache = forward(params, cache, block, start, cfg=cfg, capture=capture)
    drafted = block[:, 1:]
    keys = jax.random.split(key, block.shape[0])
    if greedy:
        probs = jax.nn.softmax(logits, axis=-1)
        n_acc, bonus = jax.vmap(accept_greedy)(logits, drafted, n_drafted)
    else:
        probs = jax.vmap(target_probs, in_axes=(0, None, None))(logits, temperature, top_p)
        q = jax.nn.one_hot(drafted, logits.shape[-1], dtype=jnp.float32)  # drafts are deterministic proposals
        n_acc, bonus = jax.vmap(accept_sampling)(probs, q, drafted, n_drafted, keys)
    p = jnp.take_along_axis(probs[:, :-1], drafted[..., None], axis=-1)[..., 0]
    top_p_vals, top_ids = jax.lax.top_k(probs, TOP)
    return (n_acc, bonus, p, top_ids, top_p_vals), feats, cache


def prefill(target: Target, cache: dict, ids: np.ndarray, capture: tuple[int, ...]) -> tuple[dict, list]:
    """Run ids through the target in fixed-size chunks: (cache, [(features, n_valid) per chunk])."""
    chunks = []
    for lo in range(0, len(ids), PREFILL_CHUNK):
        chunk = ids[lo:lo + PREFILL_CHUNK]
        padded = np.zeros((1, PREFILL_CHUNK), np.int32)
        padded[0, :len(chunk)] = chunk
        _, feats, cache = forward(target.params, cache, jnp.asarray(padded), jnp.asarray([lo], jnp.int32),
                                  cfg=target.cfg, capture=capture, with_logits=False)
        chunks.append((feats, len(chunk)))
    return cache, chunks


def cache_len_for(n_prompt: int, max_new_tokens: int, block: int) -> int:
    """Cache size bucket: room for the prompt, the output and one over-long block."""
    need = n_prompt + max_new_tokens + block + 1
    return -(-need // CACHE_BUCKET) * CACHE_BUCKET


def _validate(target: Target, prompt: str, ids: np.ndarray, max_new_tokens: int, temperature: float,
              top_p: float) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise GenerationError("the prompt is empty: type some text to generate from")
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    ctx = target.cfg.max_position
    if len(ids) >= ctx:
        raise GenerationError(f"the prompt is {len(ids)} tokens but the target's context is {ctx} tokens: "
                              "shorten the prompt")
    if len(ids) + max_new_tokens > ctx:
        raise GenerationError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                              f"target's context of {ctx} tokens: lower max_new_tokens to "
                              f"{ctx - len(ids)} or less")
    if temperature < 0 or not 0 < top_p <= 1:
        raise GenerationError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")


def settings_of(target: Target, drafter: Drafter, **kw) -> dict:
    """Run settings recorded with every result."""
    dev = jax.devices()[0]
    return {"target": target.name, "target_path": str(target.path), "dtype": target.dtype,
            "drafter": drafter.name, "drafter_checkpoint": drafter.checkpoint, "k": drafter.k,
            "backend": jax.default_backend(), "device_kind": dev.device_kind,
            "versions": {"jax": jax.__version__, "python": platform.python_version()}, **kw}


def decode(target: Target, prompt: str, drafter: Drafter | None = None, max_new_tokens: int = 256,
           temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
           raw: bool = False) -> Generator[StepTrace, None, GenerationResult]:
    """Generator over StepTraces whose return value is the GenerationResult."""
    drafter = drafter or ArDrafter()
    ids = target.encode(prompt, raw) if isinstance(prompt, str) else np.zeros(0, np.int32)
    _validate(target, prompt, ids, max_new_tokens, temperature, top_p)
    compiles0, t_start = jit_stats.compile_count(), time.perf_counter()
    k_block = max(drafter.k, 1)
    max_len = cache_len_for(len(ids), max_new_tokens, k_block + 1)
    cache = init_cache(target.cfg, 1, max_len, target.params["embed"].dtype)
    capture, greedy = tuple(drafter.feature_layers), temperature == 0.0
    state = drafter.start(ids, max_len)
    cache, chunks = prefill(target, cache, ids[:-1], capture)
    for feats, n in chunks:
        state = drafter.extend(state, feats, n)
    jax.block_until_ready(cache)
    t_decode = time.perf_counter()
    prefill_ms = (t_decode - t_start) * 1e3

    tokens, out, steps = [int(t) for t in ids], [], []
    key = jax.random.PRNGKey(seed)
    temp, nucleus = jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p)
    pending, stop = None, "length"
    while len(out) < max_new_tokens:
        t0 = time.perf_counter()
        if pending is not None:
            state = drafter.extend(state, *pending)
        proposal, state = drafter.propose(state, tokens)
        jax.block_until_ready(proposal.ids)
        t1 = time.perf_counter()
        n_drafted = int(proposal.n)
        block = np.full((1, k_block + 1), tokens[-1], np.int32)
        block[0, 1:1 + n_drafted] = np.asarray(proposal.ids)[:n_drafted]
        position = len(tokens) - 1
        key, sub = jax.random.split(key)
        result, feats, cache = verify_block(target.params, cache, jnp.asarray(block),
                                            jnp.asarray([position], jnp.int32), jnp.asarray([n_drafted], jnp.int32),
                                            sub, temp, nucleus, cfg=target.cfg, capture=capture, greedy=greedy)
        n_acc, bonus, p, top_ids, top_p_vals = (np.asarray(x)[0] for x in jax.device_get(result))
        t2 = time.perf_counter()
        n_acc, bonus = int(n_acc), int(bonus)
        drafted = [int(t) for t in block[0, 1:1 + n_drafted]]
        emitted = (drafted[:n_acc] + [bonus])[:max_new_tokens - len(out)]
        hit = [i for i, t in enumerate(emitted) if t in target.eos_ids]
        if hit:
            emitted, stop = emitted[:hit[0] + 1], "eos"
        tokens += emitted
        out += emitted
        pending = (feats, n_acc + 1)
        step = StepTrace(
            index=len(steps), position=position, drafted=drafted, accepted=n_acc, bonus=bonus,
            p=[float(x) for x in p[:n_drafted]], q=[float(x) for x in np.asarray(proposal.q)[:n_drafted]],
            top5_ids=top_ids[:n_drafted + 1].tolist(), top5_p=top_p_vals[:n_drafted + 1].tolist(),
            emitted=emitted, draft_ms=(t1 - t0) * 1e3, verify_ms=(t2 - t1) * 1e3,
            drafted_text=target.token_texts(drafted), bonus_text=target.token_texts([bonus])[0],
            top5_text=[target.token_texts(r) for r in top_ids[:n_drafted + 1].tolist()])
        steps.append(step)
        yield step
        if stop == "eos":
            break
    t_end = time.perf_counter()
    n_drafted_total = sum(len(s.drafted) for s in steps)
    n_accepted = sum(s.accepted for s in steps)
    decode_s = t_end - t_decode
    stats = {
        "tau": len(out) / len(steps) if steps else 0.0,
        "acceptance_rate": n_accepted / n_drafted_total if n_drafted_total else None,
        "tok_per_s": len(out) / decode_s if decode_s > 0 else 0.0,
        "wall_s": t_end - t_start, "prefill_ms": prefill_ms, "decode_s": decode_s,
        "n_steps": len(steps), "n_generated": len(out), "n_prompt": len(ids),
        "drafted": n_drafted_total, "accepted": n_accepted,
        "draft_ms": sum(s.draft_ms for s in steps), "verify_ms": sum(s.verify_ms for s in steps),
        "stop_reason": stop, "compiles": jit_stats.compile_count() - compiles0,
    }
    settings = settings_of(target, drafter, temperature=temperature, top_p=top_p, seed=seed,
                           max_new_tokens=max_new_tokens, raw=raw)
    return GenerationResult(target.decode(out), out, [int(t) for t in ids], steps, stats, settings)


def stream(target: Target, prompt: str, drafter: Drafter | None = None, **kw) -> Iterator[StepTrace]:
    """Yield each verify step's trace as it happens (the generator's return value is the result)."""
    return decode(target, prompt, drafter, **kw)


def generate(target: Target, prompt: str, drafter: Drafter | None = None, **kw) -> GenerationResult:
    """Run a whole generation and return its result with every step."""
    gen = decode(target, prompt, drafter, **kw)
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value
