"""The decoding loop on the embedded model: lossless drafters, traces, statistics, compile counts, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from engine import (
    CheckpointError,
    DrafterError,
    GenerationError,
    StepTrace,
    compile_count,
    generate,
    generate_batch,
    load_drafter,
    load_target,
    stream,
    warm_up,
)
from engine.decode import narrower, next_width
from tests.prompts import LOSSLESS_PROMPTS, NON_ASCII_PROMPTS

MAX_NEW = 40


@pytest.fixture(scope="module")
def ar_outputs(greedy):
    return [greedy(p, MAX_NEW).token_ids for p in LOSSLESS_PROMPTS]


@pytest.mark.parametrize("k", [3, 8])
def test_ngram_greedy_is_lossless_on_20_prompts(target, ar_outputs, k):
    drafter = load_drafter("ngram", target, k=k)
    for prompt, expected in zip(LOSSLESS_PROMPTS, ar_outputs, strict=True):
        assert generate(target, prompt, drafter=drafter, max_new_tokens=MAX_NEW).token_ids == expected, prompt


def test_trace_records_are_consistent(target):
    drafter = load_drafter("ngram", target, k=4)
    prompt = "Repeat after me: one two three, one two three, one two three."
    gen = stream(target, prompt, drafter=drafter, max_new_tokens=30)
    steps = []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as done:
            result = done.value
            break
    assert steps == result.steps and all(isinstance(s, StepTrace) for s in steps)
    assert [t for s in steps for t in s.emitted] == result.token_ids
    assert any(s.accepted > 0 for s in steps), "a repetitive prompt should get some n-gram drafts accepted"
    for s in steps:
        assert 0 <= s.accepted <= len(s.drafted) <= 4
        assert len(s.p) == len(s.q) == len(s.drafted) == len(s.drafted_text)
        assert len(s.top5_ids) == len(s.top5_p) == len(s.drafted) + 1 and all(len(r) == 5 for r in s.top5_ids)
        assert s.emitted[:s.accepted] == s.drafted[:s.accepted]
        # greedy: every accepted draft is the target's argmax, the bonus is the argmax after them
        assert all(s.top5_ids[i][0] == s.drafted[i] for i in range(s.accepted))
        assert s.bonus == s.top5_ids[s.accepted][0]
        assert all(0.0 <= p <= 1.0 for p in s.p) and s.draft_ms >= 0 and s.verify_ms > 0
    st = result.stats
    assert st["n_steps"] == len(steps) and st["n_generated"] == len(result.token_ids)
    assert st["tau"] == pytest.approx(len(result.token_ids) / len(steps))
    assert st["acceptance_rate"] == pytest.approx(sum(s.accepted for s in steps) / sum(len(s.drafted) for s in steps))
    assert result.text == target.decode(result.token_ids)
    json.dumps(result.to_dict())  # plain data all the way down


@pytest.mark.parametrize("text", ["🚀🌍✨ héllo", "日本の首都は", "한국어 문장"])
def test_piece_texts_merge_byte_pieces_wherever_a_block_starts(target, text):
    """Token texts in context never hold a half character: each block's texts join to exactly the text it adds,
    whichever token the block starts at, and the character split over byte pieces shows once, whole."""
    ids = target.tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in t for t in target.token_texts(ids))  # some tokens are byte pieces on their own
    for split in range(1, len(ids)):
        texts = target.piece_texts(ids[split:], ids[:split])
        assert len(texts) == len(ids) - split and not any("\ufffd" in t for t in texts), (split, texts)
        before = target.tokenizer.decode(ids[:split]).rstrip("\ufffd")
        assert before + "".join(texts) == text, split


def test_a_run_of_non_ascii_text_stores_whole_characters(target):
    """The emitted tokens' texts, in order, read exactly as the decoded output after the prompt."""
    for prompt in NON_ASCII_PROMPTS:
        result = generate(target, prompt, load_drafter("ngram", target, k=4), max_new_tokens=24)
        pieces = [t for s in result.steps for t in (s.drafted_text[:s.accepted] + [s.bonus_text])[:len(s.emitted)]]
        before = target.tokenizer.decode(result.prompt_ids)
        whole = target.tokenizer.decode(result.prompt_ids + result.token_ids).rstrip("\ufffd")  # cut mid-character
        assert "".join(pieces) == whole[len(before):]
        assert not any("\ufffd" in t for t in pieces), (prompt, pieces)


BATCH_ROWS = {1: [7], 4: [0, 7, 15, 18], 16: list(range(16))}


