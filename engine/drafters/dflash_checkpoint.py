"""DFlash checkpoints: model.safetensors read into the params pytree (and its d2t), saved in the published format,
and initialised from a target for training."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from ..target import Target
from ..weights import DTYPES
from . import domino as domino_head
from .base import DrafterError
from .dflash_config import FALLBACK_MASK_TOKEN, DFlashConfig, check_fit, config_json, default_target_layer_ids
from .layers import (
    TENSOR_KEYS,
    decoder_shape,
    expect_tensor,
    layer_shapes,
    layer_tensors,
    load_layers,
    matrix,
    random_layers,
    random_matrix,
    read_tensors,
    save_checkpoint,
    vector,
)


def _tensor_names(cfg: DFlashConfig) -> list[str]:
    return [f"layers.{i}." for i in range(cfg.body.num_layers)]


def load_params(path: Path, cfg: DFlashConfig, dtype: str, tied: bool = False) -> tuple[dict, np.ndarray | None]:
    """(params, d2t or None) from path/model.safetensors (z-lab names, optional `model.` prefix), shapes checked.

    Optional tensors: q/k/v/o biases (cfg.attention_bias), the drafter's own embed_tokens / lm_head (tied: the
    LM head is the embedding), d2t with its inverse t2d (a restricted draft vocabulary), the Domino head's
    (cfg.domino, params["domino"]). Others are refused."""
    tensors = read_tensors(path)
    h, v = cfg.body.hidden_size, cfg.body.vocab_size
    fc = tensors.get("fc.weight")
    if fc is None or fc.ndim != 2 or fc.shape[0] != h:
        raise DrafterError(f"DFlash fc.weight in {path} must be [{h}, F*H_target], got "
                           f"{None if fc is None else list(fc.shape)}")
    shapes = layer_shapes(cfg.body, h, bias=cfg.attention_bias)
    params = {"fc": matrix(fc, dtype), "hidden_norm": vector(expect_tensor(tensors, "hidden_norm.weight", (h,), path)),
              "norm": vector(expect_tensor(tensors, "norm.weight", (h,), path)),
              "layers": load_layers(tensors, _tensor_names(cfg), shapes, dtype, path)}
    d2t = np.asarray(tensors["d2t"], np.int64) if "d2t" in tensors else None
    vd = v if d2t is None else len(d2t)
    if "t2d" in tensors:  # the inverse map of d2t, implied by it
        expect_tensor(tensors, "t2d", (v,), path)
    if "embed_tokens.weight" in tensors:
        params["embed"] = jnp.asarray(np.asarray(expect_tensor(tensors, "embed_tokens.weight", (v, h), path),
                                                 np.float32), dtype=DTYPES[dtype])
    if "lm_head.weight" in tensors:
        if tied:
            raise DrafterError(f"DFlash checkpoint in {path} has lm_head.weight but tie_word_embeddings is true")
        params["lm_head"] = matrix(expect_tensor(tensors, "lm_head.weight", (vd, h), path), dtype)
    elif tied and "embed" in params:
        params["lm_head"] = params["embed"].T
    read = {"fc.weight", "hidden_norm.weight", "norm.weight", "d2t", "t2d", "embed_tokens.weight", "lm_head.weight"}
    read |= {f"{p}{TENSOR_KEYS[n][0]}" for p in _tensor_names(cfg) for n in shapes}
    if cfg.domino is not None:
        params["domino"], names = domino_head.load(tensors, cfg.domino, h, vd, dtype, path)
        read |= names
    unread = sorted(set(tensors) - read)
    if unread:
        raise DrafterError(f"DFlash checkpoint in {path} has tensors this loader does not read: {', '.join(unread)}")
    return params, d2t


def save_dflash(path: str | Path, cfg: DFlashConfig, params: dict, dtype: str = "float32",
                d2t: np.ndarray | None = None) -> Path:
    """Write a z-lab DFlash checkpoint (config.json + model.safetensors, float32 or bfloat16); with d2t [Vd]
    (int64, target id = draft id + d2t[draft id]) the drafter drafts over that restricted vocabulary."""
    tensors = {"fc.weight": np.asarray(params["fc"], np.float32).T,
               "hidden_norm.weight": np.asarray(params["hidden_norm"], np.float32),
               "norm.weight": np.asarray(params["norm"], np.float32),
               **layer_tensors(params["layers"], _tensor_names(cfg))}
    if "embed" in params:
        tensors["embed_tokens.weight"] = np.asarray(params["embed"], np.float32)
    if "lm_head" in params:
        tensors["lm_head.weight"] = np.asarray(params["lm_head"], np.float32).T
    if cfg.domino is not None:
        tensors |= domino_head.tensors_of(params["domino"])
    config = config_json(cfg)
    if d2t is not None:
        tensors["d2t"] = np.asarray(d2t, np.int64)
        config["draft_vocab_size"] = len(d2t)
    return save_checkpoint(path, config, tensors, dtype)


def default_mask_token_id(target: Target) -> int:
    """First embedding row the tokenizer does not use (as Qwen3 drafters do), else `<empty_output>`."""
    n_tokens = len(target.tokenizer)
    if target.cfg.vocab_size > n_tokens:
        return n_tokens
    found = target.tokenizer.convert_tokens_to_ids(FALLBACK_MASK_TOKEN)
    if found is None or found == target.tokenizer.unk_token_id:
        raise DrafterError(f"target has no spare embedding row and no {FALLBACK_MASK_TOKEN} token: "
                           "pass mask_token_id")
    return int(found)


def init_dflash(target: Target, num_layers: int, block_size: int, target_layer_ids: tuple[int, ...] | None = None,
                mask_token_id: int | None = None, seed: int = 0, intermediate_size: int | None = None,
                windows: tuple[int | None, ...] = (), causal: tuple[bool, ...] = (),
                attention_bias: bool = False) -> tuple[DFlashConfig, dict]:
    """A randomly initialised DFlash drafter for `target` (matrices N(0, 0.02), norms ones, biases zeros).

    The body copies the target's width, heads and RoPE; target_layer_ids default to the reference
    formula with one feature per drafter layer; mask_token_id to default_mask_token_id(target). windows,
    causal and attention_bias give the layers of newer drafters (see DFlashConfig).
    """
    if block_size < 2:
        raise DrafterError(f"DFlash block_size must be >= 2, got {block_size}")
    t = target.cfg
    ids = tuple(target_layer_ids) if target_layer_ids is not None else default_target_layer_ids(t.num_layers,
                                                                                               num_layers)
    mask_id = default_mask_token_id(target) if mask_token_id is None else int(mask_token_id)
    body = decoder_shape(t, "qwen3", num_layers=num_layers, intermediate_size=intermediate_size or t.intermediate_size)
    for name, per_layer in (("windows", windows), ("causal", causal)):
        if per_layer and len(per_layer) != num_layers:
            raise DrafterError(f"DFlash {name} needs one entry per drafter layer ({num_layers}), got {per_layer}")
    cfg = DFlashConfig(body, block_size, mask_id, ids, t.num_layers,
                       tuple(windows) if any(w is not None for w in windows) else (),
                       tuple(bool(c) for c in causal) if any(causal) else (), attention_bias)
    rng = np.random.default_rng(seed)
    params = {"fc": random_matrix(rng, (len(ids) * t.hidden_size, t.hidden_size), target.dtype),
              "hidden_norm": jnp.ones(t.hidden_size, jnp.float32), "norm": jnp.ones(t.hidden_size, jnp.float32),
              "layers": random_layers(rng, layer_shapes(body, t.hidden_size, attention_bias), num_layers, target.dtype)}
    check_fit(cfg, params["fc"].shape[0], t)
    return cfg, params


def append_layers(cfg: DFlashConfig, params: dict, n: int, seed: int = 0) -> tuple[DFlashConfig, dict]:
    """A deeper drafter that drafts exactly what `params` drafts: n more layers after the last one, random but with
    zero output projections (wo, w_down), so each starts as the identity on the residual stream and training grows
    it from there. New layers copy the last layer's window and causality."""
    if n < 1:
        raise DrafterError(f"append_layers needs n >= 1, got {n}")
    width = params["layers"][0]["wq"].shape[0]
    new = random_layers(np.random.default_rng([seed, 11]), layer_shapes(cfg.body, width, cfg.attention_bias), n,
                        "float32")
    new = [{**lp, "wo": jnp.zeros_like(lp["wo"]), "w_down": jnp.zeros_like(lp["w_down"])} for lp in new]
    depth = cfg.body.num_layers + n
    cfg = replace(cfg, body=replace(cfg.body, num_layers=depth),
                  windows=cfg.windows + (cfg.windows[-1],) * n if cfg.windows else (),
                  causal=cfg.causal + (cfg.causal[-1],) * n if cfg.causal else ())
    return cfg, {**params, "layers": list(params["layers"]) + new}
