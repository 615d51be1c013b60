"""The speculative decoding loop: draft -> verify -> accept -> commit, one StepTrace per verify step.

The prompt's last token is the first anchor: prefill covers prompt[:-1], so every generated token
comes out of a verify step (with `ar`, a block of just the anchor). The target cache holds every
committed token except the anchor; after a step it grows by accepted + 1 and the bonus becomes the
next anchor. Shapes are static per (batch size, K, cache bucket): blocks are padded to max(K, 1) + 1 tokens (`ar`
verifies the anchor and one dummy slot: on XLA:CPU a one-row step copies every cache buffer, docs/performance.md).
A batch shares one target cache [B, ...] with a position per sequence, and one drafter state whose caches are
batched the same way: every step drafts all sequences in one drafter call and verifies all blocks in one target
pass. In a batch, a step's draft_ms and verify_ms are those shared calls' times. As sequences finish, the batch
narrows (next_width: 16 -> 12 -> 8 -> 6 -> 4 -> 3 -> 2 -> 1) once the running ones fit the next width: the target
cache and the drafter state keep only those rows (finished ones fill the rest), so the last sequences do not pay for
finished ones. One set of programs per width, all compiled by warm_up.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Generator, Iterator
from functools import partial
from itertools import islice

import jax
import jax.numpy as jnp
import numpy as np

from . import jit_stats
from .cache import init_cache, take_rows
from .drafters.ar import ArDrafter
from .drafters.base import Drafter
from .model import forward
from .qwen3_5 import commit_states
from .sharding import fetch, mesh_label
from .target import PIECE_CONTEXT, Target
from .tokenizer import check_template, template_label
from .trace import GenerationResult, StepTrace
from .verify import accept_greedy, accept_sampling, target_probs

PREFILL_CHUNK = 64
MAX_NEW_TOKENS = 256  # the default generation length
CACHE_BUCKET = 256
TOP = 5


class GenerationError(ValueError):
    """Bad generation input (empty or oversize prompt, bad limits); the message says what to change."""


@partial(jax.jit, static_argnames=("cfg", "capture", "greedy"), donate_argnames=("cache",))
def verify_block(params, cache, block, start, n_drafted, key, temperature, top_p, *, cfg, capture, greedy):
    """Target forward over blocks [B, K+1] at `start` [B], then acceptance per sequence.

    A hybrid target's recurrent layers keep their state after every block position on device; each sequence then
    commits the one after its accepted drafts (its KV rolls back by length, in the caller).

    Returns (n_acc [B], bonus [B], p [B, K], top5_ids [B, K+1, 5], top5_p [B, K+1, 5]), features, cache.
    """
    recurrent = "rec" in cache
    logits, feats, cache = forward(params, cache, block, start, cfg=cfg, capture=capture, per_position=recurrent)
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
    if recurrent:
        cache = commit_states(cache, n_acc)
    return (n_acc, bonus, p, top_ids, top_p_vals), feats, cache


def prefill(target: Target, cache: dict, bodies: list[np.ndarray], capture: tuple[int, ...],
            on_chunk: Callable[[int, int], None] | None = None) -> tuple[dict, list]:
    """Run each sequence's ids through the target in fixed-size chunks at the same offsets (ragged: rows past a
    sequence's end are padding, written past its length and overwritten later): (cache, [(features, n_valid [B]),
    one per chunk]). on_chunk(done, total) is called as each chunk finishes (then each chunk is waited for)."""
    chunks, longest = [], max(len(ids) for ids in bodies)
    total = -(-longest // PREFILL_CHUNK)
    for lo in range(0, longest, PREFILL_CHUNK):
        padded = np.zeros((len(bodies), PREFILL_CHUNK), np.int32)
        n_valid = [max(0, min(PREFILL_CHUNK, len(ids) - lo)) for ids in bodies]
        for row, (ids, n) in enumerate(zip(bodies, n_valid, strict=True)):
            padded[row, :n] = ids[lo:lo + n]
        _, feats, cache = forward(target.params, cache, padded, np.full(len(bodies), lo, np.int32),
                                  cfg=target.cfg, capture=capture, with_logits=False,
                                  n_valid=np.asarray(n_valid, np.int32))
        chunks.append((feats, n_valid))
        if on_chunk is not None:
            jax.block_until_ready(cache)
            on_chunk(len(chunks), total)
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


def next_width(width: int) -> int:
    """The batch width below `width` a narrowing batch steps down to: the largest power of two or 1.5x a power of
    two (1, 2, 3, 4, 6, 8, 12, 16, 24, ...) under it."""
    p = 1 << (width - 1).bit_length() >> 1  # the largest power of two < width (width >= 2)
    return p * 3 // 2 if p >= 2 and p * 3 // 2 < width else p


def narrower(width: int, n_running: int) -> int:
    """The width a batch of `width` rows runs its next step at with n_running sequences still running: stepped down
    (next_width) while they fit (down to 1)."""
    while width > 1 and n_running <= next_width(width):
        width = next_width(width)
    return width


class _Sequence:
    """One sequence's progress inside a batched generation."""

    def __init__(self, ids: np.ndarray):
        self.tokens, self.out, self.steps = [int(t) for t in ids], [], []
        self.stop, self.done_at = None, None


