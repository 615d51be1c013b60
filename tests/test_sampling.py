"""Sampling is lossless end to end: through generate_batch, over several verify steps, the first three sampled tokens
follow the target's exact joint distribution, for every drafter (ar, ngram, random-weight DFlash and EAGLE-3 drafts
that the target accepts and rejects often), for a DFlash configured as the shipped default (lookup hints, hint_bias,
oov_hints, a restricted draft vocabulary and a Domino head) and on a hybrid Qwen3.5 target (gated-delta layers whose
recurrent state rolls back), with ragged prompts in one batch. Chi-square at ALPHA per case."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine import verify
from engine.cache import init_cache
from engine.config import ModelConfig
from engine.decode import generate, generate_batch
from engine.drafters import domino
from engine.drafters.ar import ArDrafter
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.dflash_checkpoint import init_dflash
from engine.drafters.eagle3 import Eagle3Drafter
from engine.drafters.eagle3_checkpoint import init_eagle3
from engine.drafters.ngram import NgramDrafter
from engine.model import forward
from engine.target import Target, load_target
from engine.weights import build_params, hf_shapes
from tests.test_verify import chi2_critical, chi_square

VOCAB, N_NEW, TEMPERATURE = 12, 3, 1.0
COPIES, SEEDS = 512, 8  # 2048 samples per prompt and drafter (the prompts alternate rows)
PROMPTS = ["\x01\x05\x07\x03", "\x02\x09"]  # ragged: 4 and 2 tokens


class ByteTokenizer:
    """Token id = character code (all < VOCAB); enough of a tokenizer for raw prompts."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def __len__(self) -> int:
        return VOCAB

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def tiny_target(dtype: str = "float32") -> Target:
    """A random 4-layer Llama with a 12-token vocabulary whose next-token distributions are far from uniform."""
    cfg = ModelConfig(arch="llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=8, rms_eps=1e-5, rope_theta=10000.0, max_position=512,
                      tie_embeddings=True)
    rng, shapes = np.random.default_rng(3), hf_shapes(cfg)

    def get(name: str) -> np.ndarray:
        scale = 0.0 if name.endswith("norm.weight") else 0.3
        return (scale * rng.normal(size=shapes[name]) + (name.endswith("norm.weight"))).astype(np.float32)

    return Target(cfg, build_params(cfg, get, dtype), ByteTokenizer(), Path("tiny"), dtype, (), "tiny")


TARGET = tiny_target()


def as_shipped(target: Target, layers: tuple[int, ...], mask: int) -> DFlashDrafter:
    """A random DFlash configured as the shipped default: lookup hints (3-grams), hint_bias 0.5, oov_hints over a
    restricted 8-token draft vocabulary, and a Domino head, all confident enough to be often wrong."""
    cfg, params = init_dflash(target, num_layers=1, block_size=4, target_layer_ids=layers, mask_token_id=mask, seed=4)
    cfg = replace(cfg, lookup_hints=3, hint_bias=0.5, oov_hints=True, domino=domino.Domino(1, 8, 12))
    draft_ids = np.array([0, 1, 2, 3, 5, 7, 8, 10])
    params = {**params, "domino": domino.init(np.random.default_rng(5), cfg.domino, target.cfg.hidden_size,
                                              len(draft_ids), "float32")}
    params = jax.tree.map(lambda a: a * 40.0 if a.ndim == 2 else a, params)
    return DFlashDrafter(target, cfg, params, k=3, d2t=draft_ids - np.arange(len(draft_ids)))


def drafters() -> dict:
    dcfg, dparams = init_dflash(TARGET, num_layers=1, block_size=4, target_layer_ids=(1, 2), mask_token_id=0, seed=1)
    dparams = jax.tree.map(lambda a: a * 40.0 if a.ndim == 2 else a, dparams)  # confident, often wrong drafts
    ecfg, eparams, d2t = init_eagle3(TARGET, seed=2, feature_layers=(0, 1, 2))
    eparams = jax.tree.map(lambda a: a * 40.0 if a.ndim == 2 else a, eparams)
    return {"ar": ArDrafter(), "ngram": NgramDrafter(k=3), "dflash": DFlashDrafter(TARGET, dcfg, dparams, k=3),
            "eagle3": Eagle3Drafter(TARGET, ecfg, eparams, d2t, k=3),
            "dflash-as-shipped": as_shipped(TARGET, (1, 2), 0)}


