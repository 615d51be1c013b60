"""Layer functions every model family and drafter shares: norms, projections, RoPE, attention, the FFN kinds
(dense SwiGLU, clamped SwiGLU, routed experts), the LM head and the cache write. Pure functions over arrays; the
leaf of the engine (it imports only the config)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from .config import ModelConfig


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., in] @ w [in, out] in the weight dtype, accumulated in float32."""
    return jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32)


def rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array, scale: float = 1.0) -> jax.Array:
    """Rotate-half RoPE. x [B, T, N, D], positions [B, T]; cos and sin are multiplied by `scale` (YaRN's
    attention factor, ModelConfig.attention_factor())."""
    freqs = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
    cos, sin = jnp.cos(freqs)[:, :, None, :], jnp.sin(freqs)[:, :, None, :]
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q: jax.Array, k: jax.Array | tuple, v: jax.Array | tuple, mask: jax.Array,
              sinks: jax.Array | None = None) -> jax.Array:
    """Grouped-query attention. q [B, T, Nh, D]; k, v [B, Nkv, S, D]; mask [B, T, S] bool -> [B, T, Nh*D].

    k and v may be tuples of parts [B, Nkv, S_i, D]: the key rows of all parts in order (S = sum S_i), attended
    to without building their concatenation (a drafter block's own K/V beside a context cache).
    `sinks` [Nh]: a learned logit per head that joins the softmax denominator and attends to nothing (gpt-oss)."""
    k_parts, v_parts = (k, v) if isinstance(k, tuple) else ((k,), (v,))
    b, t, nh, d = q.shape
    nkv = k_parts[0].shape[1]
    g = nh // nkv
    # rows of one kv head's group stacked as [g * t] queries: two plain batched matmuls on CPU
    q = q.reshape(b, t, nkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, nkv, g * t, d)
    scores = jnp.concatenate([jnp.einsum("bkqd,bksd->bkqs", q, kp.astype(jnp.float32)) for kp in k_parts],
                             axis=-1) * (d ** -0.5)
    s = scores.shape[-1]
    mask = jnp.broadcast_to(mask[:, None, None], (b, nkv, g, t, s)).reshape(b, nkv, g * t, s)
    scores = jnp.where(mask, scores, -1e30)
    if sinks is None:
        probs = jax.nn.softmax(scores, axis=-1)
    else:  # head h = kv * g + j, as the query reshape above
        sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, nkv, g, 1, 1), (b, nkv, g, t, 1))
        probs = jax.nn.softmax(jnp.concatenate([scores, sink.reshape(b, nkv, g * t, 1)], axis=-1), axis=-1)[..., :s]
    splits = list(itertools.accumulate(kp.shape[2] for kp in k_parts))[:-1]
    out = sum(jnp.einsum("bkqs,bksd->bkqd", p, vp.astype(jnp.float32))
              for p, vp in zip(jnp.split(probs, splits, axis=-1), v_parts, strict=True))
    return out.reshape(b, nkv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, nh * d)


def lm_head(params: dict, h: jax.Array) -> jax.Array:
    """Final-normed hidden [..., H] -> logits [..., V] (tied embeddings when there is no lm_head)."""
    if "lm_head" in params:
        return linear(h, params["lm_head"])
    w = params["embed"]  # tied: contract against [V, H] directly, never materialize the transpose
    return jnp.einsum("...h,vh->...v", h.astype(w.dtype), w, preferred_element_type=jnp.float32)


def embed(params: dict, tokens: jax.Array) -> jax.Array:
    return params["embed"][tokens].astype(jnp.float32)


def glu(cfg: ModelConfig, gate: jax.Array, up: jax.Array) -> jax.Array:
    """The gated activation: silu(gate) * up, or gpt-oss's clamped form when cfg.swiglu_limit is set."""
    if cfg.swiglu_limit is None:
        return jax.nn.silu(gate) * up
    limit = cfg.swiglu_limit
    gate, up = jnp.minimum(gate, limit), jnp.clip(up, -limit, limit)
    return (up + 1) * (gate * jax.nn.sigmoid(gate * cfg.swiglu_alpha))


