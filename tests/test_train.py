"""Drafter training: self-distilled data, annotation-export fine-tuning, determinism, resume, loadable output."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from engine import generate, load_drafter, load_target
from engine.config import ModelConfig
from engine.drafters import dflash, dflash_config
from engine.drafters.dflash_checkpoint import init_dflash, save_dflash
from engine.drafters.layers import shared_head
from engine.drafters.vocab import from_ids
from experiments.data import distill
from experiments.data.prompts import build_prompts
from experiments.training import evaluate, loop, objectives, sequences, train


def test_training_prompts_are_distinct_and_not_from_the_suites():
    from experiments.suites import load_suite

    prompts = build_prompts(300, seed=0)
    texts = [p["prompt"] for p in prompts]
    assert len(set(texts)) == len(texts) == 300
    assert {p["kind"] for p in prompts} == {"math", "code", "chat", "sharegpt"}
    normal = lambda text: " ".join(text.split()).lower()
    evaluation = {normal(r["prompt"]) for s in ("gsm8k", "humaneval", "mtbench") for r in load_suite(s)}
    assert not evaluation & {normal(t) for t in texts}
    assert build_prompts(50, seed=0) == prompts[:50]  # deterministic given the seed


@pytest.fixture(scope="module")
def export_dir(target, tmp_path_factory):
    """A minimal annotation export: two rejection records with their prefixes."""
    out = tmp_path_factory.mktemp("export")
    rows = [{"id": i, "prompt": p, "prefix_ids": target.encode(p).tolist()}
            for i, p in enumerate(["What is 3 + 4?", "Say hi."])]
    (out / "rejections.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, [len(r["prefix_ids"]) for r in rows]


def _train(tmp_path, init, export, name, steps=2, work="work"):
    args = ["--drafter", "dflash", "--init", str(init), "--export", str(export), "--export-weight", "2",
            "--max-new", "8", "--steps", str(steps), "--batch", "2", "--eval-every", "1", "--val", "0",
            "--seq-len", "64", "--anchors", "2", "--out", str(tmp_path / "out"), "--name", name,
            "--work", str(tmp_path / work), "--seed", "3"]
    train.main(args)
    return tmp_path / "out" / f"{name}-dflash"


def test_finetune_from_export_is_deterministic_resumable_and_loadable(target, export_dir, tmp_path):
    export, prefix_lens = export_dir
    cfg, params = init_dflash(target, num_layers=1, block_size=4, intermediate_size=64, seed=0)
    init = save_dflash(tmp_path / "init", cfg, params)
    (init / "training.json").write_text(json.dumps({"drafter": "dflash", "data": {"sequences": 7},
                                                    "training": {"steps": 11}, "curve": []}))
    seqs = sequences.export_sequences(target, export, 2, 8, (1, 8))
    assert sorted(seqs.prompt_lens.tolist()) == sorted(prefix_lens * 2)  # each prefix twice (the weight) ...
    assert all(len(f) == n for f, n in zip(seqs.features, np.diff(seqs.offsets), strict=True))  # ... continued
    a = _train(tmp_path, init, export, "a")
    b = _train(tmp_path, init, export, "b", work="work-b")
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(np.array_equal(ta[k], tb[k]) for k in ta), "same seed, same data: same weights"
    assert any(not np.array_equal(ta[k], load_file(str(init / "model.safetensors"))[k].astype(ta[k].dtype))
               for k in ta), "training changed the weights"
    card = json.loads((a / "training.json").read_text())
    assert card["training"]["steps"] == 2 and card["hardware"]["backend"] == "cpu"
    assert card["training"]["init"] == str(init)  # the lineage: what the fine-tune started from
    assert card["init_card"] == {"drafter": "dflash", "data": {"sequences": 7}, "training": {"steps": 11}}
    resumed = _train(tmp_path, init, export, "a", steps=3)  # same work dir: continues from step 2
    assert json.loads((resumed / "training.json").read_text())["training"]["steps"] == 3
    drafter = load_drafter(str(resumed), target, k=3)
    ar = generate(target, "What is 3 + 4?", max_new_tokens=12)
    assert generate(target, "What is 3 + 4?", drafter=drafter, max_new_tokens=12).token_ids == ar.token_ids


def test_tau_from_runs_caps_each_run_at_k():
    assert evaluate.tau_from_runs(np.array([0, 1, 3, 7]), 4) == [1.75, 2.25, 2.75, 3.0]
    match = np.array([[True, True, False, True], [False, True, True, True]])
    assert np.asarray(objectives.accepted_runs(match)).tolist() == [2, 0]


def test_ngram_runs_are_the_engine_lookups_accepted_prefix_and_split_copy_anchors():
    """At each anchor, the n-gram drafter's proposal from the context up to it, against the continuation; copy anchors
    are those where its first token is right."""
    tokens = np.array([[5, 6, 7, 8, 9, 5, 6, 7, 8, 4, 0, 0]], np.int32)  # "5 6 7 8" repeats, then departs
    batch = {"tokens": tokens, "lengths": np.array([10]), "anchors": np.array([[5, 6, 8, 3]], np.int32),
             "anchor_valid": np.array([[True, True, True, False]])}
    runs = evaluate.ngram_runs(batch, 4)
    # anchor 5 (token 5): lookup proposes 6 7 8 9, truth 6 7 8 4 -> 3; anchor 6: 7 8 9 5 vs 7 8 4 -> 2;
    # anchor 8 (token 8): 9 5 6 7 vs 4 -> 0; the invalid slot stays 0
    assert runs.tolist() == [[3, 2, 0, 0]]
    split = evaluate.copy_split(np.array([1, 0, 2]), runs[batch["anchor_valid"]], 4)
    assert split["copy_fraction"] == pytest.approx(2 / 3, abs=1e-4)
    assert split["copy_tau_est"][3] == 1.5 and split["copy_ngram_tau_est"][3] == 3.5
    assert split["other_tau_est"][3] == 3.0 and split["ngram_tau_est"][0] == pytest.approx(1 + 2 / 3, abs=1e-4)


def test_walk_replays_the_engines_blocks_from_the_runs_at_every_anchor():
    """Prompt of 3, 8 response tokens (anchors 2..9): the walk starts at the prompt's last token and jumps past each
    block's kept drafts and bonus; an anchor it needs but was not drawn makes it undefined."""
    runs = np.array([[2, 0, 0, 1, 0, 0, 3, 0]])  # run at anchors 2, 3, ..., 9
    batch = {"anchors": np.arange(2, 10)[None], "anchor_valid": np.ones((1, 8), bool),
             "prompt_lens": np.array([3]), "lengths": np.array([11])}
    # K=7: anchor 2 keeps 2 + bonus -> 5 keeps 1 + bonus -> 7 keeps 0 -> 8 keeps 3 (past the end): 4 steps, 8 tokens
    assert evaluate.walk_taus(batch, runs, 7) == [2.0]
    # K=1: 2 -> 4 -> 5 -> 7 -> 8 -> 10 (runs capped at 1): 5 steps
    assert evaluate.walk_taus(batch, runs, 1) == [8 / 5]
    batch["anchor_valid"][0, 3] = False  # anchor 5 not drawn
    assert evaluate.walk_taus(batch, runs, 7) is None


