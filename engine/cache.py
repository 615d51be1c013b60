"""KV cache pytree: head-major [layers, batch, kv_heads, seq, head_dim]; rollback is a length, never a copy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .config import ModelConfig


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> dict[str, jax.Array]:
    """Zeroed K and V buffers. Positions >= a sequence's length hold garbage that is never read."""
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def write_layer(buf: jax.Array, layer: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """Write new [B, Nkv, T, D] rows into buf [L, B, Nkv, S, D] at `layer`, per-sequence offsets start [B]."""
    new = new.astype(buf.dtype)
    if new.shape[0] == 1:  # one plain in-place update; XLA:CPU turns the vmapped form into a slower scatter
        return jax.lax.dynamic_update_slice(buf, new[None], (layer, 0, 0, start[0], 0))

    def one(b_buf, b_new, b_start):  # b_buf [L, Nkv, S, D], b_new [Nkv, T, D]
        return jax.lax.dynamic_update_slice(b_buf, b_new[None], (layer, 0, b_start, 0))
    return jax.vmap(one, in_axes=(1, 0, 0), out_axes=1)(buf, new, start)
