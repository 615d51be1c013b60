"""The target decoder (Llama family and Qwen3): one pure forward over T new tokens at a cache position.

forward(params, cache, tokens [B, T], start [B]) -> logits [B, T, V] | None, features [F, B, T, H] | None, cache
Token t of sequence b sits at position start[b] + t; it attends to cache positions <= its own.
`capture` names target layers whose OUTPUT is returned as features (id L = output of decoder layer L,
i.e. HF hidden_states[L + 1]; id -1 = the embeddings, i.e. the input of layer 0). As in HF, the last
layer's (id N-1 = hidden_states[N]) is taken after the final norm.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .cache import write
from .config import ModelConfig


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., in] @ w [in, out] in the weight dtype, accumulated in float32."""
    return jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32)


def rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate-half RoPE. x [B, T, N, D], positions [B, T]."""
    freqs = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
    cos, sin = jnp.cos(freqs)[:, :, None, :], jnp.sin(freqs)[:, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention. q [B, T, Nh, D]; k, v [B, Nkv, S, D]; mask [B, T, S] bool -> [B, T, Nh*D]."""
    b, t, nh, d = q.shape
    nkv, s = k.shape[1], k.shape[2]
    g = nh // nkv
    # rows of one kv head's group stacked as [g * t] queries: two plain batched matmuls on CPU
    q = q.reshape(b, t, nkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, nkv, g * t, d)
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k.astype(jnp.float32)) * (d ** -0.5)
    mask = jnp.broadcast_to(mask[:, None, None], (b, nkv, g, t, s)).reshape(b, nkv, g * t, s)
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, v.astype(jnp.float32))
    return out.reshape(b, nkv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, nh * d)


def lm_head(params: dict, h: jax.Array) -> jax.Array:
    """Final-normed hidden [..., H] -> logits [..., V] (tied embeddings when there is no lm_head)."""
    if "lm_head" in params:
        return linear(h, params["lm_head"])
    w = params["embed"]  # tied: contract against [V, H] directly, never materialize the transpose
    return jnp.einsum("...h,vh->...v", h.astype(w.dtype), w, preferred_element_type=jnp.float32)


def embed(params: dict, tokens: jax.Array) -> jax.Array:
    return params["embed"][tokens].astype(jnp.float32)


def decoder_layer(cfg: ModelConfig, lp: dict, x: jax.Array, positions: jax.Array, k_cache: jax.Array,
                  v_cache: jax.Array, start: jax.Array, mask: jax.Array):
    """One pre-norm block; writes this layer's new K/V into its cache [B, Nkv, S, D] and attends over it."""
    b, t, _ = x.shape
    inv_freq = jnp.asarray(cfg.inv_freq())
    h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
    q = linear(h, lp["wq"]).reshape(b, t, cfg.num_heads, cfg.head_dim)
    k = linear(h, lp["wk"]).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    v = linear(h, lp["wv"]).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q, k = rms_norm(q, lp["q_norm"], cfg.rms_eps), rms_norm(k, lp["k_norm"], cfg.rms_eps)
    q, k = rope(q, positions, inv_freq), rope(k, positions, inv_freq)
    k_cache = write(k_cache, k.transpose(0, 2, 1, 3), start)
    v_cache = write(v_cache, v.transpose(0, 2, 1, 3), start)
    x = x + linear(attention(q, k_cache, v_cache, mask), lp["wo"])
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
    x = x + linear(jax.nn.silu(linear(h, lp["w_gate"])) * linear(h, lp["w_up"]), lp["w_down"])
    return x, k_cache, v_cache


@partial(jax.jit, static_argnames=("cfg", "capture", "with_logits"), donate_argnames=("cache",))
def forward(params: dict, cache: dict, tokens: jax.Array, start: jax.Array, *, cfg: ModelConfig,
            capture: tuple[int, ...] = (), with_logits: bool = True):
    """Run T new tokens per sequence through the decoder, updating the cache in place (donated)."""
    b, t = tokens.shape
    positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    max_len = cache["k"][0].shape[2]
    mask = jnp.arange(max_len)[None, None, :] <= positions[:, :, None]  # [B, T, S]
    x = embed(params, tokens)
    outputs = {-1: x} if -1 in capture else {}
    ks, vs = [], []
    # layers unrolled over separate weight arrays: XLA:CPU runs this far faster than lax.scan over stacked
    # weights (f32 ~1.4x, bf16 ~10x on our machines)
    for i, lp in enumerate(params["layers"]):
        x, k_i, v_i = decoder_layer(cfg, lp, x, positions, cache["k"][i], cache["v"][i], start, mask)
        ks.append(k_i)
        vs.append(v_i)
        if i in capture:
            outputs[i] = x
    h = rms_norm(x, params["norm"], cfg.rms_eps)  # shared by the logits and feature id N-1
    if cfg.num_layers - 1 in capture:
        outputs[cfg.num_layers - 1] = h
    logits = lm_head(params, h) if with_logits else None
    feats = jnp.stack([outputs[i] for i in capture]) if capture else None
    return logits, feats, {"k": ks, "v": vs}