def decode_batch(target: Target, prompts: list[str], drafter: Drafter | None = None,
                 max_new_tokens: int = MAX_NEW_TOKENS,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, raw: bool = False,
                 template: dict | None = None, cache_len: int | None = None,
                 on_prefill: Callable[[int, int], None] | None = None, narrow_every_step: bool = False
                 ) -> Generator[list[tuple[int, StepTrace]], None, list[GenerationResult]]:
    """Speculative decoding of a batch: every step drafts all sequences in ONE drafter call, then verifies all
    blocks in ONE target pass with per-sequence acceptance and ragged lengths. Yields [(sequence index,
    StepTrace)] per step for the sequences still running; returns one GenerationResult per prompt. Finished
    sequences ride along as undrafted one-token blocks at their final position, their drafter context no longer
    growing, until the batch narrows (see the module docstring; not on a mesh, whose data axis fixes the batch).
    template: chat-template switches (e.g. {"enable_thinking": False}; engine.tokenizer.TEMPLATE_SWITCHES).
    cache_len: cache rows (default: the bucket the prompts and max_new_tokens need); on_prefill(chunks done,
    chunks): prefill progress. narrow_every_step: a warm-up walk (warm_up): no sequence stops, the width steps
    down after every step to 1, and the walk ends there, so every width's programs compile."""
    drafter = drafter or ArDrafter()
    if not prompts:
        raise GenerationError("no prompts to generate from")
    problem = check_template(target.tokenizer, template)
    if problem:
        raise GenerationError(problem)
    ids = [target.encode(p, raw, template) if isinstance(p, str) else np.zeros(0, np.int32) for p in prompts]
    for prompt, p_ids in zip(prompts, ids, strict=True):
        _validate(target, prompt, p_ids, max_new_tokens, temperature, top_p)
    compiles0, t_start = jit_stats.compile_count(), time.perf_counter()
    batch, k_block = len(ids), max(drafter.k, 1)
    max_len = cache_len_for(max(len(i) for i in ids), max_new_tokens, k_block + 1)
    if cache_len is not None:
        if cache_len < max_len:
            raise GenerationError(f"cache_len {cache_len} is below the {max_len} rows these prompts need")
        max_len = cache_len
    cache = init_cache(target.cfg, batch, max_len, target.params["embed"].dtype, target.mesh)
    capture, greedy = tuple(drafter.feature_layers), temperature == 0.0
    recurrent = "rec" in cache  # a hybrid target: verify rolls its recurrent state back to the accepted position
    seqs = [_Sequence(p_ids) for p_ids in ids]
    state = drafter.start(ids, max_len)
    cache, chunks = prefill(target, cache, [i[:-1] for i in ids], capture, on_prefill)
    for feats, n_valid in chunks:
        state = drafter.extend(state, feats, np.asarray(n_valid, np.int32))
    jax.block_until_ready(cache)
    t_decode = time.perf_counter()
    prefill_ms = (t_decode - t_start) * 1e3

    key = jax.random.PRNGKey(seed)
    temp, nucleus = np.float32(max(temperature, 1e-6)), np.float32(top_p)
    feats, n_new = None, None  # the last verify's features and each row's newly committed rows
    order = np.arange(batch)  # the sequence in each row
    can_narrow = target.mesh is None and (state is None or hasattr(state, "take"))
    while any(seqs[i].stop is None for i in order):
        t0 = time.perf_counter()
        if n_new is not None:
            state = drafter.extend(state, feats, n_new)
            if narrow_every_step and (len(order) == 1 or not can_narrow):  # every width has run: the walk ends
                for seq in seqs:
                    seq.stop, seq.done_at = seq.stop or "warm-up", seq.done_at or time.perf_counter()
                break
        running = np.array([seqs[i].stop is None for i in order])
        width = (next_width(len(order)) if narrow_every_step and n_new is not None and len(order) > 1
                 else narrower(len(order), running.sum()))
        while can_narrow and len(order) > width:  # one step down at a time: one program per width and step
            keep = np.concatenate([np.flatnonzero(running), np.flatnonzero(~running)])[:next_width(len(order))]
            for dropped in set(order) - set(order[keep]):  # finished, or (narrow_every_step) cut short
                seqs[dropped].stop = seqs[dropped].stop or "dropped"
                seqs[dropped].done_at = seqs[dropped].done_at or time.perf_counter()
            rows = jnp.asarray(keep, jnp.int32)
            cache = take_rows(cache, rows)
            state = None if state is None else state.take(rows)
            order, running = order[keep], running[keep]
        live = [seqs[i] for i in order]
        proposal, state = drafter.propose(state, [s.tokens for s in live])
        block = np.array([[s.tokens[-1]] * (k_block + 1) for s in live], np.int32)
        block[:, 1:1 + drafter.k] = proposal.ids
        starts = np.array([len(s.tokens) - 1 for s in live], np.int32)
        n_drafted = np.where(running, proposal.n, 0).astype(np.int32)
        t1 = time.perf_counter()
        key, sub = jax.random.split(key)
        result, feats, cache = verify_block(target.params, cache, block, starts, n_drafted, sub, temp, nucleus,
                                            cfg=target.cfg, capture=capture, greedy=greedy)
        n_acc, bonus, p, top_ids, top_p_vals = (np.asarray(x) for x in fetch(result))
        t2 = time.perf_counter()
        traces, n_new = [], np.zeros(len(order), np.int32)
        for row in np.flatnonzero(running):
            seq, n = live[row], int(n_drafted[row])
            accepted, drafted = int(n_acc[row]), [int(t) for t in block[row, 1:1 + n]]
            context = seq.tokens[-3 * PIECE_CONTEXT:]  # ends with the anchor
            emitted = (drafted[:accepted] + [int(bonus[row])])[:max_new_tokens - len(seq.out)]
            hit = [] if narrow_every_step else [i for i, t in enumerate(emitted) if t in target.eos_ids]
            if hit:
                emitted, seq.stop = emitted[:hit[0] + 1], "eos"
            seq.tokens += emitted
            seq.out += emitted
            n_new[row] = len(emitted)  # block rows p..p+len-1 are now committed: the anchor and accepted drafts
            rows = top_ids[row, :n + 1].tolist()
            step = StepTrace(
                index=len(seq.steps), position=int(starts[row]), drafted=drafted, accepted=accepted,
                bonus=int(bonus[row]), p=[float(x) for x in p[row, :n]],
                q=[float(x) for x in proposal.q[row, :n]], top5_ids=rows,
                top5_p=top_p_vals[row, :n + 1].tolist(), emitted=emitted, draft_ms=(t1 - t0) * 1e3,
                verify_ms=(t2 - t1) * 1e3, drafted_text=target.piece_texts(drafted, context),
                bonus_text=target.piece_texts(drafted[:accepted] + [int(bonus[row])], context)[-1],
                top5_text=[target.token_texts(r) for r in rows],
                state_rollback=k_block - accepted if recurrent else 0)
            seq.steps.append(step)
            traces.append((int(order[row]), step))
            if seq.stop is None and len(seq.out) >= max_new_tokens and not narrow_every_step:
                seq.stop = "length"
            if seq.stop is not None:
                seq.done_at = time.perf_counter()
        yield traces
    settings = settings_of(target, drafter, temperature=temperature, top_p=top_p, seed=seed,
                           max_new_tokens=max_new_tokens, raw=raw, template=template_label(template), batch=batch,
                           mesh=mesh_label(target.mesh))
    compiles = jit_stats.compile_count() - compiles0
    return [_result(target, seq, p_ids, settings, t_start, t_decode, prefill_ms, compiles)
            for seq, p_ids in zip(seqs, ids, strict=True)]


