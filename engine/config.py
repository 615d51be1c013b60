"""Static model configuration: one frozen, hashable dataclass for every target family the decoder runs.

Families: Llama, Qwen3 (dense), Qwen3-MoE and gpt-oss. A layer is a mixer (attention, full or sliding window,
optional per-head sinks and q/k/v/o biases) and a feed-forward (dense SwiGLU or a routed mixture of experts),
each chosen per layer from the fields below; the defaults are a plain dense Llama layer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint path or file that cannot be loaded; the message says why."""


LAYER_TYPES = ("full_attention", "sliding_attention")
# rope_scaling keys each rope type reads (rope_theta/type are read elsewhere)
_ROPE_KEYS = {
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate", "attention_factor",
             "mscale", "mscale_all_dim"),
}


@dataclass(frozen=True)
class ModelConfig:
    """Decoder shape and numerics. Passed to jitted functions as a static argument."""

    arch: str  # "llama", "qwen3", "qwen3_moe" or "gpt_oss"
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense SwiGLU layers
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_position: int
    qk_norm: bool = False
    tie_embeddings: bool = False
    # RoPE scaling (llama3 or yarn) as a sorted tuple of (key, value) pairs, or () for none.
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    # attention
    attention_bias: bool = False  # q/k/v/o projections carry biases
    attention_sinks: bool = False  # a learned per-head logit joins each softmax denominator (gpt-oss)
    layer_types: tuple[str, ...] = ()  # per layer, one of LAYER_TYPES; () = all full attention
    sliding_window: int = 0  # window of the sliding layers (a key at distance >= window is masked); 0 = none
    # mixture of experts (num_experts 0: every layer dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # softmax_topk: renormalise the top-k probabilities to sum to one
    decoder_sparse_step: int = 1  # layer i is routed when (i + 1) % step == 0 and i not in mlp_only_layers
    mlp_only_layers: tuple[int, ...] = ()
    router: str = "softmax_topk"  # softmax over all experts then top-k (Qwen3-MoE); topk_softmax: gpt-oss
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None  # None: silu(gate) * up; a number: gpt-oss's clamped (up + 1) * glu form
    swiglu_alpha: float = 1.702

    def window(self, layer: int) -> int:
        """Sliding window of a layer (0: full attention)."""
        sliding = bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"
        return self.sliding_window if sliding else 0

    def is_moe(self, layer: int) -> bool:
        """Whether a layer's feed-forward is the routed mixture of experts (else the dense SwiGLU)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def _yarn(self) -> tuple[float, float, float, dict]:
        """YaRN (factor, original context, attention factor, params) as transformers' _compute_yarn_parameters."""
        s = dict(self.rope_scaling)
        old_ctx = s.get("original_max_position_embeddings") or self.max_position
        factor = s.get("factor") or self.max_position / old_ctx

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attn = s.get("attention_factor")
        if attn is None:
            m, m_all = s.get("mscale"), s.get("mscale_all_dim")
            attn = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
        return float(factor), float(old_ctx), float(attn), s

    def attention_factor(self) -> float:
        """The scale RoPE applies to cos and sin (YaRN's attention factor; 1.0 otherwise)."""
        return self._yarn()[2] if dict(self.rope_scaling).get("rope_type") == "yarn" else 1.0

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies [head_dim // 2], with llama3 or YaRN scaling applied when configured."""
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        scaling = dict(self.rope_scaling)
        kind = scaling.get("rope_type")
        if kind == "llama3":
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
        elif kind == "yarn":
            factor, old_ctx, _, s = self._yarn()
            beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
            base = self.rope_theta

            def dim_of(rotations: float) -> float:
                return d * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

            low, high = dim_of(beta_fast), dim_of(beta_slow)
            if s.get("truncate", True):
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001  # as transformers: no singular ramp
            ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
            extrapolate = 1 - ramp
            inv = inv / factor * (1 - extrapolate) + inv * extrapolate
        elif kind not in (None, "default"):
            raise CheckpointError(f"unsupported rope scaling {kind!r}")
        return inv.astype(np.float32)


def _rope(hf: dict) -> tuple[float, tuple]:
    """rope_theta and scaling from a transformers 4 or 5 style config.json; unknown rope types or keys refused."""
    params = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = hf.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        extra = set(scaling) - {"rope_type", "type", "rope_theta"}
        if extra:
            raise CheckpointError(f"rope parameters {sorted(extra)} are not supported with the default rope")
        return float(theta), ()
    if kind not in _ROPE_KEYS:
        raise CheckpointError(f"unsupported rope type {kind!r}: draftscope implements default, llama3 and yarn")
    unknown = set(scaling) - set(_ROPE_KEYS[kind]) - {"rope_type", "type", "rope_theta"}
    if unknown:
        raise CheckpointError(f"{kind} rope parameters {sorted(unknown)} are not supported")
    if kind == "llama3" and hf.get("original_max_position_embeddings"):
        raise CheckpointError("a top-level original_max_position_embeddings is not supported")
    items = {k: scaling[k] for k in _ROPE_KEYS[kind] if k in scaling} | {"rope_type": kind}
    return float(theta), tuple(sorted(items.items()))


def _arch(hf: dict) -> str:
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type", "")
    if model_type == "qwen3_moe" or any(a.startswith("Qwen3Moe") for a in archs):
        return "qwen3_moe"
    if model_type == "gpt_oss" or any(a.startswith("GptOss") for a in archs):
        return "gpt_oss"
    if model_type == "qwen3" or any(a.startswith("Qwen3") for a in archs):
        return "qwen3"
    if model_type in ("llama", "smollm2", "smollm") or any(a.startswith("Llama") for a in archs):
        return "llama"
    raise CheckpointError(f"unsupported model_type {model_type!r} (architectures {archs}); draftscope targets "
                          "Llama-family, Qwen3, Qwen3-MoE and gpt-oss models")


def _layer_types(hf: dict, arch: str, n: int) -> tuple[tuple[str, ...], int]:
    """(per-layer attention kinds, sliding window), as transformers reads them for each family."""
    if arch == "llama":
        return (), 0
    window = hf.get("sliding_window")
    if arch in ("qwen3", "qwen3_moe") and not hf.get("use_sliding_window", False):
        window = None
    types = hf.get("layer_types")
    if arch == "qwen3_moe":  # Qwen3-MoE applies its window (when on) to every layer
        if types is not None:
            raise CheckpointError("qwen3_moe config.json has layer_types, which Qwen3-MoE does not define")
        types = ["sliding_attention" if window else "full_attention"] * n
    elif types is None and arch == "gpt_oss":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    elif types is None:
        start = hf.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= start else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise CheckpointError(f"layer_types must list one of {list(LAYER_TYPES)} per layer ({n}), got {types!r}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise CheckpointError(f"sliding_window must be a positive integer, got {window!r}")
    if "sliding_attention" not in types:
        return (), 0
    return tuple(types), window or 0


def _moe(hf: dict, arch: str, n: int) -> dict:
    """The mixture-of-experts fields of a Qwen3-MoE or gpt-oss config.json."""
    if arch not in ("qwen3_moe", "gpt_oss"):
        return {}
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    top_k = hf.get("num_experts_per_tok", hf.get("experts_per_token"))
    if not isinstance(experts, int) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise CheckpointError(f"need 1 <= num_experts_per_tok <= num_experts, got {top_k!r} of {experts!r}")
    if arch == "qwen3_moe":
        only = hf.get("mlp_only_layers") or []
        step = hf.get("decoder_sparse_step", 1)
        if not isinstance(step, int) or step < 1 or any(not isinstance(i, int) or not 0 <= i < n for i in only):
            raise CheckpointError(f"bad decoder_sparse_step {step!r} or mlp_only_layers {only!r}")
        return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size":
                hf["moe_intermediate_size"], "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
                "decoder_sparse_step": step, "mlp_only_layers": tuple(sorted(only))}
    limit = hf.get("swiglu_limit", 7.0)
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": hf["intermediate_size"],
            "router": "topk_softmax", "router_bias": True, "expert_bias": True,
            "swiglu_limit": float("inf") if limit is None else float(limit),
            "swiglu_alpha": float(hf.get("swiglu_alpha", 1.702))}


