"""Hybrid Qwen3.5 / Qwen3.6 targets: config, the gated full-attention mixer, the shared expert, one layer's weights.

A layer is `linear_attention` (Gated DeltaNet, engine/gated_delta.py) or `full_attention` (below), then a dense
SwiGLU or a routed MoE plus a sigmoid-gated shared expert. Layer params (matrices [in, out]):
    every layer: attn_norm, mlp_norm [H]
    full_attention: wq, w_attn_gate [H, Nh*D], wk, wv [H, Nkv*D], wo [Nh*D, H], q_norm, k_norm [D]
    linear_attention: the gated_delta keys (w_qkv, w_z, w_b, w_a, conv, dt_bias, A_log, out_norm, w_out)
    dense FFN: w_gate, w_up [H, I], w_down [I, H]
    MoE FFN: router [H, E], we_gate, we_up [E, H, Im], we_down [E, Im, H] (engine.ops.moe's layout),
             shared_w_gate, shared_w_up [H, Is], shared_w_down [Is, H], shared_expert_gate [H, 1]
Qwen3.5's RMSNorms are zero-centred (x * (1 + w)): attn_norm, mlp_norm, q_norm and k_norm are stored as 1 + w,
so engine.ops.rms_norm applies them unchanged (the model's final norm needs the same; the gated DeltaNet
norm out_norm is a plain weight). Norms, conv, dt_bias, A_log and the router stay float32; other matrices and the
experts take the load dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from . import gated_delta as gd
from .config import CheckpointError
from .gated_delta import DeltaConfig
from .ops import attention, dense_ffn, linear, moe, rms_norm, rope, write
from .sharding import STATE_AXES, heads_divide, zeros

log = logging.getLogger(__name__)

LAYER_KINDS = ("linear_attention", "full_attention")
TEXT_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}  # wrapper -> its text_config type
WRAPPER_KEYS = {"architectures", "model_type", "text_config", "vision_config", "image_token_id", "video_token_id",
                "vision_start_token_id", "vision_end_token_id", "tie_word_embeddings", "transformers_version",
                "dtype", "torch_dtype", "language_model_only"}
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
USED_KEYS = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "rope_theta",
             "partial_rotary_factor", "max_position_embeddings", "tie_word_embeddings", "layer_types",
             "full_attention_interval", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
             "linear_num_key_heads", "linear_num_value_heads", *MOE_KEYS}
# keys whose value must be the one this implementation computes
FIXED_KEYS = {"hidden_act": "silu", "attention_bias": False, "attn_output_gate": True, "output_gate_type": "swish",
              "mamba_ssm_dtype": "float32", "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "rope_scaling": None}
# keys with no effect on inference outputs (metadata, training-only, the unused multi-token-prediction head)
INERT_KEYS = {"model_type", "architectures", "dtype", "torch_dtype", "transformers_version", "initializer_range",
              "use_cache", "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id",
              "router_aux_loss_coef", "output_router_logits", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"}
# rope_parameters: mrope's sections only split the rotary dims between (t, h, w) positions, equal for text
ROPE_KEYS = {"rope_type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"}


@dataclass(frozen=True)
class HybridConfig:
    """Static shape and numerics of a Qwen3.5 / Qwen3.6 text decoder (dense or MoE)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    rotary_dim: int  # leading head dims rotated (head_dim * partial_rotary_factor); the rest pass through
    max_position: int
    tie_embeddings: bool
    layer_types: tuple[str, ...]
    delta: DeltaConfig
    intermediate_size: int = 0  # dense FFN width; 0 for MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    multimodal: bool = False  # parsed from a *ForConditionalGeneration config (a vision tower beside the decoder)

    # what the shared decoder pieces (engine.model's route, moe, dense_ffn) and drafter bodies read of a config
    router = "softmax_topk"
    router_bias = expert_bias = False
    norm_topk_prob = True  # Qwen3.5-MoE always renormalises the top-k routing weights
    swiglu_limit = None
    rope_scaling = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def arch(self) -> str:
        return "qwen3_5_moe" if self.is_moe else "qwen3_5"

    def window(self, layer: int) -> int:
        """No sliding layers: every attention layer sees the whole cache."""
        return 0

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies of the rotated part [rotary_dim // 2]."""
        d = self.rotary_dim
        return (1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))).astype(np.float32)


