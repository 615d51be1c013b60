"""Helpers the model drafters (DFlash, EAGLE-3) share: target head sharing, decoder body configs,
checkpoint tensors in Hugging Face layout <-> per-layer [in, out] params, random init, features.

Per-layer params use engine/weights.py's names and layout (matrices [in, out], norms float32):
    attn_norm [H], wq [W, Nh*D], wk/wv [W, Nkv*D], wo [Nh*D, H], mlp_norm [H],
    w_gate/w_up [H, I], w_down [I, H], (qk_norm) q_norm/k_norm [D], (attention bias) bq/bk/bv/bo float32
with W the attention input width (H for DFlash, 2H for EAGLE-3's midlayer).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..config import CheckpointError, ModelConfig, config_from_hf, read_json
from ..ops import linear, lm_head
from ..sharding import heads_divide, place_params, zeros
from ..weights import DTYPES, LAYER_KEYS
from .base import DrafterError

INIT_STD = 0.02  # Hugging Face initializer_range
# attention biases: our name -> (HF suffix inside the layer prefix, transposed), next to engine/weights.py's LAYER_KEYS
BIAS_KEYS = {"bq": ("self_attn.q_proj.bias", False), "bk": ("self_attn.k_proj.bias", False),
             "bv": ("self_attn.v_proj.bias", False), "bo": ("self_attn.o_proj.bias", False)}
TENSOR_KEYS = {**LAYER_KEYS, **BIAS_KEYS}  # every per-layer param of the drafters


def shared_head(target_params: dict) -> dict:
    """The target's frozen embedding [V, H] and LM head [H, V] (absent when tied) that drafters reuse."""
    return {k: target_params[k] for k in ("embed", "lm_head") if k in target_params}


def on_mesh(params: dict, mesh, body: ModelConfig) -> dict:
    """Drafter weights placed on the target's mesh (returned unchanged without one)."""
    return params if mesh is None else place_params(params, mesh, body.num_heads, body.num_kv_heads)


def cache_zeros(body: ModelConfig, batch: int, max_len: int, dtype, mesh) -> jax.Array:
    """One zeroed [B, Nkv, max_len, D] drafter cache buffer, on the target's mesh when it has one (batch over
    "data", KV heads over "model", as the target's cache)."""
    split = mesh is not None and heads_divide(mesh, body.num_heads, body.num_kv_heads)
    return zeros((batch, body.num_kv_heads, max_len, body.head_dim), dtype, mesh, split)


def check_extend(lengths: np.ndarray, n_new: np.ndarray, rows: int, room: int) -> None:
    """extend() input: n_new [B] of `rows` new feature rows per sequence, all rows fitting a cache of `room`."""
    if n_new.shape != lengths.shape or n_new.min() < 0 or n_new.max() > rows or lengths.max() + rows > room:
        raise DrafterError(f"extend: {n_new.tolist()} of {rows} rows at context lengths {lengths.tolist()} do not "
                           f"fit the draft cache of {room} rows")


