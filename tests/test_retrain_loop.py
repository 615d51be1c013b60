"""The annotate -> retrain loop's driver: prompt tables, suites for the bench, and the loop over the app's API."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments.suites import load_suite
from experiments.training import retrain_loop
from experiments.training.retrain_loop import TableError, load_table, spread, write_suites

REPO = Path(__file__).resolve().parents[1]
SQL_TABLE = REPO / "experiments" / "data" / "prompt_tables" / "sql_tasks.json"


def table_file(tmp_path: Path, **parts) -> Path:
    table = {"domain": "toy", "annotate": [{"id": "a", "prompt": "one"}], "heldout": [{"id": "b", "prompt": "two"}]}
    path = tmp_path / "table.json"
    path.write_text(json.dumps({**table, **parts}))
    return path


def test_the_sql_table_keeps_its_parts_apart():
    table = load_table(SQL_TABLE)
    annotate, heldout = ({r["prompt"] for r in table[p]} for p in retrain_loop.PARTS)
    assert len(annotate) == 30 and len(heldout) == 30 and not annotate & heldout
    assert table["domain"] == "sql" and all("SQL" in p for p in annotate | heldout)


def test_sql_is_outside_the_training_prompts():
    """No training prompt source mentions SQL: the domain is new to the shipped drafters."""
    sources = [*(REPO / "experiments" / "data" / "prompt_tables").glob("[!s]*.json"),
               *(REPO / "experiments" / "data" / n for n in ("prompts.py", "code_tasks.py", "drill_prompts.py"))]
    assert len(sources) >= 6
    for path in sources:
        assert not re.search(r"\bSQL\b", path.read_text(), re.IGNORECASE), path


@pytest.mark.parametrize("parts, message", [
    ({"heldout": [{"id": "b", "prompt": "one"}]}, "repeats the prompt of annotate a"),
    ({"heldout": [{"id": "a", "prompt": "two"}]}, "id 'a' appears twice"),
    ({"heldout": [{"id": "b", "prompt": " "}]}, "needs a non-empty id and prompt"),
    ({"heldout": None, "domain": None}, None),
])
def test_bad_tables_are_refused(tmp_path, parts, message):
    path = table_file(tmp_path, **parts)
    if message is None:  # a table without a part
        data = json.loads(path.read_text())
        del data["heldout"]
        path.write_text(json.dumps(data))
        message = "missing heldout"
    with pytest.raises(TableError, match=re.escape(message)):
        load_table(path)


def test_suites_load_in_the_bench(tmp_path):
    table = load_table(SQL_TABLE)
    paths = write_suites(table, tmp_path)
    rows = load_suite(str(paths["heldout"]))
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in table["heldout"]]
    assert {r["category"] for r in rows} == {"sql"} and rows[0]["id"] == table["heldout"][0]["id"]
    assert len(load_suite(str(paths["annotate"]), limit=5)) == 5


@pytest.mark.parametrize("n, expected", [(0, []), (1, [0]), (3, [0, 5, 10]), (4, [0, 3, 7, 10]), (20, list(range(11)))])
def test_spread_spaces_the_picks_over_the_run(n, expected):
    assert spread(list(range(11)), n) == expected


def test_the_loop_annotates_and_exports_through_the_app(app_server, tmp_path, capsys):
    """Two runs of the annotate part through the real app: spread rejections labelled, exported for training."""
    url, db = app_server
    path = tmp_path / "table.json"
    table = load_table(SQL_TABLE)
    path.write_text(json.dumps({**table, "annotate": table["annotate"][:2]}))
    retrain_loop.main(["annotate", "--url", url, "--table", str(path), "--k", "3", "--max-new-tokens", "24",
                       "--per-run", "2", "--export", "loop-test"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    runs, summary = lines[:-1], lines[-1]
    assert [r["id"] for r in runs] == [r["id"] for r in table["annotate"][:2]]
    assert all(r["annotated"] == min(2, r["rejections"]) for r in runs)
    folder = db.parent / "exports" / "loop-test"
    assert summary["export"] == str(folder.resolve()) and summary["annotated"] == sum(r["annotated"] for r in runs)
    records = [json.loads(x) for x in (folder / "rejections.jsonl").read_text().splitlines()]
    assert len(records) == summary["annotated"] > 0
    assert {r["label"] for r in records} == {"sql"} and {r["run_id"] for r in records} <= {r["run_id"] for r in runs}
    assert all(r["prefix_ids"] and r["drafted_token"] != r["target_token"] for r in records)


def test_compare_runs_two_dflash_checkpoints_side_by_side(app_server):
    """The shipped DFlash and a DFlash loaded by path run side by side in Compare, in one comparison group."""
    from gradio_client import Client

    from storage import open_history

    client = Client(app_server[0], verbose=False)
    folder = REPO / "checkpoints" / "smollm2-135m-dflash"
    label = client.predict(str(folder), api_name="/load_drafter")[0]["value"]
    status, *rest = client.predict(table_prompt(), ["dflash", label], "3", 0.0, 12, api_name="/compare")
    assert "2 runs" in status, status
    heads = rest[:4]  # then the block views and the plain texts (the columns are layout, not outputs)
    assert "dflash" in heads[0] and escape_label(label) in heads[1]
    runs = open_history(app_server[1]).list_runs(limit=2)
    assert {r["drafter"] for r in runs} == {"dflash"} and len({r["comparison_group"] for r in runs}) == 1
    refused = client.predict("hi", ["dflash", "nowhere (/tmp)"], "3", 0.0, 8, api_name="/compare")[0]
    assert "drafter &#x27;nowhere (/tmp)&#x27; is not loaded" in refused, refused


def table_prompt() -> str:
    return load_table(SQL_TABLE)["heldout"][0]["prompt"]


def escape_label(label: str) -> str:
    from html import escape

    return escape(label)