def test_walk_tau_of_a_checkpoint_equals_the_engines_greedy_tau(target):
    """Replayed offline from one batched prefill (evaluate_checkpoint), the shipped DFlash's tau on its own greedy
    output is the tau generate() measured, prompt by prompt."""
    prompts, k = ["What is 12 times 7? Explain.", "Write a Python function that reverses a list."], 7
    drafter = load_drafter("dflash", target, k=k)
    results = [generate(target, p, drafter=drafter, max_new_tokens=48) for p in prompts]
    seqs = [np.array(r.prompt_ids + r.token_ids, np.int32) for r in results]
    data = sequences.Sequences(np.concatenate(seqs), sequences.offsets_of([len(s) for s in seqs]),
                                   np.array([len(r.prompt_ids) for r in results]))
    args = train.parse_args(["--anchors", "512", "--batch", "2"])
    [scores] = evaluate.evaluate_checkpoint(target, drafter.checkpoint, data, args)
    engine = np.mean([r.stats["tau"] for r in results])
    assert scores["walk_tau"][k - 1] == pytest.approx(engine, abs=1e-4)
    assert scores["walk_tau"][k - 1] != scores["tau_est"][k - 1]  # uniform anchors weigh positions otherwise


def test_validation_split_stays_fixed_as_shards_are_appended():
    train_rows, val = sequences.split_validation(500, 40, seed=3)
    grown_train, grown_val = sequences.split_validation(800, 40, seed=3, pool=500)
    assert np.array_equal(val, grown_val) and len(val) == 40
    assert np.array_equal(grown_train, np.setdiff1d(np.arange(800), val)), "every other row trains"
    assert np.array_equal(grown_train[:len(train_rows)], train_rows), "the old training rows come first, unchanged"
    assert not np.array_equal(sequences.split_validation(800, 40, seed=3)[1], val), "no pool: a new split"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_offline_acceptance_equals_the_engine_at_the_same_anchors(target, kind):
    """tau_est's accepted runs, from one training-style forward over the target's greedy sequence, equal what
    the engine accepted at each of its verify steps (K = the drafter's maximum)."""
    drafter = load_drafter(kind, target) if kind == "dflash" else load_drafter(kind, target, k=7)  # K: all rows
    prompt = "Sam buys 3 packs of 12 eggs and uses 7 of them. How many eggs are left? Explain step by step."
    out = generate(target, prompt, drafter=drafter, max_new_tokens=64)
    seq = np.array(out.prompt_ids + out.token_ids, np.int32)
    steps = out.steps[:-1]  # the last step may run past the generated text
    batch = {"tokens": seq[None], "lengths": np.array([len(seq)]), "prompt_lens": np.array([len(out.prompt_ids)]),
             "anchors": np.array([[s.position for s in steps]], np.int32),
             "anchor_valid": np.ones((1, len(steps)), bool)}
    feats = distill.target_features(target.params, seq[None], cfg=target.cfg, capture=drafter.feature_layers)
    params = jax.tree.map(lambda a: a.astype(jnp.float32), drafter.params)
    if kind == "dflash":
        batch = sequences.add_hints(batch, drafter.cfg)  # the engine's lookup hints, if the drafter uses them
        runs = objectives.dflash_runs(params, drafter.cfg, drafter.head, feats, batch, drafter.vocab)
    else:
        runs = objectives.eagle3_runs(params, drafter.cfg, params.get("embed", target.params["embed"]),
                                      drafter.vocab.slots, feats, batch, drafter.k)
    assert np.asarray(runs)[0].tolist() == [s.accepted for s in steps]
    assert sum(s.accepted for s in steps) > 0  # a real check: the shipped drafters accept something here


