"""Tests for storage/: schema and migrations, run round trip, transactions, concurrency, errors, views, export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from storage import History, HistoryError, drafter_label, export_annotations, open_history
from storage.history import MIGRATIONS, SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[1]
PROMPT_IDS = [1, 2, 3, 4]


def make_step(index: int, position: int, drafted: list[int], accepted: int, bonus: int) -> dict:
    """A StepTrace.to_dict() with the exact field names of engine/trace.py."""
    rows = len(drafted) + 1
    return {
        "index": index, "position": position, "drafted": drafted, "accepted": accepted, "bonus": bonus,
        "p": [0.5 + 0.01 * j for j in range(len(drafted))], "q": [0.25 + 0.01 * j for j in range(len(drafted))],
        "top5_ids": [[700 + 10 * index + j, 1, 2, 3, 4] for j in range(rows)],
        "top5_p": [[0.6, 0.1, 0.1, 0.1, 0.1] for _ in range(rows)],
        "emitted": drafted[:accepted] + [bonus], "draft_ms": 1.5, "verify_ms": 2.25,
        "drafted_text": [f"t{t}" for t in drafted], "bonus_text": f"t{bonus}",
        "top5_text": [[f"c{j}"] * 5 for j in range(rows)], "state_rollback": len(drafted) - accepted,
    }


def make_result(accepted: list[int], k: int = 3, drafter: str = "ngram", drafted_len: list[int] | None = None,
                compiles: int = 0, **settings) -> dict:
    """A GenerationResult.to_dict() whose steps chain consistently (position, emitted)."""
    steps, position, tokens = [], len(PROMPT_IDS) - 1, []
    for i, a in enumerate(accepted):
        n = k if drafted_len is None else drafted_len[i]
        step = make_step(i, position, [100 * (i + 1) + j for j in range(n)], a, 900 + i)
        steps.append(step)
        tokens += step["emitted"]
        position += len(step["emitted"])
    drafted = sum(len(s["drafted"]) for s in steps)
    stats = {"tau": len(tokens) / len(steps), "acceptance_rate": sum(accepted) / drafted, "tok_per_s": 50.0,
             "wall_s": 0.5, "prefill_ms": 10.0, "decode_s": 0.49, "n_steps": len(steps), "n_generated": len(tokens),
             "n_prompt": len(PROMPT_IDS), "drafted": drafted, "accepted": sum(accepted), "draft_ms": 4.5,
             "verify_ms": 6.75, "stop_reason": "length", "compiles": compiles}
    settings = {"target": "tiny-llama", "target_path": "/m/tiny", "dtype": "float32", "drafter": drafter,
                "drafter_checkpoint": None, "k": k, "temperature": 0.0, "top_p": 1.0, "seed": 7,
                "max_new_tokens": len(tokens), "backend": "cpu", "device_kind": "cpu",
                "versions": {"jax": "0.10.2", "draftscope": "0.1"}, "batch": 1, "mesh": "1x1"} | settings
    return {"text": "hello world", "token_ids": tokens, "prompt_ids": list(PROMPT_IDS), "steps": steps,
            "stats": stats, "settings": settings}


@pytest.fixture
def history(tmp_path: Path) -> History:
    return open_history(tmp_path / "h.duckdb", lock_timeout=2.0)


def raw(path: Path, sql: str, params: list | None = None) -> list:
    con = duckdb.connect(str(path))
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


# -- schema and migrations -------------------------------------------------------------------------


def test_new_file_has_schema_version_tables_views_and_labels(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "dir" / "h.duckdb"
    h = open_history(path)
    assert path.exists()
    assert dict(raw(path, "SELECT key, value FROM meta"))["schema_version"] == str(SCHEMA_VERSION) == "8"
    names = {r[0] for r in raw(path, "SELECT table_name FROM duckdb_tables()")}
    assert {"meta", "runs", "steps", "kflat", "annotations", "labels"} <= names
    views = {r[0] for r in raw(path, "SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    assert {"run_summary", "position_acceptance", "drafter_comparison", "acceptance_lengths"} <= views
    assert h.list_labels()[:2] == ["format/whitespace", "number"] and "other" in h.list_labels()
    open_history(path)  # reopening is a no-op
    assert dict(raw(path, "SELECT key, value FROM meta"))["schema_version"] == "8"
    # views are recreated when their text changed (recorded as views_sha)
    raw(path, "DROP VIEW acceptance_lengths; UPDATE meta SET value = 'old' WHERE key = 'views_sha'")
    assert open_history(path).query("SELECT count(*) AS n FROM acceptance_lengths") == [{"n": 0}]


def test_v1_file_migrates_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(path))
    con.execute(MIGRATIONS[0])
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute("INSERT INTO runs (run_id, created_at, status, drafter, prompt) VALUES ('r1', now()::TIMESTAMP, "
                "'done', 'ngram', 'old prompt')")
    con.close()
    assert "annotations" not in {r[0] for r in raw(path, "SELECT table_name FROM duckdb_tables()")}

    h = open_history(path)
    assert dict(raw(path, "SELECT key, value FROM meta"))["schema_version"] == str(SCHEMA_VERSION)
    assert "paraphrase" in h.list_labels()
    [run] = h.list_runs()
    assert run["run_id"] == "r1" and run["n_annotations"] == 0
    assert (run["batch"], run["mesh"]) == (1, "1x1")  # v3: every earlier run was one sequence on one device


def old_history(path: Path, version: int) -> duckdb.DuckDBPyConnection:
    """A connection to a new history file at schema `version` (its first migrations only), to fill and close."""
    con = duckdb.connect(str(path))
    for sql in MIGRATIONS[:version]:
        con.execute(sql)
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(version)])
    return con


def test_v3_duplicate_annotations_are_merged_on_open(tmp_path: Path) -> None:
    path = tmp_path / "v3.duckdb"
    con = old_history(path, 3)
    con.execute("INSERT INTO runs (run_id, created_at, status) VALUES ('r1', TIMESTAMP '2026-01-01', 'done')")
    con.executemany("INSERT INTO annotations (run_id, step_idx, draft_pos, label, note, created_at, updated_at) "
                    "VALUES ('r1', ?, ?, ?, ?, TIMESTAMP '2026-01-01', ?::TIMESTAMP)",
                    [(2, 1, "number", "first", "2026-01-02"), (2, 1, "other", "edited last", "2026-01-05"),
                     (2, 1, "number", "second", "2026-01-03"), (3, 0, "number", "alone", "2026-01-01")])
    con.close()

    h = open_history(path)
    rows = h.query("SELECT annotation_id, step_idx, draft_pos, label, note FROM annotations ORDER BY step_idx")
    assert [(r["annotation_id"], r["step_idx"], r["draft_pos"], r["label"], r["note"]) for r in rows] == [
        (2, 2, 1, "other", "edited last"), (4, 3, 0, "number", "alone")]
    assert h.list_runs()[0]["n_annotations"] == 2
    with pytest.raises(duckdb.ConstraintException):  # the table itself refuses a twin
        raw(path, "INSERT INTO annotations (run_id, step_idx, draft_pos, label, created_at, updated_at) "
                  "VALUES ('r1', 2, 1, 'other', now()::TIMESTAMP, now()::TIMESTAMP)")


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.duckdb"
    open_history(path)
    raw(path, "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    with pytest.raises(HistoryError, match=rf"newer draftscope \(schema v{SCHEMA_VERSION + 1}, "
                                           rf"this version knows v{SCHEMA_VERSION}\)"):
        open_history(path)


# -- runs ------------------------------------------------------------------------------------------


def test_run_round_trip(history: History) -> None:
    result = make_result([2, 0, 3, 1])
    meta = {"prompt": "say hi", "suite": "gsm8k", "prompt_id": "q7", "category": "math", "source": "bench",
            "lossless": True, "comparison_group": "g1", "status": "done"}
    run_id = history.write_run(result, **meta, custom_tag="x")
    run = history.get_run(run_id)
    for key in ("text", "token_ids", "prompt_ids", "steps", "stats", "settings"):
        assert run[key] == result[key], key
    assert {k: run[k] for k in meta} == meta and run["custom_tag"] == "x" and run["run_id"] == run_id
    assert [s["index"] for s in run["steps"]] == [0, 1, 2, 3]

    other = history.write_run(make_result([1], drafter="ar"), prompt="other TEXT", suite="mtbench")
    assert history.get_run(other)["status"] == "done"
    assert [r["run_id"] for r in history.list_runs()] == [other, run_id]
    assert [r["run_id"] for r in history.list_runs(drafter="ngram")] == [run_id]
    assert [r["run_id"] for r in history.list_runs(suite="mtbench", target="tiny-llama")] == [other]
    assert [r["run_id"] for r in history.list_runs(text_like="other text")] == [other]
    assert [r["run_id"] for r in history.list_runs(text_like="HELLO")] == [other, run_id]
    assert len(history.list_runs(limit=1)) == 1
    with pytest.raises(HistoryError, match="no run"):
        history.get_run("nope")


def test_missing_optional_keys_are_tolerated(history: History) -> None:
    result = make_result([1])
    result["settings"] = {"target": "t", "k": 3}
    result["stats"] = {"tau": 2.0}
    for key in ("drafted_text", "bonus_text", "top5_text", "state_rollback"):
        del result["steps"][0][key]
    run = history.get_run(history.write_run(result))
    assert run["settings"]["versions"] == {} and run["settings"]["drafter"] is None
    assert run["stats"]["tau"] == 2.0 and run["prompt"] is None
    assert run["steps"][0]["drafted_text"] == [] and run["steps"][0]["bonus_text"] == ""
    assert run["steps"][0]["state_rollback"] == 0


def test_failed_write_leaves_no_half_run(history: History) -> None:
    result = make_result([1, 2, 3])
    result["steps"][2]["drafted"] = "not a token list"
    with pytest.raises(HistoryError, match="could not write the run"):
        history.write_run(result, prompt="bad")
    result = make_result([1, 2])
    del result["steps"][1]["p"]
    with pytest.raises(HistoryError, match="step 1 lacks p"):
        history.write_run(result)
    with pytest.raises(HistoryError, match="status"):
        history.write_run(make_result([1]), status="half")
    assert history.query("SELECT (SELECT count(*) FROM runs) AS runs, (SELECT count(*) FROM steps) AS steps") == [
        {"runs": 0, "steps": 0}]


def test_query_returns_dicts_and_changes_nothing(history: History) -> None:
    history.write_run(make_result([1]))
    assert history.query("SELECT count(*) AS n FROM runs WHERE k = ?", [3]) == [{"n": 1}]
    history.query("DELETE FROM runs")
    assert history.query("SELECT count(*) AS n FROM runs") == [{"n": 1}]
    with pytest.raises(HistoryError, match="query failed"):
        history.query("SELECT nope FROM runs")


# -- concurrency and errors ------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from tests.test_storage import make_result
    from storage import open_history
    h = open_history(sys.argv[1], lock_timeout=30)
    for i in range(20):
        h.write_run(make_result([i % 4, 1, 2]), prompt=f"{sys.argv[2]}-{i}", source=sys.argv[2])
""")