def anchors_of(tokens: list[list[int]], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's anchor (its last token) and the anchor's position, each [B] int32; DrafterError unless
    every draft context covers every committed token before its anchor."""
    positions = np.array([len(t) - 1 for t in tokens], np.int32)
    if not np.array_equal(positions, lengths):
        raise DrafterError(f"the draft contexts hold {lengths.tolist()} rows but the anchors sit at positions "
                           f"{positions.tolist()}: extend() must cover every committed token before the anchor")
    return np.array([t[-1] for t in tokens], np.int32), positions


def greedy_pick(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Greedy drafts from logits [..., V]: (argmax [...] int32, its softmax probability [...])."""
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    top = jnp.take_along_axis(logits, best[..., None], axis=-1)
    return best, 1.0 / jnp.sum(jnp.exp(logits - top), axis=-1)


def head_logits(head: dict, h: jax.Array) -> jax.Array:
    """Final-normed hidden [..., H] -> target-vocab logits [..., V] through the shared target head."""
    return lm_head(head, h)


def concat_features(features: jax.Array) -> jax.Array:
    """Target features [F, B, T, H] (capture order) -> [B, T, F*H], each row concatenated in that order."""
    f, b, t, h = features.shape
    return jnp.moveaxis(features, 0, 2).reshape(b, t, f * h)


def body_config(hf: dict, arch: str, what: str, attention_bias: bool = False) -> ModelConfig:
    """A drafter's decoder shape from its config.json; `arch` "qwen3" (q/k norms) or "llama" (none).
    MLP biases and activations other than SiLU are refused, attention biases unless `attention_bias` (the
    caller loads them). The body is never tied: drafters decide their head themselves."""
    for field in ("rope_scaling", "rope_parameters"):
        if hf.get(field) is not None and not isinstance(hf[field], dict):
            raise DrafterError(f"{what} config.json {field} must be an object, got {json.dumps(hf[field])}")
    fields = ("mlp_bias",) if attention_bias else ("attention_bias", "mlp_bias")
    for field in fields:
        if hf.get(field):
            raise DrafterError(f"{what} config.json has {field}: {json.dumps(hf[field])}; only bias-free "
                               "layers are supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise DrafterError(f"{what} config.json has hidden_act: {json.dumps(hf['hidden_act'])}; only \"silu\" "
                           "is supported")
    try:
        body = decoder_shape(config_from_hf({**hf, "model_type": arch, "architectures": []}), arch)
        body.inv_freq()  # an unsupported RoPE type fails here, at load
    except CheckpointError as e:
        raise DrafterError(f"{what} config: {e}") from None
    return body


def decoder_shape(cfg: ModelConfig, arch: str, **changes) -> ModelConfig:
    """A drafter body: only the dense decoder shape and RoPE of `cfg` (never tied; no sliding layers, biases,
    sinks or experts, which each drafter's own config holds), as `arch` ("qwen3": q/k norms), with `changes`."""
    body = ModelConfig(arch, cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
                       cfg.num_kv_heads, cfg.head_dim, cfg.rms_eps, cfg.rope_theta, cfg.max_position,
                       qk_norm=arch == "qwen3", rope_scaling=cfg.rope_scaling)
    return replace(body, **changes)


def check_keys(hf: dict, known: Iterable[str], what: str, where: str = "config.json") -> None:
    """Refuse keys of `hf` outside `known` (what a loader reads or knowingly ignores), naming them."""
    unknown = sorted(set(hf) - set(known))
    if unknown:
        raise DrafterError(f"{what} {where} has keys this loader does not read: {', '.join(unknown)}")


def body_json(body: ModelConfig) -> dict:
    """The Hugging Face config.json fields of a decoder shape (inverse of body_config)."""
    out = {"hidden_size": body.hidden_size, "intermediate_size": body.intermediate_size,
           "num_hidden_layers": body.num_layers, "num_attention_heads": body.num_heads,
           "num_key_value_heads": body.num_kv_heads, "head_dim": body.head_dim, "rms_norm_eps": body.rms_eps,
           "rope_theta": body.rope_theta, "max_position_embeddings": body.max_position,
           "vocab_size": body.vocab_size, "hidden_act": "silu", "attention_bias": False}
    if body.rope_scaling:
        out["rope_scaling"] = dict(body.rope_scaling)
    return out


def layer_shapes(body: ModelConfig, in_width: int, bias: bool = False) -> dict[str, tuple[int, ...]]:
    """Our per-layer param name -> [in, out] shape, for attention input width `in_width` (with q/k/v/o biases)."""
    h, i, d = body.hidden_size, body.intermediate_size, body.head_dim
    shapes = {"attn_norm": (h,), "wq": (in_width, body.num_heads * d), "wk": (in_width, body.num_kv_heads * d),
              "wv": (in_width, body.num_kv_heads * d), "wo": (body.num_heads * d, h), "mlp_norm": (h,),
              "w_gate": (h, i), "w_up": (h, i), "w_down": (i, h)}
    if body.qk_norm:
        shapes |= {"q_norm": (d,), "k_norm": (d,)}
    if bias:
        shapes |= {"bq": (body.num_heads * d,), "bk": (body.num_kv_heads * d,), "bv": (body.num_kv_heads * d,),
                   "bo": (h,)}
    return shapes


def linear_bias(x: jax.Array, lp: dict, w: str, b: str) -> jax.Array:
    """linear(x, lp[w]) plus the bias lp[b] when the layer has one."""
    y = linear(x, lp[w])
    return y + lp[b] if b in lp else y


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of path/model.safetensors, with a leading `model.` prefix removed from names."""
    file = path / "model.safetensors"
    if not file.is_file():
        raise DrafterError(f"no model.safetensors in {path}")
    try:
        with safe_open(str(file), framework="np") as f:
            return {k.removeprefix("model."): f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise DrafterError(f"cannot read {file}: {e}") from None


def read_config(path: Path) -> dict:
    """path/config.json as a dict (DrafterError when missing or malformed)."""
    try:
        return read_json(path / "config.json")
    except CheckpointError as e:
        raise DrafterError(str(e)) from None


def expect_tensor(tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...], path: Path) -> np.ndarray:
    """The HF tensor `name`, checked against its expected [out, in] shape."""
    if name not in tensors:
        raise DrafterError(f"tensor {name!r} missing from {path}/model.safetensors")
    a = tensors[name]
    if tuple(a.shape) != tuple(shape):
        raise DrafterError(f"tensor {name!r} in {path} has shape {list(a.shape)}, the config implies {list(shape)}")
    return a


def matrix(a: np.ndarray, dtype: str) -> jax.Array:
    """HF [out, in] weight -> our [in, out] matrix in `dtype`."""
    return jnp.asarray(np.asarray(a, np.float32).T, dtype=DTYPES[dtype])


def vector(a: np.ndarray) -> jax.Array:
    return jnp.asarray(np.asarray(a, np.float32))


def load_layers(tensors: dict, prefixes: Iterable[str], shapes: dict[str, tuple[int, ...]], dtype: str,
                path: Path) -> list[dict]:
    """One params dict per prefix from HF tensors named `{prefix}{suffix}` (separate arrays per layer run
    much faster on XLA:CPU than stacked ones)."""
    layers = []
    for p in prefixes:
        layer = {}
        for name, shape in shapes.items():
            suffix, transposed = TENSOR_KEYS[name]
            row = expect_tensor(tensors, f"{p}{suffix}", shape[::-1] if transposed else shape, path)
            layer[name] = matrix(row, dtype) if transposed else vector(row)
        layers.append(layer)
    return layers


def layer_tensors(layers: list[dict], prefixes: list[str]) -> dict[str, np.ndarray]:
    """Inverse of load_layers: per-layer params -> HF-named float32 [out, in] tensors."""
    out = {}
    for layer, p in zip(layers, prefixes, strict=True):
        for name, a in layer.items():
            suffix, transposed = TENSOR_KEYS[name]
            a = np.asarray(a, np.float32)
            out[f"{p}{suffix}"] = a.T if transposed else a
    return out


def random_layers(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]], n: int, dtype: str) -> list[dict]:
    """n random layers: matrices N(0, 0.02), norms ones, biases zeros."""
    def one(name: str, shape: tuple[int, ...]) -> jax.Array:
        if len(shape) == 2:
            return random_matrix(rng, shape, dtype)
        return (jnp.zeros if name in BIAS_KEYS else jnp.ones)(shape, jnp.float32)

    return [{name: one(name, shape) for name, shape in shapes.items()} for _ in range(n)]


def from_target_layers(layers: list[dict], target_layers: list[dict]) -> list[dict]:
    """Drafter layers started from the target's last len(layers) layers: each tensor of a shared name is copied,
    its leading slice where the drafter's is narrower (a narrower FFN keeps the first hidden units); tensors the
    target lacks or holds smaller (q/k norms, EAGLE-3's doubled input) keep their own values."""
    if len(layers) > len(target_layers):
        raise ValueError(f"{len(layers)} drafter layers, but the target has {len(target_layers)}")
    out = []
    for lp, tp in zip(layers, target_layers[len(target_layers) - len(layers):], strict=True):
        new = dict(lp)
        for name, w in lp.items():
            src = tp.get(name)
            if src is not None and src.ndim == w.ndim and all(np.less_equal(w.shape, src.shape)):
                new[name] = jnp.asarray(src[tuple(slice(0, n) for n in w.shape)], w.dtype)
        out.append(new)
    return out


def random_matrix(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> jax.Array:
    return jnp.asarray(rng.normal(0.0, INIT_STD, shape).astype(np.float32), dtype=DTYPES[dtype])


def save_checkpoint(path: str | Path, config: dict, tensors: dict[str, np.ndarray], dtype: str) -> Path:
    """Write config.json + model.safetensors; float tensors stored as `dtype` ("float32" or "bfloat16")."""
    if dtype not in DTYPES:
        raise DrafterError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    store = np.dtype(DTYPES[dtype])
    cast = {k: np.ascontiguousarray(v.astype(store) if np.issubdtype(v.dtype, np.floating) else v)
            for k, v in tensors.items()}
    save_file(cast, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}, indent=2) + "\n")
    return path


def check_layer_ids(ids: tuple[int, ...], num_target_layers: int, what: str) -> None:
    """Feature layer ids (OUTPUT convention, -1 = embeddings) must name layers of the target."""
    bad = [i for i in ids if not -1 <= i < num_target_layers]
    if bad:
        raise DrafterError(f"{what} reads target layers {bad}, outside -1..{num_target_layers - 1} of the "
                           f"{num_target_layers}-layer target")


def check_hidden(drafter_hidden: int, target: ModelConfig, what: str) -> None:
    if drafter_hidden != target.hidden_size:
        raise DrafterError(f"{what} hidden_size is {drafter_hidden} but the target's is {target.hidden_size}: "
                           "the drafter shares the target's embedding, so they must match")


def check_fc(fc_in: int, n_features: int, target: ModelConfig, what: str) -> None:
    if fc_in != n_features * target.hidden_size:
        raise DrafterError(f"{what} fc takes {fc_in} inputs but {n_features} target features of width "
                           f"{target.hidden_size} give {n_features * target.hidden_size}")


def checkpoint_dir(path: str | Path | None, default: Path, what: str, options: dict) -> Path:
    """The checkpoint directory to load: `path`, or the shipped `default` (a clear error when absent)."""
    if options:
        raise DrafterError(f"{what} takes no options, got {sorted(options)}")
    if path is None:
        if not (default / "config.json").is_file():
            raise DrafterError(f"no {what} checkpoint shipped yet (expected {default}): train one with "
                               "experiments/training/train.py or pass a checkpoint directory")
        return default
    return Path(path).expanduser()
