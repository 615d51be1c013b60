"""Hybrid Qwen3.5 / Qwen3.6 targets through the engine: loading both published layouts, parity with transformers'
PyTorch models (logits through a prefill + incremental split, features, greedy tokens), and speculative
verification whose recurrent-state rollback keeps decoding lossless (tiny random configs, float32)."""

from __future__ import annotations

import logging
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine.cache import init_cache
from engine.continuous import greedy_continuous
from engine.decode import generate, generate_batch, prefill, verify_block, warm_up
from engine.drafters import dflash
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.dflash_checkpoint import init_dflash
from engine.drafters.ngram import NgramDrafter
from engine.model import forward
from engine.qwen3_5 import commit_states
from engine.target import load_target
from engine.weights import load_weights
from tests.test_dflash import OracleMix, scramble
from tests.test_drafter_formats import fixture, write_checkpoint
from tests.test_sampling import ByteTokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.reference import assert_greedy_matches, assert_parity, hf_qwen3_5  # noqa: E402 (needs torch)

VOCAB, SEQ, SPLIT = 128, 20, 13
LOGIT_TOL = 2e-4
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4, max_position_embeddings=512,
            full_attention_interval=2)
MOE_TEXT = {k: v for k, v in TEXT.items() if k != "intermediate_size"} | dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
KINDS = ("text", "multimodal", "moe", "moe-multimodal")
SLOW = pytest.mark.slow  # a repeat of a fast check over another configuration
PROMPT = "one two three one two three one two"


def hf_model(kind: str, seed: int = 0, **text):
    """A tiny random transformers Qwen3.5 model of `kind` with every weight non-trivial (A_log, dt_bias, norms);
    `text` overrides the text-only decoder's config."""
    return hf_qwen3_5(kind, TEXT | text, MOE_TEXT, VISION, seed)


@pytest.fixture(scope="module", params=[*KINDS[:3], pytest.param(KINDS[3], marks=SLOW)])  # moe-multimodal: both repeats
def case(request, tmp_path_factory):
    """(kind, transformers model, checkpoint dir)."""
    model = hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


TOKENS = np.random.default_rng(0).integers(0, VOCAB, SEQ).astype(np.int32)


def test_logits_and_features_match_transformers(case):
    kind, model, path = case
    hidden = None
    if kind.endswith("multimodal"):  # the wrapper's hidden_states are the language model's
        with torch.no_grad():
            hidden = [h[0].numpy() for h in model.model.language_model(
                input_ids=torch.tensor(TOKENS[None].astype(np.int64)), output_hidden_states=True).hidden_states]
    assert_parity(model, path, TOKENS, SPLIT, (-1, 0, 1, 3), LOGIT_TOL, hidden)


def test_greedy_tokens_match_transformers(case):
    _, model, path = case
    assert_greedy_matches(model, path, ByteTokenizer(), PROMPT, 48)


def test_the_vision_tower_is_skipped_and_logged(tmp_path, caplog):
    hf_model("multimodal").save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="engine.qwen3_5"):
        cfg, params, _ = load_weights(tmp_path, "float32")
    assert cfg.multimodal and cfg.arch == "qwen3_5"
    assert "vision tower not loaded" in caplog.text
    assert len(params["layers"]) == TEXT["num_hidden_layers"]


@pytest.fixture(scope="module", params=["text", pytest.param("moe", marks=SLOW)])  # MoE layers: test_moe_targets
def tiny_target(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"target-{request.param}")
    hf_model(request.param, seed=3).save_pretrained(path)
    return load_target(path, tokenizer=ByteTokenizer())


PROMPTS = [PROMPT, "abc abc abc abc", "the cat sat on the mat, the cat", "x"]


def check_lossless(target, inner, batch: int) -> None:
    """Greedy output with the drafter `inner` equals plain greedy at batch `batch` with per-sequence acceptance; an
    oracle overwrites its first drafts with the known continuation (a random model rarely repeats itself) so that
    blocks are accepted at every length, and every step's recurrent state rolls back past the accepted drafts of
    its padded block. After warm_up (the inner drafter's programs are the oracle's) no run compiles, whatever
    widths its finishing order narrows the batch to."""
    prompts = PROMPTS[:batch]
    want = [generate(target, p, max_new_tokens=32, raw=True) for p in prompts]
    warm_up(target, prompts, inner, max_new_tokens=32, raw=True)
    drafter = OracleMix(inner, [w.prompt_ids + w.token_ids for w in want])
    for _ in range(2):  # the oracle's cycle moves on: the second run accepts other lengths, narrows at other steps
        got = generate_batch(target, prompts, drafter=drafter, max_new_tokens=32, raw=True)
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        assert sum(g.stats["accepted"] for g in got) > 0
        assert got[0].stats["compiles"] == 0
    block = drafter.k + 1
    assert all(s.state_rollback == block - 1 - s.accepted for g in got for s in g.steps)
    assert any(s.state_rollback for g in got for s in g.steps)


