"""Tests for engine/drafters/eagle3.py: feature-layer conversion, token/feature alignment (against an independent
NumPy implementation of dflash.md section 8), drafter cache growth after every accepted length, checkpoints and
loader errors, draft vocab maps, teacher-forced (TTT) training/inference agreement, losslessness through the engine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

# shared helpers, imported under pytest's own module name
from test_dflash import (
    LAYERS,
    TARGET,
    VOCAB,
    OracleMix,
    assert_batch_drafts_like_each_alone,
    assert_growth_matches_scratch,
    prefill,
    random_ids,
    scramble,
    target_features,
)

import engine
from engine.drafters import DrafterError, eagle3, eagle3_config, load_drafter
from engine.drafters.eagle3 import Eagle3Drafter, eagle3_labels, eagle3_train_logits
from engine.drafters.eagle3_checkpoint import init_eagle3, save_eagle3
from engine.drafters.eagle3_config import config_from_json
from engine.drafters.layers import concat_features
from engine.drafters.vocab import from_d2t, most_frequent
from tests.checkpoints import COMMON_BREAKS, rewrite_checkpoint
from tests.prompts import LOSSLESS_PROMPTS

K = 3
DRAFT_VOCAB = 64


def copy_state(state):
    return replace(state, k=jnp.copy(state.k), v=jnp.copy(state.v), window=jnp.copy(state.window))


@pytest.fixture(scope="module")
def drafter() -> Eagle3Drafter:
    counts = np.random.default_rng(0).integers(0, 1000, VOCAB)
    cfg, params, d2t = init_eagle3(TARGET, draft_vocab_size=DRAFT_VOCAB, token_counts=counts)
    return Eagle3Drafter(TARGET, cfg, scramble(params, 1), d2t, k=K)


# ---------------------------------------------------------------- conventions

def test_feature_layers_are_published_input_ids_minus_one(drafter):
    assert drafter.feature_layers == (1, LAYERS // 2 - 1, LAYERS - 4)  # inputs of layers 2, N//2, N-3
    conf = eagle3_config.config_json(drafter.cfg)
    assert conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, LAYERS // 2, LAYERS - 3]
    conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 3, 8]
    assert config_from_json(conf, LAYERS).feature_layers == (-1, 2, 7)
    del conf["eagle_config"]
    assert config_from_json(conf, LAYERS).feature_layers == (1, 3, 4)
    # the input of layer 0 is the embedding: engine id -1
    ids = random_ids(5, seed=1)
    np.testing.assert_array_equal(np.asarray(target_features(TARGET, ids, (-1,))[0, 0]),
                                  np.asarray(TARGET.params["embed"])[ids])


def test_draft_vocab_maps():
    counts = np.array([5, 0, 9, 9, 1, 7])
    vocab = most_frequent(counts, 3, 6)
    assert np.asarray(vocab.ids).tolist() == [2, 3, 5]  # most frequent, ties to the lower id, in id order
    assert np.asarray(vocab.slots).tolist() == [-1, -1, 0, 1, -1, 2]
    assert vocab.d2t().tolist() == [2, 2, 3]
    np.testing.assert_array_equal(from_d2t(vocab.d2t(), 6, "x").slots, vocab.slots)
    for who in ("DFlash", "EAGLE-3"):  # one validation for both drafters
        with pytest.raises(DrafterError, match=f"{who} d2t maps 1 draft ids onto target ids another"):
            from_d2t(np.array([2, 1, 3]), 6, who)  # draft ids 0 and 1 both map to target id 2
        with pytest.raises(DrafterError, match=f"{who} d2t maps draft ids to target ids 2..6, outside"):
            from_d2t(np.array([2, 5]), 6, who)
    assert most_frequent(None, 4, 6).d2t().tolist() == [0, 0, 0, 0]
    tokens = jnp.asarray([[2, 3, 4, 5, 2]])
    labels, valid = eagle3_labels(tokens, vocab.slots, steps=2)
    assert labels.shape == (1, 2, 5)
    assert valid[0, 0].tolist() == [False, True, True, False, False]  # tokens[2]=4 is outside the draft vocab
    assert labels[0, 0, 1:3].tolist() == [2, 0] and valid[0, 1].tolist() == [True, True, False, False, False]


# ---------------------------------------------------------------- cache growth after a verify step

def test_cache_grows_by_accepted_plus_one_and_matches_from_scratch(drafter):
    ids = random_ids(30, seed=3)
    p = len(ids) - 1
    proposal, after = drafter.propose(prefill(drafter, ids), [ids])
    assert proposal.n.tolist() == [K] and after.lengths.tolist() == [p] and after.done.tolist() == [p]
    assert_growth_matches_scratch(drafter, ids, after, [int(t) for t in proposal.ids[0]], VOCAB, copy_state, prefill)


def test_a_batch_drafts_in_one_call_what_each_sequence_drafts_alone(drafter):
    assert_batch_drafts_like_each_alone(drafter, VOCAB, seed=30)


def test_one_token_prompt_drafts_nothing_then_catches_up(drafter):
    state = drafter.start([np.asarray([7]), np.asarray([9, 4, 5])], 64)
    state = drafter.extend(state, jnp.concatenate([target_features(TARGET, [9, 4], drafter.feature_layers)] * 2, 1),
                           [0, 2])
    proposal, state = drafter.propose(state, [[7], [9, 4, 5]])
    assert proposal.n.tolist() == [0, K]  # position 0 has no target feature to draft from; its neighbour drafts
    block = [7] + [0] * K
    feats = jnp.concatenate([target_features(TARGET, block, drafter.feature_layers)] * 2, axis=1)
    state = drafter.extend(state, feats, [1, 0])
    got, _ = drafter.propose(state, [[7, 11], [9, 4, 5]])
    want, _ = drafter.propose(prefill(drafter, [7, 11]), [[7, 11]])
    assert got.ids[0].tolist() == want.ids[0].tolist()


def test_propose_refuses_out_of_step_context_and_bad_k(drafter):
    ids = random_ids(12, seed=4)
    with pytest.raises(DrafterError, match="anchors sit at positions"):
        drafter.propose(prefill(drafter, ids), [ids + [3]])
    with pytest.raises(DrafterError, match="K for drafter"):
        drafter.with_k(0)


def test_with_k_shares_params(drafter):
    ids = random_ids(15, seed=5)
    one, five = drafter.with_k(1), drafter.with_k(5)
    assert one.params is drafter.params and drafter.k == K
    a, _ = one.propose(prefill(one, ids), [ids])
    b, _ = five.propose(prefill(five, ids), [ids])
    assert a.n.tolist() == [1] and b.ids[:, :1].tolist() == a.ids.tolist()  # sequential: K only stops it earlier


# ---------------------------------------------------------------- checkpoints

def test_checkpoint_round_trip(tmp_path, drafter):
    save_eagle3(tmp_path / "f32", drafter.cfg, drafter.params, drafter.vocab.d2t())
    conf = json.loads((tmp_path / "f32" / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"] and conf["draft_vocab_size"] == DRAFT_VOCAB
    tensors = load_file(tmp_path / "f32" / "model.safetensors")
    assert tensors["d2t"].dtype == np.int64 and tensors["fc.weight"].shape == (32, 96)
    assert tensors["lm_head.weight"].shape == (DRAFT_VOCAB, 32)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (32, 64)
    loaded = load_drafter(tmp_path / "f32", TARGET, k=K)  # registry dispatch by architecture
    assert isinstance(loaded, Eagle3Drafter) and loaded.cfg == drafter.cfg
    ids = random_ids(20, seed=6)
    a, _ = drafter.propose(prefill(drafter, ids), [ids])
    b, _ = loaded.propose(prefill(loaded, ids), [ids])
    assert a.ids.tolist() == b.ids.tolist()
    np.testing.assert_array_equal(a.q, b.q)

    own_embed = {**drafter.params, "embed": TARGET.params["embed"] * 2}
    save_eagle3(tmp_path / "bf16", drafter.cfg, own_embed, drafter.vocab.d2t(), dtype="bfloat16")
    assert str(load_file(tmp_path / "bf16" / "model.safetensors")["fc.weight"].dtype) == "bfloat16"
    loaded = eagle3.load(TARGET, tmp_path / "bf16")
    assert loaded.k == eagle3_config.DEFAULT_K and "embed" in loaded.params
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), own_embed)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, rounded)


def _break(conf: dict, tensors: dict, how: str) -> None:
    if how in COMMON_BREAKS:
        COMMON_BREAKS[how](conf, tensors)
    elif how == "wrong fc width":
        tensors["fc.weight"] = tensors["fc.weight"][:, :64]
    elif how == "layer id out of range":
        conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, LAYERS + 1]
    elif how == "d2t out of range":
        tensors["d2t"] = tensors["d2t"] + VOCAB
    elif how == "d2t twice":
        tensors["d2t"][1] = tensors["d2t"][0] - 1  # draft ids 0 and 1 onto one target id
    elif how == "d2t length":
        tensors["d2t"] = tensors["d2t"][:-1]
    elif how == "two layers":
        conf["num_hidden_layers"] = 2
    elif how == "missing tensor":
        del tensors["midlayer.hidden_norm.weight"]


@pytest.mark.parametrize(("how", "message"), [
    ("wrong fc width", "fc takes 64 inputs"), ("wrong hidden size", "hidden_size is 48"),
    ("wrong vocab", "vocab of 100"), ("layer id out of range", r"target layers \[8\]"),
    ("d2t out of range", "outside the target vocab"), ("d2t length", "d2t has 63 entries"),
    ("d2t twice", "onto target ids another draft id already has"),
    ("two layers", "one decoder layer"), ("missing tensor", "midlayer.hidden_norm.weight"),
    ("wrong architecture", "expected LlamaForCausalLMEagle3"),
])
def test_loader_errors_say_what_does_not_fit(tmp_path, drafter, how, message):
    save_eagle3(tmp_path, drafter.cfg, drafter.params, drafter.vocab.d2t())
    rewrite_checkpoint(tmp_path, lambda conf, tensors: _break(conf, tensors, how))
    with pytest.raises(DrafterError, match=message):
        eagle3.load(TARGET, tmp_path)


def test_missing_default_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(eagle3, "DEFAULT_CHECKPOINT", tmp_path / "absent")
    with pytest.raises(DrafterError, match="no EAGLE-3 checkpoint shipped yet"):
        load_drafter("eagle3", TARGET)


# ---------------------------------------------------------------- parity with an independent NumPy forward

def numpy_eagle3_drafts(path: Path, embed: np.ndarray, feats: np.ndarray, tokens: list[int], k: int):
    """dflash.md section 8 from the checkpoint files, one row at a time with a growing K/V list.

    Row t = (tokens[t+1], fc(feats[t])) at position t for t < p; then drafted rows (d_j, previous output)
    at p-1+j. Returns target ids [k] and draft-vocab logits [k, Vd]."""
    conf = json.loads((path / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(path / "model.safetensors").items()}
    m = {k.removeprefix("midlayer."): v for k, v in w.items() if k.startswith("midlayer.")}
    nh, nkv, eps = conf["num_attention_heads"], conf["num_key_value_heads"], conf["rms_norm_eps"]
    d = conf["head_dim"]
    keys, values = [], []

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rot(x, pos):  # x [n, d] at one position, rotate-half RoPE
        ang = pos * conf["rope_theta"] ** (-np.arange(0, d, 2) / d)
        x1, x2 = x[:, :d // 2], x[:, d // 2:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    def row(token: int, g: np.ndarray, pos: int) -> np.ndarray:
        x = np.concatenate([rms(embed[token], m["input_layernorm.weight"]), rms(g, m["hidden_norm.weight"])])
        q = rot((m["self_attn.q_proj.weight"] @ x).reshape(nh, d), pos)
        keys.append(rot((m["self_attn.k_proj.weight"] @ x).reshape(nkv, d), pos))
        values.append((m["self_attn.v_proj.weight"] @ x).reshape(nkv, d))
        ks, vs = np.stack(keys), np.stack(values)
        out = np.zeros((nh, d))
        for head in range(nh):
            s = ks[:, head // (nh // nkv)] @ q[head] / np.sqrt(d)
            a = np.exp(s - s.max())
            out[head] = (a / a.sum()) @ vs[:, head // (nh // nkv)]
        h = g + m["self_attn.o_proj.weight"] @ out.reshape(-1)
        u = rms(h, m["post_attention_layernorm.weight"])
        gate = m["mlp.gate_proj.weight"] @ u
        return h + m["mlp.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * (m["mlp.up_proj.weight"] @ u))

    g = feats @ w["fc.weight"].T
    p = len(tokens) - 1
    for t in range(p):
        h = row(tokens[t + 1], g[t], t)
    ids, logits = [], []
    for j in range(k):
        logits.append(rms(h, w["norm.weight"]) @ w["lm_head.weight"].T)
        best = int(np.argmax(logits[-1]))
        ids.append(best + int(w["d2t"][best]))
        if j < k - 1:
            h = row(ids[-1], h, p + j)
    return ids, np.stack(logits)


def test_drafts_match_independent_numpy_reference(tmp_path, drafter):
    save_eagle3(tmp_path, drafter.cfg, drafter.params, drafter.vocab.d2t())
    loaded = eagle3.load(TARGET, tmp_path, k=K)
    ids = random_ids(19, seed=7)
    feats = np.asarray(concat_features(target_features(TARGET, ids[:-1], loaded.feature_layers)))[0]
    want_ids, want_logits = numpy_eagle3_drafts(tmp_path, np.asarray(TARGET.params["embed"]), feats, ids, K)
    state = prefill(loaded, ids)
    window_tokens = np.asarray(ids[len(ids) - K - 1:])[None]  # next tokens of rows p-W..p-1
    got_ids, _, got_logits, _, _ = eagle3.draft(loaded.params, loaded.embed, loaded.vocab, state.k, state.v,
                                                state.window, window_tokens, np.int32([len(ids) - 2]),
                                                cfg=loaded.cfg, k=K)
    np.testing.assert_allclose(np.asarray(got_logits[0]), want_logits, atol=2e-4, rtol=2e-4)
    assert got_ids[0].tolist() == want_ids


# ---------------------------------------------------------------- training forward

def test_ttt_train_logits_equal_inference_logits(drafter):
    ids = random_ids(24, seed=8)
    proposal, _ = drafter.propose(prefill(drafter, ids), [ids])
    drafts = [int(t) for t in proposal.ids[0]]
    tokens = ids + drafts[:K - 1]  # teacher forcing with the drafter's own tokens = what propose fed itself
    feats = concat_features(target_features(TARGET, tokens, drafter.feature_layers))

    def loss(params):  # the trainer's use: value_and_grad through the TTT forward
        logits = eagle3_train_logits(params, drafter.cfg, drafter.embed, feats, jnp.asarray([tokens]), steps=K)
        return logits.sum(), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(drafter.params)
    assert logits.shape == (1, K, len(tokens), DRAFT_VOCAB)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    start = len(ids) - 2  # row p-1 reads the anchor ids[-1]
    state = prefill(drafter, ids)
    _, _, want, _, _ = eagle3.draft(drafter.params, drafter.embed, drafter.vocab, state.k, state.v, state.window,
                                    np.asarray(ids[len(ids) - K - 1:])[None], np.int32([start]), cfg=drafter.cfg, k=K)
    np.testing.assert_allclose(np.asarray(logits[0, :, start]), np.asarray(want[0]), atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- through the engine (embedded SmolLM2)

@pytest.mark.slow
def test_lossless_through_the_engine_on_smollm2(target, greedy):  # conftest: the embedded SmolLM2, float32
    smol, reference = target, [greedy(p, 24) for p in LOSSLESS_PROMPTS]
    counts = np.bincount(np.concatenate([smol.encode(p) for p in LOSSLESS_PROMPTS]), minlength=smol.cfg.vocab_size)
    cfg, params, d2t = init_eagle3(smol, draft_vocab_size=4096, token_counts=counts)
    assert cfg.feature_layers == (1, 14, 26)
    drafter = Eagle3Drafter(smol, cfg, params, d2t, k=K)
    for i, (prompt, want) in enumerate(zip(LOSSLESS_PROMPTS, reference, strict=True)):
        got = engine.generate(smol, prompt, drafter=drafter, max_new_tokens=24)
        assert got.token_ids == want.token_ids, prompt
        if i < 3:
            mixed = engine.generate(smol, prompt, drafter=OracleMix(drafter, [want.prompt_ids + want.token_ids]),
                                    max_new_tokens=24)
            assert mixed.token_ids == want.token_ids and mixed.stats["accepted"] > 0, prompt
    again = engine.generate(smol, LOSSLESS_PROMPTS[0], drafter=drafter, max_new_tokens=24)
    assert again.stats["compiles"] == 0
    assert again.settings["drafter"] == "eagle3" and again.settings["k"] == K
