"""The app's history reads on a real DuckDB file: which stored `ar` run a drafter's speedup may be compared with."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.queries import matching_ar_run
from storage import History, open_history

PROMPT = "Count from 1 to 20."
SETTINGS = {"target": "SmolLM2", "dtype": "float32", "device_kind": "cpu", "mesh": "1x1", "batch": 1,
            "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 128}


def ar_result(tok_per_s: float, compiles: int = 0, **settings) -> dict:
    """A finished ar run's GenerationResult.to_dict() (no steps needed here)."""
    return {"text": "1, 2", "token_ids": [16, 28], "prompt_ids": [1, 2, 3], "steps": [],
            "stats": {"tok_per_s": tok_per_s, "decode_s": 128 / tok_per_s, "n_generated": 128, "compiles": compiles},
            "settings": {"drafter": "ar", "k": 0, "backend": "cpu", **SETTINGS, **settings}}


@pytest.fixture
def history(tmp_path: Path) -> History:
    return open_history(tmp_path / "h.duckdb", lock_timeout=2.0)


def test_only_a_warm_ar_run_on_the_same_prompt_and_settings_matches(history):
    assert matching_ar_run(history, PROMPT, SETTINGS) is None
    history.write_run(ar_result(30.0), prompt="another prompt")
    history.write_run(ar_result(31.0, max_new_tokens=10), prompt=PROMPT)  # a 10-token run
    history.write_run(ar_result(32.0, temperature=0.7), prompt=PROMPT)
    history.write_run(ar_result(33.0, dtype="bfloat16"), prompt=PROMPT)
    history.write_run(ar_result(34.0, device_kind="NVIDIA H200"), prompt=PROMPT)
    history.write_run(ar_result(35.0, drafter="ngram", k=4), prompt=PROMPT)
    history.write_run(ar_result(18.0, compiles=5), prompt=PROMPT)  # timed while XLA compiled
    history.write_run(ar_result(36.0), prompt=PROMPT, status="cancelled")
    assert matching_ar_run(history, PROMPT, SETTINGS) is None
    first = history.write_run(ar_result(24.0), prompt=PROMPT, comparison_group="g1")
    assert matching_ar_run(history, PROMPT, SETTINGS) == {"run_id": first, "tok_per_s": 24.0, "token_ids": [16, 28],
                                                          "comparison_group": "g1"}
    newest = history.write_run(ar_result(26.0), prompt=PROMPT)
    assert matching_ar_run(history, PROMPT, SETTINGS)["run_id"] == newest
