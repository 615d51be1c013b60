"""Every published drafter config generation loads, drafts and stays lossless: DFlash (legacy with and without taps,
nested Qwen3.5-style with sliding layers, causality overrides, attention biases, target_hidden_size, a restricted
draft vocabulary, a mask token string, YaRN, SpecForge Domino heads with and without shift_label) and EAGLE-3
(speculators format, eagle_config aux ids).

Each fixture in tests/fixtures/drafter_configs holds exactly the published keys (tiny shapes); its weights are random
tensors under the published names. Every key of every fixture must be read: perturbing it changes the loaded
drafter or is refused, unless the loader lists it as knowingly ignored. A sliding-window drafter run past its window
keeps every context row and matches an independent NumPy forward with the window mask."""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine.cache import init_cache
from engine.config import ModelConfig
from engine.decode import generate
from engine.drafters import DrafterError, dflash, dflash_checkpoint, dflash_config, domino, eagle3_config, load_drafter
from engine.drafters.ar import ArDrafter
from engine.drafters.layers import concat_features
from engine.drafters.ngram import NgramDrafter
from engine.drafters.vocab import from_ids
from engine.model import forward
from engine.target import Target
from engine.weights import build_params, hf_shapes

FIXTURES = Path(__file__).parent / "fixtures" / "drafter_configs"
VOCAB, HIDDEN, LAYERS, MASK = 128, 32, 6, 120
PROMPTS = ["the cat sat on the mat and the cat sat on", "abcabcabcabcabcabcabcabc"]  # > the 6-row window
N_NEW = 14


class TinyTokenizer:
    """Token id = character code (< 120), plus the special tokens of SPECIAL; enough of a tokenizer for raw prompts
    and for resolving a mask token by name."""

    SPECIAL = {"<|MASK|>": MASK, "<|pad|>": 121}
    chat_template = None
    eos_token_id = None
    unk_token_id = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def __len__(self) -> int:
        return 122

    def convert_tokens_to_ids(self, token: str):
        return self.SPECIAL.get(token)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def tiny_target(num_layers: int = LAYERS) -> Target:
    """A random Llama target (tied embeddings) whose greedy continuations are far from uniform."""
    cfg = ModelConfig(arch="llama", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_layers=num_layers,
                      num_heads=4, num_kv_heads=2, head_dim=8, rms_eps=1e-5, rope_theta=10000.0, max_position=512,
                      tie_embeddings=True)
    rng, shapes = np.random.default_rng(5), hf_shapes(cfg)

    def get(name: str) -> np.ndarray:
        if name.endswith("norm.weight"):
            return (1 + 0.1 * rng.normal(size=shapes[name])).astype(np.float32)
        scale = 1.0 if "embed" in name else shapes[name][-1] ** -0.5
        return (scale * rng.normal(size=shapes[name])).astype(np.float32)

    return Target(cfg, build_params(cfg, get, "float32"), TinyTokenizer(), Path("tiny"), "float32", (), "tiny")


TARGET = tiny_target()


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


# ---------------------------------------------------------------- random weights under the published names

