"""The drafter doctor (experiments/doctor.py): its statistics, checkpoint variants, report formats and storage, and on
the embedded model: the shipped drafters get a clean report and each injected fault is named by its check only."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from engine import load_drafter
from experiments import doctor
from storage import SCHEMA_VERSION, open_history
from tests.test_storage import old_history

REPO = Path(__file__).resolve().parent.parent
DFLASH, EAGLE3 = REPO / "checkpoints" / "smollm2-135m-dflash", REPO / "checkpoints" / "smollm2-135m-eagle3"
# the MASK-started DFlash, where each injected fault costs more than the prompt-to-prompt noise of N_PROMPTS prompts;
# the default's lookup hints copy from the context whatever its taps, mask token or template, so it loses less
PLAIN_DFLASH = REPO / "checkpoints" / "smollm2-135m-dflash-plain"
N_PROMPTS, MAX_NEW = 12, 64  # enough for a one-layer tap shift to stand out of the prompt-to-prompt noise


# -- statistics and rows -----------------------------------------------------------------------------


def test_a_consistent_gain_is_a_fault_and_noise_is_not() -> None:
    base = [1.5, 2.0, 1.8, 2.2, 1.6, 1.9]
    assert doctor.paired(base, [b + 0.2 for b in base])["fault"]  # same gain on every prompt: margin 0
    noisy = [b + d for b, d in zip(base, [0.6, -0.5, 0.4, -0.3, 0.5, -0.4], strict=True)]
    result = doctor.paired(base, noisy)
    assert not result["fault"] and result["margin"] > abs(result["diff"])
    assert not doctor.paired(base, [b - 0.3 for b in base])["fault"]  # accepting less is no fault
    assert doctor.paired(base, [b - 0.3 for b in base], two_sided=True)["fault"]  # a gap either way is
    assert not doctor.paired(base, [b + 0.01 for b in base])["fault"]  # below MIN_EFFECT of tau
    # prompts an arm could not measure (no anchor) are left out of the pairing
    assert doctor.paired([None, 1.5, 2.0], [1.0, 1.7, 2.2])["diff"] == pytest.approx(0.2)
    assert doctor.paired([1.0], [2.0]) == {"diff": 1.0, "margin": None, "fault": False}  # no noise estimate


def test_a_large_gain_inside_the_noise_is_unresolved_with_the_prompts_that_would_tell() -> None:
    """+0.4 tau on raw prompts with a margin of ~0.7 over 12 prompts must not read "ok"."""
    base = [2.0 + 0.1 * (i % 3) for i in range(12)]
    swings = [1.4, -0.6, 1.2, -0.5, 1.3, -0.4, 1.1, -0.7, 1.5, -0.3, 0.9, -0.1]  # mean +0.4, wide spread
    raw = [b + d for b, d in zip(base, swings, strict=True)]
    cmp = doctor.paired(base, raw)
    assert not cmp["fault"] and cmp["margin"] > cmp["diff"] >= doctor.RESOLVE_TAU
    assert cmp["prompts_needed"] > 12
    rows = doctor.compared("chat_template", "chat template", {"tau": 2.1, "per_prompt": base, "per_position": [0.5]},
                           [("raw prompts", {"tau": 2.5, "per_prompt": raw, "per_position": [0.6]})])
    assert [r["verdict"] for r in rows] == ["unresolved", "unresolved"]
    assert f"about {cmp['prompts_needed']} prompts" in rows[0]["detail"] and "over 12 prompts" in rows[1]["detail"]
    small = doctor.paired(base, [b + d / 10 for b, d in zip(base, swings, strict=True)])  # +0.04: not worth telling
    assert "prompts_needed" not in small


def test_per_position_acceptance_sums_to_tau_minus_one() -> None:
    accepted = [0, 3, 1, 7, 2]
    pos = doctor.per_position_of(accepted, 7)
    assert pos[0] == pytest.approx(0.8) and pos[6] == pytest.approx(0.2)
    assert 1 + sum(pos) == pytest.approx(1 + sum(accepted) / len(accepted))


def test_compared_rows_carry_the_verdict_on_the_configured_row() -> None:
    base = {"tau": 2.0, "per_prompt": [1.8, 2.0, 2.2], "per_position": [0.5, 0.3]}
    better = {"tau": 2.5, "per_prompt": [2.3, 2.5, 2.7], "per_position": [0.6, 0.4]}
    rows = doctor.compared("taps", "as configured", base, [("taps -1", better), ("taps +1", "refused: bad ids")])
    assert [(r["variant"], r["verdict"], r["configured"]) for r in rows] == [
        ("as configured", "fault", True), ("taps -1", "fault", False), ("taps +1", "inconclusive", False)]
    assert rows[1]["diff"] == pytest.approx(0.5) and rows[2]["detail"] == "refused: bad ids"
    only_refused = doctor.compared("taps", "as configured", base, [("taps +1", "refused")])
    assert only_refused[0]["verdict"] == "inconclusive"


# -- checkpoint variants --------------------------------------------------------------------------------


@pytest.mark.parametrize("src, kind, key", [(DFLASH, "dflash", "target_layer_ids"),
                                            (EAGLE3, "eagle3", "eagle_aux_hidden_state_layer_ids")])
def test_tap_shift_edits_only_the_tap_ids(tmp_path: Path, src: Path, kind: str, key: str) -> None:
    original = json.loads((src / "config.json").read_text())
    out = doctor.write_variant(src, tmp_path / "v", doctor.shift_taps(kind, -1))
    edited = json.loads((out / "config.json").read_text())
    section = "dflash_config" if kind == "dflash" else "eagle_config"
    assert edited[section][key] == [i - 1 for i in original[section][key]]
    edited[section][key] = original[section][key]
    assert edited == original
    assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_mask_edit_and_refused_variants(tmp_path: Path) -> None:
    out = doctor.write_variant(DFLASH, tmp_path / "m", doctor.set_mask(0))
    assert json.loads((out / "config.json").read_text())["dflash_config"]["mask_token_id"] == 0
    no_taps = tmp_path / "plain"
    no_taps.mkdir()
    config = json.loads((DFLASH / "config.json").read_text())
    del config["dflash_config"]["target_layer_ids"]
    (no_taps / "config.json").write_text(json.dumps(config))
    (no_taps / "model.safetensors").write_bytes((DFLASH / "model.safetensors").read_bytes())
    with pytest.raises(doctor.DrafterError, match="names no target_layer_ids"):
        doctor.write_variant(no_taps, tmp_path / "shifted", doctor.shift_taps("dflash", 1))


def test_prompts_from_a_text_file_and_bad_specs(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\n  second prompt  \nthird\n")
    assert doctor.load_prompts(str(f), 2) == ["first prompt", "second prompt"]
    with pytest.raises(doctor.DoctorError, match="neither a suite"):
        doctor.load_prompts(str(tmp_path / "missing.txt"), 3)
    with pytest.raises(doctor.DoctorError, match="positive"):
        doctor.load_prompts(str(f), 0)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(doctor.DoctorError, match="no prompts"):
        doctor.load_prompts(str(tmp_path / "empty.txt"), 3)


# -- report formats and storage ---------------------------------------------------------------------------


def synthetic_report() -> dict:
    """A report built from the doctor's own rows (no model): one fault, one ok, one not applicable check."""
    base = {"tau": 1.9, "per_prompt": [1.8, 2.0, None], "per_position": [0.5, 0.25, 0.1]}
    raw = {"tau": 1.4, "per_prompt": [1.3, 1.5, 1.4], "per_position": [0.3, 0.1, 0.0]}
    fixed = {"tau": 2.4, "per_prompt": [2.3, 2.5, 2.4], "per_position": [0.7, 0.5, 0.2]}
    rows = (doctor.compared("chat_template", "chat template", base, [("raw prompts", raw)])
            + doctor.compared("mask_token", "configured 0", base, [("engine default 16", fixed)])
            + doctor.not_applicable("rope", "the drafter's RoPE is the target's | pipes escaped"))
    identity = {"target": "t", "target_path": "/m/t", "target_dtype": "float32", "target_config_sha256": "ab",
                "drafter": "dflash", "drafter_source": "dflash", "drafter_path": "/c/d", "drafter_config_sha256": "cd",
                "k": 3, "backend": "cpu", "device": "cpu", "versions": {"jax": "0.1", "python": "3.11"}}
    settings = {"prompts": ["a", "b", "c"], "max_new_tokens": 16, "raw": False, "temperature": 0.0, "k": 3,
                "seed": 0, "min_effect": doctor.MIN_EFFECT}
    return {"identity": identity, "rows": rows, "settings": settings, "wall_s": 1.5}


