"""The app's tabs on a tiny random Llama checkpoint, in-process: app.state.start and app.ui.build, then each tab's
handler called as the page calls it. The fast tier's cover of the UI: no server, no embedded model (its tokenizer
only)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app import cli, queries, state, ui
from app.tabs import acceptance, annotate, common, compare, diagnose, generate, history, kflat
from engine.drafters.dflash_checkpoint import init_dflash, save_dflash
from engine.tokenizer import load_tokenizer
from engine.weights import embedded_model_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 49152  # the embedded tokenizer's
PROMPT = "one two three one two three one two three"


def tiny_llama(path, layers: int = 2) -> None:
    """A tiny random Llama saved with the embedded model's tokenizer: a local checkpoint directory."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=1024, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path)
    load_tokenizer(embedded_model_path()).save_pretrained(path)


@pytest.fixture(scope="module")
def wb(tmp_path_factory):
    """The workbench on the tiny target, its page built, and a tiny DFlash drafter saved beside it (not loaded)."""
    root = tmp_path_factory.mktemp("tiny-app")
    tiny_llama(root / "target")
    workbench = state.start(str(root / "target"), db=str(root / "h.duckdb"), model_roots=[str(root)])
    assert ui.build(workbench) is not None  # every tab's gr.Blocks
    cfg, params = init_dflash(workbench.target, num_layers=1, block_size=4, intermediate_size=64, seed=0)
    save_dflash(root / "dflash", cfg, params)
    return workbench


@pytest.fixture(scope="module")
def ngram_run(wb) -> str:
    """The run id of a greedy ngram generation (ar ran first as its reference)."""
    outs = list(generate.generate(wb, PROMPT, "ngram", 4, 0.0, 24, False, raw=True))
    status, run_id, numbers = outs[-1][2], outs[-1][3], outs[-1][5]
    assert "stored as run" in status and run_id, status
    assert numbers["drafter"] == "ngram" and numbers["k"] == 4 and numbers["n_generated"] > 0
    return run_id


def test_cli_defaults_bind_loopback_and_a_bad_target_exits_with_its_message(tmp_path):
    a = cli.parse([])
    assert (a.host, a.port, a.dtype, a.target, a.mesh, a.model_root) == ("127.0.0.1", 7860, "float32", None, None, None)
    assert cli.parse(["--target", "x", "--model-root", "a", "--model-root", "b"]).model_root == ["a", "b"]
    with pytest.raises(SystemExit, match=f"^draftscope: .*{tmp_path.name}"):
        cli.main(["--target", str(tmp_path / "missing"), "--db", str(tmp_path / "h.duckdb")])


def test_workbench_loads_the_tiny_target_and_refuses_the_shipped_model_drafters(wb):
    assert wb.target.name == "target" and wb.target.cfg.num_layers == 2
    assert wb.drafter_labels == ["ar", "ngram"] and wb.examples
    for name in ("dflash", "eagle3"):  # shipped for SmolLM2-135M: they share its 576-wide embedding
        assert "hidden_size is 576 but the target's is 32" in wb.unavailable[name], wb.unavailable
        assert f"**{name}**: unavailable" in common.unavailable_md(wb)
    assert "target **target**" in ui.header(wb) and "drafters: ar, ngram" in ui.header(wb)
    assert generate.k_field(wb, "ar")["interactive"] is False
    assert generate.k_field(wb, "ngram")["info"] == "ngram: a whole number in 1..64 (default 8)"
    assert kflat.default_ks(wb, "ngram") == "1,2,4,8,16,32,64" and kflat.drafter_choices(wb)[1:] == ["ngram"]
    assert "ngram 8" in compare.k_label(wb)


def test_generation_is_stored_lossless_in_the_history(wb, ngram_run):
    run = wb.history.get_run(ngram_run)
    assert run["settings"]["target"] == "target" and run["settings"]["drafter"] == "ngram"
    assert run["lossless"] is True and run["status"] == "done"
    ar = [r for r in wb.history.list_runs(drafter="ar") if r["comparison_group"] == run["comparison_group"]]
    assert len(ar) == 1 and wb.history.get_run(ar[0]["run_id"])["token_ids"] == run["token_ids"]


@pytest.mark.parametrize(("k", "max_new", "message"), [
    (0, 8, "K for ngram must be a whole number in 1..64 (its default here is 8), got 0; K=0 means no drafting"),
    (2.5, 8, "K for ngram must be a whole number in 1..64 (its default here is 8), got 2.5"),
    ("", 8, "K for ngram must be a whole number in 1..64"),
    (4, 0, "max new tokens must be a whole number in 1..2048, got 0"),
])
def test_a_bad_k_or_length_gives_the_message_the_ui_shows(wb, k, max_new, message):
    with pytest.warns(UserWarning, match=re.escape(message)):  # gr.Warning: the toast the page shows
        outs = list(generate.generate(wb, PROMPT, "ngram", k, 0.0, max_new, False))
    assert len(outs) == 1 and "error" in outs[0][2] and outs[0][5]["error"].startswith(message), outs[0][5]