def _agree(name: str, *values):
    """The one value given for a setting found in two places (None when absent from both)."""
    given = [v for v in values if v is not None]
    if any(v != given[0] for v in given):
        raise CheckpointError(f"config gives conflicting values for {name}: {given}")
    return given[0] if given else None


def _text_config(hf: dict) -> tuple[dict, bool]:
    """The decoder's config dict and whether it came from a multimodal wrapper."""
    model_type = hf.get("model_type")
    if model_type in TEXT_TYPES:
        unknown = sorted(set(hf) - WRAPPER_KEYS)
        if unknown:
            raise CheckpointError(f"{model_type} config.json has keys draftscope does not understand: {unknown}")
        text = hf.get("text_config")
        if not isinstance(text, dict):
            raise CheckpointError(f"{model_type} config.json needs a text_config object")
        if text.get("model_type", TEXT_TYPES[model_type]) != TEXT_TYPES[model_type]:
            raise CheckpointError(f"{model_type} text_config must have model_type {TEXT_TYPES[model_type]!r}, "
                                  f"got {text.get('model_type')!r}")
        _agree("tie_word_embeddings", hf.get("tie_word_embeddings"), text.get("tie_word_embeddings"))
        return text, True
    if model_type in TEXT_TYPES.values():
        return hf, False
    raise CheckpointError(f"not a Qwen3.5 hybrid config: model_type {model_type!r} (expected one of "
                          f"{sorted(TEXT_TYPES) + sorted(TEXT_TYPES.values())})")


def _layer_types(text: dict, n: int) -> tuple[str, ...]:
    interval = text.get("full_attention_interval")
    if interval is not None and (not isinstance(interval, int) or interval < 1):
        raise CheckpointError(f"full_attention_interval must be a positive integer, got {interval!r}")
    derived = tuple("full_attention" if (i + 1) % (interval or 4) == 0 else "linear_attention" for i in range(n))
    given = text.get("layer_types")
    if given is None:
        return derived
    given = tuple(given)
    if len(given) != n or not set(given) <= set(LAYER_KINDS):
        raise CheckpointError(f"layer_types must list {n} entries from {LAYER_KINDS}, got {list(given)}")
    if interval is not None and given != derived:
        raise CheckpointError(f"layer_types {list(given)} disagree with full_attention_interval {interval}")
    return given


