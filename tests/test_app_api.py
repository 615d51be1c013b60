"""The app over its HTTP API (gradio_client): generation, streaming, storage, stop, K-Flat, annotations, errors."""

from __future__ import annotations

import json
import time

import duckdb
import pytest
from gradio_client import Client

from storage import open_history

pytestmark = pytest.mark.slow
PROMPT = "Repeat exactly: <script>alert(1)</script> & the cat sat on the mat; the cat sat on the mat."


@pytest.fixture(scope="module")
def client(app_server):
    return Client(app_server[0], verbose=False)


@pytest.fixture(scope="module")
def history(app_server):
    return open_history(app_server[1])


def test_generate_streams_escapes_and_stores(client, history):
    job = client.submit(PROMPT, "ngram", 4, 0.0, 16, True, api_name="/generate")
    view, stats, status, run_id = job.result(timeout=120)
    assert len(job.outputs()) > 2  # the ar baseline and the run stream step by step
    assert "stored as run" in status and run_id
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp;" in view and "<script>" not in view
    assert 'class="tok ' in view and "ar on this prompt" in stats
    run = history.get_run(run_id)
    assert run["settings"]["drafter"] == "ngram" and run["settings"]["k"] == 4 and run["status"] == "done"
    assert run["source"] == "app" and run["prompt"] == PROMPT and run["steps"]
    assert run["lossless"] is True  # greedy ngram output equals the ar baseline run
    assert [r["drafter"] for r in history.list_runs()[:2]] == ["ngram", "ar"]


@pytest.mark.parametrize("args, expected", [
    (("", "ngram", 4, 0.0, 16, False), "the prompt is empty"),
    (("hi", "ngram", -2, 0.0, 16, False), "K must be a whole number"),
    (("hi", "ngram", 100, 0.0, 16, False), "must be an integer in 1..64"),
    (("hi", "ngram", 4, 0.0, 0, False), "max new tokens must be"),
    (("hi", "nope", 4, 0.0, 16, False), "drafter 'nope' is not loaded"),
    (("word " * 9000, "ngram", 4, 0.0, 16, False), "context"),
])
def test_bad_input_is_a_message(client, args, expected):
    view, stats, status, run_id = client.predict(*args, api_name="/generate")
    assert "error" in status and expected in status.replace("&#x27;", "'") and run_id == ""


def test_stop_stores_a_cancelled_run(client, history):
    job = client.submit("Count from 1 to 300, separated by commas.", "ngram", 4, 0.0, 600, False,
                        api_name="/generate")
    deadline = time.monotonic() + 60
    while not job.outputs() and time.monotonic() < deadline:
        time.sleep(0.05)
    client.predict(api_name="/stop")
    status, run_id = job.result(timeout=120)[2:]
    assert "stopped" in status and run_id
    run = history.get_run(run_id)
    assert run["status"] == "cancelled" and run["stats"]["stop_reason"] == "cancelled"
    assert 0 < run["stats"]["n_generated"] < 600 and len(run["steps"]) == run["stats"]["n_steps"]


def test_compare_stores_one_group(client, history):
    out = client.predict("Say hello twice: hello hello", ["ngram", "ar"], 3, 0.0, 8, api_name="/compare")
    assert "2 runs" in out[0]
    runs = history.list_runs(limit=2)
    assert {r["drafter"] for r in runs} == {"ar", "ngram"}
    assert runs[0]["comparison_group"] and runs[0]["comparison_group"] == runs[1]["comparison_group"]
    html = client.predict([r["run_id"] for r in runs], api_name="/compare_runs")
    assert html.count('class="ds-view"') == 2 and "lossless vs ar: True" in html
    assert "pick 2 to 4 runs" in client.predict([runs[0]["run_id"]], api_name="/compare_runs")
    assert "pick 2 to 4" in client.predict("hi", ["ngram"], 3, 0.0, 8, api_name="/compare")[0]


def test_kflat_sweep_is_stored_and_plotted(client, history):
    status, sweeps, _, latency, _ = client.predict("1,2", 32, 1, "ngram", [], None, api_name="/kflat_sweep")
    assert "stored" in status
    rows = history.list_kflat()
    assert [r["k"] for r in rows] == [1, 2] and rows[0]["hardware"].startswith("cpu")
    assert rows[0]["context"] == 32 and rows[0]["draft_ms"] is not None
    plot = json.loads(latency["plot"])
    assert plot["layout"]["xaxis"]["type"] == "log" and plot["data"][0]["x"] == [1, 2]
    bad = client.predict("1,x", 32, 1, "ngram", [], None, api_name="/kflat_sweep")
    assert "error" in bad[0]


def test_annotate_and_export(client, history, app_server):
    run_id = next(r["run_id"] for r in history.list_runs() if r["drafted"] > r["accepted"])
    client.predict(run_id, api_name="/annotate_open")
    step = next(s for s in history.get_run(run_id)["steps"] if s["accepted"] < len(s["drafted"]))
    pick = f"{step['index']}:{step['accepted']}"
    status = client.predict(run_id, pick, "other", "<b>note</b>", False, api_name="/annotate")[0]
    assert "stored" in status
    (ann,) = history.list_annotations(run_id=run_id)
    assert (ann["step_idx"], ann["draft_pos"], ann["note"]) == (step["index"], step["accepted"], "<b>note</b>")
    message, files = client.predict("api-export", "(all)", "(all)", api_name="/export_annotations")
    folder = app_server[1].parent / "exports" / "api-export"
    assert str(folder) in message and len(files) == 3
    record = json.loads((folder / "rejections.jsonl").read_text().splitlines()[0])
    assert record["run_id"] == run_id and record["note"] == "<b>note</b>"
    assert duckdb.sql(f"SELECT count(*) FROM '{folder / 'annotations.parquet'}'").fetchall() == [(1,)]
    outside = client.predict("../../escape", "(all)", "(all)", api_name="/export_annotations")[0]
    assert "must be inside" in outside


def test_drafter_dir_outside_model_roots_is_refused(client):
    status = client.predict("/etc", api_name="/load_drafter")[1]
    assert "outside the allowed model roots" in status
