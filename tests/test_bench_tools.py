"""The benchmark tools end to end on a tiny random Llama checkpoint (--target): the engine floor against
transformers, the data engine's throughput per slot count, the drafter update step's throughput and the recipe's
ablation runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from engine import continuous, load_target
from experiments.bench import distill_speed as bench_distill
from experiments.bench import engine_speed as bench_engine
from experiments.bench import train_speed as bench_train
from experiments.data import distill
from experiments.training import ablate
from tests.test_app_tiny import tiny_llama

pytest.importorskip("torch")
pytest.importorskip("transformers")

MIX = {"math": 0.5, "code": 0.3, "chat": 0.2}  # no sharegpt: the dataset needs no extra wheel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random 4-layer Llama checkpoint directory with the embedded tokenizer."""
    path = tmp_path_factory.mktemp("bench") / "target"
    tiny_llama(path, layers=4)
    return path


@pytest.fixture(scope="module")
def tiny_data(tiny, tmp_path_factory):
    """A self-distilled dataset of 8 prompts on the tiny target (no stored features)."""
    path = tmp_path_factory.mktemp("bench-data") / "data"
    distill.run(path, 8, target=load_target(str(tiny)), mix=MIX, max_new=8, max_prompt=128, slots=2, shard_size=4,
                features=False)
    return path


# train_drafter flags of a tiny DFlash that trains in seconds
TINY_DRAFTER = ["--seq-len", "192", "--layers", "1", "--features", "2", "--block-size", "4", "--intermediate", "32",
                "--draft-vocab", "1024"]