def hybrid_config_from_hf(hf: dict) -> HybridConfig:
    """HybridConfig from a config.json dict: Qwen3_5(Moe)ForConditionalGeneration (decoder under text_config)
    or the text-only qwen3_5_text / qwen3_5_moe_text layout. Any key not understood is a CheckpointError."""
    text, multimodal = _text_config(hf)
    unknown = sorted(set(text) - USED_KEYS - set(FIXED_KEYS) - INERT_KEYS)
    if unknown:
        raise CheckpointError(f"Qwen3.5 text config has keys draftscope does not understand: {unknown}")
    for key, want in FIXED_KEYS.items():
        if key in text and text[key] != want:
            raise CheckpointError(f"Qwen3.5 config {key}={text[key]!r} is not supported (only {want!r})")
    rope = text.get("rope_parameters") or {}
    if set(rope) - ROPE_KEYS:
        raise CheckpointError(f"rope_parameters has keys draftscope does not understand: "
                              f"{sorted(set(rope) - ROPE_KEYS)}")
    if rope.get("rope_type", "default") != "default":
        raise CheckpointError(f"unsupported rope_type {rope['rope_type']!r} (only 'default')")
    moe = any(k in text for k in MOE_KEYS) or text.get("model_type") == "qwen3_5_moe_text"
    try:
        heads, n = text["num_attention_heads"], text["num_hidden_layers"]
        head_dim, eps = text["head_dim"], float(text.get("rms_norm_eps", 1e-6))
        factor = _agree("partial_rotary_factor", rope.get("partial_rotary_factor"), text.get("partial_rotary_factor"))
        rotary = int(head_dim * (0.25 if factor is None else factor))
        delta = DeltaConfig(hidden_size=text["hidden_size"], num_k_heads=text["linear_num_key_heads"],
                            num_v_heads=text["linear_num_value_heads"], head_k_dim=text["linear_key_head_dim"],
                            head_v_dim=text["linear_value_head_dim"], conv_kernel=text["linear_conv_kernel_dim"],
                            rms_eps=eps)
        ffn = {k: text[k] for k in MOE_KEYS} if moe else {"intermediate_size": text["intermediate_size"]}
        cfg = HybridConfig(
            vocab_size=text["vocab_size"], hidden_size=text["hidden_size"], num_layers=n, num_heads=heads,
            num_kv_heads=text["num_key_value_heads"], head_dim=head_dim, rms_eps=eps,
            rope_theta=float(_agree("rope_theta", rope.get("rope_theta"), text.get("rope_theta")) or 10000.0),
            rotary_dim=rotary, max_position=text.get("max_position_embeddings", 32768),
            tie_embeddings=bool(text.get("tie_word_embeddings", False)), layer_types=_layer_types(text, n),
            delta=delta, multimodal=multimodal, **ffn)
    except KeyError as e:
        raise CheckpointError(f"Qwen3.5 text config lacks required field {e.args[0]!r}") from None
    if delta.num_v_heads % delta.num_k_heads or heads % cfg.num_kv_heads:
        raise CheckpointError("linear_num_value_heads must be a multiple of linear_num_key_heads and "
                              "num_attention_heads a multiple of num_key_value_heads")
    if rotary % 2 or not 0 < rotary <= head_dim:
        raise CheckpointError(f"partial_rotary_factor gives {rotary} rotary dims of head_dim {head_dim}: need an even "
                              "count in (0, head_dim]")
    return cfg


def partial_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate-half RoPE on the first 2 * len(inv_freq) dims of x [B, T, N, D]; the rest pass through."""
    rd = 2 * inv_freq.shape[0]
    return jnp.concatenate([rope(x[..., :rd], positions, inv_freq), x[..., rd:]], axis=-1)


def gated_attention(cfg: HybridConfig, lp: dict, h: jax.Array, positions: jax.Array, k_cache: jax.Array,
                    v_cache: jax.Array, start: jax.Array, mask: jax.Array):
    """Full-attention mixer of a normed hidden h [B, T, H] at positions [B, T]: q/k norm, partial RoPE, this
    layer's K/V written into its cache [B, Nkv, S, D] at start [B], attention under mask [B, T, S], output gated
    by sigmoid(gate) per head, then o_proj. Returns (mixer output [B, T, H], k_cache, v_cache)."""
    b, t, _ = h.shape
    inv_freq = jnp.asarray(cfg.inv_freq())
    q = rms_norm(linear(h, lp["wq"]).reshape(b, t, cfg.num_heads, cfg.head_dim), lp["q_norm"], cfg.rms_eps)
    k = rms_norm(linear(h, lp["wk"]).reshape(b, t, cfg.num_kv_heads, cfg.head_dim), lp["k_norm"], cfg.rms_eps)
    v = linear(h, lp["wv"]).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    q, k = partial_rope(q, positions, inv_freq), partial_rope(k, positions, inv_freq)
    k_cache = write(k_cache, k.transpose(0, 2, 1, 3), start)
    v_cache = write(v_cache, v.transpose(0, 2, 1, 3), start)
    out = attention(q, k_cache, v_cache, mask) * jax.nn.sigmoid(linear(h, lp["w_attn_gate"]))
    return linear(out, lp["wo"]), k_cache, v_cache


def with_shared_expert(lp: dict, h: jax.Array, routed: jax.Array) -> jax.Array:
    """MoE FFN output: the routed experts' output [..., H] plus the shared SwiGLU expert of the normed h [..., H],
    scaled by sigmoid(shared_expert_gate(h))."""
    shared = linear(jax.nn.silu(linear(h, lp["shared_w_gate"])) * linear(h, lp["shared_w_up"]), lp["shared_w_down"])
    return routed + jax.nn.sigmoid(linear(h, lp["shared_expert_gate"])) * shared


def text_prefix(names: Collection[str]) -> str:
    """Where the decoder's tensors live: 'model.language_model.' (ConditionalGeneration) or 'model.'."""
    return "model.language_model." if any(n.startswith("model.language_model.") for n in names) else "model."


