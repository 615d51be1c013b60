"""Gated DeltaNet and the hybrid Qwen3.5 layer pieces against transformers' qwen3_5 / qwen3_5_moe PyTorch modules,
and the recurrent-state rollback a partly accepted speculative block needs (tiny random configs, float32)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine import gated_delta as gd
from engine.config import CheckpointError
from engine.ops import rms_norm
from engine.qwen3_5 import gated_attention, hybrid_config_from_hf, layer_shapes, load_layer, with_shared_expert

TOL = 1e-4
TEXT = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4, max_position_embeddings=128)
MOE_TEXT = {k: v for k, v in TEXT.items() if k != "intermediate_size"} | dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
# a published Qwen3.5-27B text_config (as in its config.json), shapes only matter here
QWEN35_27B = {
    "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 248044,
    "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
    "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 48, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144, "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False, "num_attention_heads": 24, "num_hidden_layers": 64,
    "num_key_value_heads": 4, "output_gate_type": "swish", "pad_token_id": None, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-6, "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                                              "partial_rotary_factor": 0.25, "rope_theta": 10000000.0,
                                              "rope_type": "default"},
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": 248320}


@pytest.fixture(scope="module")
def hf():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return torch, transformers


def _build(hf, kind: str, tmp_path):
    """(torch model, its text decoder module, our config, loaded layer params) for a tiny random checkpoint saved
    by transformers (per-expert MoE tensors as published; text-only or model.language_model. names)."""
    from safetensors import safe_open

    from tests.reference import hf_qwen3_5

    model = hf_qwen3_5(kind, TEXT, MOE_TEXT, VISION, seed=0)
    model.save_pretrained(tmp_path)
    cfg = hybrid_config_from_hf(json.loads((tmp_path / "config.json").read_text()))
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    params = [load_layer(cfg, i, tensors.__getitem__, tensors.keys()) for i in range(cfg.num_layers)]
    decoder = model.model.language_model if kind.endswith("multimodal") else model.model
    return model, decoder, cfg, params


def _np(t):
    return t.detach().numpy()


def _close(a, b, tol=TOL):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.abs(a - b).max() < tol, np.abs(a - b).max()


# the multimodal layouts hold the same layers under model.language_model. names (their load is in the fast tier of
# test_qwen3_5_target): here they repeat the text and MoE checks (slow)
@pytest.mark.parametrize("kind", ["text", pytest.param("multimodal", marks=pytest.mark.slow), "moe",
                                  pytest.param("moe-multimodal", marks=pytest.mark.slow)])
def test_delta_net_matches_transformers(hf, tmp_path, kind):
    """Output, incremental output, and the (conv, recurrent) state of our mixer equal transformers'."""
    torch, _ = hf
    from transformers.cache_utils import DynamicCache

    model, decoder, cfg, params = _build(hf, kind, tmp_path)
    assert cfg.multimodal == kind.endswith("multimodal") and cfg.is_moe == kind.startswith("moe")
    layers = decoder.layers
    module, lp = layers[0].linear_attn, params[0]
    x = torch.randn(2, 11, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    cache = DynamicCache(config=model.config.get_text_config())
    with torch.no_grad():
        ref = _np(module(x))
        ref_steps = np.concatenate([_np(module(x[:, a:b], cache=cache)) for a, b in ((0, 7), (7, 8), (8, 11))], 1)
    h = jnp.asarray(_np(x))
    state0 = gd.init_state(cfg.delta, 2)
    for chunk in (4, 64):
        y, state = gd.prefill(cfg.delta, lp, h, state0, chunk=chunk)
        _close(y, ref)
    y_rec, _ = gd.verify(cfg.delta, lp, h, state0)
    _close(y_rec, ref)
    # incremental, as decoding runs it: a prefill, one recurrent step, a block; each carries the state on
    y_a, state = gd.prefill(cfg.delta, lp, h[:, :7], state0, chunk=4)
    y_b, states = gd.verify(cfg.delta, lp, h[:, 7:8], state)
    y_c, states = gd.verify(cfg.delta, lp, h[:, 8:], gd.commit(states, jnp.zeros(2, jnp.int32)))
    _close(jnp.concatenate([y_a, y_b, y_c], 1), ref_steps)
    state = gd.commit(states, jnp.full(2, 2, jnp.int32))
    hf_conv = _np(cache.get_conv_state(0, state_idx=0))  # [B, C, K]: the last K inputs
    _close(state["conv"], hf_conv[:, :, 1:].transpose(0, 2, 1))
    _close(state["rec"], _np(cache.get_recurrent_state(0, state_idx=0)))
    # the decoder layer's zero-centred input norm, loaded as 1 + w
    with torch.no_grad():
        _close(rms_norm(h, lp["attn_norm"], cfg.rms_eps), _np(layers[0].input_layernorm(x)))


@pytest.mark.parametrize("kind", ["text", pytest.param("multimodal", marks=pytest.mark.slow)])
def test_gated_attention_matches_transformers(hf, tmp_path, kind):
    """q/gate split, q/k norm, partial rotary and the sigmoid output gate, against Qwen3_5Attention (eager)."""
    torch, _ = hf
    model, decoder, cfg, params = _build(hf, kind, tmp_path)
    i = cfg.layer_types.index("full_attention")
    module, lp = decoder.layers[i].self_attn, params[i]
    module.config._attn_implementation = "eager"
    b, t, s = 2, 9, 16
    x = torch.randn(b, t, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    pos = torch.arange(t)[None].expand(b, t)
    rotary = decoder.rotary_emb
    causal = torch.full((t, t), float("-inf")).triu(1)[None, None].expand(b, 1, t, t)
    with torch.no_grad():
        ref = _np(module(x, position_embeddings=rotary(x, pos), attention_mask=causal)[0])
    assert cfg.rotary_dim == cfg.head_dim // 4

    def ours(h, start):
        positions = start[:, None] + jnp.arange(h.shape[1], dtype=jnp.int32)[None]
        mask = jnp.arange(s)[None, None, :] <= positions[:, :, None]
        return gated_attention(cfg, lp, h, positions, kc, vc, start, mask)

    kc = vc = jnp.zeros((b, cfg.num_kv_heads, s, cfg.head_dim), jnp.float32)
    h = jnp.asarray(_np(x))
    y, _, _ = ours(h, jnp.zeros(b, jnp.int32))
    _close(y, ref)
    y1, kc, vc = ours(h[:, :5], jnp.zeros(b, jnp.int32))
    y2, _, _ = ours(h[:, 5:], jnp.full(b, 5, jnp.int32))
    _close(jnp.concatenate([y1, y2], 1), ref)


def test_shared_expert_matches_transformers(hf, tmp_path):
    """routed + sigmoid(shared_expert_gate(h)) * shared_expert(h) equals Qwen3_5MoeSparseMoeBlock, and the routed
    experts load stacked as [E, in, out]."""
    torch, _ = hf
    model, decoder, cfg, params = _build(hf, "moe", tmp_path)
    block, lp = decoder.layers[0].mlp, params[0]
    x = torch.randn(2, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        flat = x.reshape(-1, cfg.hidden_size)
        _, weights, idx = block.gate(flat)
        routed = _np(block.experts(flat, idx, weights)).reshape(x.shape)
        ref = _np(block(x))
    _close(with_shared_expert(lp, jnp.asarray(_np(x)), jnp.asarray(routed)), ref)
    im = cfg.moe_intermediate_size
    gate_up, down = _np(block.experts.gate_up_proj), _np(block.experts.down_proj)
    _close(lp["we_gate"], gate_up[:, :im].transpose(0, 2, 1), 1e-7)
    _close(lp["we_up"], gate_up[:, im:].transpose(0, 2, 1), 1e-7)
    _close(lp["we_down"], down.transpose(0, 2, 1), 1e-7)
    _close(lp["router"], _np(block.gate.weight).T, 1e-7)


# --- our own forms against each other: random mixer weights in the loaded layout --------------------------------

prefill = jax.jit(gd.prefill, static_argnums=0, static_argnames="chunk")
verify = jax.jit(gd.verify, static_argnums=0)
CFG = gd.DeltaConfig(hidden_size=24, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6, conv_kernel=4,
                     rms_eps=1e-6)


def _mixer(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    c, h, nv = CFG.conv_dim, CFG.hidden_size, CFG.num_v_heads
    shapes = {"w_qkv": (h, c), "w_z": (h, CFG.value_dim), "w_b": (h, nv), "w_a": (h, nv), "conv": (4, c),
              "dt_bias": (nv,), "out_norm": (CFG.head_v_dim,), "w_out": (CFG.value_dim, h)}
    p = {k: jnp.asarray(rng.normal(0, 0.3, s), jnp.float32) for k, s in shapes.items()}
    return p | {"A_log": jnp.asarray(np.log(rng.uniform(0.01, 16, nv)), jnp.float32)}


def _hidden(b: int, t: int, seed: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(0, 1, (b, t, CFG.hidden_size)), jnp.float32)


def _tree_close(a: dict, b: dict, tol=TOL):
    for key in a:
        _close(a[key], b[key], tol)


def test_chunked_prefill_equals_recurrent_form():
    """Every chunk size (T a multiple of it, not, or shorter), from a non-zero state; ragged rows via n_valid keep
    the state after their own length (n_valid 0: unchanged)."""
    p, h = _mixer(), _hidden(3, 13, seed=1)
    _, start = prefill(CFG, p, _hidden(3, 6, seed=2), gd.init_state(CFG, 3))
    y_rec, states = verify(CFG, p, h, start)
    for chunk in (1, 4, 13, 16):
        y, state = prefill(CFG, p, h, start, chunk=chunk)
        _close(y, y_rec)
        _tree_close(state, gd.commit(states, jnp.full(3, 12, jnp.int32)))
    n_valid = jnp.asarray([13, 5, 0], jnp.int32)
    y, state = prefill(CFG, p, h, start, n_valid=n_valid, chunk=4)
    kept = gd.commit(states, jnp.maximum(n_valid - 1, 0))
    for b in (0, 1):
        _close(y[b, :n_valid[b]], y_rec[b, :n_valid[b]])
        _tree_close({k: v[b] for k, v in state.items()}, {k: v[b] for k, v in kept.items()})
    _tree_close({k: v[2] for k, v in state.items()}, {k: v[2] for k, v in start.items()}, 1e-6)


def test_prefill_then_steps_equals_one_pass():
    """Prefill of n tokens, then single recurrent steps and a block, equals one pass: conv and recurrent state
    carried across calls."""
    p, h = _mixer(1), _hidden(2, 12, seed=3)
    zero = gd.init_state(CFG, 2)
    y_all, s_all = prefill(CFG, p, h, zero, chunk=4)
    ys, state = [], zero
    y, state = prefill(CFG, p, h[:, :5], state, chunk=4)
    ys.append(y)
    for t in (5, 6):  # T = 1 steps: fewer new tokens than the conv kernel
        y, states = verify(CFG, p, h[:, t:t + 1], state)
        state = gd.commit(states, jnp.zeros(2, jnp.int32))
        ys.append(y)
    y, states = verify(CFG, p, h[:, 7:], state)
    ys.append(y)
    _close(jnp.concatenate(ys, 1), y_all)
    _tree_close(gd.commit(states, jnp.full(2, 4, jnp.int32)), s_all)


def test_rollback_at_every_accepted_length_matches_a_fresh_pass():
    """Batch 3, a verify block of T = 5 after a prefix: for every accepted position per row (rows differing), the
    committed state equals a fresh recurrent pass over exactly the committed tokens, and decoding on from it gives
    that fresh pass's outputs."""
    p, t, n0 = _mixer(2), 5, 6
    prefix, block, nxt = _hidden(3, n0, seed=4), _hidden(3, t, seed=5), _hidden(3, 3, seed=6)
    _, base = prefill(CFG, p, prefix, gd.init_state(CFG, 3), chunk=4)
    _, states = verify(CFG, p, block, base)
    commit = jax.jit(gd.commit)
    for shift in range(t):
        last = jnp.asarray([(shift + r * 2) % t for r in range(3)], jnp.int32)  # each row its own length
        state = commit(states, last)
        y_next, _ = verify(CFG, p, nxt, state)
        for r in range(3):
            kept = int(last[r]) + 1
            tokens = jnp.concatenate([prefix[r:r + 1], block[r:r + 1, :kept], nxt[r:r + 1]], axis=1)
            y_fresh, fresh = verify(CFG, p, tokens, gd.init_state(CFG, 1))
            fresh = gd.commit(fresh, jnp.asarray([n0 + kept - 1], jnp.int32))
            _tree_close({k: v[r:r + 1] for k, v in state.items()}, fresh)
            _close(y_next[r], y_fresh[0, n0 + kept:])


# --- config and loader ------------------------------------------------------------------------------------------

def test_config_layer_types_and_published_shapes():
    cfg = hybrid_config_from_hf(QWEN35_27B)
    assert cfg.rotary_dim == 64 and cfg.rope_theta == 1e7 and not cfg.is_moe and not cfg.multimodal
    assert hash(cfg) == hash(hybrid_config_from_hf(json.loads(json.dumps(QWEN35_27B))))  # static under jit
    assert cfg.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert (cfg.delta.num_k_heads, cfg.delta.num_v_heads, cfg.delta.conv_dim) == (16, 48, 10240)
    derived = {k: v for k, v in QWEN35_27B.items() if k != "layer_types"} | {"full_attention_interval": 2}
    assert hybrid_config_from_hf(derived).layer_types[:4] == ("linear_attention", "full_attention") * 2
    explicit = {k: v for k, v in QWEN35_27B.items() if k != "full_attention_interval"}
    explicit["layer_types"] = ["full_attention"] * 64
    assert set(hybrid_config_from_hf(explicit).layer_types) == {"full_attention"}
    wrapped = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
               "text_config": QWEN35_27B, "vision_config": {"depth": 27}, "image_token_id": 248056,
               "tie_word_embeddings": False}
    assert hybrid_config_from_hf(wrapped).multimodal
    assert hybrid_config_from_hf(QWEN35_27B | {"rope_theta": 10000000}).rope_theta == 1e7  # one value, two places


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.update(sliding_window=128), "sliding_window"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(full_attention_interval=3), "disagree"),
    (lambda c: c.update(layer_types=["linear_attention"] * 3), "64 entries"),
    (lambda c: c["rope_parameters"].update(rope_type="yarn"), "rope_type"),
    (lambda c: c["rope_parameters"].update(factor=2.0), "factor"),
    (lambda c: c.update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (lambda c: c.pop("linear_num_value_heads"), "linear_num_value_heads"),
    (lambda c: c.update(model_type="qwen3"), "model_type"),
])
def test_config_refuses_what_it_does_not_understand(edit, message):
    cfg = json.loads(json.dumps(QWEN35_27B))
    edit(cfg)
    with pytest.raises(CheckpointError, match=message):
        hybrid_config_from_hf(cfg)
    with pytest.raises(CheckpointError, match="quantization_config"):
        hybrid_config_from_hf({"model_type": "qwen3_5", "text_config": QWEN35_27B, "quantization_config": {}})


def test_loader_refuses_unknown_missing_and_misshapen_tensors():
    cfg = hybrid_config_from_hf({k: v for k, v in TEXT.items()} | {"model_type": "qwen3_5_text"})
    rng = np.random.default_rng(0)
    for i in (0, 3):
        tensors = {f"model.language_model.layers.{i}.{k}": rng.normal(size=s).astype(np.float32)
                   for k, s in layer_shapes(cfg, i).items()}
        lp = load_layer(cfg, i, tensors.__getitem__, tensors.keys())
        assert ("w_qkv" in lp) == (i == 0) and ("w_attn_gate" in lp) == (i == 3)
        name = f"model.language_model.layers.{i}.input_layernorm.weight"
        for broken, message in [({**tensors, f"model.language_model.layers.{i}.mlp.bias": np.zeros(3)}, "mlp.bias"),
                                ({k: v for k, v in tensors.items() if k != name}, "missing"),
                                ({**tensors, name: np.zeros(5, np.float32)}, "shape")]:
            with pytest.raises(CheckpointError, match=message):
                load_layer(cfg, i, broken.__getitem__, broken.keys())