def check_round_trip(report: dict, path: Path) -> dict:
    """Store the report, read it back, export it: every form equals the original; return what was read."""
    h = open_history(path)
    report_id = h.write_doctor_report(report)
    back = h.get_doctor_report(report_id)
    assert back["report_id"] == report_id and back["created_at"] is not None
    assert {k: v for k, v in back.items() if k not in ("report_id", "created_at")} == report
    assert doctor.from_json(doctor.to_json(report)) == report
    [listed] = [r for r in h.list_doctor_reports() if r["report_id"] == report_id]
    assert listed["faults"] == doctor.faults(report)
    md = doctor.to_markdown(report)
    for r in report["rows"]:
        assert f"| {r['check']} | {r['variant']} |" in md.replace("\\|", "|") or r["variant"] == "-"
    return back


def test_report_round_trips_through_duckdb_json_and_markdown(tmp_path: Path) -> None:
    report = synthetic_report()
    assert doctor.faults(report) == ["mask_token"]
    check_round_trip(report, tmp_path / "h.duckdb")
    md, text = doctor.to_markdown(report), doctor.to_text(report)
    assert "faults: mask_token" in md and "faults: mask_token" in text
    assert "RoPE is the target's \\| pipes escaped" in md  # a pipe in a cell does not break the table
    assert md.count("\n|") == 2 + len(report["rows"])
    with pytest.raises(Exception, match="no doctor report"):
        open_history(tmp_path / "h.duckdb").get_doctor_report("nope")