def layer_shapes(cfg: HybridConfig, i: int) -> dict[str, tuple[int, ...]]:
    """HF tensor suffix (inside `<prefix>layers.{i}.`) -> shape ([out, in] for matrices) of layer i."""
    h, dc = cfg.hidden_size, cfg.delta
    shapes = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    if cfg.layer_types[i] == "linear_attention":
        a = "linear_attn."
        shapes |= {a + "in_proj_qkv.weight": (dc.conv_dim, h), a + "in_proj_z.weight": (dc.value_dim, h),
                   a + "in_proj_b.weight": (dc.num_v_heads, h), a + "in_proj_a.weight": (dc.num_v_heads, h),
                   a + "conv1d.weight": (dc.conv_dim, 1, dc.conv_kernel), a + "dt_bias": (dc.num_v_heads,),
                   a + "A_log": (dc.num_v_heads,), a + "norm.weight": (dc.head_v_dim,),
                   a + "out_proj.weight": (h, dc.value_dim)}
    else:
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        a = "self_attn."
        shapes |= {a + "q_proj.weight": (2 * q, h), a + "k_proj.weight": (kv, h), a + "v_proj.weight": (kv, h),
                   a + "o_proj.weight": (h, q), a + "q_norm.weight": (cfg.head_dim,),
                   a + "k_norm.weight": (cfg.head_dim,)}
    if not cfg.is_moe:
        inter = cfg.intermediate_size
        return shapes | {"mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
                         "mlp.down_proj.weight": (h, inter)}
    im, ish = cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    shapes |= {"mlp.gate.weight": (cfg.num_experts, h), "mlp.shared_expert_gate.weight": (1, h),
               "mlp.shared_expert.gate_proj.weight": (ish, h), "mlp.shared_expert.up_proj.weight": (ish, h),
               "mlp.shared_expert.down_proj.weight": (h, ish)}
    for e in range(cfg.num_experts):
        shapes |= {f"mlp.experts.{e}.gate_proj.weight": (im, h), f"mlp.experts.{e}.up_proj.weight": (im, h),
                   f"mlp.experts.{e}.down_proj.weight": (h, im)}
    return shapes


# our name -> (HF suffix, kind): "mat" transposed to [in, out] in the load dtype ("mat32": in float32), "vec"
# float32 as stored, "norm" a zero-centred norm stored as 1 + w
_LINEAR = {"w_qkv": ("in_proj_qkv.weight", "mat"), "w_z": ("in_proj_z.weight", "mat"),
           "w_b": ("in_proj_b.weight", "mat"), "w_a": ("in_proj_a.weight", "mat"),
           "w_out": ("out_proj.weight", "mat"), "dt_bias": ("dt_bias", "vec"), "A_log": ("A_log", "vec"),
           "out_norm": ("norm.weight", "vec")}
_ATTN = {"wk": ("k_proj.weight", "mat"), "wv": ("v_proj.weight", "mat"), "wo": ("o_proj.weight", "mat"),
         "q_norm": ("q_norm.weight", "norm"), "k_norm": ("k_norm.weight", "norm")}
_DENSE = {"w_gate": ("mlp.gate_proj.weight", "mat"), "w_up": ("mlp.up_proj.weight", "mat"),
          "w_down": ("mlp.down_proj.weight", "mat")}
