"""Peers: transformers' PyTorch model of the same checkpoint, as contenders for the interleaved loop.

- hf-generate: `model.generate` greedy (compared with our `ar`);
- hf-prompt-lookup: assisted generation with `prompt_lookup_num_tokens=K` (compared with our `ngram` at K;
  transformers matches n-grams of up to 2 tokens, ours up to 3).
Both get exactly our chat-formatted prompt ids, our max_new_tokens and our stop ids. A streamer stamps the
time of every batch of new tokens: decode time runs from the first generated token(s), which prefill
produces, to the end, and covers the tokens after them, so ms/token compares with our decode_s / n_generated.
torch is a dev/bench dependency only: it is imported here, lazily.

Threads: on a busy shared CPU, torch's default (one OpenMP thread per core) can be ~10x slower than one thread
(measured 476 vs 43 ms/token on 2 loaded cores), so the thread count is an explicit, reported setting.

write_hf_dir writes a dense Llama / Qwen3 target as a Hugging Face directory from our own params (transformers'
save_pretrained refuses a GGUF-loaded model): what llama.cpp's converter needs as --target-model-dir.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from engine import Target
from engine.weights import layer_keys

from .contenders import Outcome

TORCH_HINT = "pip install torch==2.13.0 accelerate (CPU wheel; transformers' GGUF loader needs accelerate)"


class PeerError(RuntimeError):
    """A peer that cannot run here (torch missing, model not loadable by transformers)."""


def import_torch():
    """The torch module, or PeerError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise PeerError(f"the transformers peers need PyTorch, which is not installed: {TORCH_HINT}") from None
    return torch


def load_hf_model(target: Target, dtype: str = "float32"):
    """transformers' model for the target's checkpoint (a HF directory or a GGUF file, dequantized)."""
    torch = import_torch()
    from transformers import AutoModelForCausalLM

    path = Path(target.path)
    kw = {"dtype": {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]}
    try:
        if path.suffix == ".gguf":
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kw)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kw)
    except (ImportError, OSError, ValueError) as e:
        raise PeerError(f"transformers cannot load {path}: {e}") from None
    return model.eval()


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (tied tensors counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


class TimingStreamer:
    """A generate() streamer that records when each batch of tokens arrives (the first batch is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())
        self.counts.append(int(value.numel()))

    def end(self) -> None:
        pass


class HFContender:
    """transformers' generate on our prompt ids; `peer_of` names our drafter it is compared with."""

    def __init__(self, model, target: Target, name: str, k: int, peer_of: str, max_new_tokens: int,
                 temperature: float = 0.0, seed: int = 0, threads: int | None = None, template: dict | None = None,
                 **generate_kw) -> None:
        self.model, self.target, self.name, self.k, self.peer_of = model, target, name, k, peer_of
        self.seed, self.threads, self.template = seed, threads, template
        sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0} if temperature > 0 else {}
        self.kw = {"max_new_tokens": max_new_tokens, "eos_token_id": list(target.eos_ids),
                   "pad_token_id": target.eos_ids[0], **({"do_sample": False} | sampling), **generate_kw}

    def warm_up(self, row: dict) -> None:
        self.run(row)

    def run(self, row: dict) -> Outcome:
        torch = import_torch()
        ids = torch.from_numpy(self.target.encode(row["prompt"], template=self.template).astype(np.int64))[None]
        streamer = TimingStreamer()
        torch.manual_seed(self.seed)
        if self.threads:
            torch.set_num_threads(self.threads)  # process-wide: every peer sets its own before it runs
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), streamer=streamer, **self.kw)
        t1 = time.perf_counter()
        tokens = out[0, ids.shape[1]:].tolist()
        first = 1 if len(streamer.times) > 1 else 0  # batch 0 is the prompt
        decode_tokens = len(tokens) - (streamer.counts[first] if first else 0)
        return Outcome(tokens, t1 - streamer.times[first], decode_tokens, t1 - t0)


def peer_contenders(target: Target, ks: list[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
                    dtype: str = "float32", model=None, threads: int | None = None,
                    template: dict | None = None) -> list[HFContender]:
    """hf-generate (K 0) and hf-prompt-lookup at each K, sharing one transformers model (`threads`: torch threads;
    `template`: chat-template switches, as our runs get them)."""
    model = model if model is not None else load_hf_model(target, dtype)
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, threads=threads, template=template)
    peers = [HFContender(model, target, "hf-generate", 0, "ar", **kw)]
    peers += [HFContender(model, target, "hf-prompt-lookup", k, "ngram", prompt_lookup_num_tokens=k, **kw)
              for k in ks]
    return peers


def hf_config(target: Target) -> dict:
    """config.json (transformers' LlamaForCausalLM / Qwen3ForCausalLM) of a dense full-attention target."""
    cfg = target.cfg
    if cfg.arch not in ("llama", "qwen3") or cfg.num_experts or cfg.layer_types or cfg.attention_sinks:
        raise PeerError(f"write_hf_dir writes dense full-attention Llama / Qwen3 targets, not {cfg.arch} "
                        f"(experts {cfg.num_experts}, layer kinds {sorted(set(cfg.layer_types)) or 'full'})")
    tok = target.tokenizer
    rope = {"rope_type": "default", **dict(cfg.rope_scaling), "rope_theta": cfg.rope_theta}
    eos = list(target.eos_ids)
    return {
        "architectures": ["LlamaForCausalLM" if cfg.arch == "llama" else "Qwen3ForCausalLM"],
        "model_type": cfg.arch, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta, "rope_parameters": rope,
        "max_position_embeddings": cfg.max_position, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.attention_bias, "mlp_bias": False, "hidden_act": "silu",
        "bos_token_id": getattr(tok, "bos_token_id", None), "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "torch_dtype": "float32",
    }


def hf_tensors(target: Target) -> dict[str, np.ndarray]:
    """The target's params as HF-named float32 tensors ([out, in] matrices), the inverse of build_params."""
    cfg, params = target.cfg, target.params
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["norm"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = np.asarray(params["lm_head"]).T
    for i, layer in enumerate(params["layers"]):
        keys = layer_keys(cfg, i)
        unknown = sorted(set(layer) - set(keys))
        if unknown:
            raise PeerError(f"write_hf_dir does not know the params {unknown} of layer {i}")
        for ours, (suffix, transpose) in keys.items():
            w = np.asarray(layer[ours], np.float32)
            out[f"model.layers.{i}.{suffix}"] = w.T if transpose else w
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


def write_hf_dir(target: Target, out: str | Path) -> Path:
    """Write the target as a Hugging Face directory: config.json, generation_config.json, the tokenizer
    (save_pretrained) and model.safetensors (float32, HF tensor names) from our loaded params."""
    from safetensors.numpy import save_file

    config, tensors = hf_config(target), hf_tensors(target)  # both refuse what they cannot write, before any file
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=1))
    target.tokenizer.save_pretrained(str(out))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
