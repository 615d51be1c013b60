"""EAGLE-3 drafter configs: the EAGLE / SpecForge and speculators config.json formats read into a static
Eagle3Config (what is read, what is refused and why), written back, and checked against a target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import ModelConfig
from .base import DrafterError
from .layers import (
    body_config,
    body_json,
    check_fc,
    check_hidden,
    check_keys,
    check_layer_ids,
)
from .vocab import DraftVocab

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


def check_fit(cfg: Eagle3Config, params: dict, vocab: DraftVocab, target: ModelConfig) -> None:
    """Raise DrafterError naming whatever in the drafter does not fit the target (vocab: its d2t, already checked
    against the target vocab by vocab.from_d2t)."""
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
    if len(vocab.ids) != cfg.draft_vocab_size:
        raise DrafterError(f"EAGLE-3 d2t has {len(vocab.ids)} entries for draft_vocab_size {cfg.draft_vocab_size}")
