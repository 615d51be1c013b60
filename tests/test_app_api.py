"""The app over its HTTP API (gradio_client): generation, streaming, storage, stop, K-Flat, annotations, errors."""

from __future__ import annotations

import json
import re
import time
from html import escape

import duckdb
import pytest
from gradio_client import Client

from app import queries
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
    view, stats, status, run_id, text, numbers = job.result(timeout=120)
    assert len(job.outputs()) > 2  # the ar baseline and the run stream step by step
    assert "stored as run" in status and run_id
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp;" in view and "<script>" not in view
    assert 'class="tok ' in view and "ar on this prompt" in stats
    run = history.get_run(run_id)
    assert run["settings"]["drafter"] == "ngram" and run["settings"]["k"] == 4 and run["status"] == "done"
    assert run["source"] == "app" and run["prompt"] == PROMPT and run["steps"]
    assert run["lossless"] is True  # greedy ngram output equals the ar baseline run
    assert 'class="ds-plain-text"' in text and escape(run["text"]) in text  # the plain output, escaped
    assert any("prefilling" in out[2] and "prompt tokens" in out[2] for out in job.outputs())
    assert [r["drafter"] for r in history.list_runs()[:2]] == ["ngram", "ar"]
    # the run's numbers as JSON beside the HTML, equal to what was stored
    stored = history.list_runs(limit=1)[0]
    assert numbers["run_id"] == run_id and numbers["status"] == "done" and (numbers["drafter"], numbers["k"]) == (
        "ngram", 4)
    assert numbers["n_generated"] == len(run["token_ids"]) and numbers["tau"] == pytest.approx(stored["tau"])
    reference = history.get_run(history.list_runs()[1]["run_id"])
    assert numbers["speedup"] == pytest.approx(numbers["tok_per_s"] / reference["stats"]["tok_per_s"])


def test_the_api_names_its_outputs_and_types_its_inputs_as_a_client_can_use_them(client):
    """API clients read named outputs, not value_31, and no input is typed by choices frozen when the page was
    built (a `Literal[]` a stored run id could never satisfy)."""
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert [r["label"] for r in api["/generate"]["returns"]] == ["block view", "stats", "status", "stored run id",
                                                                 "output text", "run numbers"]
    unnamed = {(e, r["label"]) for e, info in api.items() for r in info["returns"]
               if not r["label"] or r["label"].startswith("value_")}
    assert not unnamed, unnamed
    for endpoint, info in api.items():
        names = [r["label"] for r in info["returns"]]
        assert len(names) == len(set(names)), (endpoint, names)
        frozen = [p["parameter_name"] for p in info["parameters"] if "Literal[]" in p["python_type"]["type"]]
        assert not frozen, (endpoint, frozen)
    kinds = {p["parameter_name"]: p["python_type"]["type"] for p in api["/open_run"]["parameters"]}
    assert kinds == {"run_id": "str"}
    # the sweep's context and cache rows default to blank: sized as the chosen acceptance drafter's runs, as the page
    kflat = {p["parameter_name"]: p["parameter_default"] for p in api["/kflat_sweep"]["parameters"]}
    assert kflat["context"] is None and kflat["cache_rows"] is None


@pytest.mark.parametrize("args, expected", [
    (("", "ngram", 4, 0.0, 16, False), "the prompt is empty"),
    (("hi", "ngram", -2, 0.0, 16, False), "K for ngram must be a whole number in 1..64"),
    (("hi", "ngram", 100, 0.0, 16, False), "K for ngram must be a whole number in 1..64"),
    (("hi", "dflash", 8, 0.0, 16, False), "K for dflash must be a whole number in 1..7"),
    (("hi", "ngram", 4, 0.0, 0, False), "max new tokens must be"),
    (("hi", "nope", 4, 0.0, 16, False), "drafter 'nope' is not loaded"),
    (("word " * 9000, "ngram", 4, 0.0, 16, False), "context"),
    (("hi", "ngram", 4, 0.0, 16, False, False, "enable_thinking=false"), "does not read the switch"),
    (("hi", "ngram", 4, 0.0, 16, False, False, "enable_thinking"), "name=value pairs"),
])
def test_bad_input_is_a_message(client, args, expected):
    view, stats, status, run_id, text, numbers = client.predict(*args, api_name="/generate")
    assert "error" in numbers and expected in numbers["error"]
    assert "error" in status and expected in status.replace("&#x27;", "'") and run_id == ""