def route(cfg: ModelConfig, lp: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Router over x [N, H] -> (weights [N, k] float32, expert ids [N, k] int32)."""
    logits = linear(x, lp["router"])
    if cfg.router_bias:
        logits = logits + lp["router_bias"]
    k = cfg.num_experts_per_tok
    if cfg.router == "topk_softmax":  # gpt-oss: top-k logits, then a softmax over those k
        top, idx = jax.lax.top_k(logits, k)
        return jax.nn.softmax(top, axis=-1), idx.astype(jnp.int32)
    top, idx = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)  # Qwen3-MoE: softmax over all, then top-k
    if cfg.norm_topk_prob:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return top, idx.astype(jnp.int32)


def _expert_bias(cfg: ModelConfig, lp: dict, name: str, idx) -> jax.Array | float:
    return lp[name][idx] if cfg.expert_bias else 0.0


def moe_dense(cfg: ModelConfig, lp: dict, x: jax.Array, weights: jax.Array, idx: jax.Array) -> jax.Array:
    """Every expert on every token [N, H], combined by the routing weights (zero for unrouted experts)."""
    wg, wu, wd = lp["we_gate"], lp["we_up"], lp["we_down"]
    xe = x.astype(wg.dtype)
    gate = jnp.einsum("nh,ehi->eni", xe, wg, preferred_element_type=jnp.float32)
    up = jnp.einsum("nh,ehi->eni", xe, wu, preferred_element_type=jnp.float32)
    if cfg.expert_bias:
        gate, up = gate + lp["be_gate"][:, None], up + lp["be_up"][:, None]
    out = jnp.einsum("eni,eih->enh", glu(cfg, gate, up).astype(wd.dtype), wd, preferred_element_type=jnp.float32)
    if cfg.expert_bias:
        out = out + lp["be_down"][:, None]
    combine = jnp.sum(jax.nn.one_hot(idx, cfg.num_experts, dtype=jnp.float32) * weights[..., None], axis=1)  # [N, E]
    return jnp.einsum("enh,ne->nh", out, combine)


def moe_gathered(cfg: ModelConfig, lp: dict, x: jax.Array, weights: jax.Array, idx: jax.Array) -> jax.Array:
    """Only the routed experts: each (token, expert) pair gathers that expert's weights and runs it."""
    n, k = idx.shape
    flat = idx.reshape(-1)  # [N*k]
    wg, wu, wd = lp["we_gate"][flat], lp["we_up"][flat], lp["we_down"][flat]
    xs = jnp.repeat(x, k, axis=0).astype(wg.dtype)  # row m = token m // k
    gate = jnp.einsum("mh,mhi->mi", xs, wg, preferred_element_type=jnp.float32) + _expert_bias(cfg, lp, "be_gate", flat)
    up = jnp.einsum("mh,mhi->mi", xs, wu, preferred_element_type=jnp.float32) + _expert_bias(cfg, lp, "be_up", flat)
    out = jnp.einsum("mi,mih->mh", glu(cfg, gate, up).astype(wd.dtype), wd, preferred_element_type=jnp.float32)
    out = out + _expert_bias(cfg, lp, "be_down", flat)
    return jnp.sum(out.reshape(n, k, -1) * weights[..., None], axis=1)


def moe(cfg: ModelConfig, lp: dict, h: jax.Array, path: str | None = None) -> jax.Array:
    """Routed mixture of experts over h [B, T, H]. `path` "dense" or "gathered"; None picks statically from the
    shape: gathered while the (token, expert) pairs are no more than the experts (it then reads fewer weights)."""
    b, t, hidden = h.shape
    x = h.reshape(b * t, hidden)
    weights, idx = route(cfg, lp, x)
    if path is None:
        path = "gathered" if b * t * cfg.num_experts_per_tok <= cfg.num_experts else "dense"
    run = {"dense": moe_dense, "gathered": moe_gathered}[path]
    return run(cfg, lp, x, weights, idx).reshape(b, t, hidden)


def dense_ffn(cfg: ModelConfig, lp: dict, h: jax.Array) -> jax.Array:
    return linear(glu(cfg, linear(h, lp["w_gate"]), linear(h, lp["w_up"])), lp["w_down"])


def write(buf: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """Write new [B, Nkv, T, D] rows into buf [B, Nkv, S, D] at per-sequence offsets start [B]."""
    new = new.astype(buf.dtype)
    if new.shape[0] == 1:  # one plain in-place update; XLA:CPU turns the vmapped form into a slower scatter
        return jax.lax.dynamic_update_slice(buf, new, (0, 0, start[0], 0))
    one = lambda b_buf, b_new, b_start: jax.lax.dynamic_update_slice(b_buf, b_new, (0, b_start, 0))  # noqa: E731
    return jax.vmap(one)(buf, new, start)
