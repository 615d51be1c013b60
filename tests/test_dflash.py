"""Tests for engine/drafters/dflash.py: layer-index convention, block layout and RoPE positions, context
cache growth after every accepted length, checkpoints and loader errors, parity with an independent NumPy
implementation of dflash.md section 2.1, training/inference agreement, and losslessness through the engine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import engine
from engine.cache import init_cache
from engine.config import ModelConfig
from engine.drafters import DrafterError, dflash, dflash_checkpoint, load_drafter
from engine.drafters.dflash import DFlashDrafter, block_tokens, dflash_labels, dflash_train_logits, draft
from engine.drafters.dflash_checkpoint import append_layers, init_dflash, save_dflash
from engine.drafters.dflash_config import default_target_layer_ids
from engine.drafters.layers import concat_features
from engine.model import forward
from engine.target import Target
from engine.weights import build_params, load_hf_dir
from tests.checkpoints import COMMON_BREAKS, rewrite_checkpoint
from tests.prompts import LOSSLESS_PROMPTS

VOCAB, HIDDEN, LAYERS, MASK = 96, 32, 8, 95
BLOCK, K = 6, 4


# ---------------------------------------------------------------- tiny random targets and drafters

def tiny_target(seed: int = 0) -> Target:
    """A random 8-layer Llama target (tied embeddings) in engine/weights.py's params layout."""
    cfg = ModelConfig(arch="llama", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_layers=LAYERS,
                      num_heads=4, num_kv_heads=2, head_dim=8, rms_eps=1e-5, rope_theta=10000.0, max_position=512,
                      tie_embeddings=True)
    rng = np.random.default_rng(seed)
    shapes = {"q_proj": (32, HIDDEN), "k_proj": (16, HIDDEN), "v_proj": (16, HIDDEN), "o_proj": (HIDDEN, 32),
              "gate_proj": (64, HIDDEN), "up_proj": (64, HIDDEN), "down_proj": (HIDDEN, 64)}

    def get(name: str) -> np.ndarray:
        if name == "model.embed_tokens.weight":
            return rng.normal(0, 1, (VOCAB, HIDDEN)).astype(np.float32)
        if name.endswith("norm.weight"):
            return (1 + 0.1 * rng.normal(size=HIDDEN)).astype(np.float32)
        return rng.normal(0, 0.2, shapes[name.split(".")[-2]]).astype(np.float32)

    return Target(cfg, build_params(cfg, get, "float32"), None, Path("tiny"), "float32", (), "tiny")


def scramble(params: dict, seed: int) -> dict:
    """Non-trivial random weights (init's N(0, 0.02) makes every draft the mask token): matrices
    N(0, 1/fan_in), norms 1 + N(0, 0.2)."""
    rng = np.random.default_rng(seed)

    def one(path, a):
        if "norm" in jax.tree_util.keystr(path):
            return jnp.asarray(1 + 0.2 * rng.normal(size=a.shape), a.dtype)
        return jnp.asarray(rng.normal(0, a.shape[-2] ** -0.5, a.shape), a.dtype)

    return jax.tree_util.tree_map_with_path(one, params)


def target_features(target: Target, ids, capture) -> jax.Array:
    """Target features [F, 1, T, H] of ids from position 0 (run padded to 64 tokens: one compile)."""
    assert len(ids) <= 64
    padded = np.zeros((1, 64), np.int32)
    padded[0, :len(ids)] = ids
    _, feats, _ = forward(target.params, init_cache(target.cfg, 1, 64), jnp.asarray(padded),
                          jnp.asarray([0], jnp.int32), cfg=target.cfg, capture=tuple(capture), with_logits=False)
    return feats[:, :, :len(ids)]


def prefill(drafter, ids, chunk: int = 8, max_len: int = 256, seed: int = 0):
    """Drafter state (a batch of one) after the engine's prefill of ids[:-1], in padded chunks whose extra rows
    are noise."""
    return prefill_batch(drafter, [ids], chunk, max_len, seed)


