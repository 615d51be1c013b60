"""8-bit targets (engine.quant): the int8 matmul against float32, a quantized target's speculative decoding lossless
against its own greedy output, and what int8 refuses."""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from engine import load_target
from engine.config import CheckpointError
from engine.decode import generate_batch
from engine.drafters.ar import ArDrafter
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.dflash_checkpoint import init_dflash
from engine.drafters.ngram import NgramDrafter
from engine.ops import linear
from engine.quant import QUANTIZED, Int8Weight, int8_linear, quantize, quantize_params
from engine.sharding import AXES
from engine.target import Target
from tests.test_sampling import tiny_target

PROMPTS = ["\x01\x05\x07\x03\x01\x05", "\x02\x09\x02\x09\x02"]


def test_int8_weights_and_activations_stay_close_to_float32():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 48)).astype(np.float32)
    q = quantize(w)
    assert q.q.dtype == jnp.int8 and q.scale.shape == (48,)
    assert np.all(np.abs(np.asarray(q.q) * np.asarray(q.scale) - w) <= np.asarray(q.scale) / 2 + 1e-6)
    x = jnp.asarray(rng.normal(size=(3, 5, 64)), jnp.float32)
    exact = np.asarray(x) @ w
    got = np.asarray(linear(x, q))  # ops.linear dispatches on the weight
    assert got.shape == (3, 5, 48)
    assert np.abs(got - exact).max() < 0.03 * np.abs(exact).max()
    one = np.asarray(int8_linear(x[:1, :1], q))  # one row runs as two: the same numbers as inside a batch
    np.testing.assert_array_equal(one[0, 0], got[0, 0])


def int8_of(target: Target) -> Target:
    return Target(target.cfg, quantize_params(target.cfg, target.params), target.tokenizer, target.path, "int8",
                  target.eos_ids, target.name + " int8")


def test_speculative_decoding_on_an_int8_target_equals_its_own_greedy_output():
    target = int8_of(tiny_target())
    assert all(isinstance(lp[k], Int8Weight) for lp in target.params["layers"] for k in QUANTIZED)
    assert target.float_dtype == "float32"
    cfg, params = init_dflash(target, num_layers=1, block_size=4, target_layer_ids=(1, 2), mask_token_id=11, seed=2)
    want = [r.token_ids for r in generate_batch(target, PROMPTS, ArDrafter(), max_new_tokens=24, raw=True)]
    for drafter in (NgramDrafter(k=3), DFlashDrafter(target, cfg, params, k=3)):
        results = generate_batch(target, PROMPTS, drafter, max_new_tokens=24, raw=True)
        assert [r.token_ids for r in results] == want, drafter.name
        assert sum(s.accepted for r in results for s in r.steps) > 0  # drafts were verified and some accepted


def test_int8_weight_bytes_count_the_int8_head_not_the_float_embedding():
    f32 = tiny_target()
    i8 = int8_of(f32)
    layers = sum(x.nbytes for x in jax.tree.leaves(i8.params["layers"]))
    assert i8.weight_bytes == layers + sum(x.nbytes for x in jax.tree.leaves(i8.params["lm_head_int8"])) + \
        i8.params["norm"].nbytes
    assert i8.weight_bytes < f32.weight_bytes / 3


def test_int8_refuses_a_mesh_and_a_family_it_does_not_cover(tmp_path):
    with pytest.raises(CheckpointError, match="int8 weights run on one device"):
        load_target(None, "int8", mesh=Mesh(np.array(jax.devices()[:1]).reshape(1, 1), AXES))
    cfg = tiny_target().cfg
    with pytest.raises(ValueError, match="dense llama and qwen3 targets; this one is gpt_oss"):
        quantize_params(replace(cfg, arch="gpt_oss"), tiny_target().params)
