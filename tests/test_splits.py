"""Sealed test slices: each suite's fixed dev/test cut, and the leak guards that keep every choice off the test slice
(train_drafter and distill refuse suite data, --export drops suite prompts, selection tools read dev only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.data import distill
from experiments.suites import DEV_PER_CATEGORY, SUITES, SealedSplitError, check_not_test, load_suite
from experiments.training import sequences, train

REPO = Path(__file__).resolve().parent.parent
SIZES = {"gsm8k": (20, 80), "humaneval": (20, 144), "mtbench": (16, 64)}


@pytest.mark.parametrize("name", SUITES)
def test_each_suite_has_a_fixed_dev_slice_and_a_sealed_test_slice_of_everything_else(name):
    rows = load_suite(name)
    dev, test = load_suite(name, split="dev"), load_suite(name, split="test")
    assert (len(dev), len(test)) == SIZES[name]
    assert {r["id"] for r in dev}.isdisjoint(r["id"] for r in test)
    assert sorted(r["id"] for r in dev + test) == sorted(r["id"] for r in rows)
    per_category: dict = {}
    for r in rows:  # the first DEV_PER_CATEGORY of each category in the wheel's order, the rest test
        per_category[r["category"]] = per_category.get(r["category"], 0) + 1
        assert r["split"] == ("dev" if per_category[r["category"]] <= DEV_PER_CATEGORY[name] else "test")
    assert load_suite(name, limit=3, split="test") == test[:3]  # a limit takes the first of the slice


def test_the_cut_is_pinned():
    """Moving the cut would unseal prompts that knobs were chosen on: the slices' edges are fixed here."""
    assert [r["id"] for r in load_suite("gsm8k", split="dev")][::19] == ["gsm8k-test-0013", "gsm8k-test-0228"]
    assert load_suite("humaneval", split="test")[0]["id"] == "HumanEval/20"
    mt = load_suite("mtbench", split="dev")
    assert len({r["category"] for r in mt}) == 8 and [r["id"] for r in mt][:3] == ["81", "82", "91"]


def test_a_jsonl_file_has_no_slices_and_a_bad_split_is_refused(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n')
    assert load_suite(str(path), split="test") == [{"id": "a", "prompt": "hi", "category": None, "split": None}]
    with pytest.raises(ValueError, match="split must be one of dev, test"):
        load_suite("gsm8k", split="train")


def test_selection_tools_refuse_the_test_slice():
    check_not_test("dev", "a sweep")
    check_not_test(None, "a sweep")
    with pytest.raises(SealedSplitError, match="a sweep reads the dev slice only: the test slice is sealed"):
        check_not_test("test", "a sweep")


def _suite_dataset(tmp_path: Path, source: str) -> Path:
    d = tmp_path / source.replace(":", "-").replace("/", "-")
    shutil.copytree(REPO / "data" / "eval-gsm8k", d)
    manifest = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**manifest, "prompt_source": source}))
    return d


def test_the_shipped_evaluation_sets_are_dev_slices():
    for name in ("gsm8k", "humaneval"):
        manifest = distill.read_manifest(REPO / "data" / f"eval-{name}")
        assert distill.suite_slice(manifest["prompt_source"]) == (name, "dev")
        distill.check_suite_data([REPO / "data" / f"eval-{name}"], training=False, what="t")
    rows = distill.prompt_rows("suite:gsm8k/dev", 100, 0, None)  # what distill --suite answers: dev prompts only
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in load_suite("gsm8k", split="dev")]


def test_the_dataset_guard_refuses_training_on_suites_and_selecting_on_a_test_slice(tmp_path):
    dev, test, legacy = (_suite_dataset(tmp_path, s) for s in ("suite:gsm8k/dev", "suite:gsm8k/test", "suite:gsm8k"))
    training = REPO / "data" / "distill-v2"
    distill.check_suite_data([training], training=True, what="t")
    distill.check_suite_data([training, dev], training=False, what="t")
    with pytest.raises(SealedSplitError, match="holds prompts of the gsm8k suite"):
        distill.check_suite_data([training, dev], training=True, what="t")
    with pytest.raises(SealedSplitError, match="the test slice is sealed"):
        distill.check_suite_data([test], training=False, what="t")
    with pytest.raises(SealedSplitError, match="records no slice of the gsm8k suite: rebuild it"):
        distill.check_suite_data([legacy], training=False, what="t")


def test_train_drafter_stops_before_anything_loads_when_the_data_would_leak(tmp_path):
    test = _suite_dataset(tmp_path, "suite:gsm8k/test")
    with pytest.raises(SystemExit, match="never trains on evaluation prompts"):
        train.main(["--data", str(REPO / "data" / "eval-gsm8k"), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="the test slice is sealed"):
        train.main(["--data", str(test), "--evaluate", "checkpoints/smollm2-135m-dflash"])


def test_export_rows_of_suite_prompts_are_dropped_before_training(tmp_path, capsys):
    suite_prompt = load_suite("humaneval", split="test")[5]["prompt"]
    rows = [{"id": 1, "prompt": "Tell me about the weather in a small mountain town today.", "prefix_ids": [1]},
            {"id": 2, "prompt": suite_prompt, "prefix_ids": [2]},
            {"id": 3, "prompt": load_suite("gsm8k", split="dev")[0]["prompt"], "prefix_ids": [3]}]
    assert [r["id"] for r in sequences.trainable_rejections(rows, tmp_path)] == [1]
    assert "2 of 3 rejections are of suite prompts, dropped" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no rejection left"):
        sequences.trainable_rejections(rows[1:], tmp_path)
    with pytest.raises(SystemExit, match="predates the prompt field"):
        sequences.trainable_rejections([{"id": 1, "prefix_ids": [1]}], tmp_path)
