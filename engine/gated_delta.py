"""Gated DeltaNet linear attention (the Qwen3.5 / Qwen3.6 `linear_attention` mixer) as pure functions.

Layer params (matrices [in, out]; Kd = Nk*Dk, Vd = Nv*Dv, C = 2*Kd + Vd):
    w_qkv [H, C] (q | k | v, each head-major), w_z [H, Vd], w_b [H, Nv], w_a [H, Nv], w_out [Vd, H],
    conv [K, C] (depthwise causal kernel; tap K-1 multiplies the newest input), dt_bias [Nv], A_log [Nv],
    out_norm [Dv] (gated RMSNorm weight, plain: x * w).
State of one layer, float32: {"conv": [B, K-1, C] the last K-1 conv inputs (oldest first), "rec": [B, Nv, Dk, Dv]}.
Value head h reads key/query head h // (Nv // Nk), as in transformers' repeat_interleave grouping.

Per value head, with beta = sigmoid(b) and g = -exp(A_log) * softplus(a + dt_bias):
    S <- S * e^g;  S <- S + k (beta (v - S^T k))^T;  o = S^T q      (q, k L2-normalised; q scaled by Dk^-0.5)
Two forms over T new tokens of a normed hidden h [B, T, H] (both return the mixer output [B, T, H]):
    prefill(cfg, p, h, state, n_valid, chunk) -> (y, state)   chunked (UT transform); rows past n_valid[b] leave
                                                             row b's state as it was after n_valid[b] tokens
    verify(cfg, p, h, state) -> (y, states)                   recurrent; every state leaf AFTER EACH position,
                                                             [B, T, ...], so a partly accepted block can roll back
commit(states, last) -> state: row b's state after position last[b] (a jit-friendly gather, no host round trip).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from .ops import linear, rms_norm

L2_EPS = 1e-6  # transformers' l2norm (aligned with flash-linear-attention)


@dataclass(frozen=True)
class DeltaConfig:
    """Shape of one Gated DeltaNet mixer; static under jit."""

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    rms_eps: float

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def state_shapes(cfg: DeltaConfig, batch: int) -> dict[str, tuple[int, ...]]:
    """Shapes of one layer's (conv, recurrent) state; both are float32."""
    return {"conv": (batch, cfg.conv_kernel - 1, cfg.conv_dim),
            "rec": (batch, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim)}


def init_state(cfg: DeltaConfig, batch: int) -> dict[str, jax.Array]:
    """A zeroed (conv, recurrent) state: what a sequence starts from."""
    return {kind: jnp.zeros(shape, jnp.float32) for kind, shape in state_shapes(cfg, batch).items()}