def hybrid_target(tmp_path: Path) -> Target:
    """A tiny random Qwen3.5 (linear gated-delta and full-attention layers) over the same 12-token vocabulary."""
    from tests.test_qwen3_5_target import hf_model

    hf_model("text", seed=5, vocab_size=VOCAB).save_pretrained(tmp_path)
    return load_target(tmp_path, tokenizer=ByteTokenizer())


def exact_joint(prompt: str, target: Target = TARGET) -> np.ndarray:
    """P(t1, t2, t3 | prompt) at TEMPERATURE from full target forwards over every continuation: [V, V, V]."""
    ids = [ord(c) for c in prompt]
    seqs = np.array([ids + list(c) for c in itertools.product(range(VOCAB), repeat=N_NEW - 1)], np.int32)
    logits, _, _ = forward(target.params, init_cache(target.cfg, len(seqs), 256), jnp.asarray(seqs),
                           jnp.zeros(len(seqs), jnp.int32), cfg=target.cfg)
    probs = np.asarray(jax.vmap(verify.target_probs, in_axes=(0, None, None))(logits, TEMPERATURE, 1.0))
    n = len(ids)
    p1 = probs[0, n - 1]  # [V]
    p2 = probs[:, n].reshape(VOCAB, -1, VOCAB)[:, 0]  # P(t2 | t1): rows t1 (t2 of the seq is free at that row)
    p3 = probs[:, n + 1].reshape(VOCAB, VOCAB, VOCAB)  # P(t3 | t1, t2)
    joint = p1[:, None, None] * p2[:, :, None] * p3
    return joint / joint.sum()


def sampled_counts(drafter, target: Target = TARGET) -> tuple[np.ndarray, int]:
    """Counts [prompt, V**N_NEW] of the first N_NEW tokens over COPIES x SEEDS samples (both prompts ride in the same
    ragged batches, COPIES / 2 rows each), and the drafts accepted on the way."""
    counts, accepted = np.zeros((len(PROMPTS), VOCAB ** N_NEW), np.int64), 0
    batch = [PROMPTS[i % 2] for i in range(COPIES)]
    for seed in range(SEEDS):
        for i, r in enumerate(generate_batch(target, batch, drafter, max_new_tokens=N_NEW, temperature=TEMPERATURE,
                                             seed=seed, raw=True)):
            accepted += r.stats["accepted"]
            counts[i % 2, np.ravel_multi_index(r.token_ids[:N_NEW], (VOCAB,) * N_NEW)] += 1
    return counts, accepted


def check_distribution(name: str, drafter, target: Target = TARGET) -> None:
    counts, accepted = sampled_counts(drafter, target)
    for index, prompt in enumerate(PROMPTS):
        stat, df = chi_square(counts[index], exact_joint(prompt, target).ravel())
        assert stat < chi2_critical(df), f"{name}, prompt {index}: chi2 {stat:.1f} > {chi2_critical(df):.1f} (df {df})"
    assert name == "ar" or accepted >= 200, accepted  # drafts were accepted (and rejected) along the way


@pytest.mark.parametrize("name", ["ar", "ngram", "dflash", "eagle3", "dflash-as-shipped"])
def test_first_three_sampled_tokens_follow_the_exact_target_distribution(name):
    check_distribution(name, drafters()[name])


def test_sampling_on_a_hybrid_target_with_the_shipped_dflash_configuration_is_lossless(tmp_path):
    pytest.importorskip("transformers")
    target = hybrid_target(tmp_path)
    check_distribution("hybrid + dflash-as-shipped", as_shipped(target, (0, 1, 3), 0), target)


def test_a_bfloat16_target_through_generate_is_lossless_and_says_its_dtype():
    target = tiny_target("bfloat16")
    assert target.params["embed"].dtype == jnp.bfloat16
    for prompt in PROMPTS:
        want = generate(target, prompt, drafter=ArDrafter(), max_new_tokens=16, raw=True)
        got = generate(target, prompt, drafter=NgramDrafter(k=3), max_new_tokens=16, raw=True)
        assert got.token_ids == want.token_ids and got.settings["dtype"] == "bfloat16"