def test_a_v4_history_migrates_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "v4.duckdb"
    con = old_history(path, 4)
    con.execute("INSERT INTO runs (run_id, created_at, status, drafter) VALUES ('r1', now()::TIMESTAMP, 'done', "
                "'dflash')")
    con.close()
    h = open_history(path)
    assert SCHEMA_VERSION == 8 and [r["run_id"] for r in h.list_runs()] == ["r1"]
    assert h.list_doctor_reports() == []
    check_round_trip(synthetic_report(), path)


def test_a_v7_report_keeps_its_rows_and_its_not_applicable_checks_say_so(tmp_path: Path) -> None:
    path = tmp_path / "v7.duckdb"
    con = old_history(path, 7)
    for idx, (verdict, detail) in enumerate([("inconclusive", "not applicable: no thinking switch"),
                                             ("inconclusive", "refused: bad ids"), ("fault", "gain +0.5")]):
        con.execute("INSERT INTO doctor_checks VALUES ('rep', ?, 'taps', 'v', false, 2.0, NULL, [0.5], [2.0], NULL, "
                    "NULL, ?, ?)", [idx, verdict, detail])
    con.close()
    rows = open_history(path).query("SELECT verdict, detail FROM doctor_checks ORDER BY idx")
    assert [r["verdict"] for r in rows] == ["not applicable", "inconclusive", "fault"]
    assert rows[0]["detail"] == "not applicable: no thinking switch"