def _check_math(hf: dict, arch: str) -> None:
    """Refuse config values that would change the math in ways the decoder does not implement."""
    act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
    if act != "silu":
        raise CheckpointError(f"hidden_act {act!r} is not supported (only silu)")
    if hf.get("mlp_bias"):
        raise CheckpointError("mlp_bias is not supported")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial_rotary_factor is not supported")
    quant = hf.get("quantization_config")
    if quant is not None and not (arch == "gpt_oss" and quant.get("quant_method") == "mxfp4"):
        raise CheckpointError(f"quantization_config {json.dumps(quant)} is not supported (only gpt-oss mxfp4)")
    if arch == "qwen3_moe" and hf.get("shared_expert_intermediate_size"):
        raise CheckpointError("a shared expert (shared_expert_intermediate_size) is not supported")


def config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json dict (Llama, Qwen3, Qwen3-MoE or gpt-oss)."""
    arch = _arch(hf)
    try:
        _check_math(hf, arch)
        heads, n = hf["num_attention_heads"], hf["num_hidden_layers"]
        theta, scaling = _rope(hf)
        types, window = _layer_types(hf, arch, n)
        return ModelConfig(
            arch=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=n,
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position=hf.get("max_position_embeddings", 4096),
            qk_norm=arch in ("qwen3", "qwen3_moe"),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
            attention_bias=bool(hf.get("attention_bias", arch == "gpt_oss")),
            attention_sinks=arch == "gpt_oss",
            layer_types=types,
            sliding_window=window,
            **_moe(hf, arch, n),
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
