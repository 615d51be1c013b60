"""`dflash`: block-diffusion drafting (DFlash, z-lab checkpoint format; docs/dflash.md sections 2-4).

One non-causal forward drafts a block. The anchor (the last committed token, at position p, with no
target feature yet) starts block [anchor, MASK x (B-1)] at positions p..p+B-1. Target features of
`target_layer_ids` (OUTPUT convention: id L = output of target layer L = HF hidden_states[L+1]),
concatenated in list order, go through fc -> hidden_norm = context C [T, H]. Every drafter layer
projects C with its own k_proj/v_proj (+ k_norm, + RoPE at each context token's absolute position)
and its block queries attend, without a causal mask, to [context K/V ; block K/V]. Final norm and the
target's LM head on block rows 1..K give the greedy drafts. Newer drafters (DFlashConfig) add sliding-window layers
(masked by position: the cache keeps every context row), block-causal layers, q/k/v/o biases, target features of
another width, their own embedding / LM head and a restricted draft vocabulary.

config.json generations read by config_from_json: legacy (top-level block_size, rope_theta; dflash_config
{mask_token_id, target_layer_ids}, or neither: taps from default_target_layer_ids and the tokenizer's <|MASK|>) and
nested (dflash_config.block_size, rope_parameters, sliding_window / use_sliding_window / layer_types, is_causal,
dflash_config.causal, mask_token as a string). Unknown keys and architectures (DFlash2DraftModel) are refused.

Draft context cache of a batch: per drafter layer K/V of context rows, head-major [B, Nkv, S, D] each,
S = the target's cache size, and each sequence's context length (ragged, like the target cache's).
extend() writes the K/V of new feature rows at each sequence's length.. and grows it by that sequence's
number of verified rows; rows past it are masked out, so rejected rows never enter. propose() drafts
the whole batch in one forward over [B, block] and does not change the cache (block K/V are transient).

Params (matrices [in, out], norms float32; embedding and LM head are the target's unless the checkpoint has its own):
    fc [F*Ht, H]; hidden_norm [H]; norm [H]; layers: a list of Qwen3 layer dicts (see layers.py);
    optional embed [V, H] and lm_head [H, Vd]
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..cache import take_rows, write
from ..config import ModelConfig
from ..model import attention, embed, linear, rms_norm, rope
from ..sharding import fetch
from ..target import Target
from ..weights import DTYPES
from . import domino as domino_head
from .base import DrafterError, Proposal, check_k
from .domino import Domino
from .layers import (
    TENSOR_KEYS,
    anchors_of,
    body_config,
    body_json,
    cache_zeros,
    check_extend,
    check_fc,
    check_hidden,
    check_keys,
    check_layer_ids,
    checkpoint_dir,
    concat_features,
    decoder_shape,
    expect_tensor,
    head_logits,
    layer_shapes,
    layer_tensors,
    linear_bias,
    load_layers,
    matrix,
    on_mesh,
    random_layers,
    random_matrix,
    read_config,
    read_tensors,
    save_checkpoint,
    shared_head,
    vector,
)
from .ngram import NgramDrafter

DOMINO_ARCHITECTURE = "DominoDraftModel"  # SpecForge's name for a DFlash body with the Domino head
DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "smollm2-135m-dflash"
ARCHITECTURES = ("DFlashDraftModel", "DFlashForCausalLM", DOMINO_ARCHITECTURE)
REFUSED_ARCHITECTURES = {"DFlash2DraftModel": "DFlash2 (grouped dynamic convolutions and a candidate selector) "
                                              "is not implemented"}
# Default mask token when the target's embedding has no spare row: SmolLM2's `<empty_output>` (id 16),
# a StarCoder-era Jupyter marker that chat never produces.
FALLBACK_MASK_TOKEN = "<empty_output>"
MASK_TOKEN = "<|MASK|>"  # the tokenizer token of configs that predate dflash_config.mask_token_id
FULL, SLIDING = "full_attention", "sliding_attention"

# config.json keys: read by config_from_json / load, or knowingly ignored (each with its reason)
READ_KEYS = frozenset({
    "architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "max_position_embeddings", "vocab_size", "hidden_act", "attention_bias", "mlp_bias", "block_size",
    "num_target_layers", "layer_types", "sliding_window", "use_sliding_window", "is_causal", "target_hidden_size",
    "draft_vocab_size", "mask_token_id", "mask_token", "target_layer_ids", "tie_word_embeddings", "dflash_config",
    "emb_dim"})
IGNORED_KEYS = {
    "auto_map": "remote-code class names (never executed)",
    "model_type": "the body is always a Qwen3-style decoder",
    "transformers_version": "writer version", "torch_dtype": "storage dtype (the safetensors say it)",
    "dtype": "storage dtype (the safetensors say it)", "bos_token_id": "the target's tokenizer decides",
    "eos_token_id": "the target's tokenizer decides", "pad_token_id": "the target's tokenizer decides",
    "use_cache": "runtime flag", "initializer_range": "training init", "attention_dropout": "training only",
    "max_window_layers": "derives layer_types only when they are absent",
}
DFLASH_READ_KEYS = frozenset({"mask_token_id", "mask_token", "target_layer_ids", "block_size", "causal",
                              "num_target_layers", "shift_label", "projector_type", "pure_draft_prefix_len",
                              "emb_dim", "gru_hidden_dim", "lookup_hints", "hint_bias", "oov_hints"})
# dflash_config keys read only at the value that leaves drafting as implemented (anything else is refused)
DFLASH_NEUTRAL = {"use_aux_hidden_state": True, "attention_sink_bias": False, "input_embedding_scale": 1.0,
                  "output_multiplier": 1.0, "final_logit_softcapping": None, "position_scheme": "incremental"}
NO_LOGIT = -1e9  # the logit of a column that holds no candidate (hint_column)


@dataclass(frozen=True)
class DFlashConfig:
    """Static drafter config (a jit static argument).

    body: the drafter's Qwen3-style decoder (body.num_layers = drafter depth, vocab = the target's).
    target_layer_ids: target layers whose outputs form the context, in concatenation order.
    windows: per drafter layer its sliding window (None: full attention); () = all full. A window W lets a
        query at position q see keys at q-W < position (and, when not causal, < q+W); every context row stays
        in the cache, masked by position.
    causal: per drafter layer whether the block's queries attend causally among themselves (they always see
        the whole visible context); () = none causal.
    attention_bias: the layers have q/k/v/o biases (params bq, bk, bv, bo).
    target_hidden_size: width of one target feature when it differs from body.hidden_size (fc takes
        len(target_layer_ids) x it).
    shift_label: block row j-1 (not row j) predicts draft j (SpecForge's shift_label).
    domino: the Domino correction head's shape (engine/drafters/domino.py), None without one.
    lookup_hints: 0, or n: the block's rows 1.. start from prompt lookup over the context (the n-gram drafter's
        proposal, n-grams up to n; MASK where it proposes nothing) instead of MASK (a draftscope extension,
        `dflash_config.lookup_hints`): the drafter sees what copying the context would draft and learns when to
        keep it.
    hint_bias: with lookup hints, a hint whose logit is within hint_bias of the best one is drafted instead of the
        argmax (`dflash_config.hint_bias`, a serving rule; 0: plain argmax; see pick_drafts).
    oov_hints: with lookup hints and a restricted draft vocabulary, a hint the vocabulary lacks is scored by the
        target's whole LM head and competes with the vocabulary (`dflash_config.oov_hints`; see hint_column).
    """

    body: ModelConfig
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    windows: tuple[int | None, ...] = ()
    causal: tuple[bool, ...] = ()
    attention_bias: bool = False
    target_hidden_size: int | None = None
    shift_label: bool = False
    domino: Domino | None = None
    lookup_hints: int = 0
    hint_bias: float = 0.0
    oov_hints: bool = False

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if self.windows else None

    def is_causal(self, layer: int) -> bool:
        return bool(self.causal) and self.causal[layer]

    @property
    def feature_width(self) -> int:
        return self.target_hidden_size or self.body.hidden_size


@dataclass(frozen=True)
class DFlashState:
    """Context caches k, v (per drafter layer [B, Nkv, S, D]) and each sequence's number of rows
    (lengths [B] int32 = its next anchor position)."""

    k: list[jax.Array]
    v: list[jax.Array]
    lengths: np.ndarray

    def take(self, rows: jax.Array) -> DFlashState:
        """The state of batch rows `rows` [B'] only (the engine drops finished sequences)."""
        return DFlashState(take_rows(self.k, rows), take_rows(self.v, rows), self.lengths[np.asarray(rows)])


def default_target_layer_ids(num_target_layers: int, n_features: int) -> tuple[int, ...]:
    """The reference layer choice (z-lab build_target_layer_ids): one feature -> [N//2]; else evenly from layer
    1 to N-3."""
    if n_features == 1:
        return (num_target_layers // 2,)
    return tuple(int(round(1 + i * (num_target_layers - 4) / (n_features - 1))) for i in range(n_features))


def _attention_layout(hf: dict, extra: dict, n_layers: int) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
    """Per-layer sliding windows and block causality. Windows follow transformers' Qwen3Config (sliding_window
    counts only with use_sliding_window; without layer_types, layers from max_window_layers on slide).
    Causality: top-level is_causal, else dflash_config.causal, else sliding layers causal and full ones not."""
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    types = hf.get("layer_types")
    if types is None:
        first = hf.get("max_window_layers", 28)
        types = [SLIDING if window is not None and i >= first else FULL for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in (FULL, SLIDING) for t in types):
        raise DrafterError(f"DFlash layer_types {types}: expected {n_layers} entries of {FULL!r} / {SLIDING!r}")
    if SLIDING in types and not (isinstance(window, int) and window >= 1):
        raise DrafterError(f"DFlash layer_types has {SLIDING} layers but no window: sliding_window "
                           f"{hf.get('sliding_window')!r} with use_sliding_window {hf.get('use_sliding_window')!r}")
    windows = tuple(window if t == SLIDING else None for t in types)
    override = hf.get("is_causal", extra.get("causal"))
    causal = tuple(bool(override) if override is not None else t == SLIDING for t in types)
    return (windows if any(w is not None for w in windows) else ()), (causal if any(causal) else ())


def _dflash_field(hf: dict, extra: dict, name: str):
    """A DFlash field from dflash_config, falling back to the top level (both given: they must agree)."""
    inner, outer = extra.get(name), hf.get(name)
    if inner is not None and outer is not None and inner != outer:
        raise DrafterError(f"DFlash {name} is {inner!r} in dflash_config but {outer!r} at the top level")
    return inner if inner is not None else outer


def _mask_token_id(hf: dict, extra: dict, tokenizer) -> int:
    """dflash_config.mask_token_id (or top level); else the mask token string resolved by the target tokenizer."""
    mask_id, token = _dflash_field(hf, extra, "mask_token_id"), _dflash_field(hf, extra, "mask_token")
    if mask_id is not None:
        if not isinstance(mask_id, int) or isinstance(mask_id, bool):
            raise DrafterError(f"DFlash mask_token_id must be an integer, got {mask_id!r}")
        found = _token_id(tokenizer, token) if token is not None else None
        if found is not None and found != mask_id:
            raise DrafterError(f"DFlash mask_token {token!r} is id {found} in the target tokenizer, but "
                               f"mask_token_id says {mask_id}")
        return mask_id
    token = MASK_TOKEN if token is None else token
    found = _token_id(tokenizer, token)
    if found is None:
        raise DrafterError(f"DFlash config.json has no mask_token_id and the target tokenizer has no {token!r} "
                           "token")
    return found


def _token_id(tokenizer, token) -> int | None:
    """The id of a (special) token string in the tokenizer, None when absent."""
    if not isinstance(token, str) or not token:
        raise DrafterError(f"DFlash mask_token must be a non-empty string, got {token!r}")
    if tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_ids"):
        return None
    found = tokenizer.convert_tokens_to_ids(token)
    if found is None or (found == tokenizer.unk_token_id and token != getattr(tokenizer, "unk_token", None)):
        return None
    return int(found)


def config_from_json(hf: dict, tokenizer=None, target_layers: int | None = None) -> DFlashConfig:
    """DFlashConfig from a DFlash config.json of any published generation (legacy top-level fields, nested
    dflash_config, sliding layers); every key is read or knowingly ignored, any other is refused.

    tokenizer: the target's, resolving a mask token given as a string (or `<|MASK|>` when the config has no
    mask id); target_layers: the target's depth, used when the config does not name num_target_layers."""
    archs = hf.get("architectures") or []
    refused = [REFUSED_ARCHITECTURES[a] for a in archs if a in REFUSED_ARCHITECTURES]
    if refused:
        raise DrafterError(f"DFlash config.json names architectures {archs}: {refused[0]}")
    if not any(a in ARCHITECTURES for a in archs):
        raise DrafterError(f"DFlash config.json names architectures {archs}; expected {ARCHITECTURES[0]}")
    check_keys(hf, READ_KEYS | set(IGNORED_KEYS), "DFlash")
    extra = hf.get("dflash_config") or {}
    if not isinstance(extra, dict):
        raise DrafterError(f"DFlash dflash_config must be an object, got {extra!r}")
    check_keys(extra, DFLASH_READ_KEYS | set(DFLASH_NEUTRAL), "DFlash", "dflash_config")
    for key, neutral in DFLASH_NEUTRAL.items():
        if key in extra and extra[key] != neutral and not (neutral is None and not extra[key]):
            raise DrafterError(f"DFlash dflash_config.{key} = {json.dumps(extra[key])} is not supported (only "
                               f"{json.dumps(neutral)})")
    bias = hf.get("attention_bias", False)
    if not isinstance(bias, bool):
        raise DrafterError(f"DFlash attention_bias must be true or false, got {bias!r}")
    body = body_config(hf, "qwen3", "DFlash", attention_bias=True)
    num_target_layers = _dflash_field(hf, extra, "num_target_layers") or target_layers
    if not isinstance(num_target_layers, int) or num_target_layers < 1:
        raise DrafterError(f"DFlash config.json has no num_target_layers (got {num_target_layers!r})")
    layer_ids = _dflash_field(hf, extra, "target_layer_ids")
    layer_ids = (default_target_layer_ids(num_target_layers, body.num_layers) if layer_ids is None
                 else tuple(int(i) for i in layer_ids))
    block_size = _dflash_field(hf, extra, "block_size")
    if not isinstance(block_size, int) or block_size < 2:
        raise DrafterError(f"DFlash block_size must be an integer >= 2, got {block_size!r}")
    target_hidden = hf.get("target_hidden_size")
    if target_hidden is not None and (not isinstance(target_hidden, int) or target_hidden < 1):
        raise DrafterError(f"DFlash target_hidden_size must be a positive integer, got {target_hidden!r}")
    windows, causal = _attention_layout(hf, extra, body.num_layers)
    shift = extra.get("shift_label", False)
    if not isinstance(shift, bool):
        raise DrafterError(f"DFlash dflash_config.shift_label must be true or false, got {shift!r}")
    hints = extra.get("lookup_hints", 0)
    if not isinstance(hints, int) or isinstance(hints, bool) or hints < 0:
        raise DrafterError(f"DFlash dflash_config.lookup_hints must be an integer >= 0, got {hints!r}")
    hint_bias = extra.get("hint_bias", 0.0)
    if isinstance(hint_bias, bool) or not isinstance(hint_bias, int | float) or not 0 <= hint_bias < math.inf:
        raise DrafterError(f"DFlash dflash_config.hint_bias must be a finite number >= 0, got {hint_bias!r}")
    if hint_bias and not hints:
        raise DrafterError("DFlash dflash_config.hint_bias needs lookup_hints (there are no hints to prefer)")
    oov_hints = extra.get("oov_hints", False)
    if not isinstance(oov_hints, bool):
        raise DrafterError(f"DFlash dflash_config.oov_hints must be true or false, got {oov_hints!r}")
    if oov_hints and not hints:
        raise DrafterError("DFlash dflash_config.oov_hints needs lookup_hints (there are no hints to draft)")
    domino = _domino_of(hf, extra, archs)
    return DFlashConfig(body, block_size, _mask_token_id(hf, extra, tokenizer), layer_ids, num_target_layers,
                        windows, causal, bias, None if target_hidden == body.hidden_size else target_hidden,
                        shift, domino, hints, float(hint_bias), oov_hints)


def _domino_of(hf: dict, extra: dict, archs: list) -> Domino | None:
    """The Domino head a config names (projector_type "domino", the default of DominoDraftModel), else None."""
    kind = extra.get("projector_type", "domino" if DOMINO_ARCHITECTURE in archs else None)
    if kind in (None, "dflash"):
        if DOMINO_ARCHITECTURE in archs:
            raise DrafterError(f"DFlash config.json names {DOMINO_ARCHITECTURE} but projector_type {kind!r}")
        return None
    if kind != "domino":
        raise DrafterError(f"DFlash dflash_config.projector_type {kind!r} is not supported (only 'dflash' and "
                           "'domino')")
    values = {"pure_draft_prefix_len": extra.get("pure_draft_prefix_len", 0),
              "emb_dim": _dflash_field(hf, extra, "emb_dim"), "gru_hidden_dim": extra.get("gru_hidden_dim")}
    for name, value in values.items():
        least = 0 if name == "pure_draft_prefix_len" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise DrafterError(f"Domino dflash_config.{name} must be an integer >= {least}, got {value!r}")
    return Domino(values["pure_draft_prefix_len"], values["emb_dim"], values["gru_hidden_dim"])


def config_json(cfg: DFlashConfig) -> dict:
    """The z-lab config.json of a DFlashConfig (with the published `auto_map`, which loading ignores)."""
    types = [SLIDING if cfg.window(i) is not None else FULL for i in range(cfg.body.num_layers)]
    out = {"architectures": [ARCHITECTURES[0]], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "model_type": "qwen3", **body_json(cfg.body), "attention_bias": cfg.attention_bias,
           "tie_word_embeddings": False, "block_size": cfg.block_size, "num_target_layers": cfg.num_target_layers,
           "layer_types": types,
           "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}}
    windows = {w for w in cfg.windows if w is not None}
    if len(windows) > 1:
        raise DrafterError(f"DFlash config.json holds one sliding_window; this drafter has {sorted(windows)}")
    if windows:
        out |= {"sliding_window": windows.pop(), "use_sliding_window": True}
    causal = [cfg.is_causal(i) for i in range(cfg.body.num_layers)]
    if causal != [t == SLIDING for t in types]:  # not the default rule: one override for every layer
        if len(set(causal)) > 1:
            raise DrafterError(f"DFlash causal layers {causal} cannot be written as one is_causal")
        out["is_causal"] = causal[0]
    if cfg.target_hidden_size is not None:
        out["target_hidden_size"] = cfg.target_hidden_size
    if cfg.shift_label:
        out["dflash_config"]["shift_label"] = True
    if cfg.lookup_hints:
        out["dflash_config"]["lookup_hints"] = cfg.lookup_hints
    if cfg.hint_bias:
        out["dflash_config"]["hint_bias"] = cfg.hint_bias
    if cfg.oov_hints:
        out["dflash_config"]["oov_hints"] = True
    if cfg.domino is not None:
        out |= {"architectures": [DOMINO_ARCHITECTURE], "auto_map": {"AutoModel": "domino.DominoDraftModel"}}
        out["dflash_config"] |= {"projector_type": "domino", "pure_draft_prefix_len": cfg.domino.prefix_len,
                                 "emb_dim": cfg.domino.emb_dim, "gru_hidden_dim": cfg.domino.gru_hidden}
    return out


def check_fit(cfg: DFlashConfig, fc_in: int, target: ModelConfig, shared_embed: bool = True) -> None:
    """Raise DrafterError naming whatever in the drafter does not fit the target (shared_embed: the drafter
    uses the target's embedding or LM head, so their widths must match)."""
    if shared_embed:
        check_hidden(cfg.body.hidden_size, target, "DFlash")
    if cfg.target_hidden_size is not None and cfg.target_hidden_size != target.hidden_size:
        raise DrafterError(f"DFlash was built for target features of width {cfg.target_hidden_size}; this target's "
                           f"hidden size is {target.hidden_size}")
    if cfg.num_target_layers != target.num_layers:
        raise DrafterError(f"DFlash was built for a {cfg.num_target_layers}-layer target; this target has "
                           f"{target.num_layers} layers")
    check_layer_ids(cfg.target_layer_ids, target.num_layers, "DFlash")
    check_fc(fc_in, len(cfg.target_layer_ids), target, "DFlash")
    if cfg.body.vocab_size != target.vocab_size:
        raise DrafterError(f"DFlash was built for a vocab of {cfg.body.vocab_size}; the target has "
                           f"{target.vocab_size}")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise DrafterError(f"DFlash mask_token_id {cfg.mask_token_id} is outside the target vocab "
                           f"(0..{target.vocab_size - 1})")


# ---------------------------------------------------------------- forward (pure functions)

def fuse_context(params: dict, cfg: DFlashConfig, features: jax.Array) -> jax.Array:
    """Concatenated target features [..., T, F*Ht] -> context C = hidden_norm(fc(features)) [..., T, H]."""
    return rms_norm(linear(features, params["fc"]), params["hidden_norm"], cfg.body.rms_eps)


def project_kv(cfg: DFlashConfig, lp: dict, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One layer's K/V of rows x [B, T, H] at positions [B, T] -> k (k_norm, RoPE), v, each [B, Nkv, T, D]."""
    b, t, _ = x.shape
    body = cfg.body
    k = linear_bias(x, lp, "wk", "bk").reshape(b, t, body.num_kv_heads, body.head_dim)
    v = linear_bias(x, lp, "wv", "bv").reshape(b, t, body.num_kv_heads, body.head_dim)
    k = rope(rms_norm(k, lp["k_norm"], body.rms_eps), positions, jnp.asarray(body.inv_freq()), body.attention_factor())
    return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def context_kv(params: dict, cfg: DFlashConfig, c: jax.Array, positions: jax.Array) -> tuple[list, list]:
    """Every layer's context K/V: C [B, T, H] at absolute positions [B, T] -> per-layer k, v [B, Nkv, T, D]."""
    kv = [project_kv(cfg, lp, c, positions) for lp in params["layers"]]
    return [k for k, _ in kv], [v for _, v in kv]


def block_layer(cfg: DFlashConfig, lp: dict, x: jax.Array, positions: jax.Array, ctx_k: jax.Array,
                ctx_v: jax.Array, mask: jax.Array, n_out: int | None = None) -> jax.Array:
    """One drafter layer on block rows x [B, Tq, H] at positions [B, Tq].

    Queries attend to [context K/V ctx_k/ctx_v [B, Nkv, S, D] ; the block's own K/V] under
    mask [B, Tq, S + Tq] (True = visible). Returns the new hidden [B, n_out, H] of the first n_out
    rows (all by default; every row's K/V is attended to either way).
    """
    body = cfg.body
    h = rms_norm(x, lp["attn_norm"], body.rms_eps)
    k_blk, v_blk = project_kv(cfg, lp, h, positions)
    x, h, positions, mask = x[:, :n_out], h[:, :n_out], positions[:, :n_out], mask[:, :n_out]
    b, t, _ = x.shape
    q = linear_bias(h, lp, "wq", "bq").reshape(b, t, body.num_heads, body.head_dim)
    q = rope(rms_norm(q, lp["q_norm"], body.rms_eps), positions, jnp.asarray(body.inv_freq()), body.attention_factor())
    x = x + linear_bias(attention(q, (ctx_k, k_blk), (ctx_v, v_blk), mask), lp, "wo", "bo")
    h = rms_norm(x, lp["mlp_norm"], body.rms_eps)
    return x + linear(jax.nn.silu(linear(h, lp["w_gate"])) * linear(h, lp["w_up"]), lp["w_down"])


def layer_mask(cfg: DFlashConfig, layer: int, positions: jax.Array, ctx_positions: jax.Array, ctx_visible: jax.Array,
               blk_visible: jax.Array) -> jax.Array:
    """One layer's attention mask [B, Tq, S + Tq] for block rows at positions [B, Tq]: the context rows at
    ctx_positions [B, S] allowed by ctx_visible [B, Tq, S], then the block rows allowed by blk_visible
    [B, Tq, Tq], narrowed by the layer's sliding window (by position) and block causality."""
    window, causal = cfg.window(layer), cfg.is_causal(layer)
    ctx, blk = ctx_visible, blk_visible
    back = positions[:, :, None] - positions[:, None, :]  # query - key position, block keys
    if window is not None:
        ctx = ctx & (positions[:, :, None] - ctx_positions[:, None, :] < window)
        blk = blk & (back < window) & (-back < window)
    if causal:
        blk = blk & (back >= 0)
    return jnp.concatenate([ctx, blk], axis=-1)


def run_block(params: dict, cfg: DFlashConfig, x: jax.Array, positions: jax.Array, ctx_k: list, ctx_v: list,
              ctx_positions: jax.Array, ctx_visible: jax.Array, blk_visible: jax.Array,
              n_out: int | None = None) -> jax.Array:
    """All drafter layers + final norm. x [B, Tq, H] at positions [B, Tq]; ctx_k/ctx_v per layer [B, Nkv, S, D]
    at ctx_positions [B, S]; visibility before windows and causality: ctx_visible [B, Tq, S], blk_visible
    [B, Tq, Tq] (see layer_mask) -> normed [B, n_out, H] (the last layer computes only the first n_out rows'
    outputs; all rows by default)."""
    last = len(params["layers"]) - 1
    masks = {}  # one mask per distinct (window, causal) layout
    for i, (lp, k, v) in enumerate(zip(params["layers"], ctx_k, ctx_v, strict=True)):
        layout = (cfg.window(i), cfg.is_causal(i))
        if layout not in masks:
            masks[layout] = layer_mask(cfg, i, positions, ctx_positions, ctx_visible, blk_visible)
        x = block_layer(cfg, lp, x, positions, k, v, masks[layout], n_out if i == last else None)
    return rms_norm(x, params["norm"], cfg.body.rms_eps)


def block_tokens(cfg: DFlashConfig, anchors: jax.Array, starts: jax.Array,
                 hints: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """The drafted blocks of a batch: ids [anchor, MASK x (size-1)] (or [anchor, hints [B, size-1]]) and positions
    p..p+size-1, each [B, size]."""
    ids = jnp.full((anchors.shape[0], cfg.block_size), cfg.mask_token_id, jnp.int32).at[:, 0].set(anchors)
    if hints is not None:
        ids = ids.at[:, 1:].set(hints)
    return ids, starts[:, None] + jnp.arange(cfg.block_size, dtype=jnp.int32)


def lookup_hints(cfg: DFlashConfig, contexts: list[np.ndarray]) -> np.ndarray:
    """Block rows 1..size-1 of each context (committed tokens ending with the anchor) under cfg.lookup_hints: the
    n-gram drafter's proposal, MASK past it -> [len(contexts), size-1] int32 (host side, as the engine drafts)."""
    lookup = NgramDrafter(cfg.block_size - 1, max_ngram=cfg.lookup_hints).lookup
    out = np.full((len(contexts), cfg.block_size - 1), cfg.mask_token_id, np.int32)
    for row, ctx in enumerate(contexts):
        ids, n = lookup(np.asarray(ctx, np.int32))
        out[row, :n] = ids[:n]
    return out


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("ctx_k", "ctx_v"))
def extend_cache(params: dict, ctx_k: list, ctx_v: list, features: jax.Array, lengths: jax.Array, *,
                 cfg: DFlashConfig) -> tuple[list, list]:
    """Write the context K/V of feature rows [F, B, T, Ht] at positions lengths[b]..lengths[b]+T-1 of each cache row."""
    c = fuse_context(params, cfg, concat_features(features))
    positions = lengths[:, None] + jnp.arange(c.shape[1], dtype=jnp.int32)[None]
    k, v = context_kv(params, cfg, c, positions)
    return ([write(a, b, lengths) for a, b in zip(ctx_k, k, strict=True)],
            [write(a, b, lengths) for a, b in zip(ctx_v, v, strict=True)])


@partial(jax.jit, static_argnames=("cfg", "k"))
def draft(params: dict, head: dict, ctx_k: list, ctx_v: list, anchors: jax.Array, starts: jax.Array,
          draft_ids: jax.Array | None = None, hints: jax.Array | None = None, *, cfg: DFlashConfig,
          k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One drafter forward over the blocks of a whole batch ([B, block] rows, whatever k is); hints [B, block-1]:
    the rows' starting tokens under cfg.lookup_hints (lookup_hints).

    Sequence b's block starts at starts[b] = its context length (its first starts[b] cache rows). With a
    restricted draft vocabulary, head["lm_head"] holds only its columns and draft_ids [Vd] their target ids.
    Returns ids [B, k] int32 (argmax of drafts 1..k: see draft_rows; with a Domino head its rollout), q [B, k] (their
    drafter probability), logits [B, k, V or Vd] (Vd + 1 with hint_column's column).
    """
    ids, positions = block_tokens(cfg, anchors, starts, hints)
    b, s, size = len(starts), ctx_k[0].shape[2], cfg.block_size
    ctx_positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    ctx_visible = jnp.broadcast_to((ctx_positions < starts[:, None])[:, None], (b, size, s))
    blk_visible = jnp.ones((b, size, size), bool)
    h = run_block(params, cfg, embed(head, ids), positions, ctx_k, ctx_v, ctx_positions, ctx_visible, blk_visible,
                  n_out=k + 1)
    rows = draft_rows(cfg, h, k)
    logits = head_logits(head, rows)
    hints = None if hints is None else hints[:, :k]
    if cfg.domino is None:
        logits = hint_column(cfg, head, rows, logits, hints)
    else:
        def draft_step(j: int, logits_j: jax.Array) -> tuple[jax.Array, jax.Array]:
            hint_j = None if hints is None else hints[:, j]
            logits_j = hint_column(cfg, head, rows[:, j], logits_j, hint_j)
            return logits_j, embed(head, pick_drafts(cfg, logits_j, hint_j, draft_ids)[0])

        logits = domino_head.rollout(params["domino"], cfg.domino, logits, rows, embed(head, anchors), draft_step)
    best, q = pick_drafts(cfg, logits, hints, draft_ids)
    return best, q, logits


def pick_drafts(cfg: DFlashConfig, logits: jax.Array, hints: jax.Array | None = None,
                draft_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Drafts [..., k] (target ids) and their drafter probability from logits [..., k, V or Vd], or [..., k, Vd + 1]
    with hint_column's column: the argmax, or, under cfg.hint_bias, the lookup hint [..., k] (target ids, MASK where
    none) when its logit is within hint_bias of the argmax's. Drafts are deterministic proposals, so any pick stays
    lossless."""
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    vd = logits.shape[-1] if draft_ids is None else len(draft_ids)
    if hints is not None and cfg.hint_bias:
        slot = hints if draft_ids is None else jnp.full(cfg.body.vocab_size, -1, jnp.int32).at[draft_ids].set(
            jnp.arange(vd, dtype=jnp.int32))[hints]
        hinted = hints != cfg.mask_token_id
        if logits.shape[-1] > vd:  # the hint column scores a hint outside the vocabulary
            slot = jnp.where(hinted & (slot < 0), vd, slot)
        slot_ok = jnp.maximum(slot, 0)
        top = jnp.take_along_axis(logits, best[..., None], axis=-1)[..., 0]
        near = jnp.take_along_axis(logits, slot_ok[..., None], axis=-1)[..., 0] + cfg.hint_bias >= top
        best = jnp.where(hinted & (slot >= 0) & near, slot_ok, best)
    picked = jnp.take_along_axis(logits, best[..., None], axis=-1)
    q = 1.0 / jnp.sum(jnp.exp(logits - picked), axis=-1)
    if draft_ids is None:
        return best, q
    return jnp.where(best == vd, hints if hints is not None else 0, draft_ids[jnp.minimum(best, vd - 1)]), q


def hint_column(cfg: DFlashConfig, head: dict, rows: jax.Array, logits: jax.Array,
                hints: jax.Array | None) -> jax.Array:
    """Under cfg.oov_hints, logits [..., k, Vd] of a restricted head (restricted_head) with one more column: each
    row's lookup hint (hints [..., k]) scored by the target's whole LM head from its hidden rows [..., k, H] when the
    draft vocabulary lacks it, NO_LOGIT when it has it or there is none. Drafting and training then run over the
    vocabulary plus the hint. Unchanged otherwise."""
    if not cfg.oov_hints or hints is None or "slots" not in head:
        return logits
    if "full_lm_head" in head:  # untied: columns of the whole LM head [H, V]
        w = jnp.moveaxis(head["full_lm_head"][:, hints], 0, -1)  # [..., k, H]
    else:  # tied: the whole head is the embedding [V, H]
        w = head["embed"][hints]
    score = jnp.einsum("...h,...h->...", rows.astype(w.dtype), w, preferred_element_type=jnp.float32)
    outside = (head["slots"][hints] < 0) & (hints != cfg.mask_token_id)
    return jnp.concatenate([logits, jnp.where(outside, score, NO_LOGIT)[..., None].astype(logits.dtype)], axis=-1)


def draft_rows(cfg: DFlashConfig, h: jax.Array, k: int) -> jax.Array:
    """The block rows [..., k, H] that predict drafts 1..k: rows 1..k, or 0..k-1 with shift_label."""
    first = 0 if cfg.shift_label else 1
    return h[..., first:first + k, :]


def restricted_head(head: dict, draft_ids: np.ndarray) -> dict:
    """The shared target head with its LM-head columns cut to draft_ids (the embedding stays whole). For hint_column
    the whole head stays too (full_lm_head [H, V] when untied; tied, it is the embedding), with slots [V]: each
    target id's column, -1 outside the cut."""
    ids = np.asarray(draft_ids)
    w = head["lm_head"] if "lm_head" in head else head["embed"].T
    slots = np.full(head["embed"].shape[0], -1, np.int32)
    slots[ids] = np.arange(len(ids), dtype=np.int32)
    whole = {"full_lm_head": head["lm_head"]} if "lm_head" in head else {}
    return {"embed": head["embed"], "lm_head": jnp.asarray(w)[:, jnp.asarray(ids)], "slots": jnp.asarray(slots),
            **whole}


def drafter_head(target_head: dict, params: dict, draft_ids: jax.Array | None) -> dict:
    """The embedding and LM head the drafter drafts with: its own params["embed"] [V, H] / params["lm_head"]
    [H, Vd] when the checkpoint has them, else the target's (its LM head cut to draft_ids)."""
    head = dict(target_head)
    if "embed" in params:  # the drafter's embedding; a tied target's head stays its embedding
        head = {"embed": params["embed"], "lm_head": head.get("lm_head", jnp.asarray(head["embed"]).T)}
    if "lm_head" in params:
        return {**head, "lm_head": params["lm_head"]}
    return head if draft_ids is None else restricted_head(head, draft_ids)


def check_d2t(d2t: np.ndarray, vocab_size: int) -> np.ndarray:
    """Target ids [Vd] of a d2t map (target id = draft id + d2t[draft id]); DrafterError when out of range."""
    if d2t.ndim != 1 or not 1 <= len(d2t) <= vocab_size:
        raise DrafterError(f"DFlash d2t must be a vector of at most {vocab_size} entries, got {list(d2t.shape)}")
    ids = np.arange(len(d2t)) + d2t.astype(np.int64)
    if ids.min() < 0 or ids.max() >= vocab_size or len(np.unique(ids)) != len(ids):
        raise DrafterError(f"DFlash d2t maps draft ids outside the target vocab 0..{vocab_size - 1} or twice")
    return ids.astype(np.int32)


# ---------------------------------------------------------------- training

def dflash_train_logits(params: dict, cfg: DFlashConfig, head: dict, features: jax.Array, tokens: jax.Array,
                        anchors: jax.Array, with_base: bool = False,
                        hints: jax.Array | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Packed-block training forward (dflash.md section 5): logits [B, A, block-1, V] (with_base: and the logits
    before a Domino head's correction, teacher forced on the true block tokens; hints [B, A, block-1]: each block's
    starting rows under cfg.lookup_hints, see lookup_hints).

    features [B, T, F*Ht] (target features of every token, concatenated in target_layer_ids order),
    tokens [B, T], anchors [B, A] (positions < T). Anchor a's block [tokens[a], MASK...] at positions
    a..a+B-1 sees the context rows < a and its own block (under the layer's window and causality), no other
    block. Row i of block a predicts tokens[a+i] (see dflash_labels). head = shared_head(target params), frozen.
    """
    b, t = tokens.shape
    size = cfg.block_size
    c = fuse_context(params, cfg, features)
    ctx_positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    ctx_k, ctx_v = context_kv(params, cfg, c, ctx_positions)
    anchor_ids = jnp.take_along_axis(tokens, anchors, axis=1)
    rest = jnp.full((b, anchors.shape[1], size - 1), cfg.mask_token_id) if hints is None else hints
    ids = jnp.concatenate([anchor_ids[..., None], rest.astype(anchor_ids.dtype)], axis=-1)  # [B, A, size]
    own_block = jnp.ones((b, size, size), bool)

    def one_block(block_ids: jax.Array, anchor: jax.Array) -> jax.Array:  # [B, size], [B] -> [B, size, H]
        ctx_visible = jnp.broadcast_to(jnp.arange(t)[None, None, :] < anchor[:, None, None], (b, size, t))
        return run_block(params, cfg, embed(head, block_ids), anchor[:, None] + jnp.arange(size), ctx_k, ctx_v,
                         ctx_positions, ctx_visible, own_block)

    # blocks mapped over anchors against the one context K/V: memory and work linear in the number of anchors
    h = jax.vmap(one_block, in_axes=(1, 1), out_axes=1)(ids, anchors)  # [B, A, size, H]
    rows = draft_rows(cfg, h, size - 1)
    base = hint_column(cfg, head, rows, head_logits(head, rows), hints)
    logits = base
    if cfg.domino is not None:  # the true block tokens 0..size-2 (anchor first) feed the GRU
        block = jnp.minimum(anchors[..., None] + jnp.arange(size - 1), t - 1).reshape(b, -1)
        block_embeds = embed(head, jnp.take_along_axis(tokens, block, axis=1)).reshape(*rows.shape[:-1], -1)
        logits = domino_head.teacher_logits(params["domino"], cfg.domino, base, rows, block_embeds)
    return (logits, base) if with_base else logits


def dflash_labels(tokens: jax.Array, anchors: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    """Targets of dflash_train_logits: labels [B, A, block-1] = tokens[a+1..a+B-1], valid where a+i < T."""
    t = tokens.shape[1]
    idx = anchors[..., None] + jnp.arange(1, block_size)
    labels = jnp.take_along_axis(tokens, jnp.minimum(idx, t - 1).reshape(tokens.shape[0], -1), axis=1)
    return labels.reshape(idx.shape), idx < t


# ---------------------------------------------------------------- the drafter

class DFlashDrafter:
    """The engine-facing drafter: start / extend / propose over a DFlashState.

    extend() donates the cache buffers of the state it is given: keep only the state it returns.
    """

    name = "dflash"

    def __init__(self, target: Target, cfg: DFlashConfig, params: dict, k: int | None = None,
                 checkpoint: str | None = None, d2t: np.ndarray | None = None):
        own_head = "embed" in params and "lm_head" in params
        check_fit(cfg, params["fc"].shape[0], target.cfg, shared_embed=not own_head)
        self.cfg, self.params = cfg, on_mesh(params, target.mesh, cfg.body)
        # an optional restricted draft vocabulary (checkpoint tensor d2t, as EAGLE-3's): a smaller LM head
        self.draft_ids = None if d2t is None else jnp.asarray(check_d2t(np.asarray(d2t), target.cfg.vocab_size))
        self.head = drafter_head(shared_head(target.params), self.params, self.draft_ids)
        if cfg.oov_hints and d2t is not None and "slots" not in self.head:
            raise DrafterError("DFlash dflash_config.oov_hints scores hints with the target's LM head; this drafter "
                               "drafts with its own restricted lm_head")
        self.mesh = target.mesh
        self.block_size, self.max_k = cfg.block_size, cfg.block_size - 1
        self.k = check_k(self.max_k if k is None else k, self.max_k, self.name)
        self.feature_layers = cfg.target_layer_ids
        self.checkpoint = checkpoint

    def with_k(self, k: int) -> DFlashDrafter:
        """The same drafter (shared params) drafting k tokens per step."""
        other = copy.copy(self)
        other.k = check_k(k, self.max_k, self.name)
        return other

    def start(self, prompts: list[np.ndarray], max_len: int) -> DFlashState:
        body, dtype, batch = self.cfg.body, self.params["fc"].dtype, len(prompts)
        zeros = lambda: [cache_zeros(body, batch, max_len, dtype, self.mesh)  # noqa: E731
                         for _ in range(body.num_layers)]
        return DFlashState(zeros(), zeros(), np.zeros(batch, np.int32))

    def extend(self, state: DFlashState, features: jax.Array, n_new: np.ndarray) -> DFlashState:
        n_new = np.asarray(n_new, np.int32)
        check_extend(state.lengths, n_new, features.shape[2], state.k[0].shape[2])
        k, v = extend_cache(self.params, state.k, state.v, features, state.lengths, cfg=self.cfg)
        return DFlashState(k, v, state.lengths + n_new)

    def propose(self, state: DFlashState, tokens: list[list[int]]) -> tuple[Proposal, DFlashState]:
        anchors, starts = anchors_of(tokens, state.lengths)
        hints = lookup_hints(self.cfg, tokens) if self.cfg.lookup_hints else None
        ids, q, _ = draft(self.params, self.head, state.k, state.v, anchors, starts, self.draft_ids, hints,
                          cfg=self.cfg, k=self.k)
        ids, q = fetch((ids, q))
        return Proposal(ids, np.full(len(tokens), self.k, np.int32), q), state


# ---------------------------------------------------------------- checkpoints

def _tensor_names(cfg: DFlashConfig) -> list[str]:
    return [f"layers.{i}." for i in range(cfg.body.num_layers)]


def load_params(path: Path, cfg: DFlashConfig, dtype: str, tied: bool = False) -> tuple[dict, np.ndarray | None]:
    """(params, d2t or None) from path/model.safetensors (z-lab names, optional `model.` prefix), shapes checked.

    Optional tensors: q/k/v/o biases (cfg.attention_bias), the drafter's own embed_tokens / lm_head (tied: the
    LM head is the embedding), d2t with its inverse t2d (a restricted draft vocabulary), the Domino head's
    (cfg.domino, params["domino"]). Others are refused."""
    tensors = read_tensors(path)
    h, v = cfg.body.hidden_size, cfg.body.vocab_size
    fc = tensors.get("fc.weight")
    if fc is None or fc.ndim != 2 or fc.shape[0] != h:
        raise DrafterError(f"DFlash fc.weight in {path} must be [{h}, F*H_target], got "
                           f"{None if fc is None else list(fc.shape)}")
    shapes = layer_shapes(cfg.body, h, bias=cfg.attention_bias)
    params = {"fc": matrix(fc, dtype), "hidden_norm": vector(expect_tensor(tensors, "hidden_norm.weight", (h,), path)),
              "norm": vector(expect_tensor(tensors, "norm.weight", (h,), path)),
              "layers": load_layers(tensors, _tensor_names(cfg), shapes, dtype, path)}
    d2t = np.asarray(tensors["d2t"], np.int64) if "d2t" in tensors else None
    vd = v if d2t is None else len(d2t)
    if "t2d" in tensors:  # the inverse map of d2t, implied by it
        expect_tensor(tensors, "t2d", (v,), path)
    if "embed_tokens.weight" in tensors:
        params["embed"] = jnp.asarray(np.asarray(expect_tensor(tensors, "embed_tokens.weight", (v, h), path),
                                                 np.float32), dtype=DTYPES[dtype])
    if "lm_head.weight" in tensors:
        if tied:
            raise DrafterError(f"DFlash checkpoint in {path} has lm_head.weight but tie_word_embeddings is true")
        params["lm_head"] = matrix(expect_tensor(tensors, "lm_head.weight", (vd, h), path), dtype)
    elif tied and "embed" in params:
        params["lm_head"] = params["embed"].T
    read = {"fc.weight", "hidden_norm.weight", "norm.weight", "d2t", "t2d", "embed_tokens.weight", "lm_head.weight"}
    read |= {f"{p}{TENSOR_KEYS[n][0]}" for p in _tensor_names(cfg) for n in shapes}
    if cfg.domino is not None:
        params["domino"], names = domino_head.load(tensors, cfg.domino, h, vd, dtype, path)
        read |= names
    unread = sorted(set(tensors) - read)
    if unread:
        raise DrafterError(f"DFlash checkpoint in {path} has tensors this loader does not read: {', '.join(unread)}")
    return params, d2t


def save_dflash(path: str | Path, cfg: DFlashConfig, params: dict, dtype: str = "float32",
                d2t: np.ndarray | None = None) -> Path:
    """Write a z-lab DFlash checkpoint (config.json + model.safetensors, float32 or bfloat16); with d2t [Vd]
    (int64, target id = draft id + d2t[draft id]) the drafter drafts over that restricted vocabulary."""
    tensors = {"fc.weight": np.asarray(params["fc"], np.float32).T,
               "hidden_norm.weight": np.asarray(params["hidden_norm"], np.float32),
               "norm.weight": np.asarray(params["norm"], np.float32),
               **layer_tensors(params["layers"], _tensor_names(cfg))}
    if "embed" in params:
        tensors["embed_tokens.weight"] = np.asarray(params["embed"], np.float32)
    if "lm_head" in params:
        tensors["lm_head.weight"] = np.asarray(params["lm_head"], np.float32).T
    if cfg.domino is not None:
        tensors |= domino_head.tensors_of(params["domino"])
    config = config_json(cfg)
    if d2t is not None:
        tensors["d2t"] = np.asarray(d2t, np.int64)
        config["draft_vocab_size"] = len(d2t)
    return save_checkpoint(path, config, tensors, dtype)


def default_mask_token_id(target: Target) -> int:
    """First embedding row the tokenizer does not use (as Qwen3 drafters do), else `<empty_output>`."""
    n_tokens = len(target.tokenizer)
    if target.cfg.vocab_size > n_tokens:
        return n_tokens
    found = target.tokenizer.convert_tokens_to_ids(FALLBACK_MASK_TOKEN)
    if found is None or found == target.tokenizer.unk_token_id:
        raise DrafterError(f"target has no spare embedding row and no {FALLBACK_MASK_TOKEN} token: "
                           "pass mask_token_id")
    return int(found)


def init_dflash(target: Target, num_layers: int, block_size: int, target_layer_ids: tuple[int, ...] | None = None,
                mask_token_id: int | None = None, seed: int = 0, intermediate_size: int | None = None,
                windows: tuple[int | None, ...] = (), causal: tuple[bool, ...] = (),
                attention_bias: bool = False) -> tuple[DFlashConfig, dict]:
    """A randomly initialised DFlash drafter for `target` (matrices N(0, 0.02), norms ones, biases zeros).

    The body copies the target's width, heads and RoPE; target_layer_ids default to the reference
    formula with one feature per drafter layer; mask_token_id to default_mask_token_id(target). windows,
    causal and attention_bias give the layers of newer drafters (see DFlashConfig).
    """
    if block_size < 2:
        raise DrafterError(f"DFlash block_size must be >= 2, got {block_size}")
    t = target.cfg
    ids = tuple(target_layer_ids) if target_layer_ids is not None else default_target_layer_ids(t.num_layers,
                                                                                               num_layers)
    mask_id = default_mask_token_id(target) if mask_token_id is None else int(mask_token_id)
    body = decoder_shape(t, "qwen3", num_layers=num_layers, intermediate_size=intermediate_size or t.intermediate_size)
    for name, per_layer in (("windows", windows), ("causal", causal)):
        if per_layer and len(per_layer) != num_layers:
            raise DrafterError(f"DFlash {name} needs one entry per drafter layer ({num_layers}), got {per_layer}")
    cfg = DFlashConfig(body, block_size, mask_id, ids, t.num_layers,
                       tuple(windows) if any(w is not None for w in windows) else (),
                       tuple(bool(c) for c in causal) if any(causal) else (), attention_bias)
    rng = np.random.default_rng(seed)
    params = {"fc": random_matrix(rng, (len(ids) * t.hidden_size, t.hidden_size), target.dtype),
              "hidden_norm": jnp.ones(t.hidden_size, jnp.float32), "norm": jnp.ones(t.hidden_size, jnp.float32),
              "layers": random_layers(rng, layer_shapes(body, t.hidden_size, attention_bias), num_layers, target.dtype)}
    check_fit(cfg, params["fc"].shape[0], t)
    return cfg, params


def append_layers(cfg: DFlashConfig, params: dict, n: int, seed: int = 0) -> tuple[DFlashConfig, dict]:
    """A deeper drafter that drafts exactly what `params` drafts: n more layers after the last one, random but with
    zero output projections (wo, w_down), so each starts as the identity on the residual stream and training grows
    it from there. New layers copy the last layer's window and causality."""
    if n < 1:
        raise DrafterError(f"append_layers needs n >= 1, got {n}")
    width = params["layers"][0]["wq"].shape[0]
    new = random_layers(np.random.default_rng([seed, 11]), layer_shapes(cfg.body, width, cfg.attention_bias), n,
                        "float32")
    new = [{**lp, "wo": jnp.zeros_like(lp["wo"]), "w_down": jnp.zeros_like(lp["w_down"])} for lp in new]
    depth = cfg.body.num_layers + n
    cfg = replace(cfg, body=replace(cfg.body, num_layers=depth),
                  windows=cfg.windows + (cfg.windows[-1],) * n if cfg.windows else (),
                  causal=cfg.causal + (cfg.causal[-1],) * n if cfg.causal else ())
    return cfg, {**params, "layers": list(params["layers"]) + new}


def load(target: Target, path: str | Path | None = None, k: int | None = None, **options) -> DFlashDrafter:
    """A DFlash drafter from a checkpoint directory of any published config generation (None: the shipped
    SmolLM2-135M drafter); a mask token given as a string is resolved by the target's tokenizer."""
    path = checkpoint_dir(path, DEFAULT_CHECKPOINT, "DFlash", options)
    hf = read_config(path)
    cfg = config_from_json(hf, getattr(target, "tokenizer", None), target.cfg.num_layers)
    # without target_hidden_size the drafter is as wide as the target: check that before reading tensors
    check_fit(cfg, len(cfg.target_layer_ids) * target.cfg.hidden_size, target.cfg,
              shared_embed=cfg.target_hidden_size is None)
    tied = hf.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise DrafterError(f"DFlash tie_word_embeddings must be true or false, got {tied!r}")
    params, d2t = load_params(path, cfg, target.dtype, tied)
    vd = hf.get("draft_vocab_size")
    if vd is not None and vd != (cfg.body.vocab_size if d2t is None else len(d2t)):
        raise DrafterError(f"DFlash draft_vocab_size is {vd} but the checkpoint in {path} has "
                           f"{'no d2t map' if d2t is None else f'a d2t map of {len(d2t)} entries'}")
    return DFlashDrafter(target, cfg, params, k=k, checkpoint=str(path), d2t=d2t)