def test_bench_engine_decodes_as_transformers_does(tiny, capsys, monkeypatch):
    real_copy = bench_engine.copy_bandwidth  # the copy bandwidth of a 16 MiB array, not 512 MiB: seconds, not tens
    monkeypatch.setattr(bench_engine, "copy_bandwidth", lambda **kw: real_copy(16 << 20, **kw))
    assert bench_engine.main(["--target", str(tiny), "--max-new-tokens", "8", "--repeats", "1", "--torch-threads",
                              "1", "--prompt", "Count to five.", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["engine"] for r in rows] == ["draftscope ar", "transformers generate (1 thread)"]
    for r in rows:
        assert r["same_tokens_as_first_ar"] is True, r  # transformers' greedy tokens are ours
        assert r["tokens"] > 0 and r["tok_per_s"] > 0 and r["copy_gb_s"] > 0 and r["dtype"] == "float32"
        assert r["weight_gb_s"] == pytest.approx(r["weight_bytes"] * r["tok_per_s"] / 1e9)
    ours, hf = rows
    assert ours["verify_ms_per_step"] > 0 and ours["host_ms_per_step"] > 0
    assert ours["ours_x"] == pytest.approx(hf["ms_per_token"] / ours["ms_per_token"]) and hf["ours_x"] == 1.0
    assert bench_engine.table(rows).count("yes") == 2


def test_bench_engine_reports_a_bad_target(tmp_path, capsys):
    assert bench_engine.main(["--target", str(tmp_path / "missing"), "--json"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_bench_distill_times_each_slot_count(tiny, capsys, monkeypatch):
    for name in ("prefill_slot", "greedy_steps"):  # main() wraps them in timers: put the originals back afterwards
        monkeypatch.setattr(continuous, name, getattr(continuous, name))
    bench_distill.main(["--target", str(tiny), "--slots", "1,2", "--prompts", "3", "--max-prompt", "128",
                        "--max-new", "8"])
    lines = capsys.readouterr().out.splitlines()
    pattern = re.compile(r"slots (\d+), cache (\d+) rows, (\d+) prompts \((\d+) prompt tokens\): ([\d.]+) response "
                         r"tok/s overall, ([\d.]+) until the queue ran dry; prefill ([\d.]+) s, decode ([\d.]+) s of "
                         r"([\d.]+) s")
    found = [pattern.fullmatch(line) for line in lines]
    assert len(found) == 2 and all(found), lines
    for slots, m in zip((1, 2), found, strict=True):
        assert int(m[1]) == slots and int(m[3]) == 3 and int(m[4]) > 0
        assert float(m[5]) > 0 and float(m[6]) > 0
        prefill, decode, wall = float(m[7]), float(m[8]), float(m[9])
        assert prefill >= 0 and decode >= 0 and prefill + decode <= wall + 0.1, lines  # printed to 0.1 s


def test_bench_train_times_each_configuration(tiny, tiny_data, capsys):
    bench_train.main(["--target", str(tiny), "--data", str(tiny_data), "--steps", "4", "--json",
                      "--config", "--anchors 2 --batch 2", "--config", "--anchors 6 --batch 2", "--", *TINY_DRAFTER])
    rows = json.loads(capsys.readouterr().out)
    assert [r["config"] for r in rows] == ["--anchors 2 --batch 2", "--anchors 6 --batch 2"]
    for r in rows:
        assert 1 <= r["timed_steps"] <= 4 and r["step_s"] > 0 and r["target_prefill_s"] >= 0
        assert r["labels_per_s"] > 0 and r["sequences_per_s"] > 0
    per_sequence = [r["labels_per_s"] / r["sequences_per_s"] for r in rows]  # trained labels per sequence
    assert per_sequence[1] > per_sequence[0]  # three times the anchors: more label positions per sequence
    assert per_sequence[0] <= 2 * 3 * 1.01  # at most anchors x (block - 1)


def test_bench_train_uses_stored_features_unless_told_not_to(tiny, tmp_path, capsys):
    data = tmp_path / "featured"
    distill.run(data, 4, target=load_target(str(tiny)), mix=MIX, max_new=8, max_prompt=128, slots=2, shard_size=4)
    bench_train.main(["--target", str(tiny), "--data", str(data), "--steps", "3", "--json", "--config",
                      "--anchors 2 --batch 2", "--config", "--anchors 2 --batch 2 --no-stored-features", "--",
                      *TINY_DRAFTER])
    rows = json.loads(capsys.readouterr().out)
    assert [r["features"] for r in rows] == ["stored", "recomputed"]


def test_ablation_arms_train_once_each_and_tabulate_against_the_first(tiny, tiny_data, tmp_path, capsys):
    out = tmp_path / "ablate"
    argv = ["--out", str(out), "--arms", "hard,soft", "--", "--drafter", "dflash", "--target", str(tiny), "--data",
            str(tiny_data), "--val", "2", "--steps", "4", "--eval-every", "2", "--patience", "10", "--batch", "2",
            "--anchors", "4", *TINY_DRAFTER]
    assert ablate.main(argv) == 0
    cards = {arm: json.loads(ablate.card_path(out, arm, "dflash").read_text()) for arm in ("hard", "soft")}
    assert [c["training"]["soft"] for c in cards.values()] == [0.0, 0.9]
    assert {c["data"]["validation_sha256"] for c in cards.values()} == {cards["hard"]["data"]["validation_sha256"]}
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| hard") or
            line.startswith("| soft")]
    assert len(rows) == 2 and "| +0.000 |" in rows[0] and "`--soft 0.9`" in rows[1], rows
    stamps = [ablate.card_path(out, arm, "dflash").stat().st_mtime_ns for arm in ("hard", "soft")]
    assert ablate.main(argv) == 0  # finished arms are skipped: nothing retrains
    assert [ablate.card_path(out, arm, "dflash").stat().st_mtime_ns for arm in ("hard", "soft")] == stamps
    assert (out / "ablations.md").read_text().count("\n| ") == 2  # the two arms' rows below the header
    assert ablate.main([*argv[:3], "nope", *argv[4:]]) == 2
    rc = ablate.main([*argv[:3], "hard,soft,slow", "--arm", "slow=--lr 1e-5", "--arm", "unused=--batch 1", *argv[4:]])
    assert rc == 0 and json.loads(ablate.card_path(out, "slow", "dflash").read_text())["training"]["lr"] == 1e-5
    assert "| slow | `--lr 1e-5` |" in (out / "ablations.md").read_text()
    assert not (out / "unused").exists()  # defined, not asked for
    assert ablate.main([*argv[:4], "--arm", "no-equals-sign", *argv[4:]]) == 2
    shipped = tmp_path / "shipped"
    shutil.copytree(ablate.card_path(out, "hard", "dflash").parent, shipped)
    assert ablate.main([*argv[:4], "--table-only", "--attach", str(shipped), *argv[4:]]) == 0
    record = json.loads((shipped / "training.json").read_text())["ablations"]
    assert [r["arm"] for r in record["rows"]] == ["hard", "soft"] and record["same_validation"]
    assert record["command"].startswith("python -m experiments.training.ablate --out")
    readme = (shipped / "README.md").read_text()
    assert "## Ablations" in readme and "| soft | `--soft 0.9` |" in readme and record["command"] in readme


@pytest.mark.slow
def test_evaluating_the_validation_split_gives_the_tau_est_a_fine_tune_starts_from(tiny, tiny_data, tmp_path, capsys):
    """--evaluate CKPT --evaluate-validation scores the split training holds out: what --init CKPT logs at step 0."""
    from experiments.training import sequences, train

    shared = ["--drafter", "dflash", "--target", str(tiny), "--data", str(tiny_data), "--val", "2", "--batch", "2",
              "--anchors", "4", *TINY_DRAFTER]
    train.main([*shared, "--steps", "2", "--eval-every", "2", "--work", str(tmp_path / "w0"),
                        "--out", str(tmp_path), "--name", "first"])
    checkpoint = tmp_path / "first-dflash"
    capsys.readouterr()
    train.main([*shared, "--evaluate", str(checkpoint), "--evaluate-validation"])
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    first = json.loads((checkpoint / "training.json").read_text())["data"]
    assert evaluated["sequences"] == first["validation_sequences"] < first["sequences"]
    f = evaluated["copy_fraction"]  # copy and other anchors partition the same anchors
    for tau, copy, other in zip(evaluated["tau_est"], evaluated["copy_tau_est"], evaluated["other_tau_est"],
                                strict=True):
        assert tau - 1 == pytest.approx(f * (copy - 1) + (1 - f) * (other - 1), abs=2e-3)
    train.main([*shared, "--evaluate", str(checkpoint), "--evaluate-validation", "--by-kind"])
    by_kind = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    kinds = distill.row_kinds(tiny_data)
    kinds = kinds[sequences.split_validation(len(kinds), 2, 0)[1]]  # the validation split's, each on its own
    assert {r["kind"]: r["sequences"] for r in by_kind} == {k: int((kinds == k).sum()) for k in set(kinds)}
    assert all(r["tau_est"][0] >= 1 for r in by_kind)
    train.main([*shared, "--init", str(checkpoint), "--steps", "1", "--eval-every", "1",
                        "--work", str(tmp_path / "w1"), "--out", str(tmp_path), "--name", "second"])
    card = json.loads((tmp_path / "second-dflash" / "training.json").read_text())
    assert card["curve"][0]["step"] == 0 and card["curve"][0]["tau_est"] == evaluated["tau_est"]


def train_tiny_dflash(tiny: Path, tiny_data: Path, out: Path, name: str, *flags: str) -> dict:
    """Train a tiny DFlash drafter (2 steps unless flags say otherwise) into out/NAME-dflash; its card."""
    from experiments.training import train

    train.main(["--drafter", "dflash", "--target", str(tiny), "--data", str(tiny_data), "--val", "2",
                        "--batch", "2", "--anchors", "4", *TINY_DRAFTER, "--steps", "2", "--eval-every", "2", *flags,
                        "--work", str(out / f"work-{name}"), "--out", str(out), "--name", name])
    return json.loads((out / f"{name}-dflash" / "training.json").read_text())


@pytest.mark.slow
def test_domino_head_trains_on_a_drafter_saves_in_the_published_format_and_stays_lossless(tiny, tiny_data, tmp_path):
    """--init CKPT --domino EMB:GRU adds a head that starts as the identity (step 0 scores what CKPT scores), trains
    with the base-anchor curriculum, saves as DominoDraftModel and drafts losslessly through the engine."""
    from engine import generate, load_drafter
    from experiments.training import objectives, train

    base = train_tiny_dflash(tiny, tiny_data, tmp_path, "base")
    card = train_tiny_dflash(tiny, tiny_data, tmp_path, "domino", "--init", str(tmp_path / "base-dflash"), "--domino",
                             "8:16", "--steps", "4", "--lr", "3e-3")
    out = tmp_path / "domino-dflash"
    assert card["curve"][0]["tau_est"] == base["curve"][-1]["tau_est"]  # proj_out starts at zero
    assert card["architecture"]["domino"] == {"prefix_len": 1, "emb_dim": 8, "gru_hidden": 16}
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["DominoDraftModel"] and conf["dflash_config"]["gru_hidden_dim"] == 16
    assert "with a Domino head (`DominoDraftModel`: GRU 16" in (out / "README.md").read_text()
    target = load_target(str(tiny))
    drafter = load_drafter(out, target)
    assert float(abs(drafter.params["domino"]["proj_out"]).max()) > 0  # the head trained
    prompt = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    want = generate(target, prompt, max_new_tokens=16)
    got = generate(target, prompt, drafter=drafter, max_new_tokens=16)
    assert got.token_ids == want.token_ids and got.stats["drafted"] > 0
    assert [float(objectives.domino_lambda(p)) for p in (0.0, 0.25, 0.5, 0.9)] == [1.0, 0.5, 0.0, 0.0]
    with pytest.raises(SystemExit):
        train.parse_args(["--domino", "64"])


@pytest.mark.slow
def test_grown_drafter_starts_where_its_init_stands_saves_deeper_and_stays_lossless(tiny, tiny_data, tmp_path):
    """--init CKPT --grow-layers 1: step 0 scores what CKPT scores, the saved drafter has one more layer, its card
    says so, and it drafts losslessly through the engine."""
    from engine import generate, load_drafter
    from experiments.training import train

    base = train_tiny_dflash(tiny, tiny_data, tmp_path, "base")
    card = train_tiny_dflash(tiny, tiny_data, tmp_path, "grown", "--init", str(tmp_path / "base-dflash"),
                             "--grow-layers", "1")
    out = tmp_path / "grown-dflash"
    assert card["curve"][0]["tau_est"] == base["curve"][-1]["tau_est"]  # the new layer starts as the identity
    assert card["architecture"]["layers"] == base["architecture"]["layers"] + 1 and card["training"]["grow_layers"] == 1
    target = load_target(str(tiny))
    drafter = load_drafter(out, target)
    assert drafter.cfg.body.num_layers == base["architecture"]["layers"] + 1
    prompt = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    want = generate(target, prompt, max_new_tokens=16)
    got = generate(target, prompt, drafter=drafter, max_new_tokens=16)
    assert got.token_ids == want.token_ids and got.stats["drafted"] > 0
    with pytest.raises(SystemExit):
        train.parse_args(["--grow-layers", "1"])  # nothing to grow without --init
    with pytest.raises(SystemExit):
        train.parse_args(["--init", str(out), "--grow-layers", "-1"])


@pytest.mark.slow
def test_lookup_hint_drafter_trains_evaluates_as_it_trained_and_stays_lossless(tiny, tiny_data, tmp_path, capsys):
    """--lookup-hints N: training, the card, --evaluate and the engine all start blocks from prompt lookup."""
    from engine import generate, load_drafter
    from experiments.training import train

    shared = ["--drafter", "dflash", "--target", str(tiny), "--data", str(tiny_data), "--val", "2", "--batch", "2",
              "--anchors", "4", *TINY_DRAFTER]
    train.main([*shared, "--lookup-hints", "3", "--steps", "2", "--eval-every", "2",
                        "--work", str(tmp_path / "w"), "--out", str(tmp_path), "--name", "hints"])
    out = tmp_path / "hints-dflash"
    card = json.loads((out / "training.json").read_text())
    assert card["architecture"]["lookup_hints"] == 3
    assert json.loads((out / "config.json").read_text())["dflash_config"]["lookup_hints"] == 3
    capsys.readouterr()
    train.main([*shared, "--evaluate", str(out), "--evaluate-validation"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tau_est"] == card["curve"][-1]["tau_est"]
    target = load_target(str(tiny))
    drafter = load_drafter(out, target)
    prompt = "List the numbers 1 2 3 4 5 6 7 8 and then 1 2 3 4 5 6 7 8 again."
    want = generate(target, prompt, max_new_tokens=16)
    got = generate(target, prompt, drafter=drafter, max_new_tokens=16)
    assert drafter.cfg.lookup_hints == 3 and got.token_ids == want.token_ids and got.stats["drafted"] > 0


@pytest.mark.slow
def test_several_hint_biases_are_chosen_on_validation_recorded_and_rebuild_the_config(tiny, tiny_data, tmp_path):
    """--hint-bias A,B scores each rule on the validation split after training, writes the best into config.json and
    the card's serving record (where it was chosen, every candidate's score), and the card rebuilds the config."""
    from experiments.training import cards

    card = train_tiny_dflash(tiny, tiny_data, tmp_path, "hinted", "--lookup-hints", "3", "--hint-bias", "0,100")
    serving = card["serving"]
    assert serving["chosen_on"] == "validation"
    assert serving["validation_sequences"] == card["data"]["validation_sequences"]
    assert [c["hint_bias"] for c in serving["candidates"]] == [0.0, 100.0]
    best = max(serving["candidates"], key=lambda c: (c[serving["metric"]], -c["hint_bias"]))
    assert serving["hint_bias"] == best["hint_bias"] == card["architecture"]["hint_bias"]
    config = json.loads((tmp_path / "hinted-dflash" / "config.json").read_text())
    assert config["dflash_config"].get("hint_bias", 0.0) == serving["hint_bias"]
    assert cards.config_from_card(card, load_target(str(tiny))) == config
    one = train_tiny_dflash(tiny, tiny_data, tmp_path, "given", "--lookup-hints", "3", "--hint-bias", "2.5")
    assert one["serving"] == {"hint_bias": 2.5, "chosen_on": "given (--hint-bias)"}
    with pytest.raises(SystemExit):
        train_tiny_dflash(tiny, tiny_data, tmp_path, "nohints", "--hint-bias", "1")