def test_finetune_evaluates_its_init_and_keeps_it_when_training_never_beats_it(tmp_path):
    """With --init, step 0 is evaluated and logged; if no later tau_est beats it, the init is what comes back."""
    seqs = sequences.Sequences(np.arange(40, dtype=np.int32) % 7, sequences.offsets_of([10] * 4),
                                   np.full(4, 3, np.int32))
    args = train.parse_args(["--init", "some/checkpoint", "--steps", "4", "--eval-every", "2", "--batch", "2",
                                     "--seq-len", "10", "--anchors", "3", "--lr", "0.1", "--patience", "5"])

    def loss_fn(p, b, frozen):  # training pulls w toward 1 ...
        return (p["w"] - 1.0) ** 2, (jnp.zeros(()), b["anchor_valid"].sum())

    def runs_fn(p, b, frozen):  # ... while the accepted runs shrink as w grows
        return jnp.broadcast_to(jnp.floor(3.0 * (1.0 - p["w"])).astype(jnp.int32), b["anchors"].shape)

    best, log = loop.train("toy", loss_fn, runs_fn, {"w": jnp.zeros(())}, seqs, seqs, args, tmp_path, None, 3)
    assert [e["step"] for e in log["log"]] == [0, 2, 4] and log["log"][0]["loss"] is None
    assert log["log"][0]["tau_est"] == [2.0, 3.0, 4.0] and log["best"]["step"] == 0
    assert float(best["w"]) == 0.0
    assert "labels_per_s" not in log["log"][0] and all(e["labels_per_s"] > 0 for e in log["log"][1:])
    assert all(max(e["tau_est"]) < 4.0 for e in log["log"][1:])


