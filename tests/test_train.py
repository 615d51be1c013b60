"""Drafter training: self-distilled data, annotation-export fine-tuning, determinism, resume, loadable output."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from engine import generate, load_drafter
from engine.drafters.dflash import init_dflash, save_dflash
from experiments import train_drafter
from experiments.train_data import build_prompts


def test_training_prompts_are_distinct_and_not_from_the_suites():
    from experiments.suites import load_suite

    prompts = build_prompts(300, seed=0)
    texts = [p["prompt"] for p in prompts]
    assert len(set(texts)) == len(texts) == 300
    assert {p["kind"] for p in prompts} == {"math", "code", "chat"}
    evaluation = {r["prompt"] for s in ("gsm8k", "humaneval", "mtbench") for r in load_suite(s)}
    assert not evaluation & set(texts)
    assert build_prompts(50, seed=0) == prompts[:50]  # deterministic given the seed


@pytest.fixture(scope="module")
def export_dir(target, tmp_path_factory):
    """A minimal annotation export: two rejection records with their prefixes."""
    out = tmp_path_factory.mktemp("export")
    rows = [{"id": i, "prefix_ids": target.encode(p).tolist()} for i, p in enumerate(["What is 3 + 4?", "Say hi."])]
    (out / "rejections.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, [len(r["prefix_ids"]) for r in rows]


def _train(tmp_path, init, export, name, steps=2, work="work"):
    args = ["--drafter", "dflash", "--init", str(init), "--export", str(export), "--export-weight", "2",
            "--samples", "2", "--max-new", "8", "--gen-batch", "4", "--steps", str(steps), "--batch", "2",
            "--seq-len", "64", "--anchors", "2", "--out", str(tmp_path / "out"), "--name", name,
            "--work", str(tmp_path / work), "--data", str(tmp_path / "data.npz"), "--seed", "3"]
    train_drafter.main(args)
    return tmp_path / "out" / f"{name}-dflash"


def test_finetune_from_export_is_deterministic_resumable_and_loadable(target, export_dir, tmp_path):
    export, prefix_lens = export_dir
    cfg, params = init_dflash(target, num_layers=1, block_size=4, intermediate_size=64, seed=0)
    init = save_dflash(tmp_path / "init", cfg, params)
    a = _train(tmp_path, init, export, "a")
    data = np.load(tmp_path / "data.npz")
    # 2 generated prompts + each export prefix twice (the weight), all continued by the target
    assert len(data["prompt_lens"]) == 6
    assert sorted(data["prompt_lens"].tolist()).count(prefix_lens[0]) >= 2
    b = _train(tmp_path, init, export, "b", work="work-b")
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(np.array_equal(ta[k], tb[k]) for k in ta), "same seed, same data: same weights"
    assert any(not np.array_equal(ta[k], load_file(str(init / "model.safetensors"))[k].astype(ta[k].dtype))
               for k in ta), "training changed the weights"
    card = json.loads((a / "training.json").read_text())
    assert card["training"]["steps"] == 2 and card["hardware"]["backend"] == "cpu"
    resumed = _train(tmp_path, init, export, "a", steps=3)  # same work dir: continues from step 2
    assert json.loads((resumed / "training.json").read_text())["training"]["steps"] == 3
    drafter = load_drafter(str(resumed), target, k=3)
    ar = generate(target, "What is 3 + 4?", max_new_tokens=12)
    assert generate(target, "What is 3 + 4?", drafter=drafter, max_new_tokens=12).token_ids == ar.token_ids