def prefill_batch(drafter, batch: list[list[int]], chunk: int = 8, max_len: int = 256, seed: int = 0):
    """Drafter state after the engine's prefill of each sequence's ids[:-1] at once, in chunks at the same offsets:
    rows past a sequence's end (and past the last chunk's real rows) are noise, with n_new 0 once it has ended."""
    rng = np.random.default_rng(seed)
    longest = max(len(ids) for ids in batch) - 1
    feats = []
    for ids in batch:  # [F, 1, longest padded to chunks, H]: real rows, then noise
        real = target_features(TARGET, ids[:-1], drafter.feature_layers)
        pad = -(-longest // chunk) * chunk - real.shape[2]
        feats.append(jnp.concatenate([real, rng.normal(size=(*real.shape[:2], pad, real.shape[3]))], axis=2))
    feats = jnp.concatenate(feats, axis=1).astype(jnp.float32)
    state = drafter.start([np.asarray(ids) for ids in batch], max_len)
    for lo in range(0, longest, chunk):
        n_new = np.array([min(chunk, max(0, len(ids) - 1 - lo)) for ids in batch], np.int32)
        state = drafter.extend(state, feats[:, :, lo:lo + chunk], n_new)
    return state


def copy_state(state):
    return replace(state, k=[jnp.copy(a) for a in state.k], v=[jnp.copy(a) for a in state.v])


def random_ids(n: int, seed: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, MASK, n)]


TARGET = tiny_target()


@pytest.fixture(scope="module")
def drafter() -> DFlashDrafter:
    cfg, params = init_dflash(TARGET, num_layers=2, block_size=BLOCK, target_layer_ids=(1, 3, 6), mask_token_id=MASK)
    return DFlashDrafter(TARGET, cfg, scramble(params, 1), k=K)


# ---------------------------------------------------------------- conventions and layout

def test_feature_id_is_output_of_layer_like_hf_hidden_states(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(hf_cfg).eval().save_pretrained(tmp_path)
    ids = [[1, 5, 7, 9, 3, 2]]
    with torch.no_grad():
        hidden = LlamaForCausalLM.from_pretrained(tmp_path)(torch.tensor(ids), output_hidden_states=True).hidden_states
    cfg, params = load_hf_dir(tmp_path, "float32")
    capture = (-1, 0, 1, 2, 3)
    _, feats, _ = forward(params, init_cache(cfg, 1, 16), jnp.asarray(ids, jnp.int32), jnp.asarray([0], jnp.int32),
                          cfg=cfg, capture=capture)
    # id L == HF hidden_states[L + 1]; for the last layer both are after the final norm
    for i, layer in enumerate(capture):
        np.testing.assert_allclose(np.asarray(feats[i, 0]), hidden[layer + 1][0].numpy(), atol=1e-5)


def test_default_target_layer_ids_follow_the_reference_formula():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(32, 4) == (1, 10, 20, 29)
    assert default_target_layer_ids(32, 1) == (16,)
    cfg, _ = init_dflash(TARGET, num_layers=3, block_size=4, mask_token_id=MASK)
    assert cfg.target_layer_ids == default_target_layer_ids(LAYERS, 3) == (1, 3, 5)


def test_block_is_anchor_then_masks_at_positions_p_onwards(drafter):
    ids, positions = block_tokens(drafter.cfg, jnp.asarray([7, 3], jnp.int32), jnp.asarray([11, 2], jnp.int32))
    assert ids.tolist() == [[7] + [MASK] * (BLOCK - 1), [3] + [MASK] * (BLOCK - 1)]
    assert positions.tolist() == [list(range(11, 11 + BLOCK)), list(range(2, 2 + BLOCK))]


def test_context_keys_are_rotated_at_absolute_positions(drafter):
    ids = random_ids(22, seed=2)
    state = prefill(drafter, ids, chunk=8)  # 21 context rows in chunks 8, 8, 5 (+3 noise rows)
    assert state.lengths.tolist() == [21]
    p, body = drafter.params, drafter.cfg.body
    feats = np.asarray(concat_features(target_features(TARGET, ids[:-1], drafter.feature_layers)))[0]

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + body.rms_eps) * w

    c = rms(feats @ np.asarray(p["fc"]), np.asarray(p["hidden_norm"]))
    inv = 1.0 / body.rope_theta ** (np.arange(0, body.head_dim, 2) / body.head_dim)
    ang = np.arange(21)[:, None, None] * inv
    for layer in range(body.num_layers):
        k = rms((c @ np.asarray(p["layers"][layer]["wk"])).reshape(21, body.num_kv_heads, body.head_dim),
                np.asarray(p["layers"][layer]["k_norm"]))
        k1, k2 = np.split(k, 2, axis=-1)
        rotated = np.concatenate([k1 * np.cos(ang) - k2 * np.sin(ang), k2 * np.cos(ang) + k1 * np.sin(ang)], -1)
        np.testing.assert_allclose(np.asarray(state.k[layer][0, :, :21]).transpose(1, 0, 2), rotated, atol=1e-4)