def _dflash_tensors(conf: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """z-lab / vLLM DFlash tensor names and [out, in] shapes for a config (written here, not by the loader)."""
    h, nh, nkv, d, inter = (conf[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                               "intermediate_size"))
    extra = conf.get("dflash_config") or {}
    taps = extra.get("target_layer_ids", conf.get("target_layer_ids"))
    n_taps = conf["num_hidden_layers"] if taps is None else len(taps)  # the default: one tap per drafter layer
    shapes = {"fc.weight": (h, n_taps * conf.get("target_hidden_size", h)), "hidden_norm.weight": (h,),
              "norm.weight": (h,)}
    for i in range(conf["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,),
                   f"{p}self_attn.q_proj.weight": (nh * d, h), f"{p}self_attn.k_proj.weight": (nkv * d, h),
                   f"{p}self_attn.v_proj.weight": (nkv * d, h), f"{p}self_attn.o_proj.weight": (h, nh * d),
                   f"{p}self_attn.q_norm.weight": (d,), f"{p}self_attn.k_norm.weight": (d,),
                   f"{p}mlp.gate_proj.weight": (inter, h), f"{p}mlp.up_proj.weight": (inter, h),
                   f"{p}mlp.down_proj.weight": (h, inter)}
        if conf.get("attention_bias"):
            shapes |= {f"{p}self_attn.q_proj.bias": (nh * d,), f"{p}self_attn.k_proj.bias": (nkv * d,),
                       f"{p}self_attn.v_proj.bias": (nkv * d,), f"{p}self_attn.o_proj.bias": (h,)}
    tensors = _random(shapes, rng)
    if conf.get("target_hidden_size", h) != h:  # a drafter of its own width brings its embedding and LM head
        tensors |= {"embed_tokens.weight": rng.normal(size=(VOCAB, h)).astype(np.float32),
                    "lm_head.weight": (h ** -0.5 * rng.normal(size=(VOCAB, h))).astype(np.float32)}
    if "draft_vocab_size" in conf:
        tensors |= _draft_vocab(conf["draft_vocab_size"], h, rng)
    if extra.get("projector_type") == "domino":  # SpecForge DominoDraftModel: prefix_gru, embed_proj (bias-free)
        g, e = extra["gru_hidden_dim"], extra["emb_dim"]
        tensors |= _random({"prefix_gru.weight_ih_l0": (3 * g, h), "prefix_gru.weight_hh_l0": (3 * g, g),
                            "embed_proj.0.weight": (e, h + g), "embed_proj.2.weight": (VOCAB, e)}, rng)
    return tensors


def _eagle3_tensors(conf: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """EAGLE (midlayer.*) or speculators (layers.0.*) EAGLE-3 tensor names and shapes for a config."""
    layer = conf.get("transformer_layer_config", conf)
    h, nh, nkv, inter = (layer[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                             "intermediate_size"))
    d = layer.get("head_dim", h // nh)
    p = "layers.0." if "speculators_model_type" in conf else "midlayer."
    shapes = {"fc.weight": (h, 3 * h), "norm.weight": (h,), f"{p}input_layernorm.weight": (h,),
              f"{p}hidden_norm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,),
              f"{p}self_attn.q_proj.weight": (nh * d, 2 * h), f"{p}self_attn.k_proj.weight": (nkv * d, 2 * h),
              f"{p}self_attn.v_proj.weight": (nkv * d, 2 * h), f"{p}self_attn.o_proj.weight": (h, nh * d),
              f"{p}mlp.gate_proj.weight": (inter, h), f"{p}mlp.up_proj.weight": (inter, h),
              f"{p}mlp.down_proj.weight": (h, inter)}
    return _random(shapes, rng) | _draft_vocab(conf["draft_vocab_size"], h, rng)


def _random(shapes: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Norms 1 + N(0, 0.1), biases N(0, 0.3), matrices N(0, 1/fan_in)."""
    def one(name, shape):
        if name.endswith("norm.weight"):
            return 1 + 0.1 * rng.normal(size=shape)
        return rng.normal(0, 0.3 if name.endswith(".bias") else shape[-1] ** -0.5, shape)

    return {name: one(name, shape).astype(np.float32) for name, shape in shapes.items()}


def _draft_vocab(vd: int, h: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A restricted draft vocabulary: d2t (target id = draft id + d2t), t2d (membership), its own LM head."""
    ids = np.sort(rng.choice(VOCAB, vd, replace=False))
    t2d = np.zeros(VOCAB, bool)
    t2d[ids] = True
    return {"d2t": (ids - np.arange(vd)).astype(np.int64), "t2d": t2d,
            "lm_head.weight": (h ** -0.5 * rng.normal(size=(vd, h))).astype(np.float32)}


def write_checkpoint(path: Path, conf: dict, seed: int = 0, tensors: dict | None = None) -> Path:
    """config.json (conf as given) + model.safetensors (random tensors under the published names unless given)."""
    path.mkdir(parents=True, exist_ok=True)
    if tensors is None:
        make = _eagle3_tensors if "eagle" in json.dumps(conf["architectures"]).lower() else _dflash_tensors
        tensors = make(conf, np.random.default_rng(seed))
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(conf))
    return path


@functools.cache
def ar_tokens(prompt: str) -> list[int]:
    return generate(TARGET, prompt, drafter=ArDrafter(), max_new_tokens=N_NEW, raw=True).token_ids


def assert_lossless(drafter) -> None:
    """Greedy speculative decoding with the drafter emits the target's own greedy tokens."""
    for prompt in PROMPTS:
        got = generate(TARGET, prompt, drafter=drafter, max_new_tokens=N_NEW, raw=True)
        assert got.token_ids == ar_tokens(prompt), prompt
        assert got.stats["drafted"] > 0


# ---------------------------------------------------------------- each generation loads, drafts, stays lossless

def _checks(name: str, d) -> None:
    """What each fixture's published keys must turn into."""
    cfg = d.cfg
    if name == "dflash_legacy":
        assert (cfg.target_layer_ids, cfg.mask_token_id, cfg.block_size, cfg.windows, cfg.causal) == \
            ((1, 3, 4), MASK, 4, (), ())
    elif name == "dflash_legacy_no_taps":  # z-lab build_target_layer_ids(6, 3); the tokenizer's <|MASK|>
        assert cfg.target_layer_ids == tuple(int(round(1 + i * (LAYERS - 4) / 2)) for i in range(3)) == (1, 2, 3)
        assert cfg.mask_token_id == MASK
    elif name == "dflash_nested_sliding":
        assert (cfg.block_size, cfg.windows, cfg.causal) == (4, (6, 6, None), (True, True, False))
        assert cfg.body.rope_theta == 1e7
    elif name == "dflash_is_causal":  # top-level is_causal overrides dflash_config.causal and the default
        assert (cfg.windows, cfg.causal) == ((6, 6, None), (True, True, True))
    elif name == "dflash_attention_bias":
        assert cfg.attention_bias and cfg.block_size == 5 and cfg.mask_token_id == 121
        assert all(float(jnp.abs(lp[b]).max()) > 0 for lp in d.params["layers"] for b in ("bq", "bk", "bv", "bo"))
    elif name == "dflash_target_hidden":
        assert (cfg.target_hidden_size, cfg.body.hidden_size) == (HIDDEN, 48)
        assert d.head["embed"].shape == (VOCAB, 48) and d.head["lm_head"].shape == (48, VOCAB)
    elif name == "dflash_draft_vocab":
        assert d.head["lm_head"].shape == (HIDDEN, 64) and d.vocab.ids.shape == (64,)
    elif name == "dflash_mask_token":
        assert cfg.mask_token_id == MASK
    elif name.startswith("dflash_domino"):
        shift = name == "dflash_domino_shift"
        assert (cfg.domino, cfg.shift_label) == (domino.Domino(1 if shift else 2, 8, 12), shift)
        assert d.params["domino"]["proj_out"].shape == (8, VOCAB)
    elif name == "eagle3_speculators":
        assert (cfg.feature_layers, cfg.norm_before_residual, cfg.draft_vocab_size, d.k) == ((1, 2, 3), True, 64, 3)
        assert dict(cfg.body.rope_scaling)["rope_type"] == "llama3" and cfg.verifier_arch == "llama"
    elif name == "eagle3_eagle_config":
        assert cfg.feature_layers == (0, 2, 4) and cfg.draft_vocab_size == 64


LOADABLE = ["dflash_legacy", "dflash_legacy_no_taps", "dflash_nested_sliding", "dflash_is_causal",
            "dflash_attention_bias", "dflash_target_hidden", "dflash_draft_vocab", "dflash_mask_token",
            "dflash_domino", "dflash_domino_shift", "eagle3_speculators", "eagle3_eagle_config"]


@pytest.mark.parametrize("name", LOADABLE)
def test_published_generation_loads_drafts_and_is_lossless(tmp_path, name):
    path = write_checkpoint(tmp_path / name, fixture(name))
    d = load_drafter(path, TARGET)  # the registry picks the loader from `architectures`
    assert d.name == ("eagle3" if name.startswith("eagle3") else "dflash") and d.checkpoint == str(path)
    _checks(name, d)
    assert_lossless(d)


# ---------------------------------------------------------------- no key silently ignored

def _paths(conf: dict, prefix: str = ""):
    """Every key path of a config (nested objects and objects inside lists walked)."""
    for key, value in conf.items():
        path = f"{prefix}{key}"
        yield path
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, dict):
                yield from _paths(item, f"{path}.{i}." if isinstance(value, list) else f"{path}.")


def _perturb(conf: dict, path: str) -> dict:
    """conf with the value at `path` changed (a number moved, a flag flipped, a string or list altered)."""
    out = copy.deepcopy(conf)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    value = node[last]
    if isinstance(value, bool):
        node[last] = not value
    elif isinstance(value, (int, float)):
        node[last] = value * 2 + 1
    elif isinstance(value, str):
        node[last] = value + "-x"
    elif isinstance(value, list):
        node[last] = value[:-1]
    elif value is None:
        node[last] = 7
    else:
        node[last] = {"unexpected": 1}
    return out


def _top_ignored(name: str, conf: dict) -> dict:
    if name.startswith("dflash"):
        return dflash_config.IGNORED_KEYS
    return eagle3_config.SPECULATORS_IGNORED_KEYS if "speculators_model_type" in conf else eagle3_config.IGNORED_KEYS


def _ignored(name: str, conf: dict, path: str) -> bool:
    """Whether the loader knowingly ignores a key path."""
    top = path.split(".")[0]
    if top in _top_ignored(name, conf):
        return True
    if path.startswith("transformer_layer_config."):  # the speculators layer config: the Llama layer keys
        key = path.split(".")[1]
        return key in eagle3_config.IGNORED_KEYS and key != "model_type"  # its model_type is checked
    return path == "speculators_config.verifier.name_or_path"


# keys a fixture holds that do nothing given its other keys, with the reason
def _inert(conf: dict, path: str, d) -> bool:
    sliding = "sliding_attention" in (conf.get("layer_types") or [])
    return {"sliding_window": not (sliding and conf.get("use_sliding_window")),  # counts only for sliding layers
            "use_sliding_window": not sliding,
            "dflash_config.causal": "is_causal" in conf,  # the top-level is_causal overrides it
            "tie_word_embeddings": "embed" not in d.params,  # ties the drafter's own embedding, when it has one
            }.get(path, False)


def _outcome(path: Path):
    """What a loaded drafter is, for comparison; the DrafterError message when loading is refused."""
    try:
        d = load_drafter(path, TARGET)
    except DrafterError as e:
        return f"refused: {e}"
    vocab = getattr(d, "vocab", None)
    return (d.cfg, d.k, None if vocab is None else tuple(np.asarray(vocab.ids)),
            {k: tuple(v.shape) for k, v in d.head.items()} if hasattr(d, "head") else None)


@pytest.mark.parametrize("name", LOADABLE)
def test_every_key_of_every_fixture_is_read(tmp_path, name):
    conf = fixture(name)
    tensors = load_file(write_checkpoint(tmp_path / "base", conf) / "model.safetensors")
    base = _outcome(tmp_path / "base")
    d = load_drafter(tmp_path / "base", TARGET)
    assert not isinstance(base, str), base
    unread = []
    for i, path in enumerate(_paths(conf)):
        got = _outcome(write_checkpoint(tmp_path / f"p{i}", _perturb(conf, path), tensors=tensors))
        refused, same = isinstance(got, str), got == base
        if _ignored(name, conf, path):
            assert same or refused, f"{path} is listed as ignored but changes the drafter"
        elif same and not _inert(conf, path, d):
            unread.append(path)
    assert not unread, f"keys of {name} that loading does not read: {unread}"


# ---------------------------------------------------------------- sliding-window layers past their window

def numpy_block_logits(path: Path, embed: np.ndarray, ctx: np.ndarray, anchor: int, p: int,
                       windowed: bool = True) -> tuple[np.ndarray, list[np.ndarray]]:
    """An independent forward from the checkpoint files: (logits of block rows 1..B-1 [B-1, V], per layer the
    context keys [p, Nkv, D]). ctx [p, F*H]: target features of positions 0..p-1; tied target head (= embed).
    Sliding layers (use_sliding_window) see a key at position j from a query at i when i - j < window (and
    j - i < window when not causal); causal layers see block keys j <= i; windowed=False: every layer full."""
    conf = json.loads((path / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(path / "model.safetensors").items()}
    extra = conf["dflash_config"]
    nh, nkv, d, eps = conf["num_attention_heads"], conf["num_key_value_heads"], conf["head_dim"], conf["rms_norm_eps"]
    size, mask_id = extra.get("block_size", conf.get("block_size")), extra["mask_token_id"]
    theta = conf["rope_parameters"]["rope_theta"]

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rot(x, pos):
        ang = np.asarray(pos)[:, None, None] * theta ** (-np.arange(0, d, 2) / d)
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    c = rms(ctx @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = embed[[anchor] + [mask_id] * (size - 1)].astype(np.float64)
    q_pos, k_pos = np.arange(p, p + size), np.concatenate([np.arange(p), np.arange(p, p + size)])
    ctx_keys = []
    for i, kind in enumerate(conf["layer_types"]):
        lw = {k.split(f"layers.{i}.")[1]: v for k, v in w.items() if k.startswith(f"layers.{i}.")}
        causal = conf.get("is_causal", extra.get("causal", kind == "sliding_attention"))
        visible = np.ones((size, p + size), bool)
        if causal:
            visible[:, p:] &= k_pos[None, p:] <= q_pos[:, None]
        if windowed and kind == "sliding_attention" and conf["use_sliding_window"]:
            win = conf["sliding_window"]
            visible &= q_pos[:, None] - k_pos[None] < win
            if not causal:
                visible &= k_pos[None] - q_pos[:, None] < win
        h = rms(x, lw["input_layernorm.weight"])

        def kv(src, pos, lw=lw):
            k = rms((src @ lw["self_attn.k_proj.weight"].T).reshape(len(src), nkv, d), lw["self_attn.k_norm.weight"])
            return rot(k, pos), (src @ lw["self_attn.v_proj.weight"].T).reshape(len(src), nkv, d)

        q = rot(rms((h @ lw["self_attn.q_proj.weight"].T).reshape(size, nh, d), lw["self_attn.q_norm.weight"]), q_pos)
        (kc, vc), (kb, vb) = kv(c, np.arange(p)), kv(h, q_pos)
        ctx_keys.append(kc)
        keys, values = np.concatenate([kc, kb]), np.concatenate([vc, vb])
        out = np.zeros((size, nh, d))
        for head in range(nh):
            g = head // (nh // nkv)
            s = np.where(visible, q[:, head] @ keys[:, g].T / np.sqrt(d), -np.inf)
            a = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (a / a.sum(-1, keepdims=True)) @ values[:, g]
        x = x + out.reshape(size, nh * d) @ lw["self_attn.o_proj.weight"].T
        h = rms(x, lw["post_attention_layernorm.weight"])
        gate = h @ lw["mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ lw["mlp.up_proj.weight"].T)) @ lw["mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])[1:] @ embed.astype(np.float64).T, ctx_keys


def _features(ids: list[int], capture: tuple[int, ...]):
    padded = np.zeros((1, 64), np.int32)
    padded[0, :len(ids)] = ids
    _, feats, _ = forward(TARGET.params, init_cache(TARGET.cfg, 1, 64), jnp.asarray(padded),
                          jnp.asarray([0], jnp.int32), cfg=TARGET.cfg, capture=capture, with_logits=False)
    return feats[:, :, :len(ids)]


@pytest.mark.parametrize("name", ["dflash_nested_sliding", "dflash_is_causal"])
def test_sliding_layers_past_their_window_keep_the_whole_context_and_match_the_window_mask(tmp_path, name):
    path = write_checkpoint(tmp_path / name, fixture(name), seed=3)
    d = dflash.load(TARGET, path)
    ids = [int(i) for i in np.random.default_rng(4).integers(0, 100, 23)]
    p, window = len(ids) - 1, fixture(name)["sliding_window"]
    assert p > 3 * window
    feats = _features(ids[:-1], d.feature_layers)
    state = d.start([np.asarray(ids)], 64)
    for lo in range(0, p, 8):  # prefill chunks, as the engine does
        state = d.extend(state, feats[:, :, lo:lo + 8], np.array([min(8, p - lo)]))
    embed = np.asarray(TARGET.params["embed"])
    want, ctx_keys = numpy_block_logits(path, embed, np.asarray(concat_features(feats))[0], ids[-1], p)
    for layer, keys in enumerate(ctx_keys):  # every context row stays in the cache, the sliding layers' too
        np.testing.assert_allclose(np.asarray(state.k[layer][0, :, :p]).transpose(1, 0, 2), keys, atol=1e-4)
    _, _, logits = dflash.draft(d.params, d.head, state.k, state.v, np.int32([ids[-1]]), np.int32([p]),
                                cfg=d.cfg, k=d.cfg.block_size - 1)
    np.testing.assert_allclose(np.asarray(logits[0]), want, atol=2e-4, rtol=2e-4)
    full, _ = numpy_block_logits(path, embed, np.asarray(concat_features(feats))[0], ids[-1], p, windowed=False)
    assert np.abs(full - want).max() > 1e-2  # the window changes the drafts' logits: the mask is what is tested


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize(("name", "change", "message"), [
    ("dflash2", {}, "DFlash2 .* is not implemented"),
    ("dflash_legacy", {"layer_scale": 1.0}, "keys this loader does not read: layer_scale"),
    ("dflash_legacy", {"dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 3, 4], "conv_group_size": 2}},
     "dflash_config has keys this loader does not read: conv_group_size"),
    ("dflash_nested_sliding", {"dflash_config": {"block_size": 4, "mask_token_id": MASK,
                                                 "target_layer_ids": [1, 2, 3, 4], "attention_sink_bias": True}},
     "attention_sink_bias = true is not supported"),
    ("dflash_nested_sliding", {"use_sliding_window": False}, "sliding_attention layers but no window"),
    ("dflash_legacy", {"num_target_layers": 8}, "8-layer target"),
    ("dflash_mask_token", {"dflash_config": {"block_size": 4, "mask_token": "<|mask|>", "target_layer_ids": [1, 3, 4]}},
     "tokenizer has no '<|mask|>' token"),
    ("eagle3_speculators", {"speculators_config": {**fixture("eagle3_speculators")["speculators_config"],
                                                   "verifier": {"architectures": ["Qwen3ForCausalLM"],
                                                                "name_or_path": "Qwen/Qwen3-8B"}}},
     "trained for a qwen3 verifier; this target is llama"),
    ("dflash_domino", {"dflash_config": {**fixture("dflash_domino")["dflash_config"], "projector_type": "markov"}},
     "projector_type 'markov' is not supported"),
    ("dflash_domino", {"dflash_config": {**fixture("dflash_domino")["dflash_config"], "gru_hidden_dim": 16}},
     r"prefix_gru.weight_ih_l0 .* must be \[48, 32\]"),
    ("dflash_domino_shift", {"emb_dim": 16}, "emb_dim is 8 in dflash_config but 16 at the top level"),
    ("eagle3_speculators", {"target_hidden_size": 48}, "target features of width 48"),
    ("eagle3_speculators", {"norm_before_fc": True}, "norm_before_fc"),
    ("eagle3_eagle_config", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "num_layers": 1}},
     "eagle_config has keys this loader does not read: num_layers"),
])
def test_refusals_name_the_reason(tmp_path, name, change, message):
    base = fixture(name)
    tensors = None if name == "dflash2" else load_file(write_checkpoint(tmp_path / "ok", base) / "model.safetensors")
    if name == "dflash2":  # its tensors are beside the point: the architecture is refused first
        tensors = {"fc.weight": np.zeros((HIDDEN, 3 * HIDDEN), np.float32)}
    path = write_checkpoint(tmp_path / "bad", {**base, **change}, tensors=tensors)
    with pytest.raises(DrafterError, match=message):
        load_drafter(path, TARGET)


def test_speculators_without_norm_before_residual_and_unread_tensors_are_refused(tmp_path):
    conf = fixture("eagle3_speculators")
    tensors = load_file(write_checkpoint(tmp_path / "ok", conf) / "model.safetensors")
    del conf["norm_before_residual"]
    with pytest.raises(DrafterError, match="must say norm_before_residual"):
        load_drafter(write_checkpoint(tmp_path / "a", conf, tensors=tensors), TARGET)
    conf = fixture("dflash_legacy")
    tensors = load_file(write_checkpoint(tmp_path / "b", conf) / "model.safetensors")
    tensors["layers.0.self_attn.sinks"] = np.zeros(4, np.float32)
    with pytest.raises(DrafterError, match="tensors this loader does not read: layers.0.self_attn.sinks"):
        load_drafter(write_checkpoint(tmp_path / "c", conf, tensors=tensors), TARGET)
    with pytest.raises(DrafterError, match="6-layer target"):  # a target of another depth
        load_drafter(write_checkpoint(tmp_path / "d", conf), tiny_target(num_layers=8))


def test_a_loaded_generation_saves_and_loads_back_the_same(tmp_path):
    for name in ("dflash_nested_sliding", "dflash_is_causal", "dflash_attention_bias", "dflash_target_hidden",
                 "dflash_domino", "dflash_domino_shift"):
        d = dflash.load(TARGET, write_checkpoint(tmp_path / name, fixture(name)))
        again = dflash.load(TARGET, dflash_checkpoint.save_dflash(tmp_path / f"{name}-saved", d.cfg, d.params))
        assert again.cfg == d.cfg, name
        jax.tree.map(np.testing.assert_array_equal, again.params, d.params)
    cfg, params = dflash_checkpoint.init_dflash(TARGET, 3, 4, (1, 3, 4), MASK, windows=(6, 6, None),
                                                causal=(True, True, False), attention_bias=True)
    assert {"bq", "bk", "bv", "bo"} <= set(params["layers"][0]) and cfg.windows == (6, 6, None)
    assert dflash.load(TARGET, dflash_checkpoint.save_dflash(tmp_path / "init", cfg, params)).cfg == cfg


# ---------------------------------------------------------------- YaRN rope through the body config

def test_yarn_drafter_loads_and_is_lossless(tmp_path):
    d = load_drafter(write_checkpoint(tmp_path / "yarn", fixture("dflash_yarn")), TARGET)
    scaling = dict(d.cfg.body.rope_scaling)
    assert (scaling["rope_type"], scaling["factor"], scaling["mscale_all_dim"]) == ("yarn", 4.0, 0.5)
    mscale = lambda m: 0.1 * m * math.log(4.0) + 1.0  # noqa: E731
    assert d.cfg.body.attention_factor() == pytest.approx(mscale(1.0) / mscale(0.5))
    assert_lossless(d)


# ---------------------------------------------------------------- lookup hints (a draftscope extension)

def test_lookup_hints_start_blocks_from_prompt_lookup_train_as_served_and_stay_lossless(tmp_path):
    conf = fixture("dflash_legacy")
    conf["dflash_config"] = {**conf["dflash_config"], "lookup_hints": 3}
    d = load_drafter(write_checkpoint(tmp_path / "hints", conf, seed=2), TARGET)
    assert d.cfg.lookup_hints == 3
    again = dflash.load(TARGET, dflash_checkpoint.save_dflash(tmp_path / "saved", d.cfg, d.params))
    assert again.cfg == d.cfg
    ids = [ord(c) for c in "the cat sat on the mat and the c"]
    hints = dflash.lookup_hints(d.cfg, [ids])  # what the n-gram drafter proposes after "... and the c"
    want_ids, n = NgramDrafter(d.cfg.block_size - 1, max_ngram=3).lookup(np.asarray(ids))
    assert n == d.cfg.block_size - 1 and hints[0].tolist() == want_ids.tolist()
    assert dflash.lookup_hints(d.cfg, [[ord("x"), ord("y")]])[0].tolist() == [MASK] * (d.cfg.block_size - 1)
    p = len(ids) - 1
    feats = _features(ids[:-1], d.feature_layers)
    state = d.start([np.asarray(ids)], 64)
    state = d.extend(state, feats, np.array([p]))
    _, _, served = dflash.draft(d.params, d.head, state.k, state.v, np.int32([ids[-1]]), np.int32([p]), None,
                                jnp.asarray(hints), cfg=d.cfg, k=d.cfg.block_size - 1)
    _, _, unhinted = dflash.draft(d.params, d.head, state.k, state.v, np.int32([ids[-1]]), np.int32([p]),
                                  cfg=d.cfg, k=d.cfg.block_size - 1)
    full = _features(ids, d.feature_layers)
    trained = dflash.dflash_train_logits(d.params, d.cfg, d.head, concat_features(full), jnp.asarray([ids]),
                                         jnp.asarray([[p]]), hints=jnp.asarray(hints)[:, None])
    np.testing.assert_allclose(np.asarray(trained[0, 0]), np.asarray(served[0]), atol=1e-4, rtol=1e-4)
    assert np.abs(np.asarray(served) - np.asarray(unhinted)).max() > 1e-3  # the hints are what the block starts from
    assert_lossless(d)


def test_hint_bias_drafts_a_hint_near_the_argmax_and_stays_lossless(tmp_path):
    conf = fixture("dflash_legacy")
    conf["dflash_config"] = {**conf["dflash_config"], "lookup_hints": 3, "hint_bias": 2.5}
    d = load_drafter(write_checkpoint(tmp_path / "bias", conf, seed=2), TARGET)
    assert d.cfg.hint_bias == 2.5
    assert dflash.load(TARGET, dflash_checkpoint.save_dflash(tmp_path / "saved", d.cfg, d.params)).cfg == d.cfg
    logits = jnp.asarray([[[0.0, 5.0, 3.0, 1.0], [0.0, 5.0, 2.0, 1.0], [4.0, 5.0, 0.0, 0.0], [0.0, 5.0, 0.0, 9.0]]])
    hints = jnp.asarray([[2, 2, MASK, 3]])  # within 2.5, not within, no hint, already the argmax
    ids, q = dflash.pick_drafts(d.cfg, logits, hints)
    assert ids.tolist() == [[2, 1, 1, 3]]
    np.testing.assert_allclose(q, jax.nn.softmax(logits)[0, jnp.arange(4), ids[0]][None], rtol=1e-6)
    assert dflash.pick_drafts(replace(d.cfg, hint_bias=0.0), logits, hints)[0].tolist() == [[1, 1, 1, 3]]
    restricted = from_ids(np.array([7, 2, 5, 3]), VOCAB, "DFlash")  # a hint outside it (9) is not drafted ...
    assert dflash.pick_drafts(d.cfg, logits, jnp.asarray([[5, 2, 9, 3]]), restricted)[0].tolist() == [[5, 2, 2, 3]]
    assert_lossless(d)
    conf["dflash_config"]["oov_hints"] = True
    with pytest.raises(DrafterError, match="oov_hints must be true or false"):
        load_drafter(write_checkpoint(tmp_path / "bad-oov", {**conf, "dflash_config": {**conf["dflash_config"],
                                                                                         "oov_hints": 1}}), TARGET)
    conf["dflash_config"].pop("oov_hints")
    for bad, message in ((-1.0, "finite number >= 0"), ("1", "finite number >= 0"), (True, "finite number >= 0")):
        conf["dflash_config"]["hint_bias"] = bad
        with pytest.raises(DrafterError, match=message):
            load_drafter(write_checkpoint(tmp_path / "bad", conf), TARGET)
    conf["dflash_config"] = {**conf["dflash_config"], "hint_bias": 1.0, "lookup_hints": 0}
    with pytest.raises(DrafterError, match="needs lookup_hints"):
        load_drafter(write_checkpoint(tmp_path / "nohints", conf), TARGET)
    conf["dflash_config"] = {**conf["dflash_config"], "hint_bias": 0.0, "oov_hints": True}
    with pytest.raises(DrafterError, match="oov_hints needs lookup_hints"):
        load_drafter(write_checkpoint(tmp_path / "oov-nohints", conf), TARGET)


def test_oov_hints_score_a_hint_outside_the_draft_vocabulary_with_the_target_head_and_stay_lossless(tmp_path):
    conf = fixture("dflash_legacy")
    conf["dflash_config"] = {**conf["dflash_config"], "lookup_hints": 3, "hint_bias": 2.5, "oov_hints": True}
    rng = np.random.default_rng(3)
    vocab = _draft_vocab(48, conf["hidden_size"], rng)  # drafts over the target's LM head cut to 48 ids
    tensors = {**_dflash_tensors(conf, rng), "d2t": vocab["d2t"], "t2d": vocab["t2d"]}
    d = load_drafter(write_checkpoint(tmp_path / "oov", conf, tensors=tensors), TARGET)
    ids_vd = np.asarray(d.vocab.ids)
    assert d.cfg.oov_hints and len(ids_vd) == 48
    saved = dflash_checkpoint.save_dflash(tmp_path / "saved", d.cfg, d.params, d2t=ids_vd - np.arange(48))
    assert dflash.load(TARGET, saved).cfg == d.cfg
    whole = dflash.DFlashDrafter(TARGET, d.cfg, d.params)  # the same weights over the whole target vocabulary

    ids = [ord(c) for c in "the cat sat on the mat and the c"]
    hints = np.asarray(dflash.lookup_hints(d.cfg, [ids]))
    outside = (hints != MASK) & ~np.isin(hints, ids_vd)
    assert outside.any() and (np.isin(hints, ids_vd)).any()  # the block holds hints outside and inside the cut
    p, k = len(ids) - 1, d.cfg.block_size - 1
    state = d.extend(d.start([np.asarray(ids)], 64), _features(ids[:-1], d.feature_layers), np.array([p]))
    served = [dflash.draft(x.params, x.head, state.k, state.v, np.int32([ids[-1]]), np.int32([p]), x.vocab,
                           jnp.asarray(hints), cfg=d.cfg, k=k)[2][0] for x in (d, whole)]
    restricted, full = np.asarray(served[0]), np.asarray(served[1])
    assert restricted.shape == (k, 49) and full.shape == (k, VOCAB)
    np.testing.assert_allclose(restricted[:, :48], full[:, ids_vd], atol=1e-4)  # the cut head's columns
    rows = np.nonzero(outside[0])[0]  # the hint column: the whole head's logit of the hint, where the cut lacks it
    np.testing.assert_allclose(restricted[rows, 48], full[rows, hints[0, rows]], atol=1e-4)
    assert (restricted[~outside[0], 48] == dflash.NO_LOGIT).all()
    trained = dflash.dflash_train_logits(d.params, d.cfg, d.head, concat_features(_features(ids, d.feature_layers)),
                                         jnp.asarray([ids]), jnp.asarray([[p]]), hints=jnp.asarray(hints)[:, None])
    np.testing.assert_allclose(np.asarray(trained[0, 0]), restricted, atol=1e-4)  # training sees the same column

    # the pick runs over the cut vocabulary plus the hint: a hint outside it is drafted within hint_bias of the top
    cut = from_ids(np.array([7, 2, 5, 3]), VOCAB, "DFlash")
    logits = jnp.asarray([[[0.0, 5.0, 3.0, 1.0, dflash.NO_LOGIT], [0.0, 5.0, 2.0, 1.0, 4.0],
                           [0.0, 5.0, 2.0, 1.0, 1.0], [0.0, 5.0, 2.0, 1.0, 6.0]]])
    hint_ids = jnp.asarray([[5, 9, 9, 9]])  # inside the cut; outside and near; outside and far; outside and top
    picked, q = dflash.pick_drafts(d.cfg, logits, hint_ids, cut)
    assert picked.tolist() == [[5, 9, 2, 9]]
    np.testing.assert_allclose(q[0], jax.nn.softmax(logits[0])[jnp.arange(4), jnp.asarray([2, 4, 1, 4])], rtol=1e-6)
    assert dflash.pick_drafts(replace(d.cfg, hint_bias=0.0), logits, hint_ids, cut)[0].tolist() == [[2, 2, 2, 9]]

    assert_lossless(dflash.DFlashDrafter(TARGET, replace(d.cfg, hint_bias=100.0), d.params,
                                         d2t=ids_vd - np.arange(48)))  # every hint drafted, outside the cut too
    own_head = {**tensors, "lm_head.weight": vocab["lm_head.weight"]}
    with pytest.raises(DrafterError, match="own restricted lm_head"):
        load_drafter(write_checkpoint(tmp_path / "own", conf, tensors=own_head), TARGET)
