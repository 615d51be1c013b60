"""Tests for engine/drafters/domino.py: the head against torch.nn.GRU and the published correction (SpecForge
DominoDraftModel.apply_logits_head, both shift_label layouts), rollout against teacher forcing, training logits
against the engine's drafts, and a checkpoint round trip (published configs and losslessness:
test_drafter_formats.py)."""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from engine.drafters import dflash, dflash_checkpoint, domino, load_drafter
from engine.drafters.dflash import DFlashDrafter, dflash_train_logits, draft
from engine.drafters.dflash_checkpoint import init_dflash
from engine.drafters.layers import concat_features
from tests.test_dflash import BLOCK, MASK, TARGET, VOCAB, prefill, random_ids, scramble, target_features

H, G, E = 32, 12, 8


def torch_head(seed: int) -> tuple[torch.nn.GRU, torch.nn.Sequential]:
    """The published modules: nn.GRU(H, G, bias=False, batch_first) and Linear(H+G, E) SiLU Linear(E, V)."""
    torch.manual_seed(seed)
    gru = torch.nn.GRU(H, G, num_layers=1, batch_first=True, bias=False)
    proj = torch.nn.Sequential(torch.nn.Linear(H + G, E, bias=False), torch.nn.SiLU(),
                               torch.nn.Linear(E, VOCAB, bias=False))
    return gru, proj


def params_of(gru: torch.nn.GRU, proj: torch.nn.Sequential) -> dict:
    """Our params from the modules' state dicts under the checkpoint names (domino.TENSORS)."""
    state = {f"prefix_gru.{k}": v for k, v in gru.state_dict().items()}
    state |= {f"embed_proj.{k}": v for k, v in proj.state_dict().items()}
    assert set(state) == set(domino.TENSORS.values())
    tensors = {k: v.detach().numpy() for k, v in state.items()}
    params, read = domino.load(tensors, domino.Domino(1, E, G), H, VOCAB, "float32", "torch")
    assert read == set(state)
    return params


def reference_final_logits(gru, proj, base, hidden, prev_emb, prefix_len: int, shift: bool) -> torch.Tensor:
    """SpecForge's apply_logits_head over whole blocks [1, n, B, ...] (base and hidden: every block row)."""
    n, size = base.shape[1:3]
    start = prefix_len if shift else 1 + prefix_len
    if shift:
        states = gru(prev_emb.reshape(n, size, -1))[0].reshape(1, n, size, -1)[:, :, start:]
    else:
        states = gru(prev_emb[:, :, :size - 1].reshape(n, size - 1, -1))[0]
        states = states.reshape(1, n, size - 1, -1)[:, :, start - 1:]
    delta = proj(torch.cat([hidden[:, :, start:], states], dim=-1))
    return torch.cat([base[:, :, :start], base[:, :, start:] + delta], dim=2)


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("prefix_len", [0, 1, 2])
def test_teacher_logits_match_the_published_head(shift, prefix_len):
    gru, proj = torch_head(0)
    params = params_of(gru, proj)
    rng = np.random.default_rng(1)
    n = 3
    base, hidden = rng.normal(size=(1, n, BLOCK, VOCAB)), rng.normal(size=(1, n, BLOCK, H))
    prev_emb = rng.normal(size=(1, n, BLOCK, H))  # embeddings of block tokens 0..B-1
    with torch.no_grad():
        want = reference_final_logits(gru, proj, *(torch.tensor(a, dtype=torch.float32) for a in
                                                   (base, hidden, prev_emb)), prefix_len, shift).numpy()
    rows = slice(0, BLOCK - 1) if shift else slice(1, BLOCK)  # the rows that predict drafts 1..B-1
    got = domino.teacher_logits(params, domino.Domino(prefix_len, E, G), jnp.asarray(base[:, :, rows], jnp.float32),
                                jnp.asarray(hidden[:, :, rows], jnp.float32),
                                jnp.asarray(prev_emb[:, :, :BLOCK - 1], jnp.float32))
    np.testing.assert_allclose(np.asarray(got), want[:, :, rows], atol=2e-5, rtol=2e-5)
    assert np.abs(want[:, :, rows] - base[:, :, rows]).max() > 1e-2  # the correction is there to be matched


def test_rollout_is_teacher_forcing_on_its_own_drafts():
    gru, proj = torch_head(2)
    params, dom = params_of(gru, proj), domino.Domino(1, E, G)
    rng = np.random.default_rng(3)
    embed_table = jnp.asarray(rng.normal(size=(VOCAB, H)), jnp.float32)
    base, rows = (jnp.asarray(rng.normal(size=(2, BLOCK - 1, d)), jnp.float32) for d in (VOCAB, H))
    anchors = jnp.asarray([5, 9])
    logits = domino.rollout(params, dom, base, rows, embed_table[anchors],
                            lambda j, lg: (lg, embed_table[jnp.argmax(lg, -1)]))
    drafts = jnp.argmax(logits, -1)
    block = jnp.concatenate([anchors[:, None], drafts[:, :-1]], axis=1)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(domino.teacher_logits(params, dom, base, rows,
                                                                                    embed_table[block])), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(logits[:, 0]), np.asarray(base[:, 0]))  # draft 1: no correction