def test_soft_target_loss_equals_cross_entropy_when_the_target_distribution_is_one_hot():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 5, 11)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 11, size=(3, 5)))
    ce = objectives.distill_loss(logits, labels, None, 0.0)
    one_hot = jax.nn.one_hot(labels, 11)
    for soft in (0.3, 1.0):
        np.testing.assert_allclose(objectives.distill_loss(logits, labels, one_hot, soft), ce, rtol=1e-5)
    spread = jax.nn.softmax(jnp.asarray(rng.normal(size=(3, 5, 11)), jnp.float32))  # a real distribution: KL differs
    assert not np.allclose(objectives.distill_loss(logits, labels, spread, 1.0), ce, rtol=1e-2)
    kl_self = objectives.distill_loss(jnp.log(spread), labels, spread, 1.0)
    np.testing.assert_allclose(kl_self, 0.0, atol=1e-5)  # KL(p || p) = 0


def test_soft_targets_are_the_targets_next_token_distribution_at_each_label(target):
    """Row k of anchor a is distributed as the target's prediction of token a+k (self-distilled data: its argmax
    is the label itself), for DFlash blocks and EAGLE-3 TTT steps alike."""
    ar = load_drafter("ar", target)
    prompt = target.encode("Name three fruits.")
    tokens = np.array([np.concatenate([prompt, generate(target, "Name three fruits.", drafter=ar,
                                                        max_new_tokens=12).token_ids])], np.int32)
    feats_of = sequences.features_fn(target, (1, 8))
    feats, last = feats_of({"tokens": jnp.asarray(tokens)}, with_last=True)
    assert feats.shape == (1, tokens.shape[1], 2 * target.cfg.hidden_size)
    head = shared_head(target.params)
    anchors = jnp.asarray([[len(prompt) - 1, len(prompt) + 3]])
    rows = anchors[..., None] + jnp.arange(4)  # block rows 1..4 predict tokens a+1..a+4 from hidden rows a..a+3
    probs = objectives.next_token_probs(head, last, rows)
    assert probs.shape == (1, 2, 4, target.cfg.vocab_size)
    np.testing.assert_array_equal(np.argmax(probs, -1)[0], tokens[0][np.asarray(rows[0]) + 1])
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


def test_a_label_the_draft_vocabulary_lacks_trains_the_hint_column_when_it_is_its_rows_hint():
    """With oov_hints, a label outside the restricted vocabulary is trained on when the lookup hint of its row is
    that token (the hint column, index Vd); otherwise it stays no label. Soft targets get the same column."""
    vocab, mask = 12, 11
    draft_ids = np.array([0, 2, 4, 6, 8])  # Vd = 5: odd ids lie outside
    draft_vocab = from_ids(draft_ids, vocab, "DFlash")
    to_vocab = np.asarray(draft_vocab.slots)
    tokens = jnp.asarray([[0, 2, 3, 5, 4, 7, 6, 9]])
    anchors, anchor_valid = jnp.asarray([[1]]), jnp.asarray([[True]])
    hints = jnp.asarray([[[3, 9, 4, 7, mask, 2]]])  # rows predict 3 5 4 7 6 9: hinted outside, wrong, inside, outside
    args = (jnp.asarray(to_vocab), tokens, jnp.asarray([8]), anchors, anchor_valid, 7)
    labels, valid = objectives.dflash_labels_in(*args)
    assert valid[0, 0].tolist() == [False, False, True, False, True, False]
    labels, valid = objectives.dflash_labels_in(*args, jnp.where(hints != mask, hints, -1), 5)
    assert valid[0, 0].tolist() == [True, False, True, True, True, False]
    assert labels[0, 0].tolist()[:4] == [5, 0, 2, 5]

    body = ModelConfig("qwen3", vocab, 4, 8, 1, 1, 1, 4, 1e-6, 1e4, 64)
    cfg = dflash_config.DFlashConfig(body, 7, mask, (0,), 1, lookup_hints=3, oov_hints=True)
    rng = np.random.default_rng(0)
    embed = jnp.asarray(rng.normal(size=(vocab, 4)), jnp.float32)
    head = dflash.restricted_head({"embed": embed}, draft_vocab)
    last = jnp.asarray(rng.normal(size=(1, 8, 4)), jnp.float32)
    rows = anchors[..., None] + jnp.arange(6)
    probs = objectives.next_token_probs(head, last, rows, lambda h, lg: dflash.hint_column(cfg, head, h, lg, hints))
    full = last[0, np.asarray(rows[0, 0])] @ embed.T  # the target's logits over its whole vocabulary, rows 1..6
    for j, hint in enumerate(np.asarray(hints[0, 0])):
        outside = hint != mask and to_vocab[hint] < 0
        kept = np.concatenate([full[j, draft_ids], full[j, [hint]] if outside else [-np.inf]])
        np.testing.assert_allclose(probs[0, 0, j], jax.nn.softmax(kept), rtol=1e-5, atol=1e-7)
    untied = dflash.restricted_head({"embed": jnp.zeros_like(embed), "lm_head": embed.T}, draft_vocab)  # own LM head
    np.testing.assert_allclose(objectives.next_token_probs(
        untied, last, rows, lambda h, lg: dflash.hint_column(cfg, untied, h, lg, hints)), probs, rtol=1e-5, atol=1e-7)


