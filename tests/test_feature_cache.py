"""Stored target features: sidecars computed for an existing dataset (distill --add-features), and training steps
that read them, hard and soft, equal to steps that recompute them."""

from __future__ import annotations

import numpy as np
import pytest

from engine import load_target
from experiments.data import distill
from experiments.training import objectives, sequences, train

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.test_bench_tools import MIX, TINY_DRAFTER  # noqa: E402 (after the skips: it imports torch)

STEP = [*TINY_DRAFTER, "--batch", "2", "--anchors", "4"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.test_app_tiny import tiny_llama

    path = tmp_path_factory.mktemp("feature-cache") / "target"
    tiny_llama(path, layers=4)
    return load_target(str(path))


def _distill(out, target, features: bool) -> dict:
    return distill.run(out, 6, target=target, mix=MIX, max_new=8, max_prompt=128, slots=2, shard_size=2,
                       features=features)


def test_added_features_equal_those_captured_while_generating_and_resume_shard_by_shard(tiny, tmp_path,
                                                                                       monkeypatch):
    _distill(tmp_path / "captured", tiny, features=True)
    _distill(tmp_path / "added", tiny, features=False)
    real = distill.prefill_features
    calls = []

    def killed_on_the_second_shard(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(distill, "prefill_features", killed_on_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        distill.add_features(tmp_path / "added", tiny)
    first = tmp_path / "added" / distill.features_name(0, distill.feature_layers(tiny.cfg.num_layers))
    stamp = first.stat().st_mtime_ns
    monkeypatch.setattr(distill, "prefill_features", real)
    manifest = distill.add_features(tmp_path / "added", tiny)  # resumes: shard 0 is not computed again
    assert first.stat().st_mtime_ns == stamp and all(s["feature_seconds"] >= 0 for s in manifest["shards"])
    captured = sequences.load_sequences([str(tmp_path / "captured")])
    added = sequences.load_sequences([str(tmp_path / "added")])
    assert added.feature_layers == captured.feature_layers and tiny.cfg.num_layers - 1 in added.feature_layers
    assert np.array_equal(added.tokens, captured.tokens)
    for a, c in zip(added.features, captured.features, strict=True):
        a, c = np.asarray(a, np.float32)[:-1], np.asarray(c, np.float32)[:-1]  # decoding never feeds the last token
        assert np.max(np.abs(a - c)) <= 2e-2 * np.abs(c).max()


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
@pytest.mark.parametrize("soft", ["0", "0.9"])
def test_a_step_on_stored_features_equals_a_step_that_recomputes_them(tiny, tmp_path, drafter, soft):
    _distill(tmp_path / "data", tiny, features=False)
    distill.add_features(tmp_path / "data", tiny)
    stored = sequences.load_sequences([str(tmp_path / "data")])
    bare = sequences.load_sequences([str(tmp_path / "data")], with_features=False)
    args = train.parse_args(["--drafter", drafter, "--soft", soft, *STEP])
    losses = []
    for data in (stored, bare):
        obj = objectives.OBJECTIVES[drafter](tiny, data, args)
        buckets = sequences.length_buckets(data, args.seq_len, args.bucket)
        batch = sequences.train_batch(data, args, 0, obj.columns, buckets)
        assert ("feats" in batch) == (data is stored)
        losses.append(float(obj.loss_fn(obj.params, batch, obj.frozen)[0]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)