def causal_conv(x: jax.Array, conv_state: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Depthwise causal conv + SiLU. x [B, T, C] after conv_state [B, K-1, C]; w [K, C].

    Returns (silu(conv) [B, T, C], the whole input window [B, K-1+T, C], whose rows j..j+K-2 are the conv state
    after j new tokens)."""
    window = jnp.concatenate([conv_state, x.astype(jnp.float32)], axis=1)
    kernel, t = w.shape[0], x.shape[1]
    y = sum(window[:, j:j + t] * w[j].astype(jnp.float32) for j in range(kernel))
    return jax.nn.silu(y), window


def _l2norm(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def _project(cfg: DeltaConfig, p: dict, h: jax.Array, conv_state: jax.Array):
    """Projections, conv and gates: (q, k [B, T, Nv, Dk] grouped per value head, v [B, T, Nv, Dv], g, beta
    [B, T, Nv], z [B, T, Nv, Dv], conv window [B, K-1+T, C])."""
    b, t, _ = h.shape
    mixed, window = causal_conv(linear(h, p["w_qkv"]), conv_state, p["conv"])
    q, k, v = jnp.split(mixed, [cfg.key_dim, 2 * cfg.key_dim], axis=-1)
    rep = cfg.num_v_heads // cfg.num_k_heads
    q = jnp.repeat(_l2norm(q.reshape(b, t, cfg.num_k_heads, cfg.head_k_dim)), rep, axis=2) * cfg.head_k_dim ** -0.5
    k = jnp.repeat(_l2norm(k.reshape(b, t, cfg.num_k_heads, cfg.head_k_dim)), rep, axis=2)
    v = v.reshape(b, t, cfg.num_v_heads, cfg.head_v_dim)
    beta = jax.nn.sigmoid(linear(h, p["w_b"]))
    g = -jnp.exp(p["A_log"].astype(jnp.float32)) * jax.nn.softplus(linear(h, p["w_a"]) + p["dt_bias"])
    z = linear(h, p["w_z"]).reshape(b, t, cfg.num_v_heads, cfg.head_v_dim)
    return q, k, v, g, beta, z, window


def _output(cfg: DeltaConfig, p: dict, o: jax.Array, z: jax.Array) -> jax.Array:
    """Gated RMSNorm (norm, then * silu(z)) per value head, then out_proj: o, z [B, T, Nv, Dv] -> [B, T, H]."""
    b, t = o.shape[:2]
    o = rms_norm(o, p["out_norm"], cfg.rms_eps) * jax.nn.silu(z)
    return linear(o.reshape(b, t, cfg.value_dim), p["w_out"])


def delta_rule_recurrent(q, k, v, g, beta, rec):
    """Token-by-token gated delta rule. q, k [B, T, Nv, Dk]; v [B, T, Nv, Dv]; g, beta [B, T, Nv];
    rec [B, Nv, Dk, Dv] -> (o [B, T, Nv, Dv], state after each position [B, T, Nv, Dk, Dv])."""
    def step(s, xs):
        q_t, k_t, v_t, g_t, b_t = xs
        s = s * jnp.exp(g_t)[..., None, None]
        delta = b_t[..., None] * (v_t - jnp.einsum("bhkv,bhk->bhv", s, k_t))
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, (jnp.einsum("bhkv,bhk->bhv", s, q_t), s)

    time_major = [jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta)]
    _, (o, states) = jax.lax.scan(step, rec, time_major)
    return jnp.moveaxis(o, 0, 1), jnp.moveaxis(states, 0, 1)


def delta_rule_chunked(q, k, v, g, beta, rec, chunk: int):
    """The same rule over chunks of `chunk` tokens (transformers' torch_chunk_gated_delta_rule): within a chunk
    a unit-lower-triangular solve condenses the delta updates into matmuls. Shapes as delta_rule_recurrent;
    returns (o [B, T, Nv, Dv], final state [B, Nv, Dk, Dv])."""
    b, t, nv, dk = k.shape
    pad = -t % chunk
    n = (t + pad) // chunk

    def chunked(a):  # [B, T, Nv, ...] -> [N, B, Nv, chunk, ...], zero-padded (g = beta = 0: state unchanged)
        a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
        return jnp.moveaxis(a.reshape(b, n, chunk, *a.shape[2:]), 1, 0).swapaxes(2, 3)

    q, k, v, g, beta = map(chunked, (q, k, v, g, beta))  # q, k, v [N, B, Nv, L, D]; g, beta [N, B, Nv, L]
    cum = jnp.cumsum(g, axis=-1)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))  # [.., L, L], 0 above diag
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    system = jnp.where(lower & ~jnp.eye(chunk, dtype=bool), (k_beta @ k.swapaxes(-1, -2)) * decay, 0.0)
    solve = lambda rhs: jax.lax.linalg.triangular_solve(  # noqa: E731 - (I + system) x = rhs
        system, rhs, left_side=True, lower=True, unit_diagonal=True)
    new_v = solve(v_beta)
    k_cumdecay = solve(k_beta * jnp.exp(cum)[..., None])
    intra = (q @ k.swapaxes(-1, -2)) * decay
    q_dec = q * jnp.exp(cum)[..., None]
    k_dec = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]

    def step(s, xs):
        new_v_i, k_cumdecay_i, intra_i, q_i, k_i, decay_i = xs
        v_i = new_v_i - k_cumdecay_i @ s
        o = q_i @ s + intra_i @ v_i
        return s * decay_i + k_i.swapaxes(-1, -2) @ v_i, o

    rec, o = jax.lax.scan(step, rec, (new_v, k_cumdecay, intra, q_dec, k_dec, chunk_decay))
    o = jnp.moveaxis(o, 0, 1).swapaxes(2, 3).reshape(b, n * chunk, nv, -1)  # [B, N*L, Nv, Dv]
    return o[:, :t], rec


def prefill(cfg: DeltaConfig, p: dict, h: jax.Array, state: dict, n_valid: jax.Array | None = None,
            chunk: int = 64) -> tuple[jax.Array, dict]:
    """Chunked form over h [B, T, H]: (mixer output [B, T, H], state after the first n_valid[b] tokens of row b,
    all T when n_valid is None). Outputs at padded rows (t >= n_valid[b]) are not meaningful."""
    q, k, v, g, beta, z, window = _project(cfg, p, h, state["conv"])
    t = h.shape[1]
    if n_valid is None:
        n_valid = jnp.full((h.shape[0],), t, jnp.int32)
    valid = jnp.arange(t)[None, :, None] < n_valid[:, None, None]
    g, beta = jnp.where(valid, g, 0.0), jnp.where(valid, beta, 0.0)
    o, rec = delta_rule_chunked(q, k, v, g, beta, state["rec"], chunk)
    km1 = cfg.conv_kernel - 1
    conv = jax.vmap(lambda w, n: jax.lax.dynamic_slice_in_dim(w, n, km1, axis=0))(window, n_valid)
    return _output(cfg, p, o, z), {"conv": conv, "rec": rec}


def verify(cfg: DeltaConfig, p: dict, h: jax.Array, state: dict) -> tuple[jax.Array, dict]:
    """Recurrent form over h [B, T, H]: (mixer output [B, T, H], per-position states {"conv": [B, T, K-1, C],
    "rec": [B, T, Nv, Dk, Dv]}, entry t being the state after token t). commit() picks the one to keep."""
    q, k, v, g, beta, z, window = _project(cfg, p, h, state["conv"])
    t, km1 = h.shape[1], cfg.conv_kernel - 1
    o, recs = delta_rule_recurrent(q, k, v, g, beta, state["rec"])
    convs = jnp.stack([window[:, 1 + j:1 + j + t] for j in range(km1)], axis=2)
    return _output(cfg, p, o, z), {"conv": convs, "rec": recs}


def commit(states: dict, last: jax.Array) -> dict:
    """Rollback after acceptance: from per-position states (leaves [B, T, ...]) keep, for each row b, the state
    after position last[b] (int32 [B], 0 <= last[b] < T; for a verify block [anchor, d_1..d_K] with n accepted
    drafts, last = n). Works on any pytree of such leaves (one layer's state or all layers')."""
    pick = jax.vmap(lambda a, i: jax.lax.dynamic_index_in_dim(a, i, axis=0, keepdims=False))
    return jax.tree.map(lambda a: pick(a, last), states)