# ---------------------------------------------------------------- cache growth after a verify step

def test_context_grows_by_accepted_plus_one_and_matches_from_scratch(drafter):
    ids = random_ids(30, seed=3)
    state = prefill(drafter, ids)
    proposal, after = drafter.propose(state, [ids])
    assert after is state and proposal.n.tolist() == [K] and proposal.ids.shape == (1, K)
    assert_growth_matches_scratch(drafter, ids, state, [int(t) for t in proposal.ids[0]], MASK, copy_state, prefill)


def assert_growth_matches_scratch(drafter, ids, state, drafts, vocab, copy_state, prefill) -> None:
    """For every accepted length 0..K: extending `state` (the context after ids, before the drafts) by the
    verified block rows grows the context by accepted + 1 and drafts what a from-scratch prefill drafts."""
    p, k = len(ids) - 1, len(drafts)
    block_feats = target_features(TARGET, ids + drafts, drafter.feature_layers)[:, :, p:]  # rows p..p+K
    for accepted in range(k + 1):
        bonus = (drafts[accepted] + 1) % vocab if accepted < k else 5
        committed = ids + drafts[:accepted] + [bonus]
        grown = drafter.extend(copy_state(state), block_feats, [accepted + 1])
        assert grown.lengths.tolist() == [p + accepted + 1] == [len(committed) - 1]
        got, _ = drafter.propose(grown, [committed])
        want, _ = drafter.propose(prefill(drafter, committed, chunk=16), [committed])
        assert got.ids.tolist() == want.ids.tolist(), accepted
        np.testing.assert_allclose(got.q, want.q, atol=1e-5)


def assert_batch_drafts_like_each_alone(drafter, vocab: int, seed: int) -> None:
    """A batch of ragged contexts drafted in one call drafts what each sequence drafts alone, before and after a
    verify step that commits a different number of rows per sequence (none for one that has finished)."""
    batch = [random_ids(n, seed + i) for i, n in enumerate([29, 9, 17, 2])]
    state = prefill_batch(drafter, batch)
    assert state.lengths.tolist() == [len(ids) - 1 for ids in batch]
    got, state = drafter.propose(state, batch)
    assert got.ids.shape == got.q.shape == (len(batch), drafter.k)
    for row, ids in enumerate(batch):
        assert_drafts_alone(drafter, ids, got, row)
    # one verify step: sequence b commits n rows of its block [anchor, drafts] (n-1 drafts accepted, then a bonus)
    n_new, drafts = [drafter.k + 1, 1, 3, 0], got.ids.tolist()
    feats = jnp.concatenate([target_features(TARGET, ids + d, drafter.feature_layers)[:, :, len(ids) - 1:]
                             for ids, d in zip(batch, drafts, strict=True)], axis=1)
    committed = [ids + d[:n - 1] + [((d + [0])[n - 1] + 1) % vocab] if n else ids
                 for ids, d, n in zip(batch, drafts, n_new, strict=True)]
    grown = drafter.extend(state, feats, np.array(n_new))
    assert grown.lengths.tolist() == [len(ids) - 1 for ids in committed]
    got, _ = drafter.propose(grown, committed)
    for row, ids in enumerate(committed):
        assert_drafts_alone(drafter, ids, got, row)


