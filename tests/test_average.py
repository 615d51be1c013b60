"""experiments.training.average: the weighted mean of drafter checkpoints, its refusals and its card."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.drafters.base import DrafterError
from engine.drafters.layers import read_tensors, save_checkpoint
from experiments.training.average import average_checkpoints
from experiments.training.cards import init_lineage, render_card

CONFIG = {"model_type": "qwen3", "hidden_size": 4}


def checkpoint(path, w: np.ndarray, d2t=(0, 2, 5), config=CONFIG, card: dict | None = None):
    save_checkpoint(path, config, {"fc.weight": w, "d2t": np.asarray(d2t, np.int64)}, "bfloat16")
    if card is not None:
        (path / "training.json").write_text(json.dumps(card))
    return path


def test_the_average_is_the_weighted_mean_in_the_first_ones_dtype_and_its_card_names_both(tmp_path):
    a = checkpoint(tmp_path / "a", np.full((2, 4), 1.0, np.float32), card={"drafter": "dflash", "ablations": None})
    b = checkpoint(tmp_path / "b", np.full((2, 4), 2.0, np.float32),
                   card={"drafter": "dflash", "date": "2026-12-04", "command": "train b", "data": {"sequences": 7}})
    out = average_checkpoints([a, b], tmp_path / "soup", [0.25, 0.75], command="average a b")
    tensors = read_tensors(out)
    assert tensors["fc.weight"].dtype.name == "bfloat16" and np.all(tensors["fc.weight"].astype(np.float32) == 1.75)
    assert tensors["d2t"].tolist() == [0, 2, 5]
    card = json.loads((out / "training.json").read_text())
    assert [x["weight"] for x in card["averaged"]] == [0.25, 0.75] and card["init_card"]["command"] == "train b"
    assert init_lineage(out)["averaged"] == card["averaged"]  # a run continued from it keeps that stage
    text = render_card("soup", card)
    assert f"weights averaged, 0.25 x `{a}` + 0.75 x `{b}`" in text and "`train b`" in text  # the lineage goes on
    halves = read_tensors(average_checkpoints([a, b], tmp_path / "even"))["fc.weight"]
    assert np.all(halves.astype(np.float32) == 1.5)


def test_checkpoints_of_other_shapes_vocabularies_or_configs_are_refused(tmp_path):
    a = checkpoint(tmp_path / "a", np.ones((2, 4), np.float32))
    with pytest.raises(DrafterError, match="shaped differently"):
        average_checkpoints([a, checkpoint(tmp_path / "b", np.ones((3, 4), np.float32))], tmp_path / "o")
    with pytest.raises(DrafterError, match="another draft vocabulary"):
        average_checkpoints([a, checkpoint(tmp_path / "c", np.ones((2, 4), np.float32), d2t=(0, 1, 5))], tmp_path / "o")
    with pytest.raises(DrafterError, match="do not share one config.json"):
        average_checkpoints([a, checkpoint(tmp_path / "d", np.ones((2, 4), np.float32), config={**CONFIG, "x": 1})],
                            tmp_path / "o")
    with pytest.raises(DrafterError, match="summing to 1"):
        average_checkpoints([a, a], tmp_path / "o", [0.5, 0.6])
    assert not (tmp_path / "o").exists()  # nothing written by a refused average