def test_anchors_cover_every_valid_response_position_when_enough_are_asked():
    rng = np.random.default_rng(1)
    lengths, prompt_lens = np.array([300, 40, 9, 20]), np.array([30, 39, 9, 5])
    anchors, valid = sequences.sample_anchors(rng, lengths, prompt_lens, 512)
    assert anchors.shape == (4, 512)
    for a, v, n, p in zip(anchors, valid, lengths, prompt_lens, strict=True):
        assert a[v].tolist() == list(range(p - 1, n - 1))  # every anchor whose next token is a response token
        assert not a[~v].any()


def test_length_buckets_cover_every_sequence_and_pad_each_batch_to_its_bucket():
    lengths = np.array([5, 60, 64, 65, 130, 500, 7, 200])
    seqs = sequences.Sequences(np.zeros(lengths.sum(), np.int32), sequences.offsets_of(lengths),
                                   np.full(len(lengths), 2, np.int32))
    args = train.parse_args(["--bucket", "64", "--seq-len", "448", "--batch", "2", "--anchors", "4"])
    buckets = sequences.length_buckets(seqs, args.seq_len, args.bucket)
    assert sorted(np.concatenate(buckets).tolist()) == list(range(len(lengths)))  # a partition
    assert [sorted(b.tolist()) for b in buckets] == [[0, 1, 2, 6], [3], [4], [7], [5]]
    seen = set()
    for step in range(60):
        batch = sequences.train_batch(seqs, args, step, None, buckets)
        width = batch["tokens"].shape[1]
        assert width == min(448, -(-int(batch["lengths"].max()) // 64) * 64)  # the longest, rounded up to 64
        seen |= {width}
    assert seen == {64, 128, 192, 256, 448}  # every bucket is drawn
    every = train.parse_args(["--bucket", "64", "--batch", "3", "--anchors", "512"])
    for step in range(20):  # anchor columns: as many as the fullest sequence needs, rounded up to the bucket
        batch = sequences.train_batch(seqs, every, step, None, buckets)
        fill = batch["lengths"] - batch["prompt_lens"]  # every response position is an anchor
        assert batch["anchor_valid"].sum(1).tolist() == fill.tolist()
        assert batch["anchors"].shape[1] == -(-int(fill.max()) // 64) * 64
    assert sequences.length_buckets(seqs, 448, 0)[0].tolist() == list(range(len(lengths)))
    args0 = train.parse_args(["--bucket", "0", "--batch", "2"])
    assert sequences.train_batch(seqs, args0, 0, None, [np.arange(len(lengths))])["tokens"].shape[1] == 448


def test_a_batch_seed_draws_new_batches_and_leaves_the_validation_split_alone():
    lengths = np.arange(10, 50)
    seqs = sequences.Sequences(np.arange(lengths.sum(), dtype=np.int32), sequences.offsets_of(lengths),
                                   np.full(len(lengths), 2, np.int32))
    buckets = [np.arange(len(lengths))]

    def rows(*extra):
        args = train.parse_args(["--bucket", "0", "--batch", "4", "--seq-len", "64", *extra])
        return [sequences.train_batch(seqs, args, step, None, buckets)["lengths"].tolist() for step in range(8)]

    assert rows() == rows("--batch-seed", "0")  # the default is --seed
    assert rows() != rows("--batch-seed", "1")
    assert rows("--seed", "5") == rows("--seed", "5", "--batch-seed", "5")


def test_annotations_stored_exported_and_trained_on_are_exactly_those_prefixes(target, tmp_path):
    """History -> export -> train_drafter --export: three annotated rejections become three training prefixes (the
    prompt, the tokens emitted before that step and the drafts before the rejected one), each continued by the
    target, and a fine-tune runs on them."""
    from storage import export_annotations, open_history

    history = open_history(tmp_path / "h.duckdb")
    prompt = "Say it three times: red, green, blue; red, green, blue; red, green"
    run = generate(target, prompt, drafter=load_drafter("ngram", target, k=4), max_new_tokens=32)
    run_id = history.write_run(run.to_dict(), prompt=prompt)
    rejected = [s for s in run.steps if s.accepted < len(s.drafted)][:3]
    assert len(rejected) == 3
    for s in rejected:
        history.save_annotation(run_id, s.index, s.accepted, "number", "")
    export_annotations(history, tmp_path / "export")
    emitted_before = {s.index: [t for e in run.steps[:s.index] for t in e.emitted] for s in rejected}
    expected = sorted(run.prompt_ids + emitted_before[s.index] + s.drafted[:s.accepted] for s in rejected)
    seqs = sequences.export_sequences(target, tmp_path / "export", 1, 4, ())
    prefixes = sorted(seqs.tokens[seqs.offsets[i]:seqs.offsets[i] + seqs.prompt_lens[i]].tolist()
                      for i in range(len(seqs)))
    assert prefixes == expected
    cfg, params = init_dflash(target, num_layers=1, block_size=4, intermediate_size=64, seed=0)
    init = save_dflash(tmp_path / "init", cfg, params)
    out = _train(tmp_path, init, tmp_path / "export", "chain", steps=1)
    assert json.loads((out / "training.json").read_text())["data"]["export"] == str(tmp_path / "export")


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_init_top_starts_the_drafter_layers_from_the_targets_top_layers(kind, tmp_path):
    """--init-top: every tensor the target layer also has is the target's (its leading slice for a narrower FFN);
    the rest stay as initialised."""
    from experiments.training.objectives import OBJECTIVES
    from experiments.training.train import parse_args
    from tests.test_app_tiny import tiny_llama

    tiny_llama(tmp_path / "t", layers=4)
    target = load_target(str(tmp_path / "t"))
    data = sequences.Sequences(np.arange(40, dtype=np.int32) % 50 + 10, np.array([0, 20, 40]),
                                   np.array([5, 5]), None)
    flags = ["--drafter", kind, "--layers", "2", "--features", "2", "--intermediate", "16", "--draft-vocab", "64"]
    fresh = OBJECTIVES[kind](target, data, parse_args(flags)).params
    top = OBJECTIVES[kind](target, data, parse_args([*flags, "--init-top"])).params
    drafted = top["layers"] if kind == "dflash" else [top["layer"]]
    before = fresh["layers"] if kind == "dflash" else [fresh["layer"]]
    tl = target.params["layers"][-len(drafted):]
    for layer, old, src in zip(drafted, before, tl, strict=True):
        for name in ("attn_norm", "wo", "w_down", "w_gate", "mlp_norm"):
            want = np.asarray(src[name], np.float32)[tuple(slice(0, n) for n in layer[name].shape)]
            np.testing.assert_array_equal(np.asarray(layer[name]), want)
        assert layer["w_gate"].shape[1] == 16 < src["w_gate"].shape[1]  # the narrower FFN: its first units
        kept = ["q_norm", "k_norm"] if kind == "dflash" else ["wq", "hidden_norm"]  # not in the target, or wider
        for name in kept:
            np.testing.assert_array_equal(np.asarray(layer[name]), np.asarray(old[name]))
    np.testing.assert_array_equal(np.asarray(top["fc"]), np.asarray(fresh["fc"]))
