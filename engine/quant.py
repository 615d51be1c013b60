"""8-bit targets: each dense projection as int8 [in, out] with a float32 scale per output column, multiplied with
its input quantized to int8 per row (absmax / 127) in XLA's int8 x int8 -> int32 dot, a quarter of float32's
weight bytes. An int8 target is a target of its own: speculative decoding on it is lossless against its own greedy
output, not float32's."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .config import ModelConfig

QUANTIZED = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # the dense layer matrices ([in, out])


class Int8Weight(NamedTuple):
    """A matrix w [in, out] ~ q * scale (a pytree of two arrays)."""

    q: jax.Array  # [in, out] int8
    scale: jax.Array  # [out] float32


def quantize(w: np.ndarray | jax.Array) -> Int8Weight:
    """Symmetric per-output-column int8 of w [in, out]."""
    w = np.asarray(w, np.float32)
    scale = np.abs(w).max(axis=0) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return Int8Weight(jnp.asarray(np.clip(np.rint(w / scale), -127, 127).astype(np.int8)), jnp.asarray(scale))


def int8_linear(x: jax.Array, w: Int8Weight) -> jax.Array:
    """x [..., in] @ w -> [..., out] float32. One row is run as two (the row twice): XLA:CPU's int8 dot of a
    single row is far slower than of two."""
    lead, n_in = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, n_in).astype(jnp.float32)
    m = rows.shape[0]
    if m == 1:
        rows = jnp.concatenate([rows, rows])
    sx = jnp.max(jnp.abs(rows), axis=-1, keepdims=True) / 127.0
    sx = jnp.where(sx > 0, sx, 1.0)
    xq = jnp.clip(jnp.round(rows / sx), -127, 127).astype(jnp.int8)
    acc = jax.lax.dot_general(xq, w.q, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    return (acc[:m].astype(jnp.float32) * sx[:m] * w.scale).reshape(*lead, -1)


def quantize_params(cfg: ModelConfig, params: dict) -> dict:
    """A float32 dense target's params with every layer matrix and the LM head (lm_head_int8, [H, V]) in int8; the
    embedding (and a tied or untied float LM head) stay for lookups and for drafters that share the head."""
    arch = getattr(cfg, "arch", "qwen3_5")
    if arch not in ("llama", "qwen3") or any(cfg.is_moe(i) for i in range(cfg.num_layers)):
        raise ValueError(f"int8 weights cover dense llama and qwen3 targets; this one is {arch}: load it as "
                         "float32 or bfloat16")
    layers = [{k: quantize(v) if k in QUANTIZED else v for k, v in lp.items()} for lp in params["layers"]]
    head = params["lm_head"] if "lm_head" in params else params["embed"].T
    return {**params, "layers": layers, "lm_head_int8": quantize(head)}
