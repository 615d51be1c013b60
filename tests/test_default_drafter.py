"""The app preselects the drafter (and K) with the best speedup measured like for like on this hardware."""

from __future__ import annotations

import json
import shutil

import jax
import pytest

from app.state import Workbench
from app.tabs.common import best_drafter
from engine import generate
from engine.drafters import eagle3_config
from storage import open_history

PROMPTS = ["Count from one to ten in words.", "What is 7 times 8? Answer briefly.", "Name three colours."]


@pytest.fixture
def workbench(target, tmp_path):
    """ar, ngram and a copy of the shipped EAGLE-3 whose model card holds no measurements yet."""
    ckpt = shutil.copytree(eagle3_config.DEFAULT_CHECKPOINT, tmp_path / "eagle3")
    card = json.loads((ckpt / "training.json").read_text())
    card.pop("measured", None)
    (ckpt / "training.json").write_text(json.dumps(card))
    wb = Workbench(target, open_history(tmp_path / "history.duckdb"), [], tmp_path)
    for label, source in (("ar", "ar"), ("ngram", "ngram"), ("eagle3", str(ckpt))):
        assert wb.try_drafter(label, source)
    return wb, ckpt


@pytest.mark.slow
def test_default_drafter_is_the_best_measured_pairing_with_ar(workbench):
    wb, _ = workbench
    assert wb.measured_speedups() == {} and best_drafter(wb) == "ngram"  # nothing measured yet
    for i, prompt in enumerate(PROMPTS):
        for label, k in (("ar", None), ("ngram", 4), ("eagle3", 3)):
            run = generate(wb.target, prompt, wb.drafter(label, k), max_new_tokens=16)
            wb.history.write_run(run.to_dict(), prompt=prompt, comparison_group=f"pair-{i}", source="test")
    decode, tokens = {}, {}
    for r in wb.history.query("SELECT drafter, decode_s, n_generated FROM runs"):
        decode[r["drafter"]] = decode.get(r["drafter"], 0.0) + r["decode_s"]
        tokens[r["drafter"]] = tokens.get(r["drafter"], 0) + r["n_generated"]
    rate = {name: tokens[name] / decode[name] for name in decode}
    expected = {name: rate[name] / rate["ar"] for name in ("ngram", "eagle3")}
    measured = wb.measured_speedups()
    assert measured["ngram"] == (pytest.approx(expected["ngram"]), 4)
    assert measured["eagle3"] == (pytest.approx(expected["eagle3"]), 3)
    assert best_drafter(wb) == max(expected, key=expected.get)


def test_model_card_measurements_count_only_on_the_same_device_kind(workbench):
    wb, ckpt = workbench
    card = json.loads((ckpt / "training.json").read_text())
    here = jax.devices()[0].device_kind
    card["measured"] = [{"suite": "gsm8k", "k": 5, "speedup": 1.7, "device_kind": here},
                        {"suite": "gsm8k", "k": 9, "speedup": 3.0, "device_kind": "some accelerator"}]
    (ckpt / "training.json").write_text(json.dumps(card))
    assert wb.measured_speedups() == {"eagle3": (1.7, 5)}
    assert best_drafter(wb) == "eagle3"
