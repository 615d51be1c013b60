"""Qwen3-MoE and gpt-oss targets: parity with transformers' PyTorch models on tiny random configs (logits through
a prefill + incremental split, features, greedy tokens), the sliding window and sinks that matter, YaRN variants,
MXFP4 expert weights, the dense and gathered MoE paths, lossless speculative decoding, meshes, and clear load
errors. A dense Qwen3 with sliding layers and attention biases checks those kinds on the dense family too."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine.cache import init_cache
from engine.config import CheckpointError, config_from_hf
from engine.decode import generate
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.dflash_checkpoint import init_dflash
from engine.drafters.ngram import NgramDrafter
from engine.model import forward
from engine.ops import moe, moe_dense, moe_gathered, route
from engine.target import load_target
from engine.weights import FP4_VALUES, dequantize_mxfp4, load_weights
from tests.test_dflash import OracleMix, scramble
from tests.test_sampling import ByteTokenizer
from tests.test_sharding import ROOT, child_env, last_json

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.reference import assert_greedy_matches, assert_parity, hf_logits, ours_split  # noqa: E402 (needs torch)

VOCAB, SEQ, SPLIT = 128, 20, 13
LOGIT_TOL = 2e-4
YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 16}  # gpt-oss's own form, scaled down
CASES = {
    "qwen3_moe": ("qwen3_moe", {"norm_topk_prob": True, "mlp_only_layers": [1]}),
    "qwen3_moe-step2": ("qwen3_moe", {"norm_topk_prob": False, "decoder_sparse_step": 2}),
    "gpt_oss": ("gpt_oss", {"rope_parameters": YARN}),
    "gpt_oss-yarn-mscale": ("gpt_oss", {"rope_parameters": {**YARN, "truncate": True, "mscale": 1.2,
                                                            "mscale_all_dim": 0.8}}),
    "gpt_oss-yarn-attention-factor": ("gpt_oss", {"rope_parameters": {**YARN, "attention_factor": 1.3}}),
    "qwen3-sliding-bias": ("qwen3", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2,
                                     "attention_bias": True}),
}
PROMPT = "one two three one two three one two"


def hf_model(kind: str, seed: int = 0, **extra):
    """A tiny random transformers model of `kind` with every weight non-trivial (sinks and biases included)."""
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, max_position_embeddings=512)
    if kind == "qwen3":  # the dense family with the new attention kinds (window, biases)
        cfg = transformers.Qwen3Config(**{**common, "intermediate_size": 48, **extra})
    elif kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**{**common, "intermediate_size": 48, "moe_intermediate_size": 16,
                                             "num_experts": 8, "num_experts_per_tok": 2, **extra})
    else:  # layers alternate sliding (window 6 < SEQ) and full attention
        cfg = transformers.GptOssConfig(**{**common, "intermediate_size": 16, "num_local_experts": 8,
                                           "num_experts_per_tok": 2, "sliding_window": 6, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "sinks" in name or name.endswith("bias"):  # transformers may initialise these to zero
                torch.nn.init.normal_(p, std=0.5)
            else:
                torch.nn.init.normal_(p, std=0.2)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """(name, transformers model, checkpoint dir) of one tiny config."""
    kind, extra = CASES[request.param]
    model = hf_model(kind, **extra)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


TOKENS = np.random.default_rng(0).integers(0, VOCAB, SEQ).astype(np.int32)


def test_logits_and_features_match_transformers(case):
    _, model, path = case
    assert_parity(model, path, TOKENS, SPLIT, (-1, 0, 2, 3), LOGIT_TOL)


def test_greedy_tokens_match_transformers(case):
    _, model, path = case
    assert_greedy_matches(model, path, ByteTokenizer(), PROMPT, 32)


def test_window_and_sinks_change_the_logits(tmp_path):
    """Guards the parity test: dropping gpt-oss's window or its sinks moves the logits far past the tolerance."""
    model = hf_model("gpt_oss", rope_parameters=YARN)
    model.save_pretrained(tmp_path)
    ref, _ = hf_logits(model, TOKENS)
    cfg, params, _ = load_weights(tmp_path, "float32")
    assert cfg.window(0) == 6 and cfg.window(1) == 0 and SEQ > 6
    no_sinks = {**params, "layers": [{k: v for k, v in lp.items() if k != "sinks"} for lp in params["layers"]]}
    for cfg_, params_ in ((cfg, params), (replace(cfg, sliding_window=0), params),
                          (replace(cfg, attention_sinks=False), no_sinks)):
        out, _, _ = forward(params_, init_cache(cfg_, 1, 64), jnp.asarray(TOKENS[None]), jnp.asarray([0], jnp.int32),
                            cfg=cfg_)
        diff = np.abs(np.asarray(out[0]) - ref).max()
        assert diff < LOGIT_TOL if cfg_ is cfg else diff > 100 * LOGIT_TOL


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_dense_and_gathered_moe_paths_agree(tmp_path, kind, tokens):
    extra = {"rope_parameters": YARN} if kind == "gpt_oss" else {"norm_topk_prob": True}
    hf_model(kind, seed=2, **extra).save_pretrained(tmp_path)
    cfg, params, _ = load_weights(tmp_path, "float32")
    lp = params["layers"][0]
    h = jnp.asarray(np.random.default_rng(tokens).normal(size=(2, tokens, cfg.hidden_size)), jnp.float32)
    dense, gathered = moe(cfg, lp, h, "dense"), moe(cfg, lp, h, "gathered")
    np.testing.assert_allclose(np.asarray(dense), np.asarray(gathered), rtol=1e-5, atol=1e-5)
    weights, idx = route(cfg, lp, h.reshape(-1, cfg.hidden_size))
    assert len(np.unique(np.asarray(idx))) > 2
    if cfg.router == "topk_softmax" or cfg.norm_topk_prob:
        np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-5)
    # the static choice: few (token, expert) pairs gather, many run densely
    x = h.reshape(-1, cfg.hidden_size)
    chosen = moe_gathered if x.shape[0] * cfg.num_experts_per_tok <= cfg.num_experts else moe_dense
    np.testing.assert_array_equal(np.asarray(moe(cfg, lp, h)).reshape(x.shape),
                                  np.asarray(chosen(cfg, lp, x, weights, idx)))


