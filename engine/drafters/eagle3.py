"""`eagle3`: EAGLE-3 drafting (one Llama decoder layer over [embedding ; target features]; dflash.md section 8).

Feature layers: EAGLE-3 reads the INPUTS of target layers (2, N//2, N-3); published configs list
such input-of-layer ids in `eagle_config.eagle_aux_hidden_state_layer_ids`. The engine captures layer
OUTPUTS (id L = output of layer L, -1 = embeddings), so feature_layers = published ids - 1, i.e.
(1, N//2-1, N-4) by default. save_eagle3 writes published (input-of-layer) ids back.

Alignment (the EAGLE convention). Drafter row t sits at position t and reads (token t+1, g_t),
g_t = fc(concat of the target features of position t); it predicts token t+2. In the engine the
anchor x_p (last committed token, position p) has no feature yet; the features of 0..p-1 came through
extend(). propose(tokens) runs, inside one jitted function (K = k passes):
    pass 0: rows p-W..p-1 (W = K+1) = (tokens[r+1], g_r) at positions r; their K/V go into the cache
            and row p-1 = (x_p, g_{p-1}) attends to cache rows <= p-1               -> d_1
    pass j: row p-1+j = (d_j, h_{j-1}) at position p-1+j, attending rows <= p-1+j    -> d_{j+1}
h_{j-1} being the previous pass's pre-norm output ("residual"). The drafter keeps its own causal
K/V cache [B, Nkv, S, D] for a batch, each sequence at its own (ragged) positions; each pass runs the
whole batch. extend() writes the K/V of rows whose next token it already knows (the
prompt's, during prefill) and keeps the fc features of the last W rows; after a verify step the
new rows p..p+a (a accepted) have next tokens known only at the next propose (accepted drafts, then
the bonus), so pass 0 (re)computes the last W rows from the committed `tokens` (rewriting rows
already written gives the same K/V). Drafted rows p.. are rewritten before any read, so rejected
drafts never leak. Training uses the same alignment (eagle3_train_logits / eagle3_labels).

Checkpoint formats (config_from_json / load_params): EAGLE / SpecForge (`LlamaForCausalLMEagle3`, layer keys at the
top level, aux ids in eagle_config or at the top, tensors midlayer.*) and speculators (`speculators_model_type:
"eagle3"`, layer keys in transformer_layer_config, speculators_config's greedy proposal gives the default K and its
verifier the target architecture, tensors layers.0.*). Unknown keys and tensors are refused.

Params (matrices [in, out], norms float32; d2t is kept apart because it is integer data):
    fc [F*Ht, H]; norm [H]; lm_head [H, Vd]; optional embed [V, H] (else the target's);
    layer: attn_norm (input_layernorm), hidden_norm [H], wq [2H, Nh*D], wk/wv [2H, Nkv*D], wo, mlp_norm,
           w_gate, w_up, w_down
    d2t [Vd] int32: target id = draft id + d2t[draft id]
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..cache import take_rows, write
from ..config import ModelConfig
from ..model import attention, linear, rms_norm, rope
from ..sharding import fetch
from ..target import Target
from .base import DrafterError, Proposal, check_k
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
    greedy_pick,
    layer_shapes,
    layer_tensors,
    load_layers,
    matrix,
    on_mesh,
    random_layers,
    random_matrix,
    read_config,
    read_tensors,
    save_checkpoint,
    vector,
)

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "smollm2-135m-eagle3"
ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3DraftModel", "Eagle3Speculator")
DEFAULT_K = 4  # the CPU verify cost is flat only to K ~ 4 (platform-notes.md)
MAX_K = 64

# the decoder-layer keys of a Llama config.json: read, or knowingly ignored (with the reason)
LAYER_READ_KEYS = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
    "vocab_size", "hidden_act", "attention_bias", "mlp_bias", "tie_word_embeddings"})
IGNORED_KEYS = {
    "model_type": "the midlayer is always a Llama layer (a transformer_layer_config's is checked)",
    "transformers_version": "writer version", "torch_dtype": "storage dtype (the safetensors say it)",
    "dtype": "storage dtype (the safetensors say it)", "bos_token_id": "the target's tokenizer decides",
    "eos_token_id": "the target's tokenizer decides", "pad_token_id": "the target's tokenizer decides",
    "use_cache": "runtime flag", "initializer_range": "training init", "attention_dropout": "training only",
    "pretraining_tp": "tensor-parallel slicing of the same matmuls",
}
# the EAGLE / SpecForge format: the layer keys at the top level
EAGLE_READ_KEYS = LAYER_READ_KEYS | {"architectures", "draft_vocab_size", "norm_before_residual", "eagle_config",
                                     "eagle_aux_hidden_state_layer_ids", "target_hidden_size"}
# the speculators format (speculators_model_type "eagle3"): the layer keys in transformer_layer_config
SPECULATORS_READ_KEYS = frozenset({
    "architectures", "speculators_model_type", "transformer_layer_config", "draft_vocab_size",
    "norm_before_residual", "norm_before_fc", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
    "speculators_config"})
SPECULATORS_IGNORED_KEYS = {
    "auto_map": "remote-code class names (never executed)", "speculators_version": "writer version",
    "has_no_defaults_at_init": "pydantic bookkeeping", "embed_requires_grad": "training only",
    "enable_sp_ulysses": "training only", "base_model_ep_plan": "expert-parallel plan of the training run",
    "torch_dtype": "storage dtype (the safetensors say it)", "dtype": "storage dtype (the safetensors say it)",
    "transformers_version": "writer version",
}
SPECULATORS_CONFIG_KEYS = frozenset({"algorithm", "proposal_methods", "default_proposal_method", "verifier"})
PROPOSAL_KEYS = frozenset({"proposal_type", "speculative_tokens", "accept_tolerance", "verifier_accept_k"})
# verifier.name_or_path is where the target came from when training; the target is checked by architecture
VERIFIER_KEYS = frozenset({"name_or_path", "architectures"})
# architecture prefix -> engine arch, for the verifier a speculators drafter names
_VERIFIER_ARCHS = (("Qwen3Moe", "qwen3_moe"), ("Qwen3", "qwen3"), ("GptOss", "gpt_oss"), ("Llama", "llama"))


@dataclass(frozen=True)
class Eagle3Config:
    """Static drafter config (a jit static argument).

    body: the midlayer's Llama shape (num_layers 1, vocab = the target's).
    feature_layers: target layers (OUTPUT convention) whose features fc fuses, in concatenation order.
    norm_before_residual: the midlayer's residual is hidden_norm(g) instead of g.
    target_hidden_size: width of one target feature when it differs from body.hidden_size.
    default_k: the draft length the checkpoint proposes (speculators' proposal_methods), None: DEFAULT_K.
    verifier_arch: the target architecture the checkpoint was trained for (engine arch name), None: unnamed.
    """

    body: ModelConfig
    draft_vocab_size: int
    feature_layers: tuple[int, ...]
    norm_before_residual: bool = False
    target_hidden_size: int | None = None
    default_k: int | None = None
    verifier_arch: str | None = None


@dataclass(frozen=True)
class Eagle3State:
    """One generation's drafter state for a batch of B sequences.

    k, v [B, Nkv, S, D]: the drafter's K/V cache, rows < done[b] of sequence b valid. window [B, W, H]: fc
    features of rows length-W..length-1 (zeros before row 0). lengths [B]: feature rows received (= the anchor
    position at propose). prompts: the prompt ids, whose rows extend() writes at once.
    """

    k: jax.Array
    v: jax.Array
    window: jax.Array
    lengths: np.ndarray
    done: np.ndarray
    prompts: list[np.ndarray]

    def take(self, rows: jax.Array) -> Eagle3State:
        """The state of batch rows `rows` [B'] only (the engine drops finished sequences)."""
        k, v, window = take_rows((self.k, self.v, self.window), rows)
        index = np.asarray(rows)
        return Eagle3State(k, v, window, self.lengths[index], self.done[index], [self.prompts[i] for i in index])


def default_feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's inputs of layers (2, N//2, N-3) as engine ids (outputs of 1, N//2-1, N-4)."""
    n = num_target_layers
    return (1, n // 2 - 1, n - 4)


def _layer_body(layer: dict, what: str) -> ModelConfig:
    """The midlayer's shape from Llama layer keys (one layer, no biases)."""
    if layer.get("num_hidden_layers", 1) != 1:
        raise DrafterError(f"EAGLE-3 drafters have one decoder layer, {what} says {layer['num_hidden_layers']}")
    if layer.get("tie_word_embeddings", False):
        raise DrafterError(f"EAGLE-3 {what} has tie_word_embeddings true; the drafter's LM head is its own")
    return body_config({**layer, "num_hidden_layers": 1}, "llama", "EAGLE-3")


def _speculators(hf: dict) -> tuple[ModelConfig, dict]:
    """(midlayer shape, the EAGLE-3 fields) of a speculators config.json; its proposal and verifier checked."""
    check_keys(hf, SPECULATORS_READ_KEYS | set(SPECULATORS_IGNORED_KEYS), "EAGLE-3")
    if hf.get("speculators_model_type") != "eagle3":
        raise DrafterError(f"speculators_model_type {hf.get('speculators_model_type')!r} is not an EAGLE-3 drafter")
    layer = hf.get("transformer_layer_config")
    if not isinstance(layer, dict) or layer.get("model_type", "llama") != "llama":
        raise DrafterError("EAGLE-3 transformer_layer_config must be a Llama layer config, got "
                           f"{layer.get('model_type') if isinstance(layer, dict) else layer!r}")
    check_keys(layer, LAYER_READ_KEYS | set(IGNORED_KEYS) | {"architectures"}, "EAGLE-3",
               "transformer_layer_config")
    if layer.get("architectures") not in (None, [], ["LlamaForCausalLM"]):
        raise DrafterError(f"EAGLE-3 transformer_layer_config names architectures {layer['architectures']}")
    if hf.get("norm_before_fc", False):
        raise DrafterError("EAGLE-3 norm_before_fc (an RMSNorm over the concatenated features) is not supported")
    if "norm_before_residual" not in hf:  # speculators and vLLM default it differently: the config must say
        raise DrafterError("EAGLE-3 speculators config.json must say norm_before_residual")
    spec = hf.get("speculators_config")
    if not isinstance(spec, dict):
        raise DrafterError(f"EAGLE-3 speculators_config must be an object, got {spec!r}")
    check_keys(spec, SPECULATORS_CONFIG_KEYS, "EAGLE-3", "speculators_config")
    if spec.get("algorithm", "eagle3") != "eagle3":
        raise DrafterError(f"EAGLE-3 speculators_config.algorithm is {spec['algorithm']!r}")
    methods = spec.get("proposal_methods") or []
    chosen = [m for m in methods if isinstance(m, dict) and m.get("proposal_type") ==
              spec.get("default_proposal_method", "greedy")]
    if not chosen:
        raise DrafterError(f"EAGLE-3 speculators_config has no {spec.get('default_proposal_method', 'greedy')!r} "
                           f"proposal method among {methods}")
    for m in methods:
        check_keys(m, PROPOSAL_KEYS, "EAGLE-3", "speculators_config.proposal_methods")
        if m.get("proposal_type") != "greedy" or m.get("accept_tolerance", 0.0) != 0.0 \
                or m.get("verifier_accept_k", 1) != 1:
            raise DrafterError(f"EAGLE-3 proposal method {m} is not supported (only exact greedy chains)")
    verifier = spec.get("verifier") or {}
    check_keys(verifier, VERIFIER_KEYS, "EAGLE-3", "speculators_config.verifier")
    archs = verifier.get("architectures") or []
    kinds = {next(kind for prefix, kind in _VERIFIER_ARCHS if a.startswith(prefix)) for a in archs
             if any(a.startswith(prefix) for prefix, _ in _VERIFIER_ARCHS)}
    if archs and len(kinds) != 1:
        raise DrafterError(f"EAGLE-3 verifier architectures {archs} are not a target draftscope runs")
    k = chosen[0].get("speculative_tokens")
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise DrafterError(f"EAGLE-3 speculative_tokens must be in 1..{MAX_K}, got {k!r}")
    fields = {"draft_vocab_size": hf.get("draft_vocab_size"), "norm_before_residual": hf["norm_before_residual"],
              "target_hidden_size": hf.get("target_hidden_size"),
              "aux": hf.get("eagle_aux_hidden_state_layer_ids"), "default_k": k,
              "verifier_arch": kinds.pop() if kinds else None}
    return _layer_body(layer, "transformer_layer_config"), fields


def _eagle(hf: dict) -> tuple[ModelConfig, dict]:
    """(midlayer shape, the EAGLE-3 fields) of an EAGLE / SpecForge config.json (the layer keys at the top)."""
    check_keys(hf, EAGLE_READ_KEYS | set(IGNORED_KEYS), "EAGLE-3")
    eagle = hf.get("eagle_config") or {}
    check_keys(eagle, {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"}, "EAGLE-3", "eagle_config")
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise DrafterError("EAGLE-3 eagle_config.use_aux_hidden_state false (no target features) is not supported")
    inner, outer = eagle.get("eagle_aux_hidden_state_layer_ids"), hf.get("eagle_aux_hidden_state_layer_ids")
    if inner is not None and outer is not None and inner != outer:
        raise DrafterError(f"EAGLE-3 aux layer ids differ: eagle_config says {inner}, the top level {outer}")
    fields = {"draft_vocab_size": hf.get("draft_vocab_size"),
              "norm_before_residual": hf.get("norm_before_residual", False),
              "target_hidden_size": hf.get("target_hidden_size"), "aux": inner if inner is not None else outer,
              "default_k": None, "verifier_arch": None}
    return _layer_body(hf, "config.json"), fields


def config_from_json(hf: dict, num_target_layers: int) -> Eagle3Config:
    """Eagle3Config from an EAGLE-3 config.json, EAGLE / SpecForge or speculators format (aux layer ids default
    to EAGLE-3's choice for the target); every key is read or knowingly ignored, any other is refused."""
    archs = hf.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        raise DrafterError(f"EAGLE-3 config.json names architectures {archs}; expected {ARCHITECTURES[0]}")
    body, f = _speculators(hf) if "speculators_model_type" in hf else _eagle(hf)
    published = f["aux"]
    if published is not None and (not isinstance(published, list) or not published
                                  or any(not isinstance(i, int) or isinstance(i, bool) for i in published)):
        raise DrafterError(f"EAGLE-3 aux layer ids must be a list of integers, got {published!r}")
    layers = (tuple(i - 1 for i in published) if published is not None  # see published_layer_ids
              else default_feature_layers(num_target_layers))
    draft_vocab = f["draft_vocab_size"] or body.vocab_size
    if not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= body.vocab_size:
        raise DrafterError(f"EAGLE-3 draft_vocab_size must be in 1..{body.vocab_size}, got {draft_vocab!r}")
    if not isinstance(f["norm_before_residual"], bool):
        raise DrafterError(f"EAGLE-3 norm_before_residual must be true or false, got {f['norm_before_residual']!r}")
    target_hidden = f["target_hidden_size"]
    if target_hidden is not None and (not isinstance(target_hidden, int) or target_hidden < 1):
        raise DrafterError(f"EAGLE-3 target_hidden_size must be a positive integer, got {target_hidden!r}")
    return Eagle3Config(body, draft_vocab, layers, f["norm_before_residual"],
                        None if target_hidden == body.hidden_size else target_hidden, f["default_k"],
                        f["verifier_arch"])


def published_layer_ids(feature_layers: tuple[int, ...] | list[int]) -> list[int]:
    """Feature layer ids (the engine's: output of layer i) as EAGLE-3 configs publish them: the input of the layer
    after, one above."""
    return [int(i) + 1 for i in feature_layers]


def config_json(cfg: Eagle3Config) -> dict:
    """The EAGLE-3 config.json of an Eagle3Config (aux ids written in the published input-of-layer convention)."""
    out = {"architectures": [ARCHITECTURES[0]], "model_type": "llama", **body_json(cfg.body),
           "tie_word_embeddings": False, "draft_vocab_size": cfg.draft_vocab_size,
           "norm_before_residual": cfg.norm_before_residual,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": published_layer_ids(cfg.feature_layers),
                            "use_aux_hidden_state": True}}
    if cfg.target_hidden_size is not None:
        out["target_hidden_size"] = cfg.target_hidden_size
    return out


def check_fit(cfg: Eagle3Config, params: dict, d2t: np.ndarray, target: ModelConfig) -> None:
    """Raise DrafterError naming whatever in the drafter does not fit the target."""
    h = cfg.body.hidden_size
    if "embed" not in params:  # the target's embedding feeds the midlayer
        check_hidden(h, target, "EAGLE-3")
    elif params["embed"].shape != (target.vocab_size, h):
        raise DrafterError(f"EAGLE-3 embed_tokens has shape {list(params['embed'].shape)}, expected "
                           f"{[target.vocab_size, h]} (the target's vocab, the drafter's width)")
    if cfg.target_hidden_size is not None and cfg.target_hidden_size != target.hidden_size:
        raise DrafterError(f"EAGLE-3 was built for target features of width {cfg.target_hidden_size}; this "
                           f"target's hidden size is {target.hidden_size}")
    if cfg.verifier_arch is not None and cfg.verifier_arch != target.arch:
        raise DrafterError(f"EAGLE-3 was trained for a {cfg.verifier_arch} verifier; this target is {target.arch}")
    if cfg.body.vocab_size != target.vocab_size:
        raise DrafterError(f"EAGLE-3 was built for a vocab of {cfg.body.vocab_size}; the target has "
                           f"{target.vocab_size}")
    check_layer_ids(cfg.feature_layers, target.num_layers, "EAGLE-3")
    check_fc(params["fc"].shape[0], len(cfg.feature_layers), target, "EAGLE-3")
    if not 1 <= cfg.draft_vocab_size <= target.vocab_size or d2t.shape != (cfg.draft_vocab_size,):
        raise DrafterError(f"EAGLE-3 d2t has shape {list(d2t.shape)} for draft_vocab_size {cfg.draft_vocab_size} "
                           f"(at most the target vocab {target.vocab_size})")
    mapped = np.arange(cfg.draft_vocab_size) + d2t
    if mapped.min() < 0 or mapped.max() >= target.vocab_size:
        raise DrafterError(f"EAGLE-3 d2t maps draft ids to target ids {int(mapped.min())}..{int(mapped.max())}, "
                           f"outside the target vocab 0..{target.vocab_size - 1}")


# ---------------------------------------------------------------- forward (pure functions)

def midlayer_qkv(params: dict, cfg: Eagle3Config, emb: jax.Array, g: jax.Array,
                 positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention inputs of rows (token embedding emb [B, T, H], hidden g [B, T, H]) at positions [B, T].

    q [B, T, Nh, D] and k, v [B, Nkv, T, D] (q, k rotated), from concat[input_layernorm(emb), hidden_norm(g)].
    """
    lp, body = params["layer"], cfg.body
    b, t, _ = emb.shape
    x = jnp.concatenate([rms_norm(emb, lp["attn_norm"], body.rms_eps), rms_norm(g, lp["hidden_norm"], body.rms_eps)],
                        axis=-1)
    inv_freq, scale = jnp.asarray(body.inv_freq()), body.attention_factor()
    q = rope(linear(x, lp["wq"]).reshape(b, t, body.num_heads, body.head_dim), positions, inv_freq, scale)
    k = rope(linear(x, lp["wk"]).reshape(b, t, body.num_kv_heads, body.head_dim), positions, inv_freq, scale)
    v = linear(x, lp["wv"]).reshape(b, t, body.num_kv_heads, body.head_dim)
    return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def midlayer_out(params: dict, cfg: Eagle3Config, g: jax.Array, attn: jax.Array) -> jax.Array:
    """Residual + o_proj(attn [B, T, Nh*D]), then the MLP block -> pre-norm output hidden [B, T, H]."""
    lp, body = params["layer"], cfg.body
    x = (rms_norm(g, lp["hidden_norm"], body.rms_eps) if cfg.norm_before_residual else g) + linear(attn, lp["wo"])
    h = rms_norm(x, lp["mlp_norm"], body.rms_eps)
    return x + linear(jax.nn.silu(linear(h, lp["w_gate"])) * linear(h, lp["w_up"]), lp["w_down"])


def draft_logits(params: dict, cfg: Eagle3Config, h: jax.Array) -> jax.Array:
    """Pre-norm hidden [..., H] -> draft-vocab logits [..., Vd]."""
    return linear(rms_norm(h, params["norm"], cfg.body.rms_eps), params["lm_head"])


@partial(jax.jit, static_argnames=("cfg", "write_kv"), donate_argnames=("cache_k", "cache_v", "window"))
def extend_rows(params: dict, embed: jax.Array, cache_k: jax.Array, cache_v: jax.Array, window: jax.Array,
                features: jax.Array, next_tokens: jax.Array, starts: jax.Array, n_new: jax.Array, *,
                cfg: Eagle3Config, write_kv: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Take feature rows starts[b]..starts[b]+T-1 of each sequence (features [F, B, T, Ht], the first n_new[b]
    verified).

    Slides each sequence's n_new[b] new fc features into window [B, W, H]; with write_kv, also writes the K/V of
    rows (next_tokens [B, T], fc feature) at positions starts[b].. (rows without a known next token hold
    placeholders that propose rewrites). Returns cache_k, cache_v, window.
    """
    g = linear(concat_features(features), params["fc"])
    slide = lambda rows, n: jax.lax.dynamic_slice_in_dim(rows, n, window.shape[1], axis=0)  # noqa: E731
    window = jax.vmap(slide)(jnp.concatenate([window, g], axis=1), n_new)
    if write_kv:
        positions = starts[:, None] + jnp.arange(g.shape[1], dtype=jnp.int32)[None]
        _, k, v = midlayer_qkv(params, cfg, embed[next_tokens].astype(jnp.float32), g, positions)
        cache_k, cache_v = write(cache_k, k, starts), write(cache_v, v, starts)
    return cache_k, cache_v, window


@partial(jax.jit, static_argnames=("cfg", "k"), donate_argnames=("cache_k", "cache_v"))
def draft(params: dict, embed: jax.Array, d2t: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
          window: jax.Array, window_tokens: jax.Array, ends: jax.Array, *, cfg: Eagle3Config, k: int):
    """k greedy draft passes over a batch; pass 0 runs each sequence's rows ends[b]-W+1..ends[b] (window
    [B, W, H], their next tokens window_tokens [B, W]; rows < 0 are not written), ends[b] = p_b - 1.

    Returns ids [B, k] (target ids), q [B, k] (drafter probability), logits [B, k, Vd], cache_k, cache_v.
    """
    s, w = cache_k.shape[2], window.shape[1]
    put = jax.vmap(lambda cache, rows, at: cache.at[:, at].set(rows.astype(cache.dtype), mode="drop"))

    def run(cache_k, cache_v, tokens, g, positions):
        """Write rows (tokens [B, n], g [B, n, H]) at positions [B, n], then each last row's pre-norm output."""
        q, k_rows, v_rows = midlayer_qkv(params, cfg, embed[tokens].astype(jnp.float32), g, positions)
        at = jnp.where(positions >= 0, positions, s)  # out of range: dropped
        cache_k, cache_v = put(cache_k, k_rows, at), put(cache_v, v_rows, at)
        mask = (jnp.arange(s)[None] <= positions[:, -1:])[:, None, :]
        return cache_k, cache_v, midlayer_out(params, cfg, g[:, -1:], attention(q[:, -1:], cache_k, cache_v, mask))

    def pick(h):
        logits = draft_logits(params, cfg, h)[:, 0]
        best, prob = greedy_pick(logits)
        return best + d2t[best], prob, logits

    cache_k, cache_v, h = run(cache_k, cache_v, window_tokens, window,
                              ends[:, None] - (w - 1) + jnp.arange(w, dtype=jnp.int32))
    token, prob, logits = pick(h)
    b = ends.shape[0]
    init = (cache_k, cache_v, token, h, jnp.zeros((b, k), jnp.int32).at[:, 0].set(token),
            jnp.zeros((b, k), jnp.float32).at[:, 0].set(prob),
            jnp.zeros((b, k, cfg.draft_vocab_size)).at[:, 0].set(logits))

    def step(j, carry):
        cache_k, cache_v, token, h, ids, qs, all_logits = carry
        cache_k, cache_v, h = run(cache_k, cache_v, token[:, None], h, (ends + j)[:, None])
        token, prob, logits = pick(h)
        return (cache_k, cache_v, token, h, ids.at[:, j].set(token), qs.at[:, j].set(prob),
                all_logits.at[:, j].set(logits))

    cache_k, cache_v, _, _, ids, qs, all_logits = jax.lax.fori_loop(1, k, step, init)
    return ids, qs, all_logits, cache_k, cache_v


# ---------------------------------------------------------------- training

def eagle3_train_logits(params: dict, cfg: Eagle3Config, embed: jax.Array, features: jax.Array, tokens: jax.Array,
                        steps: int = 1) -> jax.Array:
    """Teacher-forced forward with training-time test (TTT) over `steps` draft steps: logits [B, steps, T, Vd].

    features [B, T, F*Ht] (feature_layers concatenated), tokens [B, T], embed [V, H] (params["embed"] if
    the drafter has its own, else the target's). logits[:, i, t] is step i of a draft started at row t:
    step 0 reads (tokens[t+1], fc(features[t])) at position t; step i reads (tokens[t+1+i], step i-1's
    output at t) at position t+i, attending to step-0 rows <= t and its own earlier steps at t, exactly
    as propose() does after the anchor tokens[t+1]. Targets: eagle3_labels (tokens[t+2+i]).
    """
    b, t = tokens.shape
    g = linear(features, params["fc"])
    rows = jnp.arange(t)
    positions = jnp.broadcast_to(rows, (b, t))
    causal, diagonal = rows[:, None] >= rows[None, :], rows[:, None] == rows[None, :]
    keys, values, out = [], [], []
    for i in range(steps):
        next_tokens = jnp.pad(tokens[:, 1 + i:], ((0, 0), (0, 1 + i)))
        q, k, v = midlayer_qkv(params, cfg, embed[next_tokens].astype(jnp.float32), g, positions + i)
        keys.append(k)
        values.append(v)
        mask = jnp.concatenate([causal] + [diagonal] * i, axis=-1)[None]
        g = midlayer_out(params, cfg, g, attention(q, jnp.concatenate(keys, 2), jnp.concatenate(values, 2), mask))
        out.append(draft_logits(params, cfg, g))
    return jnp.stack(out, axis=1)


def target_to_draft(d2t: np.ndarray, vocab_size: int) -> np.ndarray:
    """Inverse of d2t: [V] int32, the draft id of each target id or -1 when it is outside the draft vocab."""
    t2d = np.full(vocab_size, -1, np.int32)
    t2d[np.arange(len(d2t)) + np.asarray(d2t)] = np.arange(len(d2t), dtype=np.int32)
    return t2d


def eagle3_labels(tokens: jax.Array, t2d: jax.Array, steps: int = 1) -> tuple[jax.Array, jax.Array]:
    """Targets of eagle3_train_logits: draft ids of tokens[t+2+i] [B, steps, T], valid where that token
    exists and is in the draft vocab (t2d = target_to_draft(d2t, V))."""
    t = tokens.shape[1]
    idx = jnp.arange(t)[None, :] + 2 + jnp.arange(steps)[:, None]  # [steps, T]
    labels = t2d[tokens[:, jnp.minimum(idx, t - 1)]]
    valid = (idx < t)[None] & (labels >= 0)
    return jnp.where(valid, labels, 0), valid


# ---------------------------------------------------------------- the drafter

class Eagle3Drafter:
    """The engine-facing drafter: start / extend / propose over an Eagle3State.

    extend() and propose() donate the cache buffers of the state they are given: keep only the state
    they return.
    """

    name = "eagle3"

    def __init__(self, target: Target, cfg: Eagle3Config, params: dict, d2t: np.ndarray, k: int | None = None,
                 checkpoint: str | None = None):
        d2t = np.asarray(d2t)
        check_fit(cfg, params, d2t, target.cfg)
        self.cfg, self.params, self.d2t = cfg, on_mesh(params, target.mesh, cfg.body), jnp.asarray(d2t, jnp.int32)
        self.embed = self.params.get("embed", target.params["embed"])
        self.mesh = target.mesh
        self.k, self.max_k = check_k((cfg.default_k or DEFAULT_K) if k is None else k, MAX_K, self.name), MAX_K
        self.feature_layers = cfg.feature_layers
        self.checkpoint = checkpoint

    def with_k(self, k: int) -> Eagle3Drafter:
        """The same drafter (shared params) drafting k tokens per step."""
        other = copy.copy(self)
        other.k = check_k(k, MAX_K, self.name)
        return other

    def start(self, prompts: list[np.ndarray], max_len: int) -> Eagle3State:
        body, dtype, batch = self.cfg.body, self.params["fc"].dtype, len(prompts)
        window = jnp.zeros((batch, self.k + 1, body.hidden_size), jnp.float32)
        cache = lambda: cache_zeros(body, batch, max_len, dtype, self.mesh)  # noqa: E731
        zero = np.zeros(batch, np.int32)
        return Eagle3State(cache(), cache(), window, zero, zero, [np.asarray(p, np.int32) for p in prompts])

    def extend(self, state: Eagle3State, features: jax.Array, n_new: np.ndarray) -> Eagle3State:
        n_new, rows = np.asarray(n_new, np.int32), features.shape[2]
        check_extend(state.lengths, n_new, rows, state.k.shape[2])
        starts, next_tokens = state.lengths, np.zeros((len(n_new), rows), np.int32)
        n_known = np.zeros_like(n_new)
        for b, (prompt, start, n) in enumerate(zip(state.prompts, starts, n_new, strict=True)):
            known = prompt[start + 1:start + 1 + n]  # next tokens of prompt rows
            next_tokens[b, :len(known)], n_known[b] = known, len(known)
        k, v, window = extend_rows(self.params, self.embed, state.k, state.v, state.window, features, next_tokens,
                                   starts, n_new, cfg=self.cfg, write_kv=bool(n_known.any()))
        done = np.where(state.done == starts, starts + n_known, state.done)
        return Eagle3State(k, v, window, starts + n_new, done, state.prompts)

    def propose(self, state: Eagle3State, tokens: list[list[int]]) -> tuple[Proposal, Eagle3State]:
        _, positions = anchors_of(tokens, state.lengths)
        w = state.window.shape[1]
        if (positions - state.done).max() > w:
            raise DrafterError(f"{(positions - state.done).max()} feature rows arrived since the last propose; "
                               f"EAGLE-3 with K={self.k} catches up at most {w}")
        next_ids = np.maximum(positions[:, None] - w + 1 + np.arange(w), 0)  # rows p-W..p-1 read tokens p-W+1..p
        window_tokens = np.array([[seq[i] for i in row] for seq, row in zip(tokens, next_ids, strict=True)], np.int32)
        ids, q, _, k, v = draft(self.params, self.embed, self.d2t, state.k, state.v, state.window, window_tokens,
                                positions - 1, cfg=self.cfg, k=self.k)
        ids, q = fetch((ids, q))
        n = np.where(positions > 0, self.k, 0).astype(np.int32)  # position 0: no target feature to draft from
        return Proposal(ids, n, q), replace(state, k=k, v=v, done=positions)


# ---------------------------------------------------------------- checkpoints

_PREFIX = ["midlayer."]  # the EAGLE / SpecForge name of the one layer; speculators call it layers.0.
_IGNORED_TENSORS = {"t2d": "the inverse of d2t", "verifier_norm.weight": "a frozen copy of the target's final norm",
                    "verifier_lm_head.weight": "a frozen copy of the target's LM head"}


def load_params(path: Path, cfg: Eagle3Config, dtype: str) -> tuple[dict, np.ndarray]:
    """(params, d2t) from path/model.safetensors (EAGLE-3 or speculators names, optional `model.` prefix), shapes
    checked; tensors neither read nor listed in _IGNORED_TENSORS are refused."""
    tensors = read_tensors(path)
    h, vd = cfg.body.hidden_size, cfg.draft_vocab_size
    prefix = _PREFIX if any(name.startswith(_PREFIX[0]) for name in tensors) else ["layers.0."]
    fc = tensors.get("fc.weight")
    if fc is None or fc.ndim != 2 or fc.shape[0] != h:
        raise DrafterError(f"EAGLE-3 fc.weight in {path} must be [{h}, F*H_target], got "
                           f"{None if fc is None else list(fc.shape)}")
    shapes = layer_shapes(cfg.body, 2 * h)
    layer = load_layers(tensors, prefix, shapes, dtype, path)[0]
    layer["hidden_norm"] = vector(expect_tensor(tensors, f"{prefix[0]}hidden_norm.weight", (h,), path))
    params = {"fc": matrix(fc, dtype), "norm": vector(expect_tensor(tensors, "norm.weight", (h,), path)),
              "lm_head": matrix(expect_tensor(tensors, "lm_head.weight", (vd, h), path), dtype), "layer": layer}
    if "embed_tokens.weight" in tensors:
        params["embed"] = jnp.asarray(np.asarray(tensors["embed_tokens.weight"], np.float32),
                                      dtype=params["fc"].dtype)
    if "t2d" in tensors:
        expect_tensor(tensors, "t2d", (cfg.body.vocab_size,), path)
    d2t = np.asarray(tensors["d2t"], np.int64) if "d2t" in tensors else np.zeros(vd, np.int64)
    if "d2t" not in tensors and vd != cfg.body.vocab_size:
        raise DrafterError(f"EAGLE-3 checkpoint in {path} has a draft vocab of {vd} but no d2t map")
    read = {"fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", *_IGNORED_TENSORS,
            f"{prefix[0]}hidden_norm.weight", *(f"{prefix[0]}{TENSOR_KEYS[n][0]}" for n in shapes)}
    unread = sorted(set(tensors) - read)
    if unread:
        raise DrafterError(f"EAGLE-3 checkpoint in {path} has tensors this loader does not read: {', '.join(unread)}")
    return params, d2t


def save_eagle3(path: str | Path, cfg: Eagle3Config, params: dict, d2t: np.ndarray, dtype: str = "float32") -> Path:
    """Write an EAGLE-3 checkpoint (config.json + model.safetensors, float32 or bfloat16; d2t int64)."""
    layer = {k: v for k, v in params["layer"].items() if k != "hidden_norm"}
    tensors = {"fc.weight": np.asarray(params["fc"], np.float32).T,
               "norm.weight": np.asarray(params["norm"], np.float32),
               "lm_head.weight": np.asarray(params["lm_head"], np.float32).T,
               "midlayer.hidden_norm.weight": np.asarray(params["layer"]["hidden_norm"], np.float32),
               "d2t": np.asarray(d2t, np.int64),
               **layer_tensors([layer], _PREFIX)}
    if "embed" in params:
        tensors["embed_tokens.weight"] = np.asarray(params["embed"], np.float32)
    return save_checkpoint(path, config_json(cfg), tensors, dtype)


def draft_vocab_map(token_counts: np.ndarray | None, draft_vocab_size: int) -> np.ndarray:
    """d2t [Vd] int64 for the draft vocab: the most frequent target ids (ties: lower id) in id order, or,
    without counts, ids 0..Vd-1 (byte-level BPE vocabularies list frequent merges first)."""
    if token_counts is None:
        return np.zeros(draft_vocab_size, np.int64)
    chosen = np.sort(np.argsort(-np.asarray(token_counts), kind="stable")[:draft_vocab_size])
    return (chosen - np.arange(draft_vocab_size)).astype(np.int64)


def init_eagle3(target: Target, draft_vocab_size: int | None = None, token_counts: np.ndarray | None = None,
                seed: int = 0, intermediate_size: int | None = None,
                feature_layers: tuple[int, ...] | None = None) -> tuple[Eagle3Config, dict, np.ndarray]:
    """A randomly initialised EAGLE-3 drafter for `target`: (cfg, params, d2t).

    draft_vocab_size defaults to the whole target vocab; token_counts [V] picks the draft vocab (see
    draft_vocab_map). The midlayer copies the target's width, heads and RoPE; the embedding is shared.
    """
    t = target.cfg
    vd = t.vocab_size if draft_vocab_size is None else int(draft_vocab_size)
    if not 1 <= vd <= t.vocab_size:
        raise DrafterError(f"draft_vocab_size must be in 1..{t.vocab_size}, got {vd}")
    layers = tuple(feature_layers) if feature_layers is not None else default_feature_layers(t.num_layers)
    body = decoder_shape(t, "llama", num_layers=1, intermediate_size=intermediate_size or t.intermediate_size)
    cfg = Eagle3Config(body, vd, layers)
    h, rng = t.hidden_size, np.random.default_rng(seed)
    layer = random_layers(rng, layer_shapes(body, 2 * h), 1, target.dtype)[0]
    layer["hidden_norm"] = jnp.ones(h, jnp.float32)
    params = {"fc": random_matrix(rng, (len(layers) * h, h), target.dtype), "norm": jnp.ones(h, jnp.float32),
              "lm_head": random_matrix(rng, (h, vd), target.dtype), "layer": layer}
    d2t = draft_vocab_map(token_counts, vd)
    check_fit(cfg, params, d2t, t)
    return cfg, params, d2t


def load(target: Target, path: str | Path | None = None, k: int | None = None, **options) -> Eagle3Drafter:
    """An EAGLE-3 drafter from a checkpoint directory, EAGLE / SpecForge or speculators format (None: the shipped
    SmolLM2-135M drafter)."""
    path = checkpoint_dir(path, DEFAULT_CHECKPOINT, "EAGLE-3", options)
    cfg = config_from_json(read_config(path), target.cfg.num_layers)
    if cfg.target_hidden_size is None:  # features as wide as the drafter: check that before reading tensors
        check_hidden(cfg.body.hidden_size, target.cfg, "EAGLE-3")
    check_layer_ids(cfg.feature_layers, target.cfg.num_layers, "EAGLE-3")
    params, d2t = load_params(path, cfg, target.dtype)
    return Eagle3Drafter(target, cfg, params, d2t, k=k, checkpoint=str(path))