def _result(target: Target, seq: _Sequence, ids: np.ndarray, settings: dict, t_start: float, t_decode: float,
            prefill_ms: float, compiles: int) -> GenerationResult:
    steps, out = seq.steps, seq.out
    n_drafted = sum(len(s.drafted) for s in steps)
    n_accepted = sum(s.accepted for s in steps)
    decode_s = seq.done_at - t_decode
    stats = {
        "tau": len(out) / len(steps) if steps else 0.0,
        "acceptance_rate": n_accepted / n_drafted if n_drafted else None,
        "tok_per_s": len(out) / decode_s if decode_s > 0 else 0.0,
        "wall_s": seq.done_at - t_start, "prefill_ms": prefill_ms, "decode_s": decode_s,
        "n_steps": len(steps), "n_generated": len(out), "n_prompt": len(ids),
        "drafted": n_drafted, "accepted": n_accepted,
        "draft_ms": sum(s.draft_ms for s in steps), "verify_ms": sum(s.verify_ms for s in steps),
        "stop_reason": seq.stop, "compiles": compiles,
    }
    return GenerationResult(target.decode(out), out, [int(t) for t in ids], steps, stats, settings)


def decode(target: Target, prompt: str, drafter: Drafter | None = None,
           **kw) -> Generator[StepTrace, None, GenerationResult]:
    """Generator over one prompt's StepTraces whose return value is the GenerationResult (a batch of one)."""
    steps = decode_batch(target, [prompt], drafter, **kw)
    while True:
        try:
            traces = next(steps)
        except StopIteration as done:
            return done.value[0]
        for _, step in traces:
            yield step