# the fast tier runs each drafter once; the other batch size of each is a repeat (slow)
@pytest.mark.parametrize("drafter_kind,batch", [("ngram", 1), ("dflash", 4), pytest.param("ngram", 4, marks=SLOW),
                                                pytest.param("dflash", 1, marks=SLOW)])
def test_speculative_decoding_is_lossless(tiny_target, drafter_kind, batch):
    """Lossless at batch 1 and 4 (plain greedy is itself transformers' greedy, above): ngram, and a random-weight
    DFlash with taps on linear and full-attention layers."""
    if drafter_kind == "ngram":
        inner = NgramDrafter(k=4)
    else:
        cfg, params = init_dflash(tiny_target, num_layers=2, block_size=8, target_layer_ids=(0, 1, 3),
                                  mask_token_id=VOCAB - 1, intermediate_size=48)
        inner = DFlashDrafter(tiny_target, cfg, scramble(params, 1), k=7)
    check_lossless(tiny_target, inner, batch)


PUBLISHED_TAPS = (1, 2, 3, 4, 5, 6, 7, 8)  # 8 taps: layers 3 and 7 full attention, the rest gated DeltaNet


@pytest.fixture(scope="module")
def published_target(tmp_path_factory):
    """A tiny hybrid target of the published layer pattern: three gated DeltaNet layers per full-attention one."""
    path = tmp_path_factory.mktemp("target-published")
    hf_model("text", seed=4, num_hidden_layers=10, full_attention_interval=4).save_pretrained(path)
    return load_target(path, tokenizer=ByteTokenizer())


@pytest.mark.parametrize("batch", [4, pytest.param(1, marks=SLOW)])  # batch 1 repeats batch 4's check
def test_a_dflash_of_the_published_shape_is_lossless(published_target, tmp_path, batch):
    """The Qwen3.5 DFlash drafters' config (dflash_nested_sliding's keys: nested dflash_config, rope_parameters,
    sliding layers) at the published block size 16 with 8 taps over both layer kinds, scaled down to the tiny target
    (its mask token the last embedding row, where the releases use 248077 / 248070), random weights: lossless."""
    conf = fixture("dflash_nested_sliding") | {"num_target_layers": published_target.cfg.num_layers}
    conf["dflash_config"] = {"block_size": 16, "mask_token_id": VOCAB - 1, "target_layer_ids": list(PUBLISHED_TAPS)}
    drafter = dflash.load(published_target, write_checkpoint(tmp_path / "dflash", conf, seed=1))
    kinds = {published_target.cfg.layer_types[i] for i in drafter.cfg.target_layer_ids}
    assert (drafter.cfg.block_size, drafter.k, drafter.cfg.windows) == (16, 15, (6, 6, None))
    assert kinds == {"linear_attention", "full_attention"}
    check_lossless(published_target, drafter, batch)


def test_the_rollback_is_stored_and_shown(tiny_target, tmp_path):
    """The rollback travels with the step: history round trip (a step written without it reads as 0) and the
    Generate view's mark beside the rejected tail."""
    from app.render import step_html
    from storage import open_history

    result = generate(tiny_target, PROMPT, drafter=NgramDrafter(k=3), max_new_tokens=8, raw=True).to_dict()
    assert all(s["state_rollback"] == 3 - s["accepted"] for s in result["steps"])
    old = {**result, "steps": [{k: v for k, v in s.items() if k != "state_rollback"} for s in result["steps"]]}
    history = open_history(tmp_path / "h.duckdb")
    stored, legacy = history.get_run(history.write_run(result)), history.get_run(history.write_run(old))
    assert [s["state_rollback"] for s in stored["steps"]] == [s["state_rollback"] for s in result["steps"]]
    assert {s["state_rollback"] for s in legacy["steps"]} == {0}
    step = result["steps"][0]
    assert f"↶{step['state_rollback']}</span>" in step_html(step)
    assert "ds-rollback" not in step_html(legacy["steps"][0])



