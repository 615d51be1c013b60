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
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..cache import take_rows
from ..ops import attention, embed, linear, rms_norm, rope, write
from ..sharding import fetch
from ..target import Target
from . import domino as domino_head
from .base import DrafterError, Proposal, check_k
from .dflash_checkpoint import load_params
from .dflash_config import DEFAULT_CHECKPOINT, DFlashConfig, check_fit, config_from_json
from .layers import (
    anchors_of,
    cache_zeros,
    check_extend,
    checkpoint_dir,
    concat_features,
    head_logits,
    linear_bias,
    on_mesh,
    read_config,
    shared_head,
)
from .ngram import NgramDrafter
from .vocab import DraftVocab, from_d2t

NO_LOGIT = -1e9  # the logit of a column that holds no candidate (hint_column)


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
          vocab: DraftVocab | None = None, hints: jax.Array | None = None, *, cfg: DFlashConfig,
          k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One drafter forward over the blocks of a whole batch ([B, block] rows, whatever k is); hints [B, block-1]:
    the rows' starting tokens under cfg.lookup_hints (lookup_hints).

    Sequence b's block starts at starts[b] = its context length (its first starts[b] cache rows). With a
    restricted draft vocabulary (vocab), head["lm_head"] holds only its columns.
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
            return logits_j, embed(head, pick_drafts(cfg, logits_j, hint_j, vocab)[0])

        logits = domino_head.rollout(params["domino"], cfg.domino, logits, rows, embed(head, anchors), draft_step)
    best, q = pick_drafts(cfg, logits, hints, vocab)
    return best, q, logits


def pick_drafts(cfg: DFlashConfig, logits: jax.Array, hints: jax.Array | None = None,
                vocab: DraftVocab | None = None) -> tuple[jax.Array, jax.Array]:
    """Drafts [..., k] (target ids) and their drafter probability from logits [..., k, V or Vd], or [..., k, Vd + 1]
    with hint_column's column: the argmax, or, under cfg.hint_bias, the lookup hint [..., k] (target ids, MASK where
    none) when its logit is within hint_bias of the argmax's. Drafts are deterministic proposals, so any pick stays
    lossless."""
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    vd = logits.shape[-1] if vocab is None else len(vocab.ids)
    if hints is not None and cfg.hint_bias:
        slot = hints if vocab is None else vocab.slots[hints]
        hinted = hints != cfg.mask_token_id
        if logits.shape[-1] > vd:  # the hint column scores a hint outside the vocabulary
            slot = jnp.where(hinted & (slot < 0), vd, slot)
        slot_ok = jnp.maximum(slot, 0)
        top = jnp.take_along_axis(logits, best[..., None], axis=-1)[..., 0]
        near = jnp.take_along_axis(logits, slot_ok[..., None], axis=-1)[..., 0] + cfg.hint_bias >= top
        best = jnp.where(hinted & (slot >= 0) & near, slot_ok, best)
    picked = jnp.take_along_axis(logits, best[..., None], axis=-1)
    q = 1.0 / jnp.sum(jnp.exp(logits - picked), axis=-1)
    if vocab is None:
        return best, q
    return jnp.where(best == vd, hints if hints is not None else 0, vocab.ids[jnp.minimum(best, vd - 1)]), q


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


def restricted_head(head: dict, vocab: DraftVocab) -> dict:
    """The shared target head with its LM-head columns cut to the draft vocabulary (the embedding stays whole). For
    hint_column the whole head stays too (full_lm_head [H, V] when untied; tied, it is the embedding), with slots
    [V]: each target id's column, -1 outside the cut (vocab.slots)."""
    w = head["lm_head"] if "lm_head" in head else head["embed"].T
    whole = {"full_lm_head": head["lm_head"]} if "lm_head" in head else {}
    return {"embed": head["embed"], "lm_head": jnp.asarray(w)[:, vocab.ids], "slots": vocab.slots, **whole}


def drafter_head(target_head: dict, params: dict, vocab: DraftVocab | None) -> dict:
    """The embedding and LM head the drafter drafts with: its own params["embed"] [V, H] / params["lm_head"]
    [H, Vd] when the checkpoint has them, else the target's (its LM head cut to the draft vocabulary)."""
    head = dict(target_head)
    if "embed" in params:  # the drafter's embedding; a tied target's head stays its embedding
        head = {"embed": params["embed"], "lm_head": head.get("lm_head", jnp.asarray(head["embed"]).T)}
    if "lm_head" in params:
        return {**head, "lm_head": params["lm_head"]}
    return head if vocab is None else restricted_head(head, vocab)


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
        self.vocab = None if d2t is None else from_d2t(d2t, target.cfg.vocab_size, "DFlash")
        self.head = drafter_head(shared_head(target.params), self.params, self.vocab)
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
        ids, q, _ = draft(self.params, self.head, state.k, state.v, anchors, starts, self.vocab, hints,
                          cfg=self.cfg, k=self.k)
        ids, q = fetch((ids, q))
        return Proposal(ids, np.full(len(tokens), self.k, np.int32), q), state


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
