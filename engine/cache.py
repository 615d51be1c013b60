"""Target cache pytree: per layer, K/V head-major [batch, kv_heads, seq, head_dim], whose rollback is a length, never
a copy; a hybrid target's gated DeltaNet layers hold a (conv, recurrent) state instead (engine.qwen3_5's
init_hybrid_cache), rolled back by keeping the state saved at the accepted position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from .config import ModelConfig
from .qwen3_5 import init_hybrid_cache
from .sharding import heads_divide, zeros


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32,
               mesh: Mesh | None = None) -> dict[str, list[jax.Array]]:
    """Zeroed K and V buffers, one per layer (on the mesh when given: batch over data, KV heads over model).

    Positions >= a sequence's length hold garbage never read."""
    if "linear_attention" in cfg.layer_types:
        return init_hybrid_cache(cfg, batch, max_len, dtype, mesh)
    shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    split = mesh is not None and heads_divide(mesh, cfg.num_heads, cfg.num_kv_heads)
    return {"k": [zeros(shape, dtype, mesh, split) for _ in range(cfg.num_layers)],
            "v": [zeros(shape, dtype, mesh, split) for _ in range(cfg.num_layers)]}


@jax.jit
def take_rows(tree, rows: jax.Array):
    """Every array of a cache pytree (batch on axis 0; None entries stay None) cut to batch rows `rows` [B']."""
    return jax.tree.map(lambda a: a[rows], tree)