def test_two_processes_write_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "shared.duckdb"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(REPO)], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    h = open_history(path)
    rows = h.query("SELECT source, count(*) AS n, sum(n_steps) AS steps FROM runs GROUP BY source ORDER BY source")
    assert rows == [{"source": "a", "n": 20, "steps": 60}, {"source": "b", "n": 20, "steps": 60}]
    assert h.query("SELECT count(*) AS n FROM steps") == [{"n": 120}]


KILLED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    import duckdb
    from tests.test_storage import make_result
    from storage import open_history
    h = open_history(sys.argv[1])
    for i in range(3):
        h.write_run(make_result([1, 2]), prompt=f"kept-{i}")
    con = duckdb.connect(sys.argv[1])  # held open with uncheckpointed writes when the process is killed
    con.execute("CREATE TABLE scratch AS SELECT range AS x FROM range(100000)")
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_a_history_killed_mid_use_opens_again_with_its_runs(tmp_path: Path) -> None:
    """kill -9 while a connection holds uncheckpointed writes: the file (and its leftover .wal) opens again and the
    committed runs are all there."""
    path = tmp_path / "h.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path), str(REPO)], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert path.with_name(path.name + ".wal").exists()  # the write-ahead log the kill leaves behind
    finally:
        proc.kill()
        proc.wait(timeout=30)
    h = open_history(path, lock_timeout=10)
    assert sorted(r["prompt"] for r in h.query("SELECT prompt FROM runs")) == ["kept-0", "kept-1", "kept-2"]
    assert h.query("SELECT count(*) AS n FROM steps") == [{"n": 6}]