_SHARED = {"router": ("mlp.gate.weight", "mat32"), "shared_expert_gate": ("mlp.shared_expert_gate.weight", "mat"),
           "shared_w_gate": ("mlp.shared_expert.gate_proj.weight", "mat"),
           "shared_w_up": ("mlp.shared_expert.up_proj.weight", "mat"),
           "shared_w_down": ("mlp.shared_expert.down_proj.weight", "mat")}


def load_layer(cfg: HybridConfig, i: int, get: Callable[[str], np.ndarray], names: Collection[str],
               dtype=jnp.float32) -> dict:
    """Layer i's params from a checkpoint's tensor names and a getter (HF [out, in] layout), under either prefix.

    Every tensor under the layer's prefix must be one this layout reads, with its expected shape."""
    names = set(names)
    base = f"{text_prefix(names)}layers.{i}."
    shapes = layer_shapes(cfg, i)
    unknown = sorted(n for n in names if n.startswith(base) and n[len(base):] not in shapes)
    if unknown:
        raise CheckpointError(f"layer {i} ({cfg.layer_types[i]}) has tensors draftscope does not read: {unknown}")

    def take(suffix: str) -> np.ndarray:
        if base + suffix not in names:
            raise CheckpointError(f"tensor {base + suffix!r} missing from the checkpoint")
        a = np.asarray(get(base + suffix), np.float32)
        if a.shape != shapes[suffix]:
            raise CheckpointError(f"tensor {base + suffix!r} has shape {a.shape}, expected {shapes[suffix]}")
        return a

    def convert(a: np.ndarray, kind: str) -> jax.Array:
        return {"mat": lambda: jnp.asarray(a.T, dtype), "mat32": lambda: jnp.asarray(a.T, jnp.float32),
                "vec": lambda: jnp.asarray(a, jnp.float32),
                "norm": lambda: jnp.asarray(a + 1.0, jnp.float32)}[kind]()

    def table(entries: dict, prefix: str = "") -> dict:
        return {name: convert(take(prefix + suffix), kind) for name, (suffix, kind) in entries.items()}

    lp = table({"attn_norm": ("input_layernorm.weight", "norm"),
                "mlp_norm": ("post_attention_layernorm.weight", "norm")})
    if cfg.layer_types[i] == "linear_attention":
        lp |= table(_LINEAR, "linear_attn.")
        lp["conv"] = jnp.asarray(take("linear_attn.conv1d.weight")[:, 0, :].T, jnp.float32)
    else:
        lp |= table(_ATTN, "self_attn.")
        # q_proj rows are per head [query (D) | gate (D)]
        wq = take("self_attn.q_proj.weight").reshape(cfg.num_heads, 2, cfg.head_dim, cfg.hidden_size)
        lp["wq"] = convert(wq[:, 0].reshape(-1, cfg.hidden_size), "mat")
        lp["w_attn_gate"] = convert(wq[:, 1].reshape(-1, cfg.hidden_size), "mat")
    if not cfg.is_moe:
        return lp | table(_DENSE)
    lp |= table(_SHARED)
    experts = [{w: take(f"mlp.experts.{e}.{w}_proj.weight").T for w in ("gate", "up", "down")}
               for e in range(cfg.num_experts)]
    return lp | {f"we_{w}": jnp.asarray(np.stack([ex[w] for ex in experts]), dtype)
                 for w in ("gate", "up", "down")}


PREFILL_CHUNK = 64  # the chunked delta rule's chunk (shorter inputs run as one chunk)
CACHE_KINDS = ("k", "v", "conv", "rec")  # a hybrid cache's per-layer lists (None where a layer has no such entry)


