"""The DFlash serving rule (hint_bias) as a train_drafter choice: parsed, chosen by the validation metric, recorded
in config.json and the card, and the shipped configs rebuilt from their cards' recorded settings."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from experiments.training import cards, evaluate, train

REPO = Path(__file__).resolve().parent.parent
DFLASH_CHECKPOINTS = ("smollm2-135m-dflash", "smollm2-135m-dflash-plain")


def test_hint_bias_values_parse_and_bad_ones_are_refused():
    assert evaluate.hint_biases("0,0.5,3") == (0.0, 0.5, 3.0)
    for bad in ("", "a", "-1", "inf", "1,1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--hint-bias wants distinct finite numbers"):
            evaluate.hint_biases(bad)
    with pytest.raises(SystemExit):
        train.parse_args(["--drafter", "eagle3", "--hint-bias", "1"])


def _scores(walks):
    return [{"tau_est": [1.5, w + 0.3], "walk_tau": [1.4, w]} for w in walks]


def test_the_rule_is_the_best_walk_and_ties_go_to_the_smaller_bias():
    assert evaluate.choose_hint_bias((0.0, 0.5, 3.0), _scores([3.57, 3.58, 3.47])) == (0.5, "walk_tau")
    assert evaluate.choose_hint_bias((0.0, 1.0), _scores([3.5, 3.5])) == (0.0, "walk_tau")
    no_walk = [{"tau_est": [1.5, t], "walk_tau": None} for t in (3.0, 3.2)]
    assert evaluate.choose_hint_bias((0.0, 1.0), no_walk) == (1.0, "tau_est")


def test_the_chosen_rule_goes_into_config_and_card_with_where_it_was_chosen(tmp_path):
    ckpt = tmp_path / "d"
    ckpt.mkdir()
    for name in ("config.json", "training.json"):
        shutil.copy(REPO / "checkpoints" / "smollm2-135m-dflash" / name, ckpt / name)
    where = {"chosen_on": "validation", "data": ["data/x"], "validation_sequences": 128}
    assert evaluate.record_serving(ckpt, (0.0, 0.5, 3.0), _scores([3.57, 3.58, 3.47]), where, "cmd") == 0.5
    config, card = (json.loads((ckpt / n).read_text()) for n in ("config.json", "training.json"))
    assert config["dflash_config"]["hint_bias"] == 0.5 == card["serving"]["hint_bias"] == card["architecture"][
        "hint_bias"]
    assert card["serving"]["chosen_on"] == "validation" and card["serving"]["command"] == "cmd"
    assert [c["walk_tau"] for c in card["serving"]["candidates"]] == [3.57, 3.58, 3.47]
    assert "hint bias 0.5" in (ckpt / "README.md").read_text()
    evaluate.record_serving(ckpt, (0.0, 3.0), _scores([3.6, 3.5]), where, "cmd")
    assert "hint_bias" not in json.loads((ckpt / "config.json").read_text())["dflash_config"]  # 0 is omitted


@pytest.mark.parametrize("name", DFLASH_CHECKPOINTS)
def test_the_shipped_config_rebuilds_from_its_cards_recorded_settings(target, name):
    ckpt = REPO / "checkpoints" / name
    card = json.loads((ckpt / "training.json").read_text())
    assert cards.config_from_card(card, target) == json.loads((ckpt / "config.json").read_text())
    if card["architecture"].get("lookup_hints"):  # a hinted drafter says where its rule was chosen: never a suite
        assert card["serving"]["chosen_on"] in ("validation", "given (--hint-bias)") or card["serving"][
            "chosen_on"].startswith("dev slice")
