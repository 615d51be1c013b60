"""Acceptance rules: greedy prefix + bonus, and the sampling path's distribution (chi-square tests)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine.cache import init_cache
from engine.config import ModelConfig
from engine.decode import verify_block
from engine.verify import accept_greedy, accept_sampling, target_probs

ALPHA = 1e-3  # significance level of every chi-square test below
N_SAMPLES = 40_000
Z_ALPHA = 3.0902  # standard normal upper quantile at ALPHA


def chi2_critical(df: int) -> float:
    """Chi-square critical value at ALPHA (Wilson-Hilferty; within 2% of the exact value for df >= 3)."""
    return df * (1 - 2 / (9 * df) + Z_ALPHA * np.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson statistic over cells with expected count >= 5 (the rest pooled), and its degrees of freedom."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float((((obs - exp) ** 2)[keep] / exp[keep]).sum()), int(keep.sum() - 1)


def test_greedy_accepts_longest_matching_prefix_then_bonus():
    logits = jnp.full((5, 10), -5.0).at[jnp.arange(5), jnp.array([3, 4, 5, 6, 7])].set(5.0)
    cases = [([3, 4, 5, 6], 4, (4, 7)), ([3, 4, 9, 6], 4, (2, 5)), ([1, 4, 5, 6], 4, (0, 3)),
             ([3, 4, 5, 6], 2, (2, 5)), ([3, 4, 5, 6], 0, (0, 3))]
    for drafted, n, (n_acc, bonus) in cases:
        got = accept_greedy(logits, jnp.array(drafted), jnp.array(n))
        assert (int(got[0]), int(got[1])) == (n_acc, bonus), (drafted, n)


def test_top_p_keeps_the_smallest_nucleus():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    p = np.asarray(target_probs(logits, jnp.float32(1.0), jnp.float32(0.7)))[0]
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(target_probs(logits, jnp.float32(1.0), jnp.float32(1.0)))[0],
                               [0.5, 0.3, 0.15, 0.05], atol=1e-6)


def _random_dists(rng, rows, vocab, sharp=1.5):
    x = np.exp(sharp * rng.normal(size=(rows, vocab)))
    return (x / x.sum(1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("one_hot", [True, False])
def test_sampling_rule_preserves_target_distribution(one_hot):
    """First emitted token ~ p_0; second emitted token given the first draft accepted ~ p_1.

    Deterministic proposals (one-hot q, what our drafters make) keep fixed drafts; a stochastic q has
    each draft sampled from its q row, as speculative sampling requires."""
    rng = np.random.default_rng(0)
    k, vocab = 3, 6
    p = _random_dists(rng, k + 1, vocab)
    if one_hot:
        drafted = np.tile(np.array([int(np.argmax(p[0])), 2, 4], np.int32), (N_SAMPLES, 1))
        q = np.eye(vocab, dtype=np.float32)[drafted[0]]
    else:
        q = _random_dists(rng, k, vocab)
        drafted = np.stack([rng.choice(vocab, N_SAMPLES, p=q[i] / q[i].sum()) for i in range(k)], 1).astype(np.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), N_SAMPLES)
    n_acc, bonus = jax.vmap(accept_sampling, in_axes=(None, None, 0, None, 0))(
        jnp.asarray(p), jnp.asarray(q), jnp.asarray(drafted), jnp.int32(k), keys)
    n_acc, bonus = np.asarray(n_acc), np.asarray(bonus)
    first = np.where(n_acc >= 1, drafted[:, 0], bonus)
    stat, df = chi_square(np.bincount(first, minlength=vocab), p[0])
    assert stat < chi2_critical(df), (stat, df)
    sel = n_acc >= 1
    second = np.where(n_acc[sel] >= 2, drafted[sel, 1], bonus[sel])
    stat, df = chi_square(np.bincount(second, minlength=vocab), p[1])
    assert stat < chi2_critical(df), (stat, df)


def test_sampling_with_fewer_real_drafts_samples_bonus_from_p():
    rng = np.random.default_rng(1)
    p = _random_dists(rng, 3, 5)
    drafted = np.array([1, 2], np.int32)
    keys = jax.random.split(jax.random.PRNGKey(1), N_SAMPLES)
    n_acc, bonus = jax.vmap(accept_sampling, in_axes=(None, None, None, None, 0))(
        jnp.asarray(p), jnp.eye(5)[drafted], jnp.asarray(drafted), jnp.int32(0), keys)
    assert int(np.asarray(n_acc).max()) == 0
    stat, df = chi_square(np.bincount(np.asarray(bonus), minlength=5), p[0])
    assert stat < chi2_critical(df)


def test_verify_block_end_to_end_sampling_distribution():
    """A tiny random target: the engine's jitted verify step emits its first token with the target's
    temperature/top-p distribution, whatever was drafted."""
    cfg = ModelConfig(arch="llama", vocab_size=16, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, rms_eps=1e-6, rope_theta=10000.0, max_position=128)
    rng = np.random.default_rng(2)
    h, nh, nkv, d, i, L = 32, 4, 2, 8, 48, 2
    shapes = {"attn_norm": (h,), "wq": (h, nh * d), "wk": (h, nkv * d), "wv": (h, nkv * d),
              "wo": (nh * d, h), "mlp_norm": (h,), "w_gate": (h, i), "w_up": (h, i), "w_down": (i, h)}
    params = {"layers": [{n: jnp.asarray(rng.normal(size=s).astype(np.float32) * (1.0 if "norm" in n else 0.5))
                          for n, s in shapes.items()} for _ in range(L)],
              "embed": jnp.asarray(rng.normal(size=(16, h)).astype(np.float32)), "norm": jnp.ones(h)}
    block = jnp.asarray([[3, 7, 7, 1]], jnp.int32)
    temperature, top_p = jnp.float32(0.8), jnp.float32(0.9)
    counts = np.zeros(16, np.int64)
    cache = init_cache(cfg, 1, 32)
    n_runs = 6000
    for s in range(n_runs):
        out, _, cache = verify_block(params, cache, block, jnp.asarray([0], jnp.int32), jnp.asarray([3], jnp.int32),
                                     jax.random.PRNGKey(s), temperature, top_p, cfg=cfg, capture=(), greedy=False)
        n_acc, bonus = int(out[0][0]), int(out[1][0])
        counts[7 if n_acc >= 1 else bonus] += 1
    from engine.model import forward
    logits, _, _ = forward(params, init_cache(cfg, 1, 32), block, jnp.asarray([0], jnp.int32), cfg=cfg)
    p0 = np.asarray(target_probs(logits[0], temperature, top_p))[0]
    stat, df = chi_square(counts, p0)
    assert stat < chi2_critical(df), (stat, df, counts, p0)