@partial(jax.jit, static_argnames=("cfg",))
def fresh_pass(params, cache, tokens, *, cfg):
    """The state after a recurrent (per-position) pass over tokens [1, T], committed at its last position inside
    one program, as verify_block does: the per-position states never back the donated cache buffers."""
    _, _, states = forward(params, cache, tokens, jnp.zeros(1, jnp.int32), cfg=cfg, per_position=True)
    return commit_states(states, jnp.full((1,), tokens.shape[1] - 1, jnp.int32))


def test_rollback_at_every_accepted_length_matches_a_fresh_pass(tmp_path):
    """One batched verify_block after a ragged prefill, row b allowed b drafts of the true greedy continuation, so
    that the rows accept 0..K: each row's committed recurrent and conv state equals a fresh recurrent pass over its
    committed tokens (prefill, anchor, accepted drafts), though the block ran past them."""
    model = hf_model("text", seed=5)
    model.save_pretrained(tmp_path)
    target = load_target(tmp_path, tokenizer=ByteTokenizer())
    k, rng = 3, np.random.default_rng(1)
    bodies = [rng.integers(0, VOCAB, n).astype(np.int32) for n in (5, 9, 2, 7)]
    blocks = []
    for body, anchor in zip(bodies, rng.integers(0, VOCAB, k + 1), strict=True):
        ids = torch.tensor(np.append(body, anchor)[None].astype(np.int64))
        with torch.no_grad():
            cont = model.generate(ids, max_new_tokens=k, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
        blocks.append([int(anchor), *cont.tolist()])
    cfg = target.cfg
    cache, _ = prefill(target, init_cache(cfg, len(bodies), 64), bodies, ())
    (n_acc, *_), _, cache = verify_block(
        target.params, cache, np.array(blocks, np.int32), np.array([len(b) for b in bodies], np.int32),
        np.arange(k + 1, dtype=np.int32), jax.random.PRNGKey(0), np.float32(1.0), np.float32(1.0), cfg=cfg,
        capture=(), greedy=True)
    assert n_acc.tolist() == list(range(k + 1))
    linear = [i for i, kind in enumerate(cfg.layer_types) if kind == "linear_attention"]
    for row, (body, block) in enumerate(zip(bodies, blocks, strict=True)):
        committed = np.append(body, block[:row + 1]).astype(np.int32)[None]
        fresh = fresh_pass(target.params, init_cache(cfg, 1, 64), committed, cfg=cfg)
        for i in linear:
            for kind in ("conv", "rec"):
                np.testing.assert_allclose(np.asarray(cache[kind][i][row]), np.asarray(fresh[kind][i][0]),
                                           atol=1e-5)


def test_continuous_batching_gives_each_prompt_its_greedy_output(tiny_target):
    """Slots reused by later prompts (a one-token prompt too) start from a zeroed recurrent state and a prefill
    that counts only each chunk's real tokens: every response is the prompt's plain greedy output."""
    prompts = PROMPTS + ["zz", "hello world"]
    want = {p: generate(tiny_target, p, max_new_tokens=12, raw=True).token_ids for p in prompts}
    queue = [(p, tiny_target.encode(p, raw=True)) for p in prompts]
    got = {key: out.tolist() for key, out, _ in greedy_continuous(tiny_target, queue, 12, slots=2, cache_len=128,
                                                                    steps_per_call=4)}
    assert got == want


def test_the_sampling_path_rolls_back_too(tiny_target):
    """Rejection sampling over a nucleus of one token is greedy: with partly accepted blocks it must reproduce the
    greedy output, which it only does when the recurrent state is committed at each accepted position."""
    prompts = PROMPTS[:2]
    want = [generate(tiny_target, p, max_new_tokens=24, raw=True) for p in prompts]
    drafter = OracleMix(NgramDrafter(k=3), [w.prompt_ids + w.token_ids for w in want])
    got = generate_batch(tiny_target, prompts, drafter=drafter, max_new_tokens=24, raw=True, temperature=1.0,
                         top_p=1e-6, seed=7)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert any(0 < s.accepted < 3 for g in got for s in g.steps)
