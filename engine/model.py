"""The target decoder: one pure forward over T new tokens at a cache position, for every supported family.

forward(params, cache, tokens [B, T], start [B]) -> logits [B, T, V] | None, features [F, B, T, H] | None, cache
Token t of sequence b sits at position start[b] + t; it attends to cache positions <= its own (and, in a
sliding-window layer, to the last `window` of them: the cache keeps every position, the mask restricts).
`capture` names target layers whose OUTPUT is returned as features (id L = output of decoder layer L,
i.e. HF hidden_states[L + 1]; id -1 = the embeddings, i.e. the input of layer 0). As in HF, the last
layer's (id N-1 = hidden_states[N]) is taken after the final norm.

Layer kinds come from the config (engine/config.py): the mixer is attention (full or sliding window, optional
q/k/v/o biases and per-head sinks), the feed-forward a dense SwiGLU or a routed mixture of experts. A hybrid
target (engine/qwen3_5.py's HybridConfig) mixes gated DeltaNet layers, whose cache entry is a recurrent state,
with output-gated attention layers; its FFN adds a gated shared expert to the routed ones. A MoE layer
runs one of two equal paths, chosen statically from the token count: with few (token, expert) pairs it gathers
only the routed experts' weights; otherwise it computes every expert densely and weights them by the routing.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .config import ModelConfig
from .ops import attention, dense_ffn, embed, linear, lm_head, moe, rms_norm, rope, write
from .qwen3_5 import hybrid_layer


def _proj(h: jax.Array, lp: dict, w: str, bias: str) -> jax.Array:
    out = linear(h, lp[w])
    return out + lp[bias] if bias in lp else out


def decoder_layer(cfg: ModelConfig, lp: dict, x: jax.Array, positions: jax.Array, k_cache: jax.Array,
                  v_cache: jax.Array, start: jax.Array, mask: jax.Array, moe_layer: bool = False):
    """One pre-norm block; writes this layer's new K/V into its cache [B, Nkv, S, D] and attends over it."""
    b, t, _ = x.shape
    inv_freq, scale = jnp.asarray(cfg.inv_freq()), cfg.attention_factor()
    h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
    q = _proj(h, lp, "wq", "bq").reshape(b, t, cfg.num_heads, cfg.head_dim)
    k = _proj(h, lp, "wk", "bk").reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    v = _proj(h, lp, "wv", "bv").reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q, k = rms_norm(q, lp["q_norm"], cfg.rms_eps), rms_norm(k, lp["k_norm"], cfg.rms_eps)
    q, k = rope(q, positions, inv_freq, scale), rope(k, positions, inv_freq, scale)
    k_cache = write(k_cache, k.transpose(0, 2, 1, 3), start)
    v_cache = write(v_cache, v.transpose(0, 2, 1, 3), start)
    x = x + _proj(attention(q, k_cache, v_cache, mask, lp.get("sinks")), lp, "wo", "bo")
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
    x = x + (moe(cfg, lp, h) if moe_layer else dense_ffn(cfg, lp, h))
    return x, k_cache, v_cache


def layer_masks(cfg: ModelConfig, positions: jax.Array, max_len: int) -> dict[int, jax.Array]:
    """Attention masks [B, T, S] by window (0: causal over the whole cache)."""
    kv = jnp.arange(max_len)[None, None, :]
    causal = kv <= positions[:, :, None]
    windows = {cfg.window(i) for i in range(cfg.num_layers)} - {0}
    return {0: causal} | {w: causal & (kv > positions[:, :, None] - w) for w in windows}


@partial(jax.jit, static_argnames=("cfg", "capture", "with_logits", "per_position"), donate_argnames=("cache",))
def forward(params: dict, cache: dict, tokens: jax.Array, start: jax.Array, *, cfg: ModelConfig,
            capture: tuple[int, ...] = (), with_logits: bool = True, n_valid: jax.Array | None = None,
            per_position: bool = False):
    """Run T new tokens per sequence through the decoder, updating the cache in place (donated).

    Recurrent (gated DeltaNet) layers only: n_valid [B] counts each row's real tokens (the state is the one after
    them; None: all T), and per_position keeps their state after every position (leaves [B, T, ...]) for
    engine.qwen3_5.commit_states to pick each sequence's accepted one."""
    b, t = tokens.shape
    positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    kv = [k for k in cache["k"] if k is not None]
    masks = layer_masks(cfg, positions, kv[0].shape[2]) if kv else {0: None}
    x = embed(params, tokens)
    outputs = {-1: x} if -1 in capture else {}
    new = {kind: [] for kind in cache}
    # layers unrolled over separate weight arrays: XLA:CPU runs this far faster than lax.scan over stacked
    # weights (f32 ~1.4x, bf16 ~10x on our machines)
    for i, lp in enumerate(params["layers"]):
        if "rec" in cache:
            x, entry = hybrid_layer(cfg, i, lp, x, positions, {kind: cache[kind][i] for kind in cache}, start,
                                    masks[0], n_valid, per_position)
        else:
            x, k_i, v_i = decoder_layer(cfg, lp, x, positions, cache["k"][i], cache["v"][i], start,
                                        masks[cfg.window(i)], cfg.is_moe(i))
            entry = {"k": k_i, "v": v_i}
        for kind in new:
            new[kind].append(entry[kind])
        if i in capture:
            outputs[i] = x
    h = rms_norm(x, params["norm"], cfg.rms_eps)  # shared by the logits and feature id N-1
    if cfg.num_layers - 1 in capture:
        outputs[cfg.num_layers - 1] = h
    logits = lm_head(params, h) if with_logits else None
    feats = jnp.stack([outputs[i] for i in capture]) if capture else None
    return logits, feats, new