def test_an_empty_prompt_or_too_few_drafters_are_refused(wb):
    with pytest.warns(UserWarning, match="the prompt is empty"):
        assert "the prompt is empty" in list(compare.compare(wb, "  ", ["ar", "ngram"], "", 0.0, 8))[-1][0]
    with pytest.warns(UserWarning, match="pick 2 to 4 drafters"):
        assert "pick 2 to 4 drafters to compare, not 1" in list(compare.compare(wb, PROMPT, ["ar"], "", 0.0, 8))[-1][0]
    assert generate.templated_text(wb, " ", False) is None


def test_an_unloaded_drafter_or_a_path_outside_the_roots_is_refused(wb, tmp_path):
    with pytest.warns(UserWarning):
        err = list(generate.generate(wb, PROMPT, "dflash", 4, 0.0, 8, False))[-1][5]["error"]
    assert err == "drafter 'dflash' is not loaded; choose one of ar, ngram"
    with pytest.raises(state.AppError, match="outside the allowed model roots"):
        wb.add_drafter_dir(str(tmp_path))
    with pytest.raises(state.AppError, match="no config.json"):
        wb.add_drafter_dir(str(wb.model_roots[0]))


def test_stop_ends_a_generation_stored_as_cancelled(wb):
    assert wb.request_stop("nobody") is False
    gen = generate.generate(wb, PROMPT + " four", "ar", None, 0.0, 64, False, raw=True)
    for out in gen:
        if "step 1," in out[2]:
            assert wb.request_stop("api")
            break
    last = list(gen)[-1]
    assert "stopped after" in last[2] and "(status cancelled)" in last[2]
    run = wb.history.get_run(last[3])
    assert run["status"] == "cancelled" and 0 < run["stats"]["n_generated"] < 64


def test_compare_stores_a_comparison_group(wb):
    outs = list(compare.compare(wb, "a b c a b c a b c", ["ngram", "ar"], "", 0.0, 12))
    assert "stored: 2 runs" in outs[-1][0]
    group = outs[-1][0].split("comparison ")[1].split(" ")[0]
    runs = [r for r in wb.history.list_runs() if r["comparison_group"] == group]
    assert sorted(r["drafter"] for r in runs) == ["ar", "ngram"]
    assert wb.history.get_run(next(r["run_id"] for r in runs if r["drafter"] == "ngram"))["lossless"] is True


def test_compare_names_a_winner_only_outside_the_baselines_own_spread(wb):
    # ar ran at 10 and 11 tok/s: a 10% band. 1.5x vs 1.0x (ar) is a lead; 1.50x vs 1.45x is a tie
    assert compare.verdict({"dflash K=7": 1.5}, [10.0, 11.0]).startswith("winner: dflash K=7 (1.50x ar), ahead of ar")
    tie = compare.verdict({"dflash K=7": 1.5, "eagle3 K=7": 1.45}, [10.0, 11.0])
    assert tie.startswith("no winner: dflash K=7 (1.50x ar) and eagle3 K=7 (1.45x)") and "10%" in tie
    assert compare.verdict({"ngram K=4": 0.9}, [10.0, 10.5]).startswith("winner: ar")  # slower than ar, clearly
    assert "no winner named: one ar run" in compare.verdict({"dflash K=7": 3.0}, [10.0])
    status = list(compare.compare(wb, "a b c a b c a b c", ["ngram", "ar"], "", 0.0, 12))[-1][0]
    assert "winner" in status and "ngram K=" in status, status  # named, or called a tie, in the status


def test_kflat_sweep_is_timed_and_stored(wb):
    assert kflat.parse_ks("4, 1,2,2") == [1, 2, 4]
    with pytest.raises(state.AppError, match="whole numbers"):
        kflat.parse_ks("1,x")
    status, sweeps, _, latency, speed = kflat.run_sweep(wb, "1,2", 16, 1, "ngram", [], None)
    assert "stored (K=1: verify" in status and "K=2: verify" in status and "draft" in status, status
    stored = queries.sweeps(wb.history)
    assert len(stored) == 1 and sorted(r["k"] for r in next(iter(stored.values()))["rows"]) == [1, 2]
    assert latency is not None and speed is not None
    with pytest.warns(UserWarning, match="repeats must be a whole number in 1..50, got 0"):
        assert "error: repeats" in kflat.run_sweep(wb, "1", 16, 0, None, [], None)[0]


