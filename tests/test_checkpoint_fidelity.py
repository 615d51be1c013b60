"""Fidelity to the published drafter formats: the target's last-layer feature is HF's post-norm
hidden_states[N], configs the drafter layers cannot honour are refused, and exported configs carry the
published `auto_map` (DFlash, Domino) and still load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.drafters import DrafterError, dflash_config, eagle3_config, load_drafter
from engine.drafters.dflash_checkpoint import save_dflash
from engine.drafters.eagle3_checkpoint import save_eagle3

CHECKPOINTS = {"dflash": dflash_config.DEFAULT_CHECKPOINT, "eagle3": eagle3_config.DEFAULT_CHECKPOINT}
DFLASH_AUTO_MAP = {"AutoModel": "dflash.DFlashDraftModel"}
DOMINO_AUTO_MAP = {"AutoModel": "domino.DominoDraftModel"}  # SpecForge's DFlash with a Domino head


def test_last_layer_feature_is_hf_post_norm_hidden_state(target, hf_smollm2):
    """On the embedded 30-layer SmolLM2: id 29 == HF hidden_states[30] (after the final norm), id 28 ==
    hidden_states[29] (no norm)."""
    torch = pytest.importorskip("torch")
    from tests.test_model_parity import _ours_incremental

    n, path, model = target.cfg.num_layers, target.path, hf_smollm2
    assert n == 30
    ids = target.encode("Explain in two sentences why the sky is blue.")
    with torch.no_grad():
        hidden = model(torch.tensor(ids[None].astype(np.int64)), output_hidden_states=True).hidden_states
    _, feats = _ours_incremental(path, ids, split=7, capture=(n - 2, n - 1))
    for got, want in zip(feats[:, 0], (hidden[n - 1][0].numpy(), hidden[n][0].numpy()), strict=True):
        scale = np.abs(want).max()  # the residual stream reaches ~1e4, the normed state ~50
        assert np.abs(got - want).max() < 1e-5 * scale


@pytest.mark.parametrize("kind", sorted(CHECKPOINTS))
@pytest.mark.parametrize("field,value", [("attention_bias", True), ("mlp_bias", True), ("hidden_act", "gelu")])
def test_configs_the_layers_cannot_honour_are_refused(tmp_path, target, kind, field, value):
    shipped = CHECKPOINTS[kind]
    conf = json.loads((shipped / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**conf, field: value}))
    (tmp_path / "model.safetensors").symlink_to(shipped / "model.safetensors")
    # DFlash layers take q/k/v/o biases (the gpt-oss-120b drafter has them): there the biases are what is missing
    expected = ("tensor 'layers.0.self_attn.q_proj.bias' missing" if (kind, field) == ("dflash", "attention_bias")
                else f"{field}: {json.dumps(value)}")
    with pytest.raises(DrafterError, match=expected):
        load_drafter(tmp_path, target)


def test_exported_configs_carry_the_published_auto_map_and_load(tmp_path, target):
    plain = CHECKPOINTS["dflash"].parent / "smollm2-135m-dflash-plain"
    for path, auto_map in ((plain, DFLASH_AUTO_MAP), (CHECKPOINTS["dflash"], DOMINO_AUTO_MAP)):  # the default: Domino
        assert json.loads((path / "config.json").read_text())["auto_map"] == auto_map
        shipped = load_drafter(path, target)
        d2t = None if shipped.vocab is None else shipped.vocab.d2t()
        save_dflash(tmp_path / path.name, shipped.cfg, shipped.params, d2t=d2t)
        assert json.loads((tmp_path / path.name / "config.json").read_text())["auto_map"] == auto_map
        assert load_drafter(tmp_path / path.name, target).cfg == shipped.cfg
    # published EAGLE-3 configs (yuhuili/EAGLE3-*, NVIDIA ModelOpt's export template) carry no auto_map
    shipped = load_drafter("eagle3", target)
    save_eagle3(tmp_path / "eagle3", shipped.cfg, shipped.params, shipped.vocab.d2t())
    assert "auto_map" not in json.loads((tmp_path / "eagle3" / "config.json").read_text())
    assert load_drafter(tmp_path / "eagle3", target).cfg == shipped.cfg
