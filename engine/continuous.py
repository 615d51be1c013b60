"""Continuous batching for data: the lean greedy `ar` path over a queue of prompts, with a fixed number of slots.

A slot that finishes (EOS or max_new_tokens) takes the next prompt at once: its prompt is prefilled into that
slot's cache rows (batch-1 chunks, `prefill_slot`) while the other slots keep their state, so no slot rides along
idle while prompts remain. Decoding runs `steps_per_call` T=1 greedy steps for all slots per device call; the host
looks at the new tokens between calls. Two programs in all (one prefill chunk, one decode call) for a given
(slots, cache_len): nothing recompiles as prompts come and go. A hybrid target adds a third, `reset_slot`, which
zeroes an admitted slot's recurrent state (K/V rows are simply overwritten by position).

Each response is exactly what `generate(..., drafter=ar)` gives for that prompt (up to float rounding of T=1 vs
T=2 steps), whichever slot it ran in: a slot attends only to its own rows at positions <= its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .cache import init_cache
from .decode import PREFILL_CHUNK, GenerationError, greedy_steps
from .model import forward
from .sharding import fetch
from .target import Target


@partial(jax.jit, static_argnames=("cfg", "capture"), donate_argnames=("cache",))
def prefill_slot(params, cache, tokens, start, slot, n_valid, *, cfg, capture: tuple[int, ...] = ()):
    """Run one prompt chunk tokens [1, C] (the first n_valid [1] real, the rest padding) at start [1] through the
    target on slot `slot`'s cache rows only.

    Returns (features [F, 1, C, H] or None, cache)."""
    rows = jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, slot, 1, axis=0), cache)
    _, feats, rows = forward(params, rows, tokens, start, cfg=cfg, capture=capture, with_logits=False,
                             n_valid=n_valid)
    cache = jax.tree.map(lambda c, r: jax.lax.dynamic_update_slice_in_dim(c, r, slot, axis=0), cache, rows)
    return feats, cache


def chunk_size(remaining: int) -> int:
    """Prefill chunk for `remaining` prompt tokens: PREFILL_CHUNK while it fills most of one, then 32 or 16 (three
    programs in all; less padding than whole PREFILL_CHUNK chunks for the usual short prompts)."""
    for size in (PREFILL_CHUNK, 32):
        if remaining > size * 3 // 4:
            return size
    return 16


@partial(jax.jit, donate_argnames=("cache",))
def reset_slot(cache, slot):
    """A hybrid target's cache with slot `slot`'s recurrent (conv, rec) state zeroed, for a new prompt."""
    zero = lambda a: jax.lax.dynamic_update_slice_in_dim(a, jnp.zeros_like(a[:1]), slot, axis=0)  # noqa: E731
    return cache | {kind: [None if a is None else zero(a) for a in cache[kind]] for kind in ("conv", "rec")}


def cache_len_for_queue(max_prompt: int, max_new_tokens: int, steps_per_call: int, multiple: int = 64) -> int:
    """Rows per slot for prompts of at most max_prompt tokens: prompt, response and one call's overrun."""
    need = max_prompt + max_new_tokens + steps_per_call
    return -(-need // multiple) * multiple


@dataclass
class _Slot:
    key: Any = None  # the caller's key of the prompt running here; None: idle
    prompt: np.ndarray | None = None
    out: list[int] = field(default_factory=list)
    feats: list[np.ndarray] = field(default_factory=list)  # [n, F*H] float16 pieces


def greedy_continuous(target: Target, prompts: Iterable[tuple[Any, np.ndarray]], max_new_tokens: int, *,
                      slots: int = 32, cache_len: int, steps_per_call: int = 8,
                      capture: tuple[int, ...] = ()) -> Iterator[tuple[Any, np.ndarray, np.ndarray | None]]:
    """Greedy continuations of (key, prompt ids) pairs, yielded as (key, response, features) when each finishes
    (completion order, not prompt order; prompts are admitted in order). A response runs through its first EOS,
    at most max_new_tokens. With `capture`, features are the target features (capture order, concatenated,
    float16) of every token of prompt + response, [len, F*H], the last row zero (never an input); else None.
    Every prompt needs 1 <= len and len + max_new_tokens + steps_per_call <= cache_len (GenerationError)."""
    cfg, params = target.cfg, target.params
    if cache_len > cfg.max_position:
        raise GenerationError(f"cache_len {cache_len} exceeds the target's context of {cfg.max_position} tokens")
    width = len(capture) * cfg.hidden_size
    cache = init_cache(cfg, slots, cache_len, params["embed"].dtype, target.mesh)
    tokens, positions = np.zeros(slots, np.int32), np.zeros(slots, np.int32)
    table, queue = [_Slot() for _ in range(slots)], iter(prompts)

    def admit(s: int) -> bool:
        nonlocal cache
        item = next(queue, None)
        if item is None:
            table[s] = _Slot()
            tokens[s], positions[s] = 0, 0
            return False
        key, ids = item
        ids = np.asarray(ids, np.int32)
        room = cache_len - max_new_tokens - steps_per_call
        if not 1 <= len(ids) <= room:
            raise GenerationError(f"prompt {key!r} has {len(ids)} tokens: need 1..{room} for cache_len {cache_len} "
                                  f"and max_new_tokens {max_new_tokens}")
        table[s] = slot = _Slot(key, ids)
        if "rec" in cache:
            cache = reset_slot(cache, np.int32(s))
        body, lo = ids[:-1], 0
        while lo < len(body):
            size = chunk_size(len(body) - lo)
            n = min(size, len(body) - lo)
            chunk = np.zeros((1, size), np.int32)
            chunk[0, :n] = body[lo:lo + n]
            feats, cache = prefill_slot(params, cache, chunk, np.full(1, lo, np.int32), np.int32(s),
                                        np.full(1, n, np.int32), cfg=cfg, capture=capture)
            if capture:
                slot.feats.append(np.asarray(fetch(feats), np.float16)[:, 0, :n].transpose(1, 0, 2).reshape(n, width))
            lo += n
        tokens[s], positions[s] = ids[-1], len(ids) - 1
        return True

    for s in range(slots):
        admit(s)
    while any(slot.key is not None for slot in table):
        out, feats, cache = greedy_steps(params, cache, tokens, positions, cfg=cfg, n_steps=steps_per_call,
                                         capture=capture)
        out = np.asarray(fetch(out))  # [slots, n]
        step_feats = np.asarray(fetch(feats), np.float16) if capture else None  # [n, F, slots, H]
        tokens, positions = out[:, -1].copy(), positions + steps_per_call
        for s, slot in enumerate(table):
            if slot.key is None:
                tokens[s], positions[s] = 0, 0
                continue
            new = out[s, :max_new_tokens - len(slot.out)].tolist()
            stop = next((i for i, t in enumerate(new) if t in target.eos_ids), None)
            new = new if stop is None else new[:stop + 1]
            if capture:  # the inputs of these steps: the previous anchor, then the new tokens but the last
                slot.feats.append(step_feats[:len(new), :, s].reshape(len(new), width))
            slot.out += new
            if stop is not None or len(slot.out) >= max_new_tokens:
                response = np.asarray(slot.out, np.int32)
                features = None
                if capture:
                    features = np.concatenate(slot.feats + [np.zeros((1, width), np.float16)])
                yield slot.key, response, features
                admit(s)