@pytest.mark.parametrize("batch", sorted(BATCH_ROWS))
@pytest.mark.parametrize("name", ["ar", "ngram", "dflash", "eagle3"])
def test_batch_is_lossless_per_sequence_with_ragged_lengths(target, ar_outputs, name, batch):
    """Prompts of different lengths verified together, every step's drafts for the whole batch from one drafter
    call: each sequence's tokens equal its greedy output alone, each keeps its own positions, and finished
    sequences stop while the others go on."""
    rows = BATCH_ROWS[batch]
    prompts = [LOSSLESS_PROMPTS[i] for i in rows]
    drafter = load_drafter(name, target, k=None if name == "ar" else 4)
    results = generate_batch(target, prompts, drafter, max_new_tokens=MAX_NEW)
    assert batch == 1 or len({len(r.prompt_ids) for r in results}) > 1, "prompts should have ragged lengths"
    for i, res in zip(rows, results, strict=True):
        assert res.token_ids == ar_outputs[i], LOSSLESS_PROMPTS[i]
        assert [t for s in res.steps for t in s.emitted] == res.token_ids
        positions = np.cumsum([len(res.prompt_ids) - 1] + [len(s.emitted) for s in res.steps[:-1]])
        assert [s.position for s in res.steps] == positions.tolist()
        assert res.settings["batch"] == batch and res.stats["n_steps"] == len(res.steps)
    if name != "ar" and batch > 1:
        assert len({r.stats["n_steps"] for r in results}) > 1, "sequences should finish after different steps"
        assert sum(r.stats["accepted"] for r in results) > 0


SHIPPED_PROMPTS = LOSSLESS_PROMPTS[:12] + NON_ASCII_PROMPTS  # code, math, chat and non-ASCII: 16 prompts


@pytest.fixture(scope="module")
def shipped_refs(greedy):
    return [greedy(p, MAX_NEW).token_ids for p in SHIPPED_PROMPTS]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", ["dflash", "eagle3"])
def test_shipped_trained_drafters_are_lossless_with_many_drafts_accepted(target, shipped_refs, name, batch):
    """The shipped checkpoints (trained: most drafts are real tokens) on 16 varied prompts, alone and 4 at a time:
    every sequence is the target's greedy output, and enough drafts were accepted for that to mean something."""
    drafter = load_drafter(name, target, k=4)
    results = [r for i in range(0, len(SHIPPED_PROMPTS), batch)
               for r in generate_batch(target, SHIPPED_PROMPTS[i:i + batch], drafter, max_new_tokens=MAX_NEW)]
    for prompt, res, want in zip(SHIPPED_PROMPTS, results, shipped_refs, strict=True):
        assert res.token_ids == want, prompt
    accepted = [r.stats["accepted"] for r in results]
    assert sum(accepted) >= 8 * len(results) and sum(a > 0 for a in accepted) >= 12, accepted


@pytest.mark.parametrize("name", ["dflash", "eagle3"])
def test_batched_drafting_compiles_nothing_after_warmup(target, name):
    """The batch size and every width it narrows to are static shapes warm_up compiles: two batches of other ragged
    prompts (sequences finishing at different steps, the batch narrowing as they do) compile nothing."""
    drafter = load_drafter(name, target, k=4)
    warm_up(target, LOSSLESS_PROMPTS[:4], drafter, max_new_tokens=16)
    for prompts in (LOSSLESS_PROMPTS[8:12], LOSSLESS_PROMPTS[4:8]):
        results = generate_batch(target, prompts, drafter, max_new_tokens=16)
        assert [r.stats["compiles"] for r in results] == [0] * 4


def test_the_batch_narrows_as_sequences_finish():
    assert [next_width(w) for w in (16, 12, 8, 6, 4, 3, 2, 5, 7)] == [12, 8, 6, 4, 3, 2, 1, 4, 6]
    assert [narrower(16, n) for n in (16, 13, 12, 9, 8, 5, 4, 3, 2, 1)] == [16, 16, 12, 12, 8, 6, 4, 3, 2, 1]
    assert [narrower(6, n) for n in (5, 4, 1)] == [6, 4, 1] and narrower(1, 1) == 1


def test_no_recompilation_after_warmup(target):
    drafter = load_drafter("ngram", target, k=5)
    generate(target, "Warm up the compiled step functions.", drafter=drafter, max_new_tokens=16)
    before = compile_count()
    result = generate(target, "Now a different prompt of another length, please answer.", drafter=drafter,
                      max_new_tokens=16)
    assert result.stats["compiles"] == 0 and compile_count() == before


