"""DFlash drafter configs: the z-lab / SpecForge config.json read into a static DFlashConfig (what is read,
what is refused and why), written back, and checked against a target."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import ModelConfig
from .base import DrafterError
from .domino import Domino
from .layers import (
    body_config,
    body_json,
    check_fc,
    check_hidden,
    check_keys,
    check_layer_ids,
)

FULL, SLIDING = "full_attention", "sliding_attention"
DOMINO_ARCHITECTURE = "DominoDraftModel"  # SpecForge's name for a DFlash body with the Domino head


DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "smollm2-135m-dflash"


ARCHITECTURES = ("DFlashDraftModel", "DFlashForCausalLM", DOMINO_ARCHITECTURE)


REFUSED_ARCHITECTURES = {"DFlash2DraftModel": "DFlash2 (grouped dynamic convolutions and a candidate selector) "
                                              "is not implemented"}


# Default mask token when the target's embedding has no spare row: SmolLM2's `<empty_output>` (id 16),
# a StarCoder-era Jupyter marker that chat never produces.
FALLBACK_MASK_TOKEN = "<empty_output>"


MASK_TOKEN = "<|MASK|>"  # the tokenizer token of configs that predate dflash_config.mask_token_id


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