@partial(jax.jit, static_argnames=("cfg", "n_steps", "capture"), donate_argnames=("cache",))
def greedy_steps(params, cache, tokens, positions, *, cfg, n_steps: int, capture: tuple[int, ...] = ()):
    """n_steps plain greedy target steps, one token per sequence each (T=1), in one device loop.

    tokens [B] (the anchors) at positions [B] -> (the next n_steps greedy tokens [B, n_steps], features of the
    n_steps input tokens [n_steps, F, B, H] or None, cache)."""
    def step(carry, _):
        cache, tok, pos = carry
        logits, feats, cache = forward(params, cache, tok[:, None], pos, cfg=cfg, capture=capture)
        nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        return (cache, nxt, pos + 1), (nxt, None if feats is None else feats[:, :, 0])

    (cache, _, _), (out, feats) = jax.lax.scan(step, (cache, tokens, positions), None, length=n_steps)
    return out.T, feats, cache


def _drain(gen: Generator):
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value


def stream(target: Target, prompt: str, drafter: Drafter | None = None, **kw) -> Iterator[StepTrace]:
    """Yield each verify step's trace as it happens (the generator's return value is the result)."""
    return decode(target, prompt, drafter, **kw)


def generate(target: Target, prompt: str, drafter: Drafter | None = None, **kw) -> GenerationResult:
    """Run a whole generation and return its result with every step."""
    return _drain(decode(target, prompt, drafter, **kw))


def generate_batch(target: Target, prompts: list[str], drafter: Drafter | None = None,
                   **kw) -> list[GenerationResult]:
    """Generate for a batch of prompts verified together (see decode_batch); one result per prompt."""
    return _drain(decode_batch(target, prompts, drafter, **kw))


WARM_UP_PROMPT = "Hello."  # a one-chunk stand-in: the compiled shapes depend on the batch and cache size only


def warm_up(target: Target, prompts: list[str], drafter: Drafter | None = None, **kw) -> tuple[int, float]:
    """Compile what decode_batch(target, prompts, drafter, **kw) needs, untimed: one-chunk stand-in prompts in the
    same cache size through a prefill and a step at every width the batch can narrow to (each extending the
    drafter), so a long prompt is not prefilled twice. Returns (XLA compiles, seconds). Time generations after
    it."""
    compiles0, t0 = jit_stats.compile_count(), time.perf_counter()
    drafter = drafter or ArDrafter()
    longest = max(len(target.encode(p, kw.get("raw", False), kw.get("template"))) for p in prompts)
    block = max(drafter.k, 1) + 1
    rows = kw.pop("cache_len", None) or cache_len_for(longest, kw.get("max_new_tokens", MAX_NEW_TOKENS), block)
    steps = decode_batch(target, [WARM_UP_PROMPT] * len(prompts), drafter, cache_len=rows,
                         narrow_every_step=target.mesh is None, **kw)
    for _ in islice(steps, 2 if target.mesh is not None else None):
        pass
    steps.close()
    return jit_stats.compile_count() - compiles0, time.perf_counter() - t0