def domino_drafter(shift: bool = False, k: int = BLOCK - 1, vocab: int = VOCAB, **extra) -> DFlashDrafter:
    """A random DFlash drafter with a Domino head; vocab < VOCAB: a restricted draft vocabulary of that size; extra:
    more DFlashConfig fields (lookup hints)."""
    cfg, params = init_dflash(TARGET, num_layers=2, block_size=BLOCK, target_layer_ids=(1, 3, 6), mask_token_id=MASK)
    cfg = replace(cfg, shift_label=shift, domino=domino.Domino(1, E, G), **extra)
    params = scramble({**params, "domino": domino.init(np.random.default_rng(0), cfg.domino, H, vocab, "float32")}, 4)
    ids = np.sort(np.random.default_rng(6).choice(VOCAB, vocab, replace=False))
    return DFlashDrafter(TARGET, cfg, params, k=k, d2t=None if vocab == VOCAB else ids - np.arange(vocab))


@pytest.mark.parametrize(("shift", "vocab"), [(False, VOCAB), (True, VOCAB), (False, 40)])
def test_training_logits_equal_the_engines_drafting_along_its_drafts(shift, vocab):
    """Teacher forcing on a sequence whose continuation is the drafter's own block gives the engine's logits (a
    restricted vocabulary's drafts go back into the GRU as their target ids)."""
    d = domino_drafter(shift, vocab=vocab)
    tokens = random_ids(24, seed=8)
    anchor = 11
    state = prefill(d, tokens[:anchor + 1])
    ids, _, want = draft(d.params, d.head, state.k, state.v, np.int32([tokens[anchor]]), np.int32([anchor]),
                         d.vocab, cfg=d.cfg, k=BLOCK - 1)
    assert want.shape == (1, BLOCK - 1, vocab)
    seq = tokens[:anchor + 1] + np.asarray(ids[0]).tolist()
    feats = concat_features(target_features(TARGET, seq, d.feature_layers))
    got, base = dflash_train_logits(d.params, d.cfg, d.head, feats, jnp.asarray([seq]), jnp.asarray([[anchor]]),
                                    with_base=True)
    np.testing.assert_allclose(np.asarray(got[0, 0]), np.asarray(want[0]), atol=1e-4, rtol=1e-4)
    assert np.abs(np.asarray(got - base)).max() > 1e-3


def test_hinted_drafts_feed_the_gru_as_picked_and_train_as_served():
    """With lookup hints, hints outside the draft vocabulary (oov_hints) and a hint_bias that drafts them, the GRU
    takes each draft as picked, hint or argmax: teacher forcing along the served block gives the served logits."""
    d = domino_drafter(vocab=40, lookup_hints=3, hint_bias=100.0, oov_hints=True)
    tokens = random_ids(9, seed=8) * 2  # the second copy: lookup proposes the rest of the first
    anchor = 12
    hints = dflash.lookup_hints(d.cfg, [tokens[:anchor + 1]])
    outside = (hints != MASK) & ~np.isin(hints, np.asarray(d.vocab.ids))
    assert outside[0, 1:].any()  # a hint the vocabulary lacks, drafted by its own column, then fed to the GRU
    state = prefill(d, tokens[:anchor + 1])
    ids, _, served = draft(d.params, d.head, state.k, state.v, np.int32([tokens[anchor]]), np.int32([anchor]),
                           d.vocab, jnp.asarray(hints), cfg=d.cfg, k=BLOCK - 1)
    hinted = hints[0] != MASK
    np.testing.assert_array_equal(np.asarray(ids[0])[hinted], hints[0, hinted])  # hint_bias 100: every hint drafted
    argmax = np.asarray(d.vocab.ids)[np.argmax(np.asarray(served[0, :, :40]), -1)]
    assert (argmax != np.asarray(ids[0]))[:-1].any()  # feeding the argmax instead would change a later draft
    seq = tokens[:anchor + 1] + np.asarray(ids[0]).tolist()
    feats = concat_features(target_features(TARGET, seq, d.feature_layers))
    trained = dflash_train_logits(d.params, d.cfg, d.head, feats, jnp.asarray([seq]), jnp.asarray([[anchor]]),
                                  hints=jnp.asarray(hints)[:, None])
    assert served.shape == (1, BLOCK - 1, 41) and trained.shape == (1, 1, BLOCK - 1, 41)  # 40 ids, the hint column
    np.testing.assert_allclose(np.asarray(trained[0, 0]), np.asarray(served[0]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shift", [False, True])
def test_checkpoint_round_trip(tmp_path, shift):
    d = domino_drafter(shift, k=4)
    path = dflash_checkpoint.save_dflash(tmp_path / "domino", d.cfg, d.params)
    conf = (path / "config.json").read_text()
    assert '"DominoDraftModel"' in conf and '"projector_type": "domino"' in conf
    again = load_drafter(path, TARGET, k=4)
    assert again.cfg == d.cfg and again.cfg.domino == domino.Domino(1, E, G) and again.cfg.shift_label == shift
    jax.tree.map(np.testing.assert_array_equal, again.params, d.params)
