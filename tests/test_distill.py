"""Self-distillation data: the engine's lean greedy path, its features, and sharded resumable datasets."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from engine import generate, load_drafter
from engine.cache import init_cache
from engine.continuous import cache_len_for_queue, greedy_continuous
from engine.decode import GenerationError
from engine.model import forward
from experiments.data import distill
from experiments.data.prompts import build_prompts
from experiments.training import train
from experiments.training.sequences import feature_columns, load_sequences, sample_anchors, split_validation

PROMPTS = ["What is 12 times 7?", "Write a haiku about rain.",
           "List three prime numbers greater than 50 and explain why each of them is prime."]
MIX = {"math": 0.5, "code": 0.3, "chat": 0.2}  # no sharegpt: the test needs no extra wheel


def test_continuous_batching_gives_generate_ar_responses_whichever_slot_and_its_features_equal_a_full_forward(target):
    ar = load_drafter("ar", target)
    prompts = PROMPTS + ["Hi", "Name a colour."]
    ids = [target.encode(p) for p in prompts]
    refs = [generate(target, p, drafter=ar, max_new_tokens=24).token_ids for p in prompts]
    assert len(refs[3]) < 24  # one stops early at EOS: its slot is reused mid-call
    layers = distill.feature_layers(target.cfg.num_layers)
    cache_len = cache_len_for_queue(64, 24, 8)
    for slots in (2, 3):  # 5 prompts over 2 or 3 slots: prompts land in other slots, next to other neighbours
        order, feats = [], {}
        for i, resp, f in greedy_continuous(target, enumerate(ids), 24, slots=slots, cache_len=cache_len,
                                            capture=layers):
            assert resp.tolist() == refs[i], (slots, prompts[i])
            order.append(i)
            feats[i] = f
        assert sorted(order) == list(range(5))  # each once, in completion order:
        assert slots == 3 or order.index(3) < order.index(2)  # with 2 slots, "Hi" starts with prompt 2, ends first
    seq = np.concatenate([ids[2], refs[2]])
    _, full, _ = forward(target.params, init_cache(target.cfg, 1, 128), jnp.asarray(seq[None]),
                         jnp.zeros(1, jnp.int32), cfg=target.cfg, capture=layers, with_logits=False)
    full = np.asarray(full)[:, 0].transpose(1, 0, 2).reshape(len(seq), -1)
    got = feats[2].astype(np.float32)
    assert got.shape == full.shape and not got[-1].any()  # the last token was never an input
    scale = np.abs(full[:-1]).max(axis=1, keepdims=True)
    assert np.max(np.abs(got[:-1] - full[:-1]) / scale) < 2e-3


def test_continuous_batching_refuses_a_prompt_longer_than_its_cache(target):
    ids = [np.arange(1, 60, dtype=np.int32)]
    with pytest.raises(GenerationError, match="need 1..40"):
        list(greedy_continuous(target, enumerate(ids), 16, slots=1, cache_len=64, steps_per_call=8))


def _run(out, n, target, **kw):
    return distill.run(out, n, target=target, mix=MIX, max_new=8, max_prompt=96, slots=2, shard_size=2, **kw)


def test_dataset_resumes_after_an_interruption_without_duplicates_or_gaps(target, tmp_path, monkeypatch):
    fresh = _run(tmp_path / "fresh", 5, target)
    real = distill.greedy_continuous

    def killed_after(n_done):
        def stream(*args, **kw):
            for n, item in enumerate(real(*args, **kw)):
                if n == n_done:
                    raise KeyboardInterrupt  # a kill between two completions
                yield item
        return stream

    monkeypatch.setattr(distill, "greedy_continuous", killed_after(3))  # shard 0 written, shard 1 half done
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "resumed", 5, target)
    assert len(distill.read_manifest(tmp_path / "resumed")["shards"]) == 1  # the finished shard survived
    monkeypatch.setattr(distill, "greedy_continuous", real)
    _run(tmp_path / "resumed", 3, target)  # resume to 3 prompts: a short last shard ...
    resumed = _run(tmp_path / "resumed", 5, target)  # ... redone in full when the dataset grows
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in fresh["shards"]]
    a, b = distill.load_dataset(tmp_path / "fresh"), distill.load_dataset(tmp_path / "resumed")
    assert all(np.array_equal(a[k], b[k]) for k in ("tokens", "offsets", "prompt_lens"))
    index = np.concatenate([np.load(tmp_path / "resumed" / s["file"])["prompt_index"] for s in resumed["shards"]])
    assert index.tolist() == list(range(5))  # every prompt once, in order
    seqs = load_sequences([str(tmp_path / "resumed")])
    assert len(seqs) == 5 and seqs.features is not None
    assert all(len(f) == n for f, n in zip(seqs.features, np.diff(seqs.offsets), strict=True))


def test_feature_pass_resumes_shard_by_shard_and_training_uses_the_finished_shards(target, tmp_path, monkeypatch,
                                                                                   capsys):
    _run(tmp_path / "captured", 5, target)  # features captured while generating
    captured = load_sequences([str(tmp_path / "captured")])
    _run(tmp_path / "bare", 5, target, features=False)  # 3 shards: 2, 2 and 1 sequences
    assert load_sequences([str(tmp_path / "bare")]).features is None
    real = distill.prefill_features
    calls = []

    def killed_on_second(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(distill, "prefill_features", killed_on_second)
    with pytest.raises(KeyboardInterrupt):
        distill.add_features(tmp_path / "bare", target)
    partial = load_sequences([str(tmp_path / "bare")])
    assert [f is not None for f in partial.features] == [True, True, False, False, False]
    assert partial.subset(np.array([1, 0])).features is not None  # finished shards only: stored
    assert partial.subset(np.array([0, 2])).features is None  # one row without: computed per batch
    assert feature_columns(partial, partial.feature_layers[:1], target.cfg.hidden_size) is None
    seed = next(s for s in range(50) if split_validation(5, 1, s)[1].tolist() == [4])  # validation: shard 2's row
    train.main(["--data", str(tmp_path / "bare"), "--limit-sequences", "2", "--val", "1", "--seed", str(seed),
                        "--layers", "1", "--block-size", "4", "--intermediate", "32", "--draft-vocab", "64",
                        "--steps", "1", "--eval-every", "1", "--batch", "2", "--seq-len", "64", "--anchors", "2",
                        "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    assert "features stored (training), computed once (validation)" in capsys.readouterr().out
    card = json.loads((tmp_path / "out" / "smollm2-135m-dflash" / "training.json").read_text())
    assert card["training"]["steps"] == 1 and card["curve"][-1]["tau_est"][0] >= 1.0
    monkeypatch.setattr(distill, "prefill_features", real)
    manifest = distill.add_features(tmp_path / "bare", target)
    assert all(s["feature_seconds"] >= 0 for s in manifest["shards"])
    full = load_sequences([str(tmp_path / "bare")])
    for got, want in zip(full.features, captured.features, strict=True):  # prefill = what generation captured
        got, want = got[:-1].astype(np.float32), want[:-1].astype(np.float32)  # (it never fed the last token)
        assert got.shape == want.shape
        assert np.max(np.abs(got - want) / np.abs(want).max(axis=1, keepdims=True)) < 3e-3


def test_dataset_refuses_other_settings_and_corrupt_shards(target, tmp_path):
    _run(tmp_path, 2, target, features=False)
    with pytest.raises(distill.DatasetError, match="other settings"):
        distill.run(tmp_path, 2, target=target, mix=MIX, max_new=9, max_prompt=96, slots=2, shard_size=2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    changed = {**manifest, "shards": [{**manifest["shards"][0], "prompts_sha256": "0" * 16}]}
    (tmp_path / "manifest.json").write_text(json.dumps(changed))  # as if the prompt generators had changed since
    with pytest.raises(distill.DatasetError, match="generators changed"):
        _run(tmp_path, 4, target, features=False)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / manifest["shards"][0]["file"]).write_bytes(b"not a shard")
    with pytest.raises(distill.DatasetError, match="checksum"):
        distill.load_dataset(tmp_path)


def test_row_kinds_rebuild_each_sequences_prompt_kind_and_distrust_changed_generators(target, tmp_path):
    _run(tmp_path, 4, target, features=False)
    index = np.concatenate([np.load(tmp_path / s["file"])["prompt_index"]
                            for s in distill.read_manifest(tmp_path)["shards"]])
    rows = build_prompts(4, 0, MIX)
    assert distill.row_kinds(tmp_path).tolist() == [rows[i]["kind"] for i in index]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["shards"][0]["prompts_sha256"] = "0" * 16  # as if the generators had changed since
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert distill.row_kinds(tmp_path).tolist() == ["unknown"] * 2 + [rows[i]["kind"] for i in index[2:]]


def test_anchors_cover_response_positions_only_without_replacement():
    rng = np.random.default_rng(0)
    lengths, prompt_lens = np.array([40, 12, 30]), np.array([10, 10, 29])
    anchors, valid = sample_anchors(rng, lengths, prompt_lens, 16)
    for a, v, n, p in zip(anchors, valid, lengths, prompt_lens, strict=True):
        picked = a[v]
        assert len(set(picked.tolist())) == len(picked)  # no replacement
        assert picked.min(initial=p - 1) >= p - 1 and picked.max(initial=0) <= n - 2  # labels a+1.. lie in the response
        assert len(picked) == min(16, n - p)
    assert anchors[2][valid[2]].tolist() == [28]


def test_continuous_batching_on_a_tiny_target_equals_generate_ar():
    """The fast-tier twin of the embedded-model test: a random 12-token target, 5 prompts over 2 slots."""
    from engine.drafters.ar import ArDrafter
    from tests.test_sampling import TARGET

    prompts = ["\x01\x05\x07\x03", "\x02\x09", "\x04", "\x03\x03\x03\x03\x03\x03", "\x0a\x06"]
    refs = [generate(TARGET, p, drafter=ArDrafter(), max_new_tokens=10, raw=True).token_ids for p in prompts]
    ids = [TARGET.encode(p, raw=True) for p in prompts]
    got = {i: r.tolist() for i, r, _ in greedy_continuous(TARGET, enumerate(ids), 10, slots=2,
                                                          cache_len=cache_len_for_queue(8, 10, 8))}
    assert [got[i] for i in range(len(prompts))] == refs