def test_stop_stores_a_cancelled_run(client, history):
    """Stop while the drafter's own run streams (after its ar reference): that run is stored as cancelled."""
    job = client.submit("Count from 1 to 300, separated by commas.", "ngram", 4, 0.0, 600, False,
                        api_name="/generate")
    deadline = time.monotonic() + 300
    while not any("ngram K=4: step" in out[2] for out in job.outputs()) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.predict(api_name="/stop")
    status, run_id = job.result(timeout=120)[2:4]
    assert "stopped" in status and run_id
    run = history.get_run(run_id)
    assert run["settings"]["drafter"] == "ngram" and run["settings"]["k"] == 4  # the drafter's run, not ar's
    assert run["status"] == "cancelled" and run["stats"]["stop_reason"] == "cancelled"
    assert 0 < run["stats"]["n_generated"] < 600 and len(run["steps"]) == run["stats"]["n_steps"]


NOTES = "Summarise these notes. " + " ".join(f"Note {i}: the launch moved to week {i % 7}." for i in range(200))


def test_a_baseline_says_it_is_the_baseline_and_no_speedup_shows_before_a_token(client):
    """A long prompt (prefill progress is shown): the ar baseline is never called the run's "done", and the
    drafter's stats show no speedup while it prefills."""
    job = client.submit(NOTES, "ngram", 4, 0.0, 4, True, api_name="/generate")
    status = job.result(timeout=600)[2]
    assert "ngram K=4: done" in status
    statuses = [out[2] for out in job.outputs()]
    assert not any("ar: done" in s for s in statuses), statuses
    assert any("ar baseline done" in s and "starting ngram" in s for s in statuses), statuses
    assert any("ngram K=4: prefilling" in out[2] and "speedup vs ar" in out[1] for out in job.outputs())
    assert not any("0.00×" in out[1] for out in job.outputs())


def test_stop_while_prefilling_ends_the_run_within_a_chunk(client, history):
    """Stop pressed while the prompt is prefilled: the prefill ends after its chunk, the run is stored as cancelled
    with no step, and the status says where it stopped."""
    job = client.submit(NOTES + " Then list them.", "ngram", 4, 0.0, 64, False, api_name="/generate")
    deadline = time.monotonic() + 300
    def chunks_done() -> int:  # the furthest prefill chunk any output so far reports
        return max([int(m[1]) for out in job.outputs() for m in re.finditer(r"chunk (\d+)/", out[2])] or [0])

    while chunks_done() < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    client.predict(api_name="/stop")
    status, run_id = job.result(timeout=120)[2:4]
    stopped = re.search(r"stopped while prefilling, after chunk (\d+)/(\d+)", status)
    assert stopped and int(stopped[1]) < int(stopped[2]), status
    run = history.get_run(run_id)
    assert run["status"] == "cancelled" and run["stats"]["stop_reason"] == "cancelled" and not run["steps"]


def test_compare_stores_one_group(client, history):
    out = client.predict("Say hello twice: hello hello", ["ngram", "ar"], 3, 0.0, 8, api_name="/compare")
    assert "2 runs" in out[0]
    runs = history.list_runs(limit=2)
    assert {r["drafter"] for r in runs} == {"ar", "ngram"}
    assert runs[0]["comparison_group"] and runs[0]["comparison_group"] == runs[1]["comparison_group"]
    html = client.predict([r["run_id"] for r in runs], api_name="/compare_runs")
    assert html.count('class="ds-view"') == 2 and "lossless vs ar: True" in html
    ngram, ar = sorted(runs, key=lambda r: r["drafter"] == "ar")  # replay shows each run's speedup over ar
    assert "this is the ar baseline" in html and f"{ngram['tok_per_s'] / ar['tok_per_s']:.2f}×" in html
    replay = client.predict(ngram["run_id"], api_name="/open_run")
    assert f"{ngram['tok_per_s'] / ar['tok_per_s']:.2f}×" in replay
    assert f"ar run …{ar['run_id'][-8:]} it was measured against" in replay  # pinned to its comparison's ar run
    assert "pick 2 to 4 runs" in client.predict([runs[0]["run_id"]], api_name="/compare_runs")
    assert "pick 2 to 4" in client.predict("hi", ["ngram"], 3, 0.0, 8, api_name="/compare")[0]


def api_defaults(client) -> dict[str, dict]:
    """{endpoint: {parameter: the value its component starts with}}."""
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    return {e: {p["parameter_name"]: p["parameter_default"] for p in info["parameters"]} for e, info in api.items()}


