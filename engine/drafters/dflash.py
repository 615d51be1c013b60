"""`dflash`: block-diffusion drafting (DFlash, z-lab checkpoint format; docs/dflash.md sections 2-4).

One non-causal forward drafts a block. The anchor (the last committed token, at position p, with no
target feature yet) starts block [anchor, MASK x (B-1)] at positions p..p+B-1. Target features of
`target_layer_ids` (OUTPUT convention: id L = output of target layer L = HF hidden_states[L+1]),
concatenated in list order, go through fc -> hidden_norm = context C [T, H]. Every drafter layer
projects C with its own k_proj/v_proj (+ k_norm, + RoPE at each context token's absolute position)
and its block queries attend, without a causal mask, to [context K/V ; block K/V]. Final norm and the
target's LM head on block rows 1..K give the greedy drafts.

Draft context cache of a batch: per drafter layer K/V of context rows, head-major [B, Nkv, S, D] each,
S = the target's cache size, and each sequence's context length (ragged, like the target cache's).
extend() writes the K/V of new feature rows at each sequence's length.. and grows it by that sequence's
number of verified rows; rows past it are masked out, so rejected rows never enter. propose() drafts
the whole batch in one forward over [B, block] and does not change the cache (block K/V are transient).

Params (matrices [in, out], norms float32; embedding and LM head are the target's):
    fc [F*Ht, H]; hidden_norm [H]; norm [H]; layers: a list of Qwen3 layer dicts (see layers.py)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..cache import write
from ..config import ModelConfig
from ..model import attention, embed, linear, rms_norm, rope
from ..sharding import fetch
from ..target import Target
from .base import DrafterError, Proposal, check_k
from .layers import (
    anchors_of,
    body_config,
    body_json,
    cache_zeros,
    check_extend,
    check_fc,
    check_hidden,
    check_layer_ids,
    checkpoint_dir,
    concat_features,
    expect_tensor,
    greedy_pick,
    head_logits,
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
    shared_head,
    vector,
)

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "smollm2-135m-dflash"
ARCHITECTURES = ("DFlashDraftModel", "DFlashForCausalLM")
# Default mask token when the target's embedding has no spare row: SmolLM2's `<empty_output>` (id 16),
# a StarCoder-era Jupyter marker that chat never produces.
FALLBACK_MASK_TOKEN = "<empty_output>"


@dataclass(frozen=True)
class DFlashConfig:
    """Static drafter config (a jit static argument).

    body: the drafter's Qwen3-style decoder (body.num_layers = drafter depth, vocab = the target's).
    target_layer_ids: target layers whose outputs form the context, in concatenation order.
    """

    body: ModelConfig
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int


@dataclass(frozen=True)
class DFlashState:
    """Context caches k, v (per drafter layer [B, Nkv, S, D]) and each sequence's number of rows
    (lengths [B] int32 = its next anchor position)."""

    k: list[jax.Array]
    v: list[jax.Array]
    lengths: np.ndarray


def default_target_layer_ids(num_target_layers: int, n_features: int) -> tuple[int, ...]:
    """The reference layer choice: one feature -> [N//2]; else evenly from layer 1 to N-3."""
    if n_features == 1:
        return (num_target_layers // 2,)
    return tuple(int(round(1 + i * (num_target_layers - 4) / (n_features - 1))) for i in range(n_features))


def config_from_json(hf: dict) -> DFlashConfig:
    """DFlashConfig from a z-lab config.json; DFlash fields read from `dflash_config` or the top level."""
    archs = hf.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        raise DrafterError(f"DFlash config.json names architectures {archs}; expected {ARCHITECTURES[0]}")
    extra = hf.get("dflash_config") or {}

    def field(name: str):
        value = extra.get(name, hf.get(name))
        if value is None:
            raise DrafterError(f"DFlash config.json has no {name} (neither in dflash_config nor at the top level)")
        return value

    mask_id, layer_ids = int(field("mask_token_id")), tuple(int(i) for i in field("target_layer_ids"))
    block_size, num_target_layers = int(field("block_size")), int(field("num_target_layers"))
    if block_size < 2:
        raise DrafterError(f"DFlash block_size must be >= 2, got {block_size}")
    if any(t not in (None, "full_attention") for t in hf.get("layer_types") or []):
        raise DrafterError(f"DFlash layer_types {hf['layer_types']}: only full_attention layers are supported")
    body = body_config(hf, "qwen3", "DFlash")
    return DFlashConfig(body, block_size, mask_id, layer_ids, num_target_layers)


def config_json(cfg: DFlashConfig) -> dict:
    """The z-lab config.json of a DFlashConfig (with the published `auto_map`, which loading ignores)."""
    return {"architectures": [ARCHITECTURES[0]], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "model_type": "qwen3", **body_json(cfg.body),
            "tie_word_embeddings": False, "block_size": cfg.block_size, "num_target_layers": cfg.num_target_layers,
            "layer_types": ["full_attention"] * cfg.body.num_layers,
            "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}}


def check_fit(cfg: DFlashConfig, fc_in: int, target: ModelConfig) -> None:
    """Raise DrafterError naming whatever in the drafter does not fit the target."""
    check_hidden(cfg.body.hidden_size, target, "DFlash")
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
    k = linear(x, lp["wk"]).reshape(b, t, body.num_kv_heads, body.head_dim)
    v = linear(x, lp["wv"]).reshape(b, t, body.num_kv_heads, body.head_dim)
    k = rope(rms_norm(k, lp["k_norm"], body.rms_eps), positions, jnp.asarray(body.inv_freq()))
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
    q = linear(h, lp["wq"]).reshape(b, t, body.num_heads, body.head_dim)
    q = rope(rms_norm(q, lp["q_norm"], body.rms_eps), positions, jnp.asarray(body.inv_freq()))
    k = jnp.concatenate([ctx_k.astype(jnp.float32), k_blk], axis=2)
    v = jnp.concatenate([ctx_v.astype(jnp.float32), v_blk], axis=2)
    x = x + linear(attention(q, k, v, mask), lp["wo"])
    h = rms_norm(x, lp["mlp_norm"], body.rms_eps)
    return x + linear(jax.nn.silu(linear(h, lp["w_gate"])) * linear(h, lp["w_up"]), lp["w_down"])


def run_block(params: dict, cfg: DFlashConfig, x: jax.Array, positions: jax.Array, ctx_k: list, ctx_v: list,
              mask: jax.Array, n_out: int | None = None) -> jax.Array:
    """All drafter layers + final norm. x [B, Tq, H]; ctx_k/ctx_v per layer [B, Nkv, S, D] -> normed [B, n_out, H]
    (the last layer computes only the first n_out rows' outputs; all rows by default)."""
    last = len(params["layers"]) - 1
    for i, (lp, k, v) in enumerate(zip(params["layers"], ctx_k, ctx_v, strict=True)):
        x = block_layer(cfg, lp, x, positions, k, v, mask, n_out if i == last else None)
    return rms_norm(x, params["norm"], cfg.body.rms_eps)


def block_tokens(cfg: DFlashConfig, anchors: jax.Array, starts: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The drafted blocks of a batch: ids [anchor, MASK x (size-1)] and positions p..p+size-1, each [B, size]."""
    ids = jnp.full((anchors.shape[0], cfg.block_size), cfg.mask_token_id, jnp.int32).at[:, 0].set(anchors)
    return ids, starts[:, None] + jnp.arange(cfg.block_size, dtype=jnp.int32)


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
          draft_ids: jax.Array | None = None, *, cfg: DFlashConfig, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One drafter forward over the blocks of a whole batch ([B, block] rows, whatever k is).

    Sequence b's block starts at starts[b] = its context length (its first starts[b] cache rows). With a
    restricted draft vocabulary, head["lm_head"] holds only its columns and draft_ids [Vd] their target ids.
    Returns ids [B, k] int32 (argmax of rows 1..k), q [B, k] (their drafter probability), logits [B, k, V or Vd].
    """
    ids, positions = block_tokens(cfg, anchors, starts)
    s = ctx_k[0].shape[2]
    visible = jnp.concatenate([jnp.arange(s)[None] < starts[:, None], jnp.ones((len(starts), cfg.block_size), bool)],
                              axis=1)
    mask = jnp.broadcast_to(visible[:, None], (len(starts), cfg.block_size, s + cfg.block_size))
    h = run_block(params, cfg, embed(head, ids), positions, ctx_k, ctx_v, mask, n_out=k + 1)
    logits = head_logits(head, h[:, 1:])
    best, q = greedy_pick(logits)
    return (best if draft_ids is None else draft_ids[best]), q, logits


def restricted_head(head: dict, draft_ids: np.ndarray) -> dict:
    """The shared target head with its LM-head columns cut to draft_ids (the embedding stays whole)."""
    w = head["lm_head"] if "lm_head" in head else head["embed"].T
    return {"embed": head["embed"], "lm_head": jnp.asarray(w)[:, jnp.asarray(draft_ids)]}


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
                        anchors: jax.Array) -> jax.Array:
    """Packed-block training forward (dflash.md section 5): logits [B, A, block-1, V].

    features [B, T, F*Ht] (target features of every token, concatenated in target_layer_ids order),
    tokens [B, T], anchors [B, A] (positions < T). Anchor a's block [tokens[a], MASK...] at positions
    a..a+B-1 sees the context rows < a and its own block bidirectionally, no other block. Row i of
    block a predicts tokens[a+i] (see dflash_labels). head = shared_head(target params), frozen.
    """
    b, t = tokens.shape
    n_anchors, size = anchors.shape[1], cfg.block_size
    c = fuse_context(params, cfg, features)
    ctx_k, ctx_v = context_kv(params, cfg, c, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)))
    anchor_ids = jnp.take_along_axis(tokens, anchors, axis=1)
    ids = jnp.concatenate([anchor_ids[..., None], jnp.full((b, n_anchors, size - 1), cfg.mask_token_id)], axis=-1)
    positions = (anchors[..., None] + jnp.arange(size)).reshape(b, n_anchors * size)
    row_anchor = jnp.repeat(anchors, size, axis=1)  # [B, A*size]
    ctx_mask = jnp.arange(t)[None, None, :] < row_anchor[:, :, None]
    owner = jnp.repeat(jnp.arange(n_anchors), size)
    blk_mask = jnp.broadcast_to(owner[:, None] == owner[None, :], (b, n_anchors * size, n_anchors * size))
    mask = jnp.concatenate([ctx_mask, blk_mask], axis=-1)
    h = run_block(params, cfg, embed(head, ids.reshape(b, -1)), positions, ctx_k, ctx_v, mask)
    return head_logits(head, h.reshape(b, n_anchors, size, -1)[:, :, 1:])


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
        check_fit(cfg, params["fc"].shape[0], target.cfg)
        self.cfg, self.params, self.head = cfg, on_mesh(params, target.mesh, cfg.body), shared_head(target.params)
        # an optional restricted draft vocabulary (checkpoint tensor d2t, as EAGLE-3's): a smaller LM head
        self.draft_ids = None if d2t is None else jnp.asarray(check_d2t(np.asarray(d2t), target.cfg.vocab_size))
        if self.draft_ids is not None:
            self.head = restricted_head(self.head, self.draft_ids)
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
        ids, q, _ = draft(self.params, self.head, state.k, state.v, anchors, starts, self.draft_ids, cfg=self.cfg,
                          k=self.k)
        ids, q = fetch((ids, q))
        return Proposal(ids, np.full(len(tokens), self.k, np.int32), q), state


# ---------------------------------------------------------------- checkpoints

def _tensor_names(cfg: DFlashConfig) -> list[str]:
    return [f"layers.{i}." for i in range(cfg.body.num_layers)]


def load_params(path: Path, cfg: DFlashConfig, dtype: str) -> dict:
    """Params from path/model.safetensors (z-lab names, optional `model.` prefix), shapes checked."""
    tensors = read_tensors(path)
    h = cfg.body.hidden_size
    fc = tensors.get("fc.weight")
    if fc is None or fc.ndim != 2 or fc.shape[0] != h:
        raise DrafterError(f"DFlash fc.weight in {path} must be [{h}, F*H_target], got "
                           f"{None if fc is None else list(fc.shape)}")
    return {"fc": matrix(fc, dtype), "hidden_norm": vector(expect_tensor(tensors, "hidden_norm.weight", (h,), path)),
            "norm": vector(expect_tensor(tensors, "norm.weight", (h,), path)),
            "layers": load_layers(tensors, _tensor_names(cfg), layer_shapes(cfg.body, h), dtype, path)}


def save_dflash(path: str | Path, cfg: DFlashConfig, params: dict, dtype: str = "float32",
                d2t: np.ndarray | None = None) -> Path:
    """Write a z-lab DFlash checkpoint (config.json + model.safetensors, float32 or bfloat16); with d2t [Vd]
    (int64, target id = draft id + d2t[draft id]) the drafter drafts over that restricted vocabulary."""
    tensors = {"fc.weight": np.asarray(params["fc"], np.float32).T,
               "hidden_norm.weight": np.asarray(params["hidden_norm"], np.float32),
               "norm.weight": np.asarray(params["norm"], np.float32),
               **layer_tensors(params["layers"], _tensor_names(cfg))}
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
                mask_token_id: int | None = None, seed: int = 0,
                intermediate_size: int | None = None) -> tuple[DFlashConfig, dict]:
    """A randomly initialised DFlash drafter for `target` (matrices N(0, 0.02), norms ones).

    The body copies the target's width, heads and RoPE; target_layer_ids default to the reference
    formula with one feature per drafter layer; mask_token_id to default_mask_token_id(target).
    """
    if block_size < 2:
        raise DrafterError(f"DFlash block_size must be >= 2, got {block_size}")
    t = target.cfg
    ids = tuple(target_layer_ids) if target_layer_ids is not None else default_target_layer_ids(t.num_layers,
                                                                                               num_layers)
    mask_id = default_mask_token_id(target) if mask_token_id is None else int(mask_token_id)
    body = replace(t, arch="qwen3", qk_norm=True, num_layers=num_layers, tie_embeddings=False,
                   intermediate_size=intermediate_size or t.intermediate_size)
    cfg = DFlashConfig(body, block_size, mask_id, ids, t.num_layers)
    rng = np.random.default_rng(seed)
    params = {"fc": random_matrix(rng, (len(ids) * t.hidden_size, t.hidden_size), target.dtype),
              "hidden_norm": jnp.ones(t.hidden_size, jnp.float32), "norm": jnp.ones(t.hidden_size, jnp.float32),
              "layers": random_layers(rng, layer_shapes(body, t.hidden_size), num_layers, target.dtype)}
    check_fit(cfg, params["fc"].shape[0], t)
    return cfg, params


def load(target: Target, path: str | Path | None = None, k: int | None = None, **options) -> DFlashDrafter:
    """A DFlash drafter from a z-lab checkpoint directory (None: the shipped SmolLM2-135M drafter)."""
    path = checkpoint_dir(path, DEFAULT_CHECKPOINT, "DFlash", options)
    cfg = config_from_json(read_config(path))
    check_fit(cfg, len(cfg.target_layer_ids) * target.cfg.hidden_size, target.cfg)
    params = load_params(path, cfg, target.dtype)
    d2t = read_tensors(path).get("d2t")
    return DFlashDrafter(target, cfg, params, k=k, checkpoint=str(path), d2t=d2t)