def hybrid_layer(cfg: HybridConfig, i: int, lp: dict, x: jax.Array, positions: jax.Array, entry: dict,
                 start: jax.Array, mask: jax.Array | None, n_valid: jax.Array | None, per_position: bool):
    """Decoder layer i over x [B, T, H]: its mixer (gated DeltaNet or gated attention), then the FFN. `entry` is the
    layer's cache entry (CACHE_KINDS -> array or None); returns (x, the updated entry). A linear layer runs the
    chunked form (state after the first n_valid[b] tokens, all when None) or, with per_position, the recurrent
    form whose conv/rec entries hold the state after each position ([B, T, ...], for gated_delta.commit)."""
    h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
    entry = dict(entry)
    if cfg.layer_types[i] == "linear_attention":
        state = {"conv": entry["conv"], "rec": entry["rec"]}
        if per_position:
            y, state = gd.verify(cfg.delta, lp, h, state)
        else:
            y, state = gd.prefill(cfg.delta, lp, h, state, n_valid, chunk=min(PREFILL_CHUNK, h.shape[1]))
        entry |= state
    else:
        y, entry["k"], entry["v"] = gated_attention(cfg, lp, h, positions, entry["k"], entry["v"], start, mask)
    x = x + y
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
    return x + (with_shared_expert(lp, h, moe(cfg, lp, h)) if cfg.is_moe else dense_ffn(cfg, lp, h)), entry


def init_hybrid_cache(cfg: HybridConfig, batch: int, max_len: int, dtype=jnp.float32,
                      mesh: Mesh | None = None) -> dict[str, list]:
    """Zeroed per-layer entries: K/V [B, Nkv, S, D] for attention layers, the (conv, rec) float32 state for
    gated DeltaNet layers; None in the lists of the other kind. On a mesh the batch goes over "data", K/V heads
    (when both head counts divide) and the recurrent state's value heads (when they divide) over "model"."""
    split = mesh is not None and heads_divide(mesh, cfg.num_heads, cfg.num_kv_heads)
    kv_shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    cache = {kind: [None] * cfg.num_layers for kind in CACHE_KINDS}
    for i, kind in enumerate(cfg.layer_types):
        if kind == "linear_attention":
            for name, shape in gd.state_shapes(cfg.delta, batch).items():
                cache[name][i] = zeros(shape, jnp.float32, mesh, logical=STATE_AXES[name])
        else:
            cache["k"][i], cache["v"][i] = (zeros(kv_shape, dtype, mesh, split) for _ in "kv")
    return cache


def commit_states(cache: dict, last: jax.Array) -> dict:
    """After a per-position (verify) forward: each sequence keeps its recurrent and conv state after block
    position last[b]; K/V entries pass through (their rollback is the sequence's length)."""
    if "rec" not in cache:
        return cache
    return cache | gd.commit({"conv": cache["conv"], "rec": cache["rec"]}, last)


# tensors of a published checkpoint beside the decoder, not loaded: prefix -> what they are
SKIPPED = {"model.visual.": "vision tower", "mtp.": "multi-token-prediction head"}


def load_params(cfg: HybridConfig, get: Callable[[str], np.ndarray], names: Collection[str], dtype=jnp.float32
                ) -> tuple[dict, list[str]]:
    """The params pytree (engine.model.forward's layout, hybrid layers as load_layer) from either layout, and the
    checkpoint's tensors deliberately not loaded (SKIPPED), which are logged."""
    names = set(names)
    prefix, h, v = text_prefix(names), cfg.hidden_size, cfg.vocab_size

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in names:
            raise CheckpointError(f"tensor {name!r} missing from the checkpoint")
        a = np.asarray(get(name), np.float32)
        if a.shape != shape:
            raise CheckpointError(f"tensor {name!r} has shape {a.shape}, expected {shape}")
        return a

    params = {"embed": jnp.asarray(take(prefix + "embed_tokens.weight", (v, h)), dtype),
              "layers": [load_layer(cfg, i, get, names, dtype) for i in range(cfg.num_layers)],
              "norm": jnp.asarray(take(prefix + "norm.weight", (h,)) + 1.0, jnp.float32)}  # zero-centred
    if not cfg.tie_embeddings:
        params["lm_head"] = jnp.asarray(take("lm_head.weight", (v, h)).T, dtype)
    skipped = sorted(n for n in names if n.startswith(tuple(SKIPPED)))
    for start, what in SKIPPED.items():
        count = sum(n.startswith(start) for n in skipped)
        if count:
            log.info("%s not loaded (%d tensors under %s)", what, count, start)
    return params, skipped