def shown_speedup(stats: str) -> str:
    """The speedup a stats table shows, e.g. '1.23×'."""
    return re.search(r"speedup vs ar</td><td>([0-9.]+×)", stats).group(1)


def test_k_that_ran_is_shown_and_stored_and_bad_k_is_refused(client, history):
    before = len(history.list_runs())
    one = "K for ngram must be a whole number in 1..64 (its default here is 8)"  # one message for every bad K
    for k, expected in [(0, one + ", got 0; K=0 means no drafting: that is the ar drafter"), (2.5, one), (-1, one),
                        (None, one)]:
        status, run_id = client.predict("Name a colour.", "ngram", k, 0.0, 8, False, api_name="/generate")[2:4]
        assert "error" in status and expected in status and run_id == ""
    assert len(history.list_runs()) == before  # nothing ran, not even the ar baseline
    status, run_id = client.predict("Name a colour.", "ngram", 3, 0.0, 8, False, api_name="/generate")[2:4]
    assert "ngram K=3: done" in status and history.get_run(run_id)["settings"]["k"] == 3
    status, run_id = client.predict("Name a colour.", "ar", None, 0.0, 8, False, api_name="/generate")[2:4]
    assert "ar: done" in status and history.get_run(run_id)["settings"]["k"] == 0  # ar ignores K


def test_speedup_is_against_warm_ar_on_the_same_prompt_and_settings(client, history):
    prompt = "Write the days of the week, separated by commas."
    def ar_runs():
        return history.query("SELECT run_id, max_new_tokens FROM runs WHERE drafter = 'ar' AND prompt = ? "
                             "ORDER BY max_new_tokens", [prompt])

    assert not ar_runs()  # no ar run on this prompt: the first drafter run brings its own
    stats, status, run_id = client.predict(prompt, "ngram", 5, 0.0, 20, False, api_name="/generate")[1:4]
    run = history.get_run(run_id)
    (ar,) = [history.get_run(r["run_id"]) for r in ar_runs()]
    assert "ar on this prompt and settings, just run" in stats
    assert shown_speedup(stats) == f"{run['stats']['tok_per_s'] / ar['stats']['tok_per_s']:.2f}×"
    for r in (run, ar):  # both timed warm: compilation happened in the untimed warm-up and is reported apart
        assert r["stats"]["compiles"] == 0 and r["stats"]["warmup_s"] > 0
        assert {k: r["settings"][k] for k in ("max_new_tokens", "temperature", "top_p", "seed", "batch")} == \
            {"max_new_tokens": 20, "temperature": 0.0, "top_p": 1.0, "seed": 0, "batch": 1}
    assert run["stats"]["warmup_compiles"] > 0 and "XLA compiles before timing" in stats  # K=5 was new here
    assert run["comparison_group"] == ar["comparison_group"] is not None and run["lossless"] is True
    assert run["baseline_run_id"] == ar["run_id"]  # the speedup stays pinned to the ar run it was measured against
    # Again at another K: the stored ar run is the reference; a different length needs its own ar run.
    stats = client.predict(prompt, "ngram", 4, 0.0, 20, False, api_name="/generate")[1]
    assert f"stored ar run …{ar['run_id'][-8:]}, same prompt and settings" in stats
    client.predict(prompt, "ngram", 4, 0.0, 12, False, api_name="/generate")
    assert [r["max_new_tokens"] for r in ar_runs()] == [12, 20]


def test_raw_prompts_skip_the_chat_template_and_the_view_shows_what_the_target_reads(client, history):
    prompt = "The capital of France is"
    view = client.predict(prompt, "ngram", 4, 0.0, 8, False, False, api_name="/generate")[0]
    assert "as the target reads it" in view and "&lt;|im_start|&gt;" in view  # the template, folded, escaped
    templated = history.list_runs(limit=1)[0]["run_id"]
    view, _, status, run_id, _, _ = client.predict(prompt, "ngram", 4, 0.0, 8, False, True, api_name="/generate")
    assert "stored as run" in status and "as the target reads it" not in view  # raw: it reads the prompt itself
    raw_run, templated_run = history.get_run(run_id), history.get_run(templated)
    assert raw_run["settings"]["raw"] is True and templated_run["settings"]["raw"] is False
    assert len(raw_run["prompt_ids"]) < len(templated_run["prompt_ids"])
    ar = history.query("SELECT run_id FROM runs WHERE drafter = 'ar' AND prompt = ?", [prompt])
    assert len(ar) == 2  # raw and templated runs each got their own ar reference: kept apart