HOLDER = "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); sys.stdin.read()"


def test_locked_file_times_out_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "h.duckdb"
    open_history(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(HistoryError, match=rf"in use by another process \(pid {holder.pid}"):
            open_history(path, lock_timeout=0.3)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    open_history(path, lock_timeout=5).write_run(make_result([1]))  # free again


def test_corrupt_file_is_reported_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "h.duckdb"
    garbage = os.urandom(64) + b"this is not a database" * 200
    path.write_bytes(garbage)
    with pytest.raises(HistoryError, match="not a draftscope history.*left untouched"):
        open_history(path)
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.duckdb"]


def test_foreign_duckdb_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    raw(path, "CREATE TABLE t AS SELECT 42 AS x")
    with pytest.raises(HistoryError, match="not a draftscope history"):
        open_history(path)
    assert raw(path, "SELECT table_name FROM duckdb_tables()") == [("t",)]


def test_unusable_paths(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(HistoryError, match="cannot create the directory"):
        open_history(blocker / "sub" / "h.duckdb")
    with pytest.raises(HistoryError, match="is a directory"):
        open_history(tmp_path)


# -- annotations, labels, kflat --------------------------------------------------------------------


def test_annotations_and_labels(history: History) -> None:
    run_id = history.write_run(make_result([1, 0]), prompt="p")
    a = history.save_annotation(run_id, 0, 1, "number", "a digit")
    b = history.save_annotation(run_id, 1, 0, "other")
    assert [r["annotation_id"] for r in history.list_annotations()] == [a, b]
    [row] = history.list_annotations(label="number", drafter="ngram")
    assert (row["drafted_token"], row["drafted_text"], row["position"], row["note"]) == (101, "t101", 5, "a digit")
    assert history.list_annotations(drafter="ar") == []

    history.update_annotation(a, note="two digits")
    history.update_annotation(b, label="number")
    assert [(r["label"], r["note"]) for r in history.list_annotations(label="number")] == [
        ("number", "two digits"), ("number", "")]
    history.delete_annotation(b)
    assert [r["annotation_id"] for r in history.list_annotations()] == [a]
    assert history.list_runs()[0]["n_annotations"] == 1
    # saving a token again updates its one annotation (same id, new label and note), it never adds a twin
    assert history.save_annotation(run_id, 0, 1, "other", "re-saved") == a
    [again] = history.list_annotations(run_id=run_id)
    assert (again["annotation_id"], again["label"], again["note"]) == (a, "other", "re-saved")
    assert again["updated_at"] > again["created_at"] and history.list_runs()[0]["n_annotations"] == 1

    history.add_label("tokenizer-boundary")
    history.add_label("tokenizer-boundary")
    assert history.list_labels()[-1] == "tokenizer-boundary" and len(history.list_labels()) == 7
    for call, match in [(lambda: history.save_annotation(run_id, 0, 3, "number"), "outside"),
                        (lambda: history.save_annotation(run_id, 5, 0, "number"), "no step 5"),
                        (lambda: history.save_annotation(run_id, 0, 0, "nonsense"), "unknown label"),
                        (lambda: history.update_annotation(999, note="x"), "no annotation 999"),
                        (lambda: history.delete_annotation(b), f"no annotation {b}")]:
        with pytest.raises(HistoryError, match=match):
            call()


def test_kflat_round_trip(history: History) -> None:
    rows = [{"context": c, "k": k, "verify_ms": 10.0 + k, "draft_ms": None, "repeats": 5}
            for c in (128, 512) for k in (1, 4)]
    sweep = history.write_kflat(rows, hardware="cpu: test 2 cores", backend="cpu", model="tiny", dtype="float32")
    history.write_kflat(rows[:1], hardware="gpu: NVIDIA H200", backend="gpu", model="tiny", dtype="bfloat16",
                        drafter="dflash")
    got = history.list_kflat(hardware="cpu: test 2 cores")
    assert [(r["context"], r["k"], r["verify_ms"]) for r in got] == [(128, 1, 11.0), (128, 4, 14.0),
                                                                     (512, 1, 11.0), (512, 4, 14.0)]
    assert {r["sweep_id"] for r in got} == {sweep} and got[0]["extra"] == {"repeats": 5}
    assert [r["drafter"] for r in history.list_kflat(model="tiny")] == [None] * 4 + ["dflash"]


# -- views -----------------------------------------------------------------------------------------


def test_sweeps_written_k_by_k_are_one_sweep_and_same_minute_sweeps_are_told_apart(history: History) -> None:
    from app import queries

    meta = dict(hardware="cpu: test 2 cores", backend="cpu", model="tiny", dtype="float32", drafter="dflash")
    sweep = history.write_kflat([{"context": 32, "k": 1, "verify_ms": 2.0}], **meta)
    assert history.write_kflat([{"context": 32, "k": 2, "verify_ms": 2.5}], **meta, sweep_id=sweep) == sweep
    other = history.write_kflat([{"context": 32, "k": 1, "verify_ms": 2.1}, {"context": 32, "k": 2, "verify_ms": 2.6}],
                                **meta)
    stored = queries.sweeps(history)
    rows = stored[sweep]["rows"]
    assert [r["k"] for r in rows] == [1, 2] and len({r["created_at"] for r in rows}) == 1
    assert stored[sweep]["short"] != stored[other]["short"] and stored[sweep]["label"] != stored[other]["label"]
    assert "draft dflash · K 1-2 · ctx 32" in stored[sweep]["short"]


def test_views_match_hand_computed_values(history: History) -> None:
    # ngram, k=3: accepted per step 0,1,3,2,3 and one short block (2 drafted, 2 accepted).
    history.write_run(make_result([0, 1, 3]), suite="s")
    history.write_run(make_result([2, 3, 2], drafted_len=[3, 3, 2]), suite="s")
    history.write_run(make_result([1]), suite="s", status="cancelled")  # counted nowhere: finished runs only
    history.write_run(make_result([0, 0], drafter="ar"), suite="s")

    rows = history.query("SELECT i, n_steps, n_reached, n_accepted, survival, conditional_acceptance "
                         "FROM position_acceptance WHERE drafter = 'ngram' ORDER BY i")
    # accepted (drafted) in the finished runs: 0(3) 1(3) 3(3) 2(3) 3(3) 2(2)
    # every step counts at every position up to K (the short block did not survive to 3):
    # i=1: 6 steps, reached 6, accepted>=1: 5;  i=2: 6 steps, reached (a>=1) 5, a>=2: 4;
    # i=3: 6 steps, reached (a>=2) 4, a>=3: 2
    expected = [(1, 6, 6, 5), (2, 6, 5, 4), (3, 6, 4, 2)]
    assert [(r["i"], r["n_steps"], r["n_reached"], r["n_accepted"]) for r in rows] == expected
    for r, (_, n, reached, acc) in zip(rows, expected, strict=True):
        assert r["survival"] == pytest.approx(acc / n)
        assert r["conditional_acceptance"] == pytest.approx(acc / reached)

    assert 1 + sum(r["survival"] for r in rows) == pytest.approx(1 + (0 + 1 + 3 + 2 + 3 + 2) / 6)  # tokens per step
    hist = history.query("SELECT accepted, n_steps FROM acceptance_lengths WHERE drafter = 'ngram' ORDER BY accepted")
    assert [(r["accepted"], r["n_steps"]) for r in hist] == [(0, 1), (1, 1), (2, 2), (3, 2)]
    assert sum(r["n_steps"] for r in hist) == rows[0]["n_steps"]  # the histogram counts the steps survival counts

    history.write_run(make_result([3, 3], batch=4, mesh="2x4"), suite="s")  # a batch of 4: compared apart
    comp = {(r["drafter"], r["batch"]): r for r in history.query("SELECT * FROM drafter_comparison WHERE suite = 's'")}
    assert comp[("ngram", 4)]["n_runs"] == 1 and comp[("ngram", 4)]["tau"] == 4.0
    comp = {d: r for (d, b), r in comp.items() if b == 1}
    assert comp["ngram"]["n_runs"] == 2 and comp["ar"]["n_runs"] == 1
    # run tau = n_generated / n_steps: (1+2+4)/3 and (3+4+3)/3; pooled acceptance (4+7)/(9+8)
    assert comp["ngram"]["tau"] == pytest.approx((7 / 3 + 10 / 3) / 2)
    assert comp["ngram"]["acceptance_rate"] == pytest.approx(11 / 17)
    assert comp["ar"]["acceptance_rate"] == 0 and comp["ngram"]["tok_per_s"] == 50.0

    summary = history.query("SELECT status, n_steps, batch, mesh FROM run_summary ORDER BY created_at")
    assert [r["status"] for r in summary] == ["done", "done", "cancelled", "done", "done"]
    assert [r["n_steps"] for r in summary] == [3, 3, 1, 2, 2]
    assert [(r["batch"], r["mesh"]) for r in summary][-2:] == [(1, "1x1"), (4, "2x4")]
    history.write_run(make_result([3, 3], compiles=2), suite="cold")  # timed while compiling: no tok/s
    cold = history.query("SELECT n_runs, tau, tok_per_s FROM drafter_comparison WHERE suite = 'cold'")
    assert cold == [{"n_runs": 1, "tau": 4.0, "tok_per_s": None}]


def test_views_keep_two_checkpoints_of_one_drafter_kind_apart(history: History) -> None:
    """Two DFlash checkpoints compared in one history are two rows and two curves, named by their folders."""
    from app import plots, queries

    history.write_run(make_result([3, 3], drafter="dflash", drafter_checkpoint="/c/new-dflash"), suite="s")
    history.write_run(make_result([0, 1], drafter="dflash", drafter_checkpoint="/c/old-dflash"), suite="s")
    comp = {r["drafter_checkpoint"]: r for r in history.query("SELECT * FROM drafter_comparison")}
    assert comp["/c/new-dflash"]["tau"] == 4.0 and comp["/c/old-dflash"]["tau"] == pytest.approx(3 / 2)
    survival = {(r["drafter_checkpoint"], r["i"]): r["survival"] for r in queries.position_rows(history, None, None,
                                                                                                 None)}
    assert survival[("/c/new-dflash", 3)] == 1.0 and survival[("/c/old-dflash", 1)] == 0.5
    lengths = queries.length_rows(history, None, ["dflash"], "s")
    assert {(r["drafter_checkpoint"], r["accepted"], r["n_steps"]) for r in lengths} == {
        ("/c/new-dflash", 3, 2), ("/c/old-dflash", 0, 1), ("/c/old-dflash", 1, 1)}
    names = {trace.name for trace in plots.length_histogram(lengths).data}
    assert names == {"dflash (c/new-dflash) · s · K=3 · T=0", "dflash (c/old-dflash) · s · K=3 · T=0"}
    calibration = plots.calibration_figure(queries.calibration_rows(history, None, None, None))
    assert {"dflash (c/new-dflash)", "dflash (c/old-dflash)"} <= {trace.name for trace in calibration.data}
    same_folder_name = [drafter_label("dflash", f"/a/{run}/smollm2-135m-dflash") for run in ("run1", "run2")]
    assert same_folder_name == ["dflash (run1/smollm2-135m-dflash)", "dflash (run2/smollm2-135m-dflash)"]


def test_measured_speedup_compares_tokens_per_second_when_lengths_differ(history: History) -> None:
    """At T > 0 the ar reference may stop at EOS long before the drafter's run: rates are compared, not seconds."""
    def run(drafter: str, accepted: list[int], decode_s: float) -> dict:
        result = make_result(accepted, drafter=drafter, temperature=0.8, max_new_tokens=128)
        result["stats"]["decode_s"] = decode_s
        return result

    history.write_run(run("ar", [0] * 50, 5.0), prompt="p", comparison_group="g")  # 50 tokens in 5 s: 10 tok/s
    history.write_run(run("dflash", [3] * 32, 8.0), prompt="p", comparison_group="g")  # 128 tokens in 8 s: 16 tok/s
    rows = history.query("SELECT drafter, n_pairs, speedup FROM measured_speedup")
    assert rows == [{"drafter": "dflash", "n_pairs": 1, "speedup": pytest.approx(1.6)}]  # decode seconds: 0.625x


# -- export ----------------------------------------------------------------------------------------


def test_export_annotations(history: History, tmp_path: Path) -> None:
    result = make_result([2, 1, 0])  # k=3; steps emit 3, 2, 1 tokens
    run_id = history.write_run(result, prompt="What is 2+2?")
    history.write_run(make_result([1], drafter="ar"), prompt="unannotated")
    first = history.save_annotation(run_id, 1, 1, "number", "rejected")  # draft_pos == accepted -> bonus
    later = history.save_annotation(run_id, 2, 2, "long-range")  # draft_pos > accepted -> top5 row
    other = history.write_run(make_result([0], drafter="ar"), prompt="ar prompt")
    history.save_annotation(other, 0, 0, "number")

    paths = export_annotations(history, tmp_path / "out", drafter="ngram")
    assert set(paths) == {"parquet", "conversations", "rejections"} and all(p.exists() for p in paths.values())

    conversations = [json.loads(line) for line in paths["conversations"].read_text().splitlines()]
    assert conversations == [{"id": run_id, "conversations": [{"role": "user", "content": "What is 2+2?"},
                                                              {"role": "assistant", "content": "hello world"}]}]

    rej = {r["id"]: r for r in map(json.loads, paths["rejections"].read_text().splitlines())}
    assert set(rej) == {first, later}
    s0, s1, s2 = result["steps"]
    r1 = rej[first]
    assert r1["prefix_ids"] == PROMPT_IDS + s0["emitted"] + s1["drafted"][:1]
    assert r1["position"] == len(r1["prefix_ids"]) == s1["position"] + 2
    assert (r1["drafted_token"], r1["target_token"], r1["target_text"]) == (s1["drafted"][1], s1["bonus"], "t901")
    assert (r1["p"], r1["q"], r1["top5_ids"], r1["top5_p"]) == (s1["p"][1], s1["q"][1], s1["top5_ids"][1],
                                                                s1["top5_p"][1])
    assert (r1["run_id"], r1["step_idx"], r1["draft_pos"], r1["label"], r1["note"]) == (run_id, 1, 1, "number",
                                                                                        "rejected")
    assert (r1["drafter"], r1["k"], r1["temperature"], r1["target"]) == ("ngram", 3, 0.0, "tiny-llama")
    r2 = rej[later]
    assert r2["prefix_ids"] == PROMPT_IDS + s0["emitted"] + s1["emitted"] + s2["drafted"][:2]
    assert r2["position"] == len(r2["prefix_ids"])
    assert r2["target_token"] == s2["top5_ids"][2][0] != s2["bonus"]

    con = duckdb.connect()
    parquet = con.execute("SELECT id, run_id, label, drafter, prompt, drafted, prefix_ids FROM read_parquet(?) "
                          "ORDER BY id", [str(paths["parquet"])]).fetchall()
    assert [(r[0], r[2], r[3]) for r in parquet] == [(first, "number", "ngram"), (later, "long-range", "ngram")]
    assert parquet[0][5] == s1["drafted"] and parquet[0][6] == r1["prefix_ids"]

    only_number = export_annotations(history, tmp_path / "num", label="number")
    rej = {r["id"]: r for r in map(json.loads, only_number["rejections"].read_text().splitlines())}
    ar_id = history.list_annotations(drafter="ar")[0]["annotation_id"]
    assert sorted(rej) == sorted([first, ar_id])
    assert rej[ar_id]["prefix_ids"] == PROMPT_IDS and rej[ar_id]["position"] == len(PROMPT_IDS)
    assert con.execute("SELECT count(*) FROM read_parquet(?)", [str(only_number["parquet"])]).fetchone()[0] == 2


def test_survival_never_rises_with_position_when_blocks_have_different_lengths(history: History) -> None:
    """An n-gram drafter drafts short (or no) blocks on misses and long ones on matches: counting only the steps that
    drafted >= i tokens made survival rise with i; every step counts at every position, so it never rises."""
    history.write_run(make_result([0, 0, 0, 6, 0], k=6, drafted_len=[1, 1, 1, 6, 0]), suite="s")
    rows = history.query("SELECT i, n_steps, survival FROM position_acceptance WHERE drafter = 'ngram' ORDER BY i")
    assert [r["i"] for r in rows] == [1, 2, 3, 4, 5, 6] and {r["n_steps"] for r in rows} == {5}
    survival = [r["survival"] for r in rows]
    assert all(b <= a for a, b in zip(survival, survival[1:], strict=False)) and survival[-1] == pytest.approx(0.2)
    hist = history.query("SELECT sum(n_steps) AS n FROM acceptance_lengths WHERE drafter = 'ngram'")
    assert hist == [{"n": 5}]


def test_a_stored_runs_speedup_stays_pinned_to_the_ar_run_it_was_measured_against(history: History) -> None:
    """History replays a run against its own baseline_run_id, however many ar runs are stored after it; the spread
    of those runs is shown beside it, and a run stored without a baseline says what it is compared with."""
    from types import SimpleNamespace

    from app.runner import stored_speedup

    def ar(rate):
        result = make_result([0, 0], drafter="ar", max_new_tokens=16)
        result["stats"]["tok_per_s"] = rate
        return history.write_run(result, prompt="p", suite="s")

    first = ar(20.0)
    drafted = make_result([3, 3], max_new_tokens=16)
    drafted["stats"]["tok_per_s"] = 30.0
    pinned = history.write_run(drafted, prompt="p", baseline_run_id=first)
    unpinned = history.write_run(drafted, prompt="p")
    wb = SimpleNamespace(history=history)
    assert stored_speedup(wb, history.get_run(pinned))[0] == pytest.approx(1.5)
    ar(25.0)  # a newer, faster ar run
    value, note = stored_speedup(wb, history.get_run(pinned))
    assert value == pytest.approx(1.5) and f"ar run …{first[-8:]} it was measured against" in note
    assert "1.20-1.50x against all 2 stored ar runs" in note
    value, note = stored_speedup(wb, history.get_run(unpinned))
    assert value == pytest.approx(1.2) and note.startswith("no baseline stored with it; the newest ar run")


def test_an_identical_repeated_run_counts_once_in_acceptance_and_every_time_in_timing(history: History) -> None:
    """A deterministic run repeated gives the same steps again: one sample for survival, the histogram, calibration
    and tau; each copy is still a timing sample. A run with other output (another seed at T > 0) counts apart."""
    from app import queries

    for _ in range(3):
        history.write_run(make_result([0, 1, 3]), suite="s")
    history.write_run(make_result([3, 3]), suite="s", status="done")  # other tokens: a sample of its own
    rows = history.query("SELECT i, n_steps, n_accepted FROM position_acceptance WHERE drafter = 'ngram' ORDER BY i")
    assert [(r["n_steps"], r["n_accepted"]) for r in rows] == [(5, 4), (5, 3), (5, 3)]
    assert history.query("SELECT sum(n_steps) AS n FROM acceptance_lengths WHERE drafter = 'ngram'") == [{"n": 5}]
    comp = history.query("SELECT n_runs, n_timed, tau, n_generated FROM drafter_comparison WHERE drafter = 'ngram'")
    assert comp == [{"n_runs": 2, "n_timed": 4, "tau": pytest.approx((7 / 3 + 8 / 2) / 2), "n_generated": 15}]
    # drafts the verifier reached (j <= accepted, j < K): (1 + 2 + 3) once, not three times, + (3 + 3)
    assert sum(r["n"] for r in queries.calibration_rows(history, None, None, None)) == 6 + 6
    n_repeats = history.query("SELECT count(*) FILTER (WHERE is_repeat) AS n FROM finished_runs")
    assert n_repeats == [{"n": 2}]