def test_mxfp4_dequantization_is_exact():
    """Hand-packed blocks: byte = high code << 4 | low code; the low nibble is the even element; scale 127 is 2^0."""
    e2m1 = {0b0000: 0.0, 0b0001: 0.5, 0b0010: 1.0, 0b0011: 1.5, 0b0100: 2.0, 0b0101: 3.0, 0b0110: 4.0, 0b0111: 6.0,
            0b1000: -0.0, 0b1001: -0.5, 0b1010: -1.0, 0b1011: -1.5, 0b1100: -2.0, 0b1101: -3.0, 0b1110: -4.0,
            0b1111: -6.0}
    assert FP4_VALUES.tolist() == [e2m1[c] for c in range(16)]
    codes = np.arange(32) % 16  # element j of a block holds code j % 16
    blocks = np.zeros((2, 1, 16), np.uint8)
    blocks[0, 0] = codes[0::2] | (codes[1::2] << 4)
    blocks[1, 0] = codes[::-1][0::2] | (codes[::-1][1::2] << 4)
    scales = np.array([[127], [129]], np.uint8)  # 2^0 and 2^2
    out = dequantize_mxfp4(blocks, scales)
    assert out.shape == (2, 32) and out.dtype == np.float32
    np.testing.assert_array_equal(out[0], [e2m1[c] for c in codes])
    np.testing.assert_array_equal(out[1], [4 * e2m1[c] for c in codes[::-1]])
    np.testing.assert_array_equal(dequantize_mxfp4(np.full((1, 2, 16), 0x71, np.uint8), np.array([[120, 130]],
                                                                                                 np.uint8)),
                                  [[0.5 * 2 ** -7, 6 * 2 ** -7] * 16 + [0.5 * 2 ** 3, 6 * 2 ** 3] * 16])
    with pytest.raises(CheckpointError, match="do not match"):
        dequantize_mxfp4(blocks, scales[:1])