def assert_drafts_alone(drafter, ids: list[int], batched, row: int) -> None:
    """Row `row` of a batched proposal equals the proposal for `ids` prefilled and drafted alone."""
    alone, _ = drafter.propose(prefill(drafter, ids), [ids])
    assert batched.ids[row].tolist() == alone.ids[0].tolist() and batched.n[row] == alone.n[0], row
    np.testing.assert_allclose(batched.q[row], alone.q[0], atol=1e-5)


def test_a_batch_drafts_in_one_call_what_each_sequence_drafts_alone(drafter):
    assert_batch_drafts_like_each_alone(drafter, MASK, seed=20)


def test_propose_refuses_a_context_out_of_step_with_the_tokens(drafter):
    ids = random_ids(12, seed=4)
    with pytest.raises(DrafterError, match="anchors sit at positions"):
        drafter.propose(prefill(drafter, ids), [ids + [3]])


def test_with_k_shares_params_and_drafts_a_prefix(drafter):
    ids = random_ids(15, seed=5)
    full = drafter.with_k(BLOCK - 1)
    assert full.params is drafter.params and drafter.k == K
    long, _ = full.propose(prefill(full, ids), [ids])
    short, _ = drafter.propose(prefill(drafter, ids), [ids])
    assert long.ids[:, :K].tolist() == short.ids.tolist()  # the whole block runs whatever K is
    with pytest.raises(DrafterError, match="K for drafter"):
        drafter.with_k(BLOCK)


# ---------------------------------------------------------------- checkpoints