# -- on the embedded model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc(target):
    return doctor.Doctor(target, max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def prompts():
    return doctor.load_prompts(None, N_PROMPTS)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> dict[str, Path]:
    """Copies of the MASK-started DFlash drafter with one fault each."""
    tmp = tmp_path_factory.mktemp("faulty")
    return {"taps": doctor.write_variant(PLAIN_DFLASH, tmp / "taps", doctor.shift_taps("dflash", 1)),
            "mask_token": doctor.write_variant(PLAIN_DFLASH, tmp / "mask", doctor.set_mask(0))}


def verdicts(report: dict) -> dict[str, str]:
    return {r["check"]: r["verdict"] for r in report["rows"] if r["configured"] or r["variant"] == "-"}


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_the_shipped_drafters_get_a_clean_report(doc, prompts, drafter: str, tmp_path: Path) -> None:
    report = doc.diagnose(drafter, prompts)
    print(f"\n{doctor.to_text(report)}")
    assert set(verdicts(report)) == set(doctor.CHECKS)
    assert doctor.faults(report) == []
    v = verdicts(report)
    assert v["taps"] == v["dtype"] == v["chat_template"] == v["train_serve"] == "ok"
    assert v["thinking"] == "not applicable"  # SmolLM2's template has no thinking mode
    assert v["rope"] == "not applicable" and v["temperature"] == "not applicable"
    assert v["shared_head"] == ("ok" if drafter == "eagle3" else "not applicable")
    assert v["mask_token"] == "not applicable"  # the shipped DFlash mask is the engine's default; EAGLE-3 has none
    serve = [r for r in report["rows"] if r["check"] == "train_serve"]
    assert abs(serve[1]["diff"]) < 0.05  # the offline metric and the engine agree at the engine's anchors
    check_round_trip(report, tmp_path / "h.duckdb")


@pytest.mark.parametrize("fault", ["taps", "mask_token", "chat_template"])
def test_an_injected_fault_is_named_by_its_check_and_no_other(doc, prompts, faulty, fault: str) -> None:
    if fault == "chat_template":  # a drafter trained on templated prompts, served raw
        report = doc.diagnose(PLAIN_DFLASH, prompts, raw=True)
    else:
        report = doc.diagnose(faulty[fault], prompts)
    print(f"\n{doctor.to_text(report)}")
    assert doctor.faults(report) == [fault]
    fixes = [r["variant"] for r in report["rows"] if r["check"] == fault and not r["configured"]
             and r["verdict"] == "fault"]
    expected = {"taps": ["taps -1"], "mask_token": ["engine default 16"], "chat_template": ["chat template"]}
    assert fixes == expected[fault]


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_taps_that_are_not_the_cards_are_a_fault_however_small_the_gap(small, tmp_path: Path, drafter: str) -> None:
    """The shipped drafter with its taps moved by one (its card copied with it, saying what it trained with):
    lookup hints may hide the cost in the noise of a few prompts, the card does not."""
    doc, texts = small
    shipped = Path(load_drafter(drafter, doc.base).checkpoint)
    moved = doctor.write_variant(shipped, tmp_path / "moved", doctor.shift_taps(drafter, 1))
    (moved / "training.json").write_text((shipped / "training.json").read_text())
    rows = doc.diagnose(moved, texts, checks=("taps",))["rows"]
    assert rows[0]["verdict"] == "fault" and "its card (training.json) says it was trained with" in rows[0]["detail"]
    assert rows[1]["variant"].startswith("trained with") and rows[1]["tau"] is not None
    clean = doc.diagnose(drafter, texts, checks=("taps",))["rows"]
    assert not any(r["variant"].startswith("trained with") for r in clean)  # the shipped taps are its card's


@pytest.mark.slow
def test_the_cli_prints_json_and_stores_the_report(tmp_path: Path, capsys) -> None:
    db, md = tmp_path / "h.duckdb", tmp_path / "r.md"
    doctor.main(["--drafter", "dflash", "--limit", "2", "--max-new-tokens", "12", "--json", "--history", str(db),
                 "--markdown", str(md)])
    rows = json.loads(capsys.readouterr().out)
    assert {r["check"] for r in rows} == set(doctor.CHECKS)
    assert all({"check", "variant", "tau", "verdict", "per_position"} <= set(r) for r in rows)
    assert all(r["verdict"] in doctor.VERDICTS for r in rows)
    [stored] = open_history(db).list_doctor_reports()
    assert open_history(db).get_doctor_report(stored["report_id"])["rows"] == rows
    assert "### drafter doctor" in md.read_text()


THINKING_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
                     "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def small(target):
    """A doctor for three short prompts (checks that only need to run, not to resolve small effects)."""
    return doctor.Doctor(target, max_new_tokens=16), ["What is 2 + 3?", "Name a colour.", "Say hello."]


def test_the_temperature_check_compares_sampling_with_greedy(small) -> None:
    doc, texts = small
    rows = doc.diagnose("dflash", texts, temperature=1.0, checks=("temperature",))["rows"]
    assert [r["variant"] for r in rows] == ["engine, T=1", "engine, T=0"]
    assert all(r["tau"] == r["engine_tau"] and r["tau"] >= 1 for r in rows)
    assert rows[0]["verdict"] == "info" and rows[1]["diff"] is not None  # sampling accepts less: expected, no fault
    assert "expected" in rows[0]["detail"] and "not a fault" in rows[0]["detail"]


def test_a_template_with_a_thinking_mode_is_measured_both_ways(target) -> None:
    tokenizer = copy.deepcopy(target.tokenizer)
    tokenizer.chat_template = THINKING_TEMPLATE
    thinking = dataclasses.replace(target, tokenizer=tokenizer)
    assert doctor.thinking_text(thinking, "hi", False).endswith("<think>\n\n</think>\n\n")
    assert doctor.thinking_text(thinking, "hi", True) == doctor.thinking_text(thinking, "hi", None)
    report = doctor.Doctor(thinking, max_new_tokens=16).diagnose(
        "dflash", ["What is 2 + 3?", "Name a colour.", "Say hello."], checks=("thinking",))
    rows = report["rows"]
    assert [r["variant"] for r in rows] == ["template default", "thinking off"]  # on renders as the default
    assert all(r["tau"] is not None and r["verdict"] in ("ok", "fault") for r in rows)