def test_compare_starts_from_the_generate_defaults_and_brings_its_ar(client, history):
    defaults = api_defaults(client)
    generate, compare = defaults["/generate"], defaults["/compare"]
    assert compare["max_new_tokens"] == generate["max_new_tokens"] == 128 and compare["k"] == ""
    drafter, k = generate["drafter"], generate["k"]  # the preselected drafter at its default K
    others = [d for d in ("ngram", "eagle3") if d != drafter][:1]
    prompt = "Name two rivers."
    out = client.predict(prompt, [*others, drafter], "", 0.0, 8, api_name="/compare")  # clicked in this order
    columns = [d for d in ("ngram", "dflash", "eagle3") if d in {drafter, *others}]  # shown in the checkboxes' order
    assert "2 runs" in out[0] and f"{drafter} K={k}" in out[1 + columns.index(drafter)]
    group = history.list_runs(limit=1)[0]["comparison_group"]
    runs = history.query("SELECT drafter, k FROM runs WHERE comparison_group = ? ORDER BY created_at", [group])
    assert [r["drafter"] for r in runs] == ["ar", *columns]  # ar ran first: none was stored for this prompt
    assert runs[1 + columns.index(drafter)]["k"] == k
    assert "ar on this prompt and settings, just run" in out[1 + columns.index(drafter)]
    assert "pick 2 to 4" in client.predict("hi", ["ngram"], "", 0.0, 8, api_name="/compare")[0]
    assert "K for ngram must be a whole number in 1..64" in client.predict("hi", ["ngram", "ar"], "2.5", 0.0, 8,
                                                                           api_name="/compare")[0]


def test_kflat_sweep_is_stored_and_plotted(client, history):
    assert api_defaults(client)["/kflat_sweep"]["drafter"] != "(none: verify only)"  # draft time by default
    status, sweeps, _, latency, speed = client.predict("1,2", 32, 1, "ngram", [], "ngram", 128,
                                                      api_name="/kflat_sweep")
    assert "stored" in status and "draft" in status
    rows = history.list_kflat()
    assert [r["k"] for r in rows] == [1, 2] and rows[0]["hardware"].startswith("cpu")
    assert [r["extra"]["cache_rows"] for r in rows] == [128, 128]  # timed in the cache size asked for
    assert rows[0]["context"] == 32 and rows[0]["draft_ms"] is not None and rows[0]["drafter"] == "ngram"
    plot = json.loads(latency["plot"])
    assert plot["layout"]["xaxis"]["type"] == "log" and plot["data"][0]["x"] == [1, 2]
    # The predicted speedup uses the measured draft time: tau(K) / ((draft(K) + verify(K)) / verify(1)).
    survival, _ = queries.survival(history, history.list_runs(limit=1)[0]["target"], "ngram")
    curve = json.loads(speed["plot"])["data"][0]
    assert "with ngram's draft time" in curve["name"]
    expected = [(1 + sum(survival[:r["k"]])) / ((r["verify_ms"] + r["draft_ms"]) / rows[0]["verify_ms"]) for r in rows]
    assert curve["y"] == pytest.approx(expected)
    # the drafter's measured speedups (its runs over their ar pairs, on this device) are drawn beside the prediction
    measured = queries.measured_speedups(history, history.list_runs(limit=1)[0]["target"], "ngram", "cpu")
    drawn = [t for t in json.loads(speed["plot"])["data"] if t.get("name", "").startswith("measured")]
    assert measured and [m["k"] for m in measured] == drawn[0]["x"]
    bad = client.predict("1,x", 32, 1, "ngram", [], None, api_name="/kflat_sweep")
    assert "error" in bad[0]
    small = client.predict("1,2", 200, 1, "ngram", [], None, 128, api_name="/kflat_sweep")[0]
    assert "cache rows (context 200 + K=2 + 1 need) must be a whole number in 203.." in small
    assert len(history.list_kflat()) == len(rows)


def test_kflat_refuses_a_k_the_timed_drafter_cannot_draft_before_anything_runs(client, history):
    before = len(history.list_kflat())
    status = client.predict("1,2,4,8", 32, 1, "dflash", [], None, api_name="/kflat_sweep")[0]
    assert "K for dflash must be a whole number in 1..7" in status and "got 8" in status
    assert len(history.list_kflat()) == before  # nothing compiled, timed or stored


