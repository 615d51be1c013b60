"""The one comparison table (experiments.bench.report.drafter_table): from the newest bench on the sealed test slices,
one
row per drafter with the data it trained on, into docs/results.md and the README; the README's drafter list agrees
with the shipped checkpoints."""

from __future__ import annotations

import json
import re
from pathlib import Path

from experiments.bench import report
from storage import open_history

REPO = Path(__file__).resolve().parent.parent


def _run(drafter, tau, decode_s, checkpoint=None, split="test", suite="gsm8k", prompt="p1", command="bench A"):
    steps = [{"index": 0, "position": 3, "drafted": [1, 2] if drafter != "ar" else [], "accepted": 1 if drafter != "ar"
              else 0, "bonus": 5, "p": [], "q": [], "top5_ids": [], "top5_p": [], "emitted": [1, 5],
              "draft_ms": 2.0, "verify_ms": 10.0}]
    return {"text": "x", "token_ids": [1, 5], "prompt_ids": [1, 2, 3, 4], "steps": steps,
            "stats": {"tau": tau, "n_steps": 1, "n_generated": 2, "decode_s": decode_s, "drafted": len(steps[0]
                      ["drafted"]), "accepted": steps[0]["accepted"], "draft_ms": 2.0, "verify_ms": 10.0,
                      "compiles": 0, "tok_per_s": 2 / decode_s},
            "settings": {"target": "t", "dtype": "float32", "drafter": drafter, "drafter_checkpoint": checkpoint,
                         "k": 0 if drafter == "ar" else 7, "temperature": 0.0, "batch": 1, "device_kind": "cpu"}}


def test_the_table_reads_the_newest_test_slice_bench_and_says_what_each_drafter_trained_on(tmp_path):
    h = open_history(tmp_path / "h.duckdb")
    ckpt = "checkpoints/smollm2-135m-dflash"
    for suite in ("gsm8k", "mtbench"):
        group = f"g-{suite}"
        for drafter, tau, s, c in (("ar", 1.0, 1.0, None), ("dflash", 3.0, 0.5, ckpt)):
            h.write_run(_run(drafter, tau, s, c), source="bench", suite=suite, split="test", prompt_id="1",
                        comparison_group=group, lossless=True, command="bench A")
    h.write_run(_run("dflash", 9.0, 0.1, ckpt), source="bench", suite="gsm8k", split="dev", prompt_id="1",
                comparison_group="g-dev", lossless=True, command="bench DEV")  # a dev bench never enters the table
    h.write_run(_run("ar", 1.0, 1.0), source="bench", suite="gsm8k", split="dev", prompt_id="1",
                comparison_group="g-dev", lossless=True, command="bench DEV")
    table = report.drafter_table(h)
    assert "sealed test slices (gsm8k 1, mtbench 1 prompts)" in table and "`bench A`" in table
    row = next(line for line in table.splitlines() if line.startswith("| `dflash"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    card = json.loads((REPO / ckpt / "training.json").read_text())
    budget = report.training_budget(card)
    assert cells[1] == "DFlash, one block forward + prompt-lookup hints + Domino correction head"
    assert cells[3] == f"{budget['sequences']:,}" and cells[4].endswith(f"{budget['passes']:,}")
    assert cells[5:7] == ["3.00 / 2.00x", "3.00 / 2.00x"] and cells[-1] == "2/2"
    assert "9.00" not in table
    assert budget["passes"] >= card["training"]["steps"] * card["training"]["batch"] and budget["partial"]
    doc = tmp_path / "README.md"
    doc.write_text(f"intro\n{report.TABLE_BEGIN}\nold\n{report.TABLE_END}\nafter\n")
    report.write_table(h, doc)
    text = doc.read_text()
    assert "old" not in text and table in text and text.startswith("intro") and text.endswith("after\n")


def test_without_a_test_slice_bench_the_table_says_how_to_make_one(tmp_path):
    assert "No bench run on the test slices yet" in report.drafter_table(open_history(tmp_path / "h.duckdb"))


def test_the_readmes_drafter_list_agrees_with_the_shipped_checkpoints():
    readme = (REPO / "README.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([\w./-]+)` \|.*$", readme, re.MULTILINE)}
    for ckpt in sorted((REPO / "checkpoints").iterdir()):
        card = json.loads((ckpt / "training.json").read_text())
        name = {"smollm2-135m-dflash": "dflash", "smollm2-135m-eagle3": "eagle3"}.get(ckpt.name, f"checkpoints/"
                                                                                                  f"{ckpt.name}")
        assert name in rows, f"README's drafter table lacks {name}"
        assert report.describe(card["drafter"], card) in rows[name] and f"({ckpt.name}" in rows[name].replace(
            "[", "(")