def test_history_lists_replays_and_compares_runs(wb, ngram_run):
    rows = history.table(wb, queries.ALL, queries.ALL, "")
    ids = [r[history.COLUMNS.index("run_id")] for r in rows]
    assert ngram_run in ids and len(rows[0]) == len(history.COLUMNS)
    assert history.table(wb, "ngram", queries.ALL, "") and all(
        r[1] == "ngram" for r in history.table(wb, "ngram", queries.ALL, ""))
    replay = history.open_run(wb, ngram_run)
    assert f"run {ngram_run} · ngram K=4" in replay and "lossless vs ar: True" in replay and "speedup vs ar" in replay
    assert "pick a run" in history.open_run(wb, None)
    assert history.compare_runs(wb, ids[:2]).count("<h4>") == 2
    assert "pick 2 to 4 runs" in history.compare_runs(wb, ids[:1])


def test_acceptance_summarises_the_stored_runs(wb, ngram_run):
    *figs, table = acceptance.views(wb, wb.target.name, None, queries.ALL)
    assert len(figs) == 4 and all(f is not None for f in figs)
    mine = [r for r in table if r[0] == "ngram"]
    assert mine and mine[0][acceptance.SUMMARY_COLUMNS.index("n_runs")] >= 1


def test_annotate_labels_a_rejected_token_and_exports_it(wb, ngram_run):
    run = wb.history.get_run(ngram_run)
    choices = annotate.rejected_choices(run)
    view, token = annotate.show_run(wb, ngram_run)
    assert "data-pick" in view and token["choices"] == choices
    assert choices, "the random target rejects some of ngram's drafts"
    label = wb.history.list_labels()[0]
    assert "stored" in annotate.add(wb, ngram_run, choices[0][1], label, "tiny")
    rows = annotate.annotation_rows(wb, ngram_run, True)
    assert len(rows) == 1 and rows[0][5] == label and rows[0][6] == "tiny"
    with pytest.warns(UserWarning, match="choose a run"):
        assert "choose a run" in annotate.add(wb, None, None, label, "")
    html, files = annotate.export(wb, "ann", queries.ALL, queries.ALL)
    assert "exported to" in html and sorted(Path(f).name for f in files) == [
        "annotations.parquet", "conversations.jsonl", "rejections.jsonl"]
    record = json.loads(next(Path(f) for f in files if f.endswith("rejections.jsonl")).read_text().splitlines()[0])
    assert (record["run_id"], record["label"], record["note"]) == (ngram_run, label, "tiny")
    assert record["prefix_ids"] == run["prompt_ids"] + run["token_ids"][:record["position"] - len(run["prompt_ids"])]
    with pytest.warns(UserWarning, match="must be inside"):
        html, files = annotate.export(wb, "../outside", None, None)
    assert "error: the export folder must be inside" in html and files is None


def test_diagnose_runs_the_doctor_on_a_loaded_dflash_drafter(wb):
    with pytest.raises(state.AppError, match="DFlash / EAGLE-3"):
        diagnose.run_doctor(wb, "ngram", diagnose.MIXED, 2, 8, False, 0.0)
    root = wb.model_roots[0]
    assert state.checkpoint_dirs(root) == [root / "dflash", root / "target"] and state.checkpoint_dirs(root / "x") == []
    label = wb.add_drafter_dir(str(root / "dflash"))
    assert label == f"dflash ({root})" and wb.default_k[label] == 3
    assert diagnose.drafter_choices(wb) == [label]
    status, rows, fig, markdown = diagnose.run_doctor(wb, label, "gsm8k", 2, 8, False, 0.0)
    assert "stored as report" in status and rows and markdown.startswith("### drafter doctor")
    assert [r["report_id"] for r in wb.history.list_doctor_reports()] == [status.split("`")[1]]


def test_kflat_takes_the_acceptance_of_one_checkpoint_and_times_its_drafter(wb, ngram_run):
    root = wb.model_roots[0]
    label = wb.add_drafter_dir(str(root / "dflash"))
    status = list(generate.generate(wb, PROMPT, label, 3, 0.0, 12, False, raw=True))[-1][2]
    assert "stored as run" in status, status
    stored = kflat.stored_label(wb, label)
    assert stored == f"dflash ({root.name}/dflash)"  # how the history names its runs
    sources = kflat.acceptance_sources(wb)
    assert sources[stored] == ("dflash", wb.drafter(label).checkpoint) and list(sources)[-1] == "ngram"
    assert kflat.timed_default(wb, stored) == label and kflat.default_ks(wb, label) == "1,2,3"
    assert "as 1 stored dflash" in kflat.run_like(wb, stored)[2]
    curve, steps = queries.survival(wb.history, wb.target.name, *sources[stored])
    assert len(curve) == 3 and steps > 0