@pytest.mark.parametrize("name", ["ar", "ngram", "dflash", "eagle3"])
def test_warm_up_compiles_a_long_prompt_without_prefilling_it(target, name):
    """warm_up runs a one-chunk stand-in in the long prompt's cache size: the run after it compiles nothing, and its
    prefill reports each of its chunks in order."""
    drafter = load_drafter(name, target, k=None if name == "ar" else 4)
    prompt = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 60  # ~600 tokens: 10 chunks
    warm_up(target, [prompt], drafter, max_new_tokens=8)
    progress = []
    result = generate(target, prompt, drafter, max_new_tokens=8, on_prefill=lambda *a: progress.append(a))
    total = -(-(len(result.prompt_ids) - 1) // 64)
    assert total >= 9 and progress == [(i, total) for i in range(1, total + 1)]
    assert result.stats["compiles"] == 0


def test_no_recompilation_after_warmup_when_sampling_in_a_larger_cache_bucket(target):
    """T > 0 (the sampling verify program) with prompts long enough for the second cache bucket: after one warm-up
    run, another prompt of another length in that bucket, another seed and temperature compiles nothing."""
    drafter = load_drafter("ngram", target, k=5)
    first = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 22
    second = "Summarise this, please: " + "a stitch in time saves nine, they say. " * 25
    lengths = [len(target.encode(p)) for p in (first, second)]
    assert lengths[0] != lengths[1] and all(256 < n + 16 + 7 <= 512 for n in lengths), lengths  # bucket 512, not 256
    generate(target, first, drafter=drafter, max_new_tokens=16, temperature=0.8, seed=1)
    before = compile_count()
    result = generate(target, second, drafter=drafter, max_new_tokens=16, temperature=0.6, top_p=0.9, seed=2)
    assert result.stats["compiles"] == 0 and compile_count() == before


def test_sampling_changes_with_seed_and_is_reproducible(target):
    drafter = load_drafter("ngram", target, k=4)
    kw = dict(drafter=drafter, max_new_tokens=24, temperature=1.0, top_p=0.95)
    a = generate(target, "Write a creative sentence about the sea.", seed=1, **kw).token_ids
    b = generate(target, "Write a creative sentence about the sea.", seed=1, **kw).token_ids
    c = generate(target, "Write a creative sentence about the sea.", seed=2, **kw).token_ids
    assert a == b and a != c


@pytest.mark.parametrize("prompt,kw,match", [
    ("", {}, "empty"),
    ("   \n", {}, "empty"),
    ("hello", {"max_new_tokens": 0}, "max_new_tokens"),
    ("word " * 9000, {}, "context"),
    ("hello", {"max_new_tokens": 8190}, "exceeds"),
    ("hello", {"temperature": -1.0}, "temperature"),
])
def test_bad_generation_input_is_a_clear_error(target, prompt, kw, match):
    with pytest.raises(GenerationError, match=match):
        generate(target, prompt, **kw)


@pytest.mark.parametrize("name,k,match", [("ngram", 0, "1..64"), ("ngram", 65, "1..64"), ("ngram", -3, "1..64"),
                                          ("nonsense", 4, "unknown drafter")])
def test_bad_drafter_choice_is_a_clear_error(target, name, k, match):
    with pytest.raises(DrafterError, match=match):
        load_drafter(name, target, k=k)


def test_bad_checkpoint_paths_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_target(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        load_target(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_target(bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(CheckpointError, match="lacks required field"):
        load_target(bad)
    (tmp_path / "x.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(CheckpointError, match="GGUF"):
        load_target(tmp_path / "x.gguf")
    with pytest.raises(CheckpointError, match="dtype"):
        load_target(None, dtype="float8")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_generate_cli_json_and_lossless(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Count from 1 to 5."}) + "\n"
                       + json.dumps({"id": "b", "prompt": "Say hi."}) + "\n")
    out = _cli("engine.generate", "--prompt-file", str(prompts), "--drafter", "ngram", "--k", "3",
               "--max-new-tokens", "12", "--json", "--check-lossless")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"]
    for r in rows:
        assert r["lossless"] is True and 1 <= len(r["token_ids"]) <= 12
        assert {"text", "tau", "acceptance_rate", "tok_per_s", "wall_s", "steps"} <= set(r)
        assert set(r["steps"][0]) == {"drafted", "accepted", "bonus", "draft_ms", "verify_ms"}
        assert r["compiles"] == 0 and r["warmup_s"] > 0  # tok/s is timed warm; the warm-up is reported apart
    assert rows[0]["warmup_compiles"] > 0  # a fresh process compiles in the first warm-up, not in the timed run
    bad = _cli("engine.generate", "--prompt", "", "--drafter", "ar")
    assert bad.returncode == 2 and "empty" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_kflat_cli_json():
    out = _cli("experiments.bench.kflat", "--ks", "1,4", "--context", "32", "--drafter", "ngram", "--repeats", "1",
               "--json", "--no-store")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["k"] for r in rows] == [1, 4]
    assert all(r["verify_ms"] > 0 and r["draft_ms"] >= 0 for r in rows)


def test_prompt_ids_are_chat_formatted_unless_raw(target):
    chat = target.encode("hi")
    raw = target.encode("hi", raw=True)
    assert len(chat) > len(raw) and np.all(raw == target.tokenizer("hi")["input_ids"])
    assert target.tokenizer.decode(chat).startswith("<|im_start|>")


def test_kflat_times_random_weights_from_a_config(tmp_path, capsys):
    """Sweeps where weights cannot travel (e.g. a lent GPU): a config.json alone, random weights of its shapes."""
    from experiments.bench import kflat

    conf = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    assert kflat.main(["--target", str(tmp_path / "config.json"), "--random-weights", "--ks", "1,3", "--context", "16",
                      "--repeats", "1", "--json", "--no-store"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["k"] for r in rows] == [1, 3] and all(r["verify_ms"] > 0 for r in rows)