def test_annotate_and_export(client, history, app_server):
    run_id = next(r["run_id"] for r in history.list_runs() if r["drafted"] > r["accepted"])
    view, token = client.predict(run_id, False, api_name="/annotate_open")
    steps = history.get_run(run_id)["steps"]
    first = {f"{s['index']}:{s['accepted']}" for s in steps if s["accepted"] < len(s["drafted"])}
    assert {c[1] for c in token["choices"]} == first  # real rejections only, by default
    every = client.predict(run_id, True, api_name="/annotate_open")[1]["choices"]
    assert first < {c[1] for c in every} or all(s["accepted"] >= len(s["drafted"]) - 1 for s in steps)
    step = next(s for s in history.get_run(run_id)["steps"] if s["accepted"] < len(s["drafted"]))
    pick = f"{step['index']}:{step['accepted']}"
    client.predict(run_id, pick, "number", "first thought", False, api_name="/annotate")
    status = client.predict(run_id, pick, "other", "<b>note</b>", False, api_name="/annotate")[0]
    assert "stored" in status
    (ann,) = history.list_annotations(run_id=run_id)  # saving the same token again updated its one annotation
    assert (ann["step_idx"], ann["draft_pos"], ann["label"], ann["note"]) == (step["index"], step["accepted"], "other",
                                                                              "<b>note</b>")
    message, files = client.predict("api-export", "(all)", "(all)", api_name="/export_annotations")
    folder = app_server[1].parent / "exports" / "api-export"
    assert str(folder) in message and len(files) == 3
    record = json.loads((folder / "rejections.jsonl").read_text().splitlines()[0])
    assert record["run_id"] == run_id and record["note"] == "<b>note</b>"
    assert duckdb.sql(f"SELECT count(*) FROM '{folder / 'annotations.parquet'}'").fetchall() == [(1,)]
    outside = client.predict("../../escape", "(all)", "(all)", api_name="/export_annotations")[0]
    assert "must be inside" in outside


def test_api_parameters_are_named_as_the_ui_names_them(client):
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    names = {endpoint: [p["parameter_name"] for p in info["parameters"]] for endpoint, info in api.items()}
    assert names["/generate"] == ["prompt", "drafter", "k", "temperature", "max_new_tokens", "run_ar_again",
                                  "raw_prompt", "template_switches"]
    assert names["/compare"] == ["prompt", "drafters", "k", "temperature", "max_new_tokens"]
    assert names["/annotate"] == ["run_id", "rejected_token", "label", "note", "only_this_run"]
    assert names["/annotation_update"] == ["annotation_id", "label", "note", "run_id", "only_this_run"]
    assert names["/export_annotations"] == ["folder", "label", "drafter"]
    assert names["/compare_runs"] == ["run_ids"] and names["/load_drafter"] == ["checkpoint_dir"]
    short = {(e, n) for e, ns in names.items() for n in ns if len(n) < 4 and n != "k"}
    assert not short, f"parameter names that say nothing: {short}"


@pytest.mark.parametrize("temperature", [5.0, -1.0, None])
def test_out_of_range_temperature_is_a_status_message_and_no_traceback(client, app_server, temperature):
    log = app_server[1].parent / "app.log"
    before = len(log.read_text())
    status, numbers = client.predict("hi", "ngram", 4, temperature, 8, False, api_name="/generate")[2::3]
    assert "error: temperature" in status and "0..2 (0 = greedy)" in numbers["error"], status
    out = client.predict("hi", ["ngram", "ar"], 3, temperature, 8, api_name="/compare")
    assert "error: temperature" in out[0]
    assert "Traceback" not in log.read_text()[before:]


def test_a_drafter_directory_inside_the_model_roots_loads_and_runs(client, history):
    from tests.conftest import REPO

    folder = REPO / "checkpoints" / "smollm2-135m-eagle3"  # the repo is a model root of the app under test
    dropdown, status = client.predict(str(folder), api_name="/load_drafter")
    label = f"{folder.name} ({folder.parent})"
    assert f"loaded drafter {label}" in status and dropdown["value"] == label
    run_id = client.predict("Name a colour.", label, 3, 0.0, 8, False, api_name="/generate")[3]
    run = history.get_run(run_id)
    assert run["settings"]["drafter"] == "eagle3" and run["settings"]["drafter_checkpoint"] == str(folder)
    assert run["settings"]["k"] == 3


def test_drafter_dir_outside_model_roots_is_refused(client):
    status = client.predict("/etc", api_name="/load_drafter")[1]
    assert "outside the allowed model roots" in status