def test_checkpoint_round_trip(tmp_path, drafter):
    save_dflash(tmp_path / "f32", drafter.cfg, drafter.params)
    conf = json.loads((tmp_path / "f32" / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"] and conf["block_size"] == BLOCK
    assert conf["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [1, 3, 6]}
    assert load_file(tmp_path / "f32" / "model.safetensors")["fc.weight"].shape == (HIDDEN, 3 * HIDDEN)
    loaded = load_drafter(tmp_path / "f32", TARGET, k=K)  # registry dispatch by architecture
    assert isinstance(loaded, DFlashDrafter) and loaded.cfg == drafter.cfg
    assert loaded.checkpoint == str(tmp_path / "f32") and loaded.feature_layers == (1, 3, 6)
    ids = random_ids(20, seed=6)
    a, _ = drafter.propose(prefill(drafter, ids), [ids])
    b, _ = loaded.propose(prefill(loaded, ids), [ids])
    assert a.ids.tolist() == b.ids.tolist()
    np.testing.assert_array_equal(a.q, b.q)

    save_dflash(tmp_path / "bf16", drafter.cfg, drafter.params, dtype="bfloat16")
    assert str(load_file(tmp_path / "bf16" / "model.safetensors")["fc.weight"].dtype) == "bfloat16"
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), drafter.params)
    loaded = dflash.load(TARGET, tmp_path / "bf16")
    assert loaded.k == BLOCK - 1
    jax.tree.map(np.testing.assert_array_equal, loaded.params, rounded)


def _break(conf: dict, tensors: dict, how: str) -> None:
    if how in COMMON_BREAKS:
        COMMON_BREAKS[how](conf, tensors)
    elif how == "missing mask id":
        del conf["dflash_config"]["mask_token_id"]
    elif how == "missing layer ids":
        del conf["dflash_config"]["target_layer_ids"]
    elif how == "wrong fc width":
        tensors["fc.weight"] = tensors["fc.weight"][:, :2 * HIDDEN]
    elif how == "mask id outside vocab":
        conf["dflash_config"]["mask_token_id"] = VOCAB
    elif how == "layer id out of range":
        conf["dflash_config"]["target_layer_ids"] = [1, 3, LAYERS]
    elif how == "other target depth":
        conf["num_target_layers"] = 12
    elif how == "missing tensor":
        del tensors["layers.1.mlp.up_proj.weight"]


@pytest.mark.parametrize(("how", "message"), [
    ("missing mask id", "no mask_token_id and the target tokenizer has no"),
    ("missing layer ids", "fc takes 96 inputs but 2 target features"),  # default taps: one per drafter layer
    ("wrong fc width", "fc takes 64 inputs"), ("wrong hidden size", "hidden_size is 48"),
    ("wrong vocab", "vocab of 100"), ("mask id outside vocab", "mask_token_id 96 is outside"),
    ("layer id out of range", r"target layers \[8\]"), ("other target depth", "12-layer target"),
    ("missing tensor", "layers.1.mlp.up_proj.weight"), ("wrong architecture", "expected DFlashDraftModel"),
])
def test_loader_errors_say_what_does_not_fit(tmp_path, drafter, how, message):
    save_dflash(tmp_path, drafter.cfg, drafter.params)
    rewrite_checkpoint(tmp_path, lambda conf, tensors: _break(conf, tensors, how))
    with pytest.raises(DrafterError, match=message):
        dflash.load(TARGET, tmp_path)


def test_loader_accepts_top_level_fields_and_model_prefix(tmp_path, drafter):
    save_dflash(tmp_path, drafter.cfg, drafter.params)
    conf = json.loads((tmp_path / "config.json").read_text())
    conf |= conf.pop("dflash_config")
    (tmp_path / "config.json").write_text(json.dumps(conf))
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({f"model.{k}": v for k, v in tensors.items()}, tmp_path / "model.safetensors")
    assert dflash.load(TARGET, tmp_path).cfg == drafter.cfg


def test_missing_default_checkpoint_and_bad_k(tmp_path, monkeypatch, drafter):
    monkeypatch.setattr(dflash, "DEFAULT_CHECKPOINT", tmp_path / "absent")
    with pytest.raises(DrafterError, match="no DFlash checkpoint shipped yet"):
        load_drafter("dflash", TARGET)
    save_dflash(tmp_path / "ok", drafter.cfg, drafter.params)
    with pytest.raises(DrafterError, match="K for drafter"):
        dflash.load(TARGET, tmp_path / "ok", k=0)
    with pytest.raises(DrafterError, match="no options"):
        dflash.load(TARGET, tmp_path / "ok", window=3)


# ---------------------------------------------------------------- parity with an independent NumPy forward

def numpy_dflash_logits(path: Path, embed: np.ndarray, ctx: np.ndarray, anchor: int, p: int) -> np.ndarray:
    """dflash.md section 2.1 from the checkpoint files: logits [B-1, V] of block rows 1..B-1.

    ctx [p, F*H]: target features of positions 0..p-1; tied target head (= embed)."""
    conf = json.loads((path / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(path / "model.safetensors").items()}
    nh, nkv, d, eps = conf["num_attention_heads"], conf["num_key_value_heads"], conf["head_dim"], conf["rms_norm_eps"]
    size, mask = conf["block_size"], conf["dflash_config"]["mask_token_id"]

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rot(x, pos):  # x [T, n, d], rotate-half RoPE
        ang = np.asarray(pos)[:, None, None] * conf["rope_theta"] ** (-np.arange(0, d, 2) / d)
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    c = rms(ctx @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = embed[[anchor] + [mask] * (size - 1)].astype(np.float64)
    blk_pos, ctx_pos = range(p, p + size), range(p)
    for i in range(conf["num_hidden_layers"]):
        lw = {k.split(f"layers.{i}.")[1]: v for k, v in w.items() if k.startswith(f"layers.{i}.")}
        h = rms(x, lw["input_layernorm.weight"])

        def kv(src, pos, lw=lw):
            k = rms((src @ lw["self_attn.k_proj.weight"].T).reshape(len(src), nkv, d), lw["self_attn.k_norm.weight"])
            return rot(k, pos), (src @ lw["self_attn.v_proj.weight"].T).reshape(len(src), nkv, d)

        q = rot(rms((h @ lw["self_attn.q_proj.weight"].T).reshape(size, nh, d), lw["self_attn.q_norm.weight"]),
                blk_pos)
        (kc, vc), (kb, vb) = kv(c, ctx_pos), kv(h, blk_pos)
        keys, values = np.concatenate([kc, kb]), np.concatenate([vc, vb])
        out = np.zeros((size, nh, d))
        for head in range(nh):
            g = head // (nh // nkv)
            s = q[:, head] @ keys[:, g].T / np.sqrt(d)
            a = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (a / a.sum(-1, keepdims=True)) @ values[:, g]  # no mask: context + whole block
        x = x + out.reshape(size, nh * d) @ lw["self_attn.o_proj.weight"].T
        h = rms(x, lw["post_attention_layernorm.weight"])
        gate = h @ lw["mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ lw["mlp.up_proj.weight"].T)) @ lw["mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])[1:] @ embed.astype(np.float64).T


def test_forward_matches_independent_numpy_reference(tmp_path, drafter):
    save_dflash(tmp_path, drafter.cfg, drafter.params)
    loaded = dflash.load(TARGET, tmp_path)
    ids = random_ids(19, seed=7)
    p = len(ids) - 1
    ctx = np.asarray(concat_features(target_features(TARGET, ids[:-1], loaded.feature_layers)))[0]
    want = numpy_dflash_logits(tmp_path, np.asarray(TARGET.params["embed"]), ctx, ids[-1], p)
    state = prefill(loaded, ids)
    drafts, _, logits = draft(loaded.params, loaded.head, state.k, state.v, np.int32([ids[-1]]), np.int32([p]),
                              cfg=loaded.cfg, k=BLOCK - 1)
    np.testing.assert_allclose(np.asarray(logits[0]), want, atol=2e-4, rtol=2e-4)
    assert drafts[0].tolist() == want.argmax(-1).tolist()


# ---------------------------------------------------------------- training forward

def test_train_logits_equal_inference_logits(drafter):
    tokens = random_ids(30, seed=8)
    feats = concat_features(target_features(TARGET, tokens, drafter.feature_layers))
    anchors = jnp.asarray([[4, 11, 12, 26]], jnp.int32)

    def loss(params):  # the trainer's use: value_and_grad through the packed-block forward
        logits = dflash_train_logits(params, drafter.cfg, drafter.head, feats, jnp.asarray([tokens]), anchors)
        return logits.sum(), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(drafter.params)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    assert logits.shape == (1, 4, BLOCK - 1, VOCAB)
    for i, a in enumerate(anchors[0].tolist()):
        state = prefill(drafter, tokens[:a + 1])
        _, _, want = draft(drafter.params, drafter.head, state.k, state.v, np.int32([tokens[a]]), np.int32([a]),
                           cfg=drafter.cfg, k=BLOCK - 1)
        np.testing.assert_allclose(np.asarray(logits[0, i]), np.asarray(want[0]), atol=1e-4, rtol=1e-4)
    labels, valid = dflash_labels(jnp.asarray([tokens]), anchors, BLOCK)
    assert labels[0, 0].tolist() == tokens[5:10] and bool(valid[0, :3].all())
    assert valid[0, 3].tolist() == [True, True, True, False, False]  # 26 + 4 is past the end



def test_appended_layers_leave_the_drafts_unchanged_and_learn(drafter):
    """A drafter grown by append_layers drafts exactly what it grew from, and the new layers get gradients."""
    tokens = random_ids(30, seed=9)
    feats = concat_features(target_features(TARGET, tokens, drafter.feature_layers))
    anchors = jnp.asarray([[3, 15, 22]], jnp.int32)
    cfg, params = append_layers(drafter.cfg, drafter.params, 1, seed=4)
    assert cfg.body.num_layers == 3 and len(params["layers"]) == 3

    def logits_of(p, c):
        return dflash_train_logits(p, c, drafter.head, feats, jnp.asarray([tokens]), anchors)

    np.testing.assert_allclose(np.asarray(logits_of(params, cfg)), np.asarray(logits_of(drafter.params, drafter.cfg)),
                               atol=1e-5, rtol=1e-5)
    grads = jax.grad(lambda p: logits_of(p, cfg)[..., 0].sum())(params)["layers"][2]
    assert float(jnp.abs(grads["wo"]).max()) > 0 and float(jnp.abs(grads["w_down"]).max()) > 0
    with pytest.raises(DrafterError, match="n >= 1"):
        append_layers(drafter.cfg, drafter.params, 0)

# ---------------------------------------------------------------- through the engine (embedded SmolLM2)

class OracleMix:
    """Runs the real drafter every step, then overwrites each sequence's first m drafts (m cycling 0..K) with the
    target's known continuation (references: per sequence, prompt + greedy output; found by prefix), so that the
    engine accepts m+ drafts and extends by m+1 rows."""

    def __init__(self, inner, references: list[list[int]]):
        self.inner, self.references, self.calls = inner, references, 0
        self.name, self.k, self.feature_layers, self.checkpoint = inner.name, inner.k, inner.feature_layers, None

    def start(self, prompt_ids, max_len):
        return self.inner.start(prompt_ids, max_len)

    def extend(self, state, features, n_new):
        return self.inner.extend(state, features, n_new)

    def propose(self, state, tokens):
        proposal, state = self.inner.propose(state, tokens)
        m, self.calls = self.calls % (self.k + 1), self.calls + 1
        ids = np.array(proposal.ids)
        for row, seq in enumerate(tokens):  # rows are sequences in the batch's current order (it narrows)
            reference = next(r for r in self.references if r[:len(seq)] == list(seq))
            known = reference[len(seq):len(seq) + m]
            ids[row, :len(known)] = known
        return replace(proposal, ids=ids), state


@pytest.mark.slow
def test_lossless_through_the_engine_on_smollm2(target, greedy):  # conftest: the embedded SmolLM2, float32
    smol, reference = target, [greedy(p, 24) for p in LOSSLESS_PROMPTS]
    cfg, params = init_dflash(smol, num_layers=1, block_size=4)
    assert cfg.mask_token_id == 16 and smol.tokenizer.convert_ids_to_tokens(16) == "<empty_output>"
    drafter = DFlashDrafter(smol, cfg, params, k=3)
    for i, (prompt, want) in enumerate(zip(LOSSLESS_PROMPTS, reference, strict=True)):
        got = engine.generate(smol, prompt, drafter=drafter, max_new_tokens=24)
        assert got.token_ids == want.token_ids, prompt
        if i < 3:
            mixed = engine.generate(smol, prompt, drafter=OracleMix(drafter, [want.prompt_ids + want.token_ids]),
                                    max_new_tokens=24)
            assert mixed.token_ids == want.token_ids and mixed.stats["accepted"] > 0, prompt
    again = engine.generate(smol, LOSSLESS_PROMPTS[0], drafter=drafter, max_new_tokens=24)
    assert again.stats["compiles"] == 0
    assert again.settings["drafter"] == "dflash" and again.settings["k"] == 3


@pytest.mark.slow
def test_restricted_draft_vocabulary_is_lossless_and_drafts_like_the_full_one(target, tmp_path):
    shipped = dflash.load(target)  # its body and shared head; a Domino head is tied to its own draft vocabulary
    body = {k: v for k, v in shipped.params.items() if k != "domino"}
    full = DFlashDrafter(target, replace(shipped.cfg, domino=None), body, k=7)  # the full vocabulary
    prompt = "Anna has 4 boxes with 6 pencils each. She gives away 5 pencils. How many are left?"
    want = engine.generate(target, prompt, drafter=full, max_new_tokens=40)
    drafted = sorted({t for s in want.steps for t in s.drafted})
    inside = np.union1d(np.arange(3000), drafted)  # every full-vocabulary draft lies inside this set
    d2t = inside - np.arange(len(inside))
    path = dflash_checkpoint.save_dflash(tmp_path / "restricted", full.cfg, full.params, d2t=d2t)
    restricted = load_drafter(str(path), target, k=7)
    assert restricted.head["lm_head"].shape == (target.cfg.hidden_size, len(inside))
    got = engine.generate(target, prompt, drafter=restricted, max_new_tokens=40)
    assert got.token_ids == want.token_ids
    assert [s.drafted for s in got.steps] == [s.drafted for s in want.steps]  # same argmax: same drafts
    small = np.setdiff1d(np.arange(2000), drafted)  # now no full-vocabulary draft is draftable
    narrow_cfg = replace(full.cfg, oov_hints=False)  # oov_hints would also draft lookup hints outside it
    narrow = DFlashDrafter(target, narrow_cfg, full.params, k=7, d2t=small - np.arange(len(small)))
    out = engine.generate(target, prompt, drafter=narrow, max_new_tokens=40)
    assert out.token_ids == want.token_ids  # verification keeps it lossless whatever is drafted
    assert all(set(s.drafted) <= set(small.tolist()) for s in out.steps)
    with pytest.raises(DrafterError, match="d2t"):
        DFlashDrafter(target, full.cfg, full.params, d2t=np.array([target.cfg.vocab_size]))


@pytest.mark.slow
def test_shipped_drafter_drafts_in_the_engine_what_its_training_forward_drafts_on_a_count(target):
    """No train/serve gap: at the engine's own anchors, dflash_train_logits over prompt + output drafts exactly the
    engine's blocks (features, positions, masks, lookup hints and the draft vocabulary seen alike), on a count."""
    from experiments.training.sequences import add_hints, features_fn

    prompt = "Continue the sequence: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"
    d = load_drafter("dflash", target)
    run = engine.generate(target, prompt, drafter=d, max_new_tokens=32)
    seq = np.concatenate([target.encode(prompt), run.token_ids]).astype(np.int32)[None]
    feats, _ = features_fn(target, d.cfg.target_layer_ids)({"tokens": jnp.asarray(seq)})
    anchors = np.asarray([[s.position for s in run.steps]], np.int32)
    hints = add_hints({"tokens": seq, "anchors": anchors, "anchor_valid": np.ones(anchors.shape, bool)},
                      d.cfg).get("hints")
    logits = dflash_train_logits(d.params, d.cfg, d.head, feats, jnp.asarray(seq), jnp.asarray(anchors), hints=hints)
    drafts = np.asarray(dflash.pick_drafts(d.cfg, logits, None if hints is None else jnp.asarray(hints),
                                           d.vocab)[0])[0]
    # a Domino head's GRU reads the block's tokens: teacher forcing equals the rollout along the accepted prefix and
    # at the first rejected draft, after which the engine feeds its own drafts and training the target's tokens
    seen = [len(s.drafted) if d.cfg.domino is None else min(len(s.drafted), s.accepted + 1) for s in run.steps]
    want = [s.drafted[:n] for s, n in zip(run.steps, seen, strict=True)]
    assert [drafts[i, :n].tolist() for i, n in enumerate(seen)] == want
    assert sum(seen) > len(seen)  # more than one draft per step compared


@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_over_key_parts_equals_attention_over_their_concatenation(with_sinks):
    """The drafter's block attends to (context cache, own block) as parts, never building their concatenation."""
    from engine.ops import attention

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(2, 3, 4, 8)), jnp.float32)
    ks = [jnp.asarray(rng.normal(size=(2, 2, n, 8)), jnp.float32) for n in (5, 3)]
    vs = [jnp.asarray(rng.normal(size=(2, 2, n, 8)), jnp.float32) for n in (5, 3)]
    mask = jnp.asarray(rng.random((2, 3, 8)) < 0.7).at[..., 0].set(True)
    sinks = jnp.asarray(rng.normal(size=4), jnp.float32) if with_sinks else None
    whole = attention(q, jnp.concatenate(ks, 2), jnp.concatenate(vs, 2), mask, sinks)
    np.testing.assert_allclose(attention(q, tuple(ks), tuple(vs), mask, sinks), whole, rtol=1e-6, atol=1e-6)