def test_mxfp4_checkpoint_matches_transformers_dequantized(tmp_path):
    """A gpt-oss checkpoint with MXFP4 experts (as the Hub's) loads to the logits of the transformers model holding
    transformers' own dequantization of the same blocks."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    e, h, i = 8, 32, 32  # MXFP4 packs 32 values a block along the input dimension
    model = hf_model("gpt_oss", rope_parameters=YARN, intermediate_size=i)
    model.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    rng = np.random.default_rng(5)
    for n, layer in enumerate(model.model.layers):
        experts, prefix = layer.mlp.experts, f"model.layers.{n}.mlp.experts."
        for proj, rows, cols in (("gate_up_proj", 2 * i, h), ("down_proj", h, i)):
            blocks = rng.integers(0, 256, (e, rows, cols // 32, 16), dtype=np.uint8)
            scales = rng.integers(122, 128, (e, rows, cols // 32), dtype=np.uint8)
            with torch.no_grad():
                getattr(experts, proj).copy_(convert_moe_packed_tensors(torch.from_numpy(blocks),
                                                                        torch.from_numpy(scales), dtype=torch.float32))
            del tensors[prefix + proj]
            tensors[f"{prefix}{proj}_blocks"], tensors[f"{prefix}{proj}_scales"] = blocks, scales
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    ref, _ = hf_logits(model, TOKENS)
    ours, _ = ours_split(tmp_path, TOKENS, SPLIT)
    assert np.abs(ref).max() > 1.0 and np.abs(ours - ref).max() < LOGIT_TOL


@pytest.fixture(scope="module", params=["qwen3_moe", "gpt_oss"])
def tiny_target(request, tmp_path_factory):
    kind = request.param
    path = tmp_path_factory.mktemp(f"target-{kind}")
    hf_model(kind, seed=3, **({"rope_parameters": YARN} if kind == "gpt_oss" else {})).save_pretrained(path)
    return load_target(path, tokenizer=ByteTokenizer())


@pytest.mark.parametrize("drafter_kind", ["ngram", "dflash"])
def test_speculative_decoding_is_lossless(tiny_target, drafter_kind):
    """Greedy output with a drafter equals plain greedy: ngram on a repetitive prompt, and a random-weight DFlash of
    a published drafter's shape (gpt-oss-20b-DFlash: block 8; Qwen3-Coder-30B-A3B-DFlash: block 16), whose first
    drafts an oracle overwrites with the known continuation so that blocks are accepted in part."""
    want = generate(tiny_target, PROMPT, max_new_tokens=32, raw=True)
    if drafter_kind == "ngram":
        drafter = NgramDrafter(k=4)
    else:
        block = 8 if tiny_target.cfg.arch == "gpt_oss" else 16
        cfg, params = init_dflash(tiny_target, num_layers=2, block_size=block, target_layer_ids=(0, 2, 3),
                                  mask_token_id=VOCAB - 1)
        drafter = OracleMix(DFlashDrafter(tiny_target, cfg, scramble(params, 1), k=block - 1),
                            [want.prompt_ids + want.token_ids])
    got = generate(tiny_target, PROMPT, drafter=drafter, max_new_tokens=32, raw=True)
    assert got.token_ids == want.token_ids
    assert got.stats["accepted"] > 0


def _saved(tmp_path, kind: str = "gpt_oss"):
    hf_model(kind, **({"rope_parameters": YARN} if kind == "gpt_oss" else {})).save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def test_an_unread_checkpoint_tensor_is_an_error(tmp_path):
    _saved(tmp_path, "qwen3_moe")
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.mlp.shared_expert.gate_proj.weight"] = np.zeros((16, 32), np.float32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="does not read: model.layers.0.mlp.shared_expert.gate_proj.weight"):
        load_weights(tmp_path, "float32")


@pytest.mark.parametrize("change,message", [
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention", "full_attention"]}, "layer_types"),
    ({"rope_parameters": {**YARN, "rope_type": "longrope"}}, "unsupported rope type 'longrope'"),
    ({"rope_parameters": {**YARN, "low_freq_factor": 1.0}}, r"yarn rope parameters \['low_freq_factor'\]"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"sliding_window": 0}, "sliding_window"),
])
def test_config_values_that_change_the_math_are_refused(tmp_path, change, message):
    conf = _saved(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        config_from_hf({**conf, **change})


def test_qwen3_moe_layer_kinds_and_defaults_keep_dense_families():
    conf = {"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 12,
            "moe_intermediate_size": 4, "num_hidden_layers": 6, "num_attention_heads": 2, "num_experts": 4,
            "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    cfg = config_from_hf(conf)
    assert [cfg.is_moe(i) for i in range(6)] == [False, True, False, False, False, True]
    assert cfg.layer_types == () and cfg.window(0) == 0 and not cfg.attention_sinks
    dense = config_from_hf({**conf, "model_type": "qwen3"})
    assert not any(dense.is_moe(i) for i in range(6)) and dense.num_experts == 0 and dense.attention_factor() == 1.0
    with pytest.raises(CheckpointError, match="layer_types"):
        config_from_hf({**conf, "layer_types": ["full_attention"] * 6})


def test_yarn_inv_freq_and_attention_factor_match_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for params in (YARN, {**YARN, "truncate": True, "mscale": 1.2, "mscale_all_dim": 0.8},
                   {**YARN, "attention_factor": 1.3}, {**YARN, "factor": None}):
        hf = transformers.GptOssConfig(hidden_size=32, num_attention_heads=4, head_dim=8, num_hidden_layers=2,
                                       max_position_embeddings=512, rope_parameters=dict(params))
        inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
        cfg = config_from_hf(hf.to_dict())
        np.testing.assert_allclose(cfg.inv_freq(), inv.numpy(), rtol=1e-6)
        assert cfg.attention_factor() == pytest.approx(factor, rel=1e-12)
    assert hash(cfg)  # still a static jit argument


@pytest.mark.slow
@pytest.mark.parametrize("kinds", [("qwen3_moe", "gpt_oss"), ("qwen3_5", "qwen3_5_moe")])
def test_moe_and_hybrid_targets_on_8_devices_give_the_tokens_of_one(kinds):
    """tests/moe_mesh_worker.py: each tiny MoE or hybrid target on 1x8 and 2x4 meshes of simulated CPU devices at
    batch 2, experts split over "model" (expert parallel), a hybrid's gated DeltaNet value heads and recurrent state
    split over "model" (its batch over "data"), greedy with ar, and ngram and a random DFlash accepted at every
    length: the tokens of one device, and a second run compiles nothing."""
    proc = subprocess.run([sys.executable, "tests/moe_mesh_worker.py", *kinds], cwd=ROOT, env=child_env(8),
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = last_json(proc.stdout)
    assert report["devices"] == 8 and set(report["targets"]) == set(kinds)
    for kind, meshes in report["targets"].items():
        assert all(meshes.pop("one_device").values()), kind
        for spec, got in meshes.items():
            assert all(got["same_tokens"].values()) and got["n_tokens"] == dict.fromkeys(got["n_tokens"], [16]), \
                (kind, spec, got)
            assert got["logits_diff"] < 5e-4 and got["compiles_again"] == 0, (kind, spec, got)
            assert got["accepted"]["ngram"] > 0 and got["accepted"]["dflash"] > 0, (kind, spec, got)
            specs = got["specs"]
            if kind != "qwen3_5":
                assert specs["we_gate"][0] == "model" and "we_gate" in got["layout"], (kind, spec, got)
            if kind.startswith("qwen3_5"):  # value heads 8, query / KV heads 8 / 4: attention splits on 2x4 only
                assert specs["w_z"] == ["None", "model"] and specs["w_out"] == ["model", "None"], (kind, specs)
                assert specs["w_qkv"] == ["None", "None"], specs  # q|k|v concatenated: replicated
                assert specs["rec_state"] == ["data", "model", "None", "None"], specs
                assert specs["wq"] == (["None", "model"] if spec == "2x4" else ["None", "None"]), (spec, specs)
                assert got["state_rollback"]["dflash"] > 0, got
