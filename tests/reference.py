"""Parity helpers for the model-family tests: transformers' logits, hidden states and greedy tokens for a tiny HF
model, and ours from a prefill then one token at a time. Importing it skips the importing test module without torch."""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
import numpy as np
import pytest

from engine.cache import init_cache
from engine.decode import generate
from engine.model import forward
from engine.target import load_target
from engine.weights import load_weights

torch = pytest.importorskip("torch")


def hf_logits(model, tokens: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """transformers' logits [T, V] and hidden_states (each [T, H]) for tokens [T]."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens[None].astype(np.int64)), output_hidden_states=True)
    return out.logits[0].numpy(), [h[0].numpy() for h in out.hidden_states]


def ours_split(path, tokens: np.ndarray, split: int, capture=(), cfg_change: dict | None = None):
    """Our logits [T, V] (and features [F, T, H]) from a prefill of tokens[:split] then one token at a time."""
    cfg, params, _ = load_weights(path, "float32")
    cfg = replace(cfg, **(cfg_change or {}))
    cache = init_cache(cfg, 1, 64)
    logits, feats = [], []
    for lo, hi in [(0, split)] + [(t, t + 1) for t in range(split, len(tokens))]:
        out, f, cache = forward(params, cache, jnp.asarray(tokens[None, lo:hi]), jnp.asarray([lo], jnp.int32),
                                cfg=cfg, capture=capture)
        logits.append(np.asarray(out[0]))
        feats.append(None if f is None else np.asarray(f[:, 0]))
    return np.concatenate(logits), (np.concatenate(feats, axis=1) if capture else None)


def assert_parity(model, path, tokens: np.ndarray, split: int, capture: tuple[int, ...], tol: float,
                  hidden: list[np.ndarray] | None = None) -> None:
    """Our logits within tol of transformers' for tokens (prefill of tokens[:split], then one at a time), and our
    features for capture equal to hidden_states (feature id L = hidden_states[L + 1], the last after the final norm;
    hidden: another module's hidden states where the model's own are not the decoder's)."""
    ref, own_hidden = hf_logits(model, tokens)
    ours, feats = ours_split(path, tokens, split, capture=capture)
    assert np.abs(ref).max() > 1.0  # logits that can tell a wrong layer from a right one
    assert np.abs(ours - ref).max() < tol
    hidden = own_hidden if hidden is None else hidden
    for row, layer in enumerate(capture):
        np.testing.assert_allclose(feats[row], hidden[layer + 1], atol=1e-4)


def assert_greedy_matches(model, path, tokenizer, prompt: str, n: int) -> None:
    """Our greedy continuation of a raw prompt equals transformers' generate(do_sample=False), n tokens."""
    target = load_target(path, tokenizer=tokenizer)
    ids = target.encode(prompt, raw=True)
    with torch.no_grad():
        ref = model.generate(torch.tensor(ids[None].astype(np.int64)), max_new_tokens=n, do_sample=False,
                             pad_token_id=0)[0, len(ids):].tolist()
    assert generate(target, prompt, max_new_tokens=n, raw=True).token_ids == ref


def randomise(model, seed: int):
    """Random weights everywhere, including A_log, dt_bias and every norm (HF's init leaves those trivial)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 16, generator=g).log())
            elif name.endswith("dt_bias") or "norm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    return model.eval()


def hf_qwen3_5(kind: str, text: dict, moe_text: dict, vision: dict, seed: int = 0):
    """A randomised transformers Qwen3.5 model: kind text, multimodal, moe or moe-multimodal."""
    transformers = pytest.importorskip("transformers")
    if kind == "text":
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**text))
    elif kind == "multimodal":
        model = transformers.Qwen3_5ForConditionalGeneration(
            transformers.Qwen3_5Config(text_config=text, vision_config=vision))
    elif kind == "moe":
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**moe_text))
    else:
        model = transformers.Qwen3_5MoeForConditionalGeneration(
            transformers.Qwen3_5MoeConfig(text_config=moe_text, vision_config=vision))
    return randomise(model, seed)
