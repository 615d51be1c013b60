"""Acceptance rules for one drafted block, per sequence (vmap over a batch).

Block row i (0..K) holds the target's distribution for the token after block token i; drafted[i]
is judged against row i. Greedy: the longest prefix where drafted[i] == argmax(row i), then the
bonus argmax(row n_acc). Sampling: speculative rejection sampling (accept drafted[i] with
probability min(1, p/q), else draw from normalize(max(0, p - q))); when every real draft is
accepted the bonus is drawn from p itself. Both keep the target's output distribution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def target_probs(logits: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """Sampling distribution [T, V] from logits: temperature, then nucleus (top-p) truncation."""
    probs = jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)

    def nucleus(p):
        order = jnp.argsort(-p, axis=-1)
        sorted_p = jnp.take_along_axis(p, order, axis=-1)
        keep_sorted = (jnp.cumsum(sorted_p, axis=-1) - sorted_p) < top_p  # always keeps the top token
        keep = jnp.zeros_like(keep_sorted).at[jnp.arange(p.shape[0])[:, None], order].set(keep_sorted)
        p = jnp.where(keep, p, 0.0)
        return p / p.sum(axis=-1, keepdims=True)

    return jax.lax.cond(top_p < 1.0, nucleus, lambda p: p, probs)


def accept_greedy(logits: jax.Array, drafted: jax.Array, n_drafted: jax.Array) -> tuple[jax.Array, jax.Array]:
    """logits [K+1, V], drafted [K] -> (number accepted, bonus token)."""
    k = drafted.shape[0]
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    ok = (drafted == best[:k]) & (jnp.arange(k) < n_drafted)
    n_acc = jnp.cumprod(ok.astype(jnp.int32)).sum()
    return n_acc, best[n_acc]


def accept_sampling(probs: jax.Array, q_probs: jax.Array, drafted: jax.Array, n_drafted: jax.Array,
                    key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """probs [K+1, V] target, q_probs [K, V] proposal, drafted [K] -> (number accepted, bonus token)."""
    k = drafted.shape[0]
    rows = jnp.arange(k)
    p_d, q_d = probs[rows, drafted], q_probs[rows, drafted]
    key_u, key_b = jax.random.split(key)
    u = jax.random.uniform(key_u, (k,))
    ok = (u * q_d < p_d) & (rows < n_drafted)
    n_acc = jnp.cumprod(ok.astype(jnp.int32)).sum()
    p_row = probs[n_acc]
    rejected = n_acc < n_drafted
    residual = jnp.maximum(p_row - jnp.where(rejected, q_probs[jnp.minimum(n_acc, k - 1)], 0.0), 0.0)
    total = residual.sum()
    dist = jnp.where(total > 0, residual / jnp.where(total > 0, total, 1.0), p_row)
    bonus = jax.random.categorical(key_b, jnp.log(dist)).astype(jnp.int32)
    return n_acc, bonus
