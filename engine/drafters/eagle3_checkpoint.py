"""EAGLE-3 checkpoints: model.safetensors read into the params pytree and its d2t, saved in the published format,
and initialised from a target (with a draft vocabulary of its most frequent tokens) for training."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from ..target import Target
from .base import DrafterError
from .eagle3_config import Eagle3Config, check_fit, config_json, default_feature_layers
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
from .vocab import most_frequent

_PREFIX = ["midlayer."]  # the EAGLE / SpecForge name of the one layer; speculators call it layers.0.


_IGNORED_TENSORS = {"t2d": "the inverse of d2t", "verifier_norm.weight": "a frozen copy of the target's final norm",
                    "verifier_lm_head.weight": "a frozen copy of the target's LM head"}


def load_params(path: Path, cfg: Eagle3Config, dtype: str) -> tuple[dict, np.ndarray]:
    """(params, d2t) from path/model.safetensors (EAGLE-3 or speculators names, optional `model.` prefix), shapes
    checked; tensors neither read nor listed in _IGNORED_TENSORS are refused."""
    tensors = read_tensors(path)
    h, vd = cfg.body.hidden_size, cfg.draft_vocab_size
    prefix = _PREFIX if any(name.startswith(_PREFIX[0]) for name in tensors) else ["layers.0."]
    fc = tensors.get("fc.weight")
    if fc is None or fc.ndim != 2 or fc.shape[0] != h:
        raise DrafterError(f"EAGLE-3 fc.weight in {path} must be [{h}, F*H_target], got "
                           f"{None if fc is None else list(fc.shape)}")
    shapes = layer_shapes(cfg.body, 2 * h)
    layer = load_layers(tensors, prefix, shapes, dtype, path)[0]
    layer["hidden_norm"] = vector(expect_tensor(tensors, f"{prefix[0]}hidden_norm.weight", (h,), path))
    params = {"fc": matrix(fc, dtype), "norm": vector(expect_tensor(tensors, "norm.weight", (h,), path)),
              "lm_head": matrix(expect_tensor(tensors, "lm_head.weight", (vd, h), path), dtype), "layer": layer}
    if "embed_tokens.weight" in tensors:
        params["embed"] = jnp.asarray(np.asarray(tensors["embed_tokens.weight"], np.float32),
                                      dtype=params["fc"].dtype)
    if "t2d" in tensors:
        expect_tensor(tensors, "t2d", (cfg.body.vocab_size,), path)
    d2t = np.asarray(tensors["d2t"], np.int64) if "d2t" in tensors else np.zeros(vd, np.int64)
    if "d2t" not in tensors and vd != cfg.body.vocab_size:
        raise DrafterError(f"EAGLE-3 checkpoint in {path} has a draft vocab of {vd} but no d2t map")
    read = {"fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", *_IGNORED_TENSORS,
            f"{prefix[0]}hidden_norm.weight", *(f"{prefix[0]}{TENSOR_KEYS[n][0]}" for n in shapes)}
    unread = sorted(set(tensors) - read)
    if unread:
        raise DrafterError(f"EAGLE-3 checkpoint in {path} has tensors this loader does not read: {', '.join(unread)}")
    return params, d2t


def save_eagle3(path: str | Path, cfg: Eagle3Config, params: dict, d2t: np.ndarray, dtype: str = "float32") -> Path:
    """Write an EAGLE-3 checkpoint (config.json + model.safetensors, float32 or bfloat16; d2t int64)."""
    layer = {k: v for k, v in params["layer"].items() if k != "hidden_norm"}
    tensors = {"fc.weight": np.asarray(params["fc"], np.float32).T,
               "norm.weight": np.asarray(params["norm"], np.float32),
               "lm_head.weight": np.asarray(params["lm_head"], np.float32).T,
               "midlayer.hidden_norm.weight": np.asarray(params["layer"]["hidden_norm"], np.float32),
               "d2t": np.asarray(d2t, np.int64),
               **layer_tensors([layer], _PREFIX)}
    if "embed" in params:
        tensors["embed_tokens.weight"] = np.asarray(params["embed"], np.float32)
    return save_checkpoint(path, config_json(cfg), tensors, dtype)


def init_eagle3(target: Target, draft_vocab_size: int | None = None, token_counts: np.ndarray | None = None,
                seed: int = 0, intermediate_size: int | None = None,
                feature_layers: tuple[int, ...] | None = None) -> tuple[Eagle3Config, dict, np.ndarray]:
    """A randomly initialised EAGLE-3 drafter for `target`: (cfg, params, d2t).

    draft_vocab_size defaults to the whole target vocab; token_counts [V] picks the draft vocab (see
    vocab.most_frequent). The midlayer copies the target's width, heads and RoPE; the embedding is shared.
    """
    t = target.cfg
    vd = t.vocab_size if draft_vocab_size is None else int(draft_vocab_size)
    if not 1 <= vd <= t.vocab_size:
        raise DrafterError(f"draft_vocab_size must be in 1..{t.vocab_size}, got {vd}")
    layers = tuple(feature_layers) if feature_layers is not None else default_feature_layers(t.num_layers)
    body = decoder_shape(t, "llama", num_layers=1, intermediate_size=intermediate_size or t.intermediate_size)
    cfg = Eagle3Config(body, vd, layers)
    h, rng = t.hidden_size, np.random.default_rng(seed)
    layer = random_layers(rng, layer_shapes(body, 2 * h), 1, target.dtype)[0]
    layer["hidden_norm"] = jnp.ones(h, jnp.float32)
    params = {"fc": random_matrix(rng, (len(layers) * h, h), target.dtype), "norm": jnp.ones(h, jnp.float32),
              "lm_head": random_matrix(rng, (h, vd), target.dtype), "layer": layer}
    vocab = most_frequent(token_counts, vd, t.vocab_size)
    check_fit(cfg, params, vocab, t)
    return cfg, params, vocab.d2t()
