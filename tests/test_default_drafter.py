"""The app preselects the drafter (and K) with the best speedup measured like for like on this hardware."""

from __future__ import annotations

import pytest

from app.state import Workbench
from app.tabs.common import best_drafter
from engine import generate
from storage import open_history

PROMPTS = ["Count from one to ten in words.", "What is 7 times 8? Answer briefly.", "Name three colours."]


@pytest.mark.slow
def test_default_drafter_is_the_best_measured_pairing_with_ar(target, tmp_path):
    wb = Workbench(target, open_history(tmp_path / "history.duckdb"), [], tmp_path)
    for name in ("ar", "ngram", "eagle3"):
        assert wb.try_drafter(name, name)
    assert wb.measured_speedups() == {} and best_drafter(wb) == "ngram"  # nothing measured yet
    for i, prompt in enumerate(PROMPTS):
        for label, k in (("ar", None), ("ngram", 4), ("eagle3", 3)):
            run = generate(target, prompt, wb.drafter(label, k), max_new_tokens=16)
            wb.history.write_run(run.to_dict(), prompt=prompt, comparison_group=f"pair-{i}", source="test")
    decode = {}
    for r in wb.history.query("SELECT drafter, decode_s FROM runs"):
        decode[r["drafter"]] = decode.get(r["drafter"], 0.0) + r["decode_s"]
    expected = {name: decode["ar"] / decode[name] for name in ("ngram", "eagle3")}
    measured = wb.measured_speedups()
    assert measured["ngram"] == (pytest.approx(expected["ngram"]), 4)
    assert measured["eagle3"] == (pytest.approx(expected["eagle3"]), 3)
    assert best_drafter(wb) == max(expected, key=expected.get)
