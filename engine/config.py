"""Static model configuration: one frozen, hashable dataclass for the Llama and Qwen3 families."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint path or file that cannot be loaded; the message says why."""


@dataclass(frozen=True)
class ModelConfig:
    """Decoder shape and numerics. Passed to jitted functions as a static argument."""

    arch: str  # "llama" or "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_position: int
    qk_norm: bool = False
    tie_embeddings: bool = False
    # Llama-3 RoPE scaling as a sorted tuple of (key, value) pairs, or () for none.
    rope_scaling: tuple[tuple[str, Any], ...] = ()

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies [head_dim // 2], with Llama-3 scaling applied when configured."""
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        scaling = dict(self.rope_scaling)
        if scaling.get("rope_type") == "llama3":
            factor = scaling["factor"]
            low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
            old_ctx = scaling["original_max_position_embeddings"]
            wavelen = 2 * np.pi / inv
            low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
            smooth = (old_ctx / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * inv / factor + smooth * inv
            inv = np.where(wavelen > low_wavelen, inv / factor, inv)
            mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            inv = np.where(mid, smoothed, inv)
        elif scaling and scaling.get("rope_type") not in (None, "default"):
            raise CheckpointError(f"unsupported rope scaling {scaling.get('rope_type')!r}")
        return inv.astype(np.float32)


def _rope(hf: dict) -> tuple[float, tuple]:
    """rope_theta and scaling from a transformers 4 or 5 style config.json."""
    params = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type") not in (None, "default") else None)
    items = ()
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        keep = ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        norm = dict(scaling, rope_type=scaling.get("rope_type", scaling.get("type")))
        items = tuple(sorted((k, norm[k]) for k in keep if k in norm))
    return float(theta), items


def config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json dict (LlamaForCausalLM or Qwen3ForCausalLM)."""
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type", "")
    if model_type == "qwen3" or any(a.startswith("Qwen3") for a in archs):
        arch = "qwen3"
    elif model_type in ("llama", "smollm2", "smollm") or any(a.startswith("Llama") for a in archs):
        arch = "llama"
    else:
        raise CheckpointError(f"unsupported model_type {model_type!r} (architectures {archs}); "
                              "draftscope targets Llama-family and Qwen3 models")
    try:
        heads = hf["num_attention_heads"]
        theta, scaling = _rope(hf)
        return ModelConfig(
            arch=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position=hf.get("max_position_embeddings", 4096),
            qk_norm=arch == "qwen3",
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
        )
    except KeyError as e:
        raise CheckpointError(f"config.json lacks required field {e.args[0]!r}") from None


def read_json(path: Path) -> dict:
    """A JSON file as a dict, with a clear error for a missing or malformed file."""
    if not path.is_file():
        raise CheckpointError(f"missing {path.name} in {path.parent}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data
