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


def drafter_result(tok_per_s: float, positions: list[int], k: int = 4, n_prompt: int = 40, accepted: int = 2,
                   **settings) -> dict:
    """A finished ngram run with one step per position (each accepting `accepted` of k drafts)."""
    steps = [{"index": i, "position": p, "drafted": [5] * k, "accepted": accepted, "bonus": 6, "p": [0.5] * k,
              "q": [1.0] * k, "top5_ids": [], "top5_p": [], "emitted": [5, 5, 6], "draft_ms": 1.0, "verify_ms": 30.0}
             for i, p in enumerate(positions)]
    stats = {"tok_per_s": tok_per_s, "decode_s": 128 / tok_per_s, "n_generated": 128, "compiles": 0,
             "n_prompt": n_prompt, "tau": 3.0}
    return {"text": "x", "token_ids": [5] * 128, "prompt_ids": list(range(n_prompt)), "steps": steps,
            "stats": stats, "settings": {"backend": "cpu", **SETTINGS, "drafter": "ngram", "k": k, **settings}}


def test_kflat_times_as_runs_ran_and_checks_its_prediction_against_them(history):
    """K-Flat's defaults come from the drafter's stored runs (median block position, their cache size), and the
    measured speedup per K is the tok/s ratio over the ar run of each pair; a prediction's error is against it."""
    from app import plots
    from app.queries import measured_speedups, run_shape

    assert run_shape(history, "SmolLM2", "ngram") is None
    for group, (ar_rate, rate) in enumerate([(20.0, 24.0), (22.0, 30.0)]):
        history.write_run(ar_result(ar_rate), prompt=PROMPT, comparison_group=str(group))
        history.write_run(drafter_result(rate, [40, 70, 100]), prompt=PROMPT, comparison_group=str(group))
    history.write_run(drafter_result(28.0, [300, 400, 500], n_prompt=300), prompt=PROMPT + " (long)")
    shape = run_shape(history, "SmolLM2", "ngram")
    # medians per run 70, 70, 400 -> 70; two of three runs needed 40 + 128 + 6 rows -> the 256-row bucket
    assert shape == {"context": 70, "cache_rows": 256, "n_runs": 3}
    (point,) = measured_speedups(history, "SmolLM2", "ngram", "cpu")
    assert point["k"] == 4 and point["n_pairs"] == 2
    assert point["speedup"] == pytest.approx((256 / (128 / 24 + 128 / 30)) / (256 / (128 / 20 + 128 / 22)))
    assert measured_speedups(history, "SmolLM2", "ngram", "NVIDIA H200") == []
    sweep = [{"k": 1, "verify_ms": 30.0, "draft_ms": 1.0}, {"k": 4, "verify_ms": 36.0, "draft_ms": 2.0}]
    (error,) = plots.prediction_errors(sweep, [0.8, 0.6, 0.4, 0.2], [point])
    predicted = (1 + 0.8 + 0.6 + 0.4 + 0.2) / (38.0 / 30.0)
    assert error["predicted"] == pytest.approx(predicted) and error["error"] == pytest.approx(
        predicted / point["speedup"] - 1)
    figure = plots.speedup_figure({"here": sweep}, [0.8, 0.6, 0.4, 0.2], "ngram", "ngram", [point])
    assert [t.name for t in figure.data if t.name and t.name.startswith("measured")] and figure.data[-1].x == (4,)


def test_kflat_reads_each_checkpoint_of_a_drafter_kind_apart(history):
    """Two DFlash checkpoints on one target: survival, measured speedup and run shape each come from one of them."""
    from app.queries import measured_speedups, run_shape, survival

    for group, (ckpt, accepted, rate) in enumerate([("out/a/dflash", 1, 24.0), ("out/b/dflash", 3, 36.0)]):
        history.write_run(ar_result(20.0), prompt=PROMPT, comparison_group=str(group))
        history.write_run(drafter_result(rate, [40, 70], accepted=accepted, drafter="dflash",
                                         drafter_checkpoint=ckpt), prompt=PROMPT, comparison_group=str(group))
    assert survival(history, "SmolLM2", "dflash", "out/a/dflash") == ([1.0, 0.0, 0.0, 0.0], 2)
    assert survival(history, "SmolLM2", "dflash", "out/b/dflash") == ([1.0, 1.0, 1.0, 0.0], 2)
    assert survival(history, "SmolLM2", "dflash") == ([], 0)  # no run of a dflash without a checkpoint
    speedups = [measured_speedups(history, "SmolLM2", "dflash", "cpu", checkpoint=c)[0]["speedup"]
                for c in ("out/a/dflash", "out/b/dflash")]
    assert speedups == [pytest.approx(24 / 20), pytest.approx(36 / 20)]
    assert run_shape(history, "SmolLM2", "dflash", "out/a/dflash")["n_runs"] == 1


def test_an_ar_run_with_other_chat_template_switches_does_not_match(history):
    """Thinking on or off changes what the target reads: a drafter's speedup is against ar with the same switches."""
    history.write_run(ar_result(25.0, template="enable_thinking=true"), prompt=PROMPT)
    assert matching_ar_run(history, PROMPT, SETTINGS | {"template": "enable_thinking=false"}) is None
    same = history.write_run(ar_result(24.0, template="enable_thinking=false"), prompt=PROMPT)
    assert matching_ar_run(history, PROMPT, SETTINGS | {"template": "enable_thinking=false"})["run_id"] == same
    assert matching_ar_run(history, PROMPT, SETTINGS) is None  # no switches: neither of those
