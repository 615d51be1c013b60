"""Our JAX decoder against transformers' PyTorch models: tiny random Llama/Qwen3 configs and the embedded GGUF."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine.cache import init_cache  # noqa: E402
from engine.config import CheckpointError  # noqa: E402
from engine.model import forward  # noqa: E402
from engine.weights import load_weights  # noqa: E402

LOGIT_TOL = 2e-4  # max |logit difference| in float32


def _tiny(kind: str, **extra):
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=32, **extra)  # head_dim != hidden/heads
        return transformers.Qwen3ForCausalLM(cfg)
    cfg = transformers.LlamaConfig(**common, **extra)
    return transformers.LlamaForCausalLM(cfg)


def _ours_incremental(path, tokens: np.ndarray, split: int, capture=()):
    """Logits from a prefill of tokens[:split] then a second call with the rest (exercises the cache)."""
    cfg, params, _ = load_weights(path, "float32")
    cache = init_cache(cfg, 1, 64)
    a, fa, cache = forward(params, cache, jnp.asarray(tokens[None, :split]), jnp.asarray([0], jnp.int32), cfg=cfg,
                           capture=capture)
    b, fb, cache = forward(params, cache, jnp.asarray(tokens[None, split:]), jnp.asarray([split], jnp.int32),
                           cfg=cfg, capture=capture)
    feats = np.concatenate([np.asarray(fa), np.asarray(fb)], axis=2) if capture else None
    return np.concatenate([np.asarray(a[0]), np.asarray(b[0])]), feats


@pytest.mark.parametrize("kind,extra", [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}}),
    ("qwen3", {"tie_word_embeddings": True}),
    ("qwen3", {"tie_word_embeddings": False}),
])
def test_tiny_models_match_transformers(tmp_path, kind, extra):
    torch.manual_seed(0)
    model = _tiny(kind, **extra).eval()
    model.save_pretrained(tmp_path)
    tokens = np.random.default_rng(0).integers(0, 97, 20).astype(np.int32)
    with torch.no_grad():
        out = model(torch.tensor(tokens[None].astype(np.int64)), output_hidden_states=True)
    ref = out.logits[0].numpy()
    ours, feats = _ours_incremental(tmp_path, tokens, split=13, capture=(-1, 0, 2))
    assert np.abs(ours - ref).max() < LOGIT_TOL
    # feature id L is the OUTPUT of layer L == HF hidden_states[L + 1]; id -1 is the embedding output
    hs = [h[0].numpy() for h in out.hidden_states]
    np.testing.assert_allclose(feats[0, 0], hs[0], atol=1e-5)
    np.testing.assert_allclose(feats[1, 0], hs[1], atol=1e-4)
    # the last HF hidden state is after the final norm, and so is our feature of the last layer
    np.testing.assert_allclose(feats[2, 0], hs[3], atol=1e-4)


def test_sharded_safetensors_load_as_the_single_file(tmp_path):
    """A checkpoint saved in several shards (model.safetensors.index.json) loads to the same logits."""
    torch.manual_seed(1)
    model = _tiny("qwen3", tie_word_embeddings=False).eval()
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file() and len(shards) > 1, shards
    tokens = np.random.default_rng(1).integers(0, 97, 12).astype(np.int32)
    one, _ = _ours_incremental(tmp_path / "one", tokens, split=7)
    sharded, _ = _ours_incremental(tmp_path / "sharded", tokens, split=7)
    np.testing.assert_array_equal(one, sharded)
    (tmp_path / "sharded" / shards[0]).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_weights(tmp_path / "sharded", "float32")


def test_embedded_gguf_greedy_matches_transformers(target, hf_smollm2):
    """64 greedy tokens of the embedded SmolLM2 GGUF equal transformers' own GGUF-loaded model."""
    from engine import generate

    model = hf_smollm2
    prompt = "Explain in two sentences why the sky is blue."
    ids = target.encode(prompt)
    with torch.no_grad():
        ref = model.generate(torch.tensor(ids[None].astype(np.int64)), max_new_tokens=64, do_sample=False,
                             pad_token_id=target.tokenizer.eos_token_id)
    ref_new = ref[0, len(ids):].tolist()
    ours = generate(target, prompt, max_new_tokens=64)
    assert ours.token_ids == ref_new
    with torch.no_grad():
        ref_logits = model(torch.tensor(ids[None].astype(np.int64))).logits[0, -1].numpy()
    cfg, params = target.cfg, target.params
    cache = init_cache(cfg, 1, 256)
    logits, _, _ = forward(params, cache, jnp.asarray(ids[None]), jnp.asarray([0], jnp.int32), cfg=cfg)
    assert np.abs(np.asarray(logits[0, -1]) - ref_logits).max() < 1e-3
