"""Drafter training objectives: the DFlash and EAGLE-3 losses, their labels, the accepted runs each kind's greedy
blocks give, and each kind's trainable state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from engine.drafters import dflash, dflash_checkpoint, dflash_config, domino, eagle3, eagle3_checkpoint
from engine.drafters.layers import from_target_layers, head_logits, shared_head
from engine.drafters.vocab import DraftVocab, from_d2t, most_frequent
from engine.target import Target

from .cards import write_card
from .sequences import Sequences, add_hints, features_fn, response_tokens, stored_columns


def dflash_labels_in(head_vocab: jax.Array, tokens: jax.Array, lengths: jax.Array, anchors: jax.Array,
                     anchor_valid: jax.Array, block_size: int, hints: jax.Array | None = None,
                     hint_slot: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Labels [B, A, block-1] (indices into the training head's vocabulary) and their validity. With hint_slot
    (the index of dflash.hint_column's column), a label outside the vocabulary that is its row's hint
    (hints [B, A, block-1], MASK where none) is that column."""
    idx = anchors[..., None] + jnp.arange(1, block_size)
    tokens_at = jnp.take_along_axis(tokens, jnp.minimum(idx, tokens.shape[1] - 1).reshape(tokens.shape[0], -1), 1)
    tokens_at = tokens_at.reshape(idx.shape)
    labels = head_vocab[tokens_at]
    if hint_slot is not None:
        labels = jnp.where((labels < 0) & (tokens_at == hints), hint_slot, labels)
    valid = (idx < lengths[:, None, None]) & (labels >= 0) & anchor_valid[..., None]
    return jnp.maximum(labels, 0), valid


def distill_loss(logits: jax.Array, labels: jax.Array, target_probs: jax.Array | None, soft: float) -> jax.Array:
    """Per-row loss: (1 - soft) * CE(hard label) + soft * KL(target || drafter) over the same vocabulary.

    target_probs (the target's own next-token distribution, [..., V]) is only read when soft > 0; with a
    one-hot distribution at the label the KL term equals the CE term."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    if not soft:
        return ce
    log_q = jax.nn.log_softmax(logits, axis=-1)
    kl = jnp.sum(jax.scipy.special.xlogy(target_probs, target_probs) - target_probs * log_q, axis=-1)
    return (1.0 - soft) * ce + soft * kl


def next_token_probs(head: dict, last_hidden: jax.Array, rows: jax.Array,
                     column: Callable[[jax.Array, jax.Array], jax.Array] | None = None) -> jax.Array:
    """The target's distribution over the head's vocabulary for the token after each of `rows` [B, ...]:
    softmax(head(last_hidden[b, row])), last_hidden [B, T, H] the final-normed hidden (feature id N-1).
    column(hidden [B, ..., H], logits) adds the drafter's extra columns (dflash.hint_column)."""
    b, t = last_hidden.shape[:2]
    h = jnp.take_along_axis(last_hidden, jnp.clip(rows, 0, t - 1).reshape(b, -1)[..., None], axis=1)
    h = h.reshape(*rows.shape, -1)
    logits = head_logits(head, h)
    return jax.nn.softmax(logits if column is None else column(h, logits), axis=-1)


def domino_lambda(progress: jax.Array, start: float = 1.0, decay: float = 0.5) -> jax.Array:
    """Weight of the base logits' loss in a Domino step (SpecForge's base-anchor curriculum): `start` at the first
    step, linearly down to 0 at `decay` of the training steps (progress = step / steps)."""
    return start * jnp.clip(1.0 - progress / decay, 0.0, 1.0)


def dflash_loss(params, cfg, head, feats, batch, gamma: float, to_vocab: jax.Array, last_hidden=None,
                soft: float = 0.0):
    """Distillation loss over drafts 1..B-1, weighted exp(-(k-1)/gamma), valid rows only; (loss, (acc of draft 1,
    trained label positions)).

    With a training vocabulary (head["lm_head"] holding only its columns), to_vocab maps target ids to its
    indices (-1: outside, not a label). soft > 0 mixes in KL to the target's distribution (see distill_loss;
    last_hidden [B, T, H] gives it: draft k of anchor a predicts token a+k, from the target's hidden at a+k-1).
    With a Domino head: (1 - lambda) x the corrected logits' loss + lambda x the base logits' (domino_lambda of
    batch["progress"])."""
    hints = batch.get("hints")
    logits, base = dflash.dflash_train_logits(params, cfg, head, feats, batch["tokens"], batch["anchors"],
                                              with_base=True, hints=hints)  # [B, A, S-1, V]
    hint_slot = head_width(head) if logits.shape[-1] > head_width(head) else None  # dflash.hint_column's column
    labels, valid = dflash_labels_in(to_vocab, batch["tokens"], batch["lengths"], batch["anchors"],
                                     batch["anchor_valid"], cfg.block_size,
                                     None if hints is None else jnp.where(hints != cfg.mask_token_id, hints, -1),
                                     hint_slot)
    weight = jnp.exp(-jnp.arange(cfg.block_size - 1) / gamma) * valid
    probs = None
    if soft:
        probs = next_token_probs(head, last_hidden, batch["anchors"][..., None] + jnp.arange(cfg.block_size - 1),
                                 lambda h, lg: dflash.hint_column(cfg, head, h, lg, hints))
    loss = distill_loss(logits, labels, probs, soft)
    if cfg.domino is not None:
        lam = domino_lambda(batch["progress"])
        loss = (1.0 - lam) * loss + lam * distill_loss(base, labels, probs, soft)
    acc = (jnp.argmax(logits, -1) == labels) * valid
    acc1 = acc[..., 0].sum() / jnp.maximum(valid[..., 0].sum(), 1)
    return (loss * weight).sum() / jnp.maximum(weight.sum(), 1e-9), (acc1, valid.sum())


def eagle3_loss(params, cfg, embed, t2d, feats, batch, steps: int, target_head=None, last_hidden=None,
                soft: float = 0.0):
    """Distillation loss of every TTT step on rows whose label lies in the response; (loss, (acc at step 1,
    trained label positions)).

    soft > 0: target_head is the target's head cut to the draft vocabulary (label of step i at row t is token
    t+2+i, predicted by the target's hidden at t+1+i)."""
    logits = eagle3.eagle3_train_logits(params, cfg, embed, feats, batch["tokens"], steps)  # [B, steps, T, Vd]
    valid, labels = eagle3_valid(t2d, batch, steps)
    probs = None
    if soft:
        t = batch["tokens"].shape[1]
        rows = jnp.arange(t)[None, None, :] + 1 + jnp.arange(steps)[None, :, None]
        probs = next_token_probs(target_head, last_hidden, jnp.broadcast_to(rows, (len(batch["tokens"]), steps, t)))
    loss = distill_loss(logits, labels, probs, soft)
    acc = (jnp.argmax(logits, -1) == labels) & valid
    acc1 = acc[:, 0].sum() / jnp.maximum(valid[:, 0].sum(), 1)
    return (loss * valid).sum() / jnp.maximum(valid.sum(), 1), (acc1, valid.sum())


def eagle3_valid(t2d, batch, steps: int) -> tuple[jax.Array, jax.Array]:
    labels, valid = eagle3.eagle3_labels(batch["tokens"], t2d, steps)
    idx = jnp.arange(batch["tokens"].shape[1])[None, None, :] + 2 + jnp.arange(steps)[None, :, None]
    lengths, prompt_lens = batch["lengths"][:, None, None], batch["prompt_lens"][:, None, None]
    return valid & (idx < lengths) & (idx >= prompt_lens), labels


def accepted_runs(match: jax.Array) -> jax.Array:
    """Leading matches per row: match [..., K] bool -> [...] int32."""
    return jnp.cumprod(match.astype(jnp.int32), axis=-1).sum(-1)


def dflash_runs(params, cfg, head, feats, batch, vocab: DraftVocab | None = None) -> jax.Array:
    """Accepted-run length [B, A] of the drafter's greedy block at each anchor against the sequence's own
    continuation (the target's greedy tokens): what a greedy engine step anchored there accepts at K = B-1.
    vocab: a restricted head's draft vocabulary (as DFlashDrafter drafts)."""
    logits = dflash.dflash_train_logits(params, cfg, head, feats, batch["tokens"], batch["anchors"],
                                        hints=batch.get("hints"))
    return picked_runs(cfg, logits, batch, vocab)


def picked_runs(cfg, logits, batch, vocab: DraftVocab | None = None) -> jax.Array:
    """Accepted-run lengths [B, A] of the drafts cfg's serving rule (pick_drafts: argmax, or a lookup hint within
    cfg.hint_bias) picks from block logits [B, A, block-1, V]."""
    drafts, _ = dflash.pick_drafts(cfg, logits, batch.get("hints"), vocab)
    identity = jnp.arange(cfg.body.vocab_size, dtype=jnp.int32)
    labels, valid = dflash_labels_in(identity, batch["tokens"], batch["lengths"], batch["anchors"],
                                     batch["anchor_valid"], cfg.block_size)
    return accepted_runs((drafts == labels) & valid)


def eagle3_runs(params, cfg, embed, t2d, feats, batch, k: int) -> jax.Array:
    """EAGLE-3's accepted-run length [B, A] at each anchor for K = k. Teacher forcing equals free drafting along
    the accepted prefix, so TTT logits give the runs; row t = anchor - 1 (EAGLE alignment); a label outside the
    draft vocabulary ends the run."""
    logits = eagle3.eagle3_train_logits(params, cfg, embed, feats, batch["tokens"], k)  # [B, K, T, Vd]
    valid, labels = eagle3_valid(t2d, batch, k)
    match = ((jnp.argmax(logits, -1) == labels) & valid).transpose(0, 2, 1)  # [B, T, K]
    return jnp.take_along_axis(accepted_runs(match), jnp.maximum(batch["anchors"] - 1, 0), axis=1)


@dataclass
class Objective:
    """What train() optimizes for one drafter kind: the starting params, loss_fn(params, batch, frozen) -> (loss,
    (acc, trained label positions)), runs_fn for tau_est, the target layers it reads, features(batch) -> their
    values, their stored feature columns (None: computed per batch), the largest K of tau_est, save(params, log,
    data, val) -> the checkpoint, and the frozen arrays both functions read (target weights, head)."""

    params: dict
    loss_fn: Callable
    runs_fn: Callable
    feature_layers: tuple[int, ...]
    features: Callable
    columns: np.ndarray | None
    max_k: int
    save: Callable[..., Path]
    frozen: dict
    annotate: Callable[[dict], dict] | None = None


def dflash_objective(target: Target, data: Sequences, args) -> Objective:
    vocab_size = target.cfg.vocab_size
    if args.init:
        drafter = dflash.load(target, args.init)
        cfg, params = drafter.cfg, drafter.params
        vocab = drafter.vocab
        if args.grow_layers:
            cfg, params = dflash_checkpoint.append_layers(cfg, params, args.grow_layers, args.seed)
    else:
        ids = dflash_config.default_target_layer_ids(target.cfg.num_layers, args.features)
        cfg, params = dflash_checkpoint.init_dflash(target, args.layers, args.block_size, ids, seed=args.seed,
                                         intermediate_size=args.intermediate)
        params = start_layers(params, target, args)
        vocab = None
        if args.draft_vocab < vocab_size:  # the most frequent response tokens of the training data
            counts = np.bincount(response_tokens(data), minlength=vocab_size)
            vocab = most_frequent(counts, args.draft_vocab, vocab_size)
    head = shared_head(target.params)
    if vocab is not None:
        head = dflash.restricted_head(head, vocab)
    if args.lookup_hints and not cfg.lookup_hints:
        cfg = replace(cfg, lookup_hints=args.lookup_hints)
    if args.oov_hints:
        if not cfg.lookup_hints or vocab is None:
            raise SystemExit("--oov-hints needs lookup hints and a restricted draft vocabulary")
        cfg = replace(cfg, oov_hints=True)
    biases = args.hint_bias or (0.0,)
    if any(biases) and not cfg.lookup_hints:
        raise SystemExit("--hint-bias is a rule for lookup hints: pass --lookup-hints N too")
    # one --hint-bias is the rule as given; several are chosen on validation after training (choose_serving)
    cfg = replace(cfg, hint_bias=biases[0] if len(biases) == 1 else 0.0)
    if args.domino and cfg.domino is None:  # a fresh Domino head on a fresh or loaded drafter
        emb_dim, gru = (int(x) for x in args.domino.split(":"))
        cfg = replace(cfg, domino=domino.Domino(args.domino_prefix, emb_dim, gru))
        params = {**params, "domino": domino.init(np.random.default_rng([args.seed, 7]), cfg.domino,
                                                  cfg.body.hidden_size, head_width(head), "float32")}
    to_vocab = jnp.arange(vocab_size, dtype=jnp.int32) if vocab is None else vocab.slots
    feats_of = features_fn(target, cfg.target_layer_ids)
    frozen = {"target": target.params, "head": head, "to_vocab": to_vocab, "vocab": vocab}

    def loss_fn(p, b, fz):
        feats, last = feats_of(b, bool(args.soft), fz["target"])
        return dflash_loss(p, cfg, fz["head"], feats, b, args.gamma, fz["to_vocab"], last, args.soft)

    def runs_fn(p, b, fz):
        return dflash_runs(p, cfg, fz["head"], feats_of(b, False, fz["target"])[0], b, fz["vocab"])

    def save(params, log: dict, data: Sequences, val: Sequences) -> Path:
        d2t = None if vocab is None else vocab.d2t()
        out = dflash_checkpoint.save_dflash(Path(args.out) / f"{args.name}-dflash", cfg, params, dtype="bfloat16",
                                            d2t=d2t)
        write_card(out, "dflash", args, data, val, log, {"layers": cfg.body.num_layers, "block_size": cfg.block_size,
                                                         "target_layer_ids": list(cfg.target_layer_ids),
                                                         "intermediate_size": cfg.body.intermediate_size,
                                                         "draft_vocab_size": head_width(head),
                                                         "domino": None if cfg.domino is None else
                                                         vars(cfg.domino), "lookup_hints": cfg.lookup_hints,
                                                         "oov_hints": cfg.oov_hints, "hint_bias": cfg.hint_bias},
                   serving={"hint_bias": cfg.hint_bias, "chosen_on": "given (--hint-bias)"} if cfg.lookup_hints
                   else None)
        return out

    columns = stored_columns(data, cfg.target_layer_ids, target, args)
    return Objective(jax.tree.map(lambda a: a.astype(jnp.float32), params), loss_fn, runs_fn, cfg.target_layer_ids,
                     lambda b: feats_of(b)[0], columns, cfg.block_size - 1, save, frozen,
                     lambda b: add_hints(b, cfg))


def eagle3_objective(target: Target, data: Sequences, args) -> Objective:
    if args.init:
        drafter = eagle3.load(target, args.init)
        cfg, params, vocab = drafter.cfg, drafter.params, drafter.vocab
    else:
        counts = np.bincount(data.tokens, minlength=target.cfg.vocab_size)
        cfg, params, d2t = eagle3_checkpoint.init_eagle3(target, args.draft_vocab, counts, seed=args.seed,
                                                         intermediate_size=args.intermediate)
        vocab = from_d2t(d2t, target.cfg.vocab_size, "EAGLE-3")
        params = start_layers(params, target, args)
    params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    embed = params.get("embed", target.params["embed"])
    feats_of = features_fn(target, cfg.feature_layers)
    target_head = dflash.restricted_head(shared_head(target.params), vocab)
    k_eval = args.block_size - 1
    frozen = {"target": target.params, "embed": embed, "t2d": vocab.slots, "target_head": target_head}

    def loss_fn(p, b, fz):
        feats, last = feats_of(b, bool(args.soft), fz["target"])
        return eagle3_loss(p, cfg, fz["embed"], fz["t2d"], feats, b, args.ttt_steps, fz["target_head"], last,
                           args.soft)

    def runs_fn(p, b, fz):
        return eagle3_runs(p, cfg, fz["embed"], fz["t2d"], feats_of(b, False, fz["target"])[0], b, k_eval)

    def save(params, log: dict, data: Sequences, val: Sequences) -> Path:
        out = eagle3_checkpoint.save_eagle3(Path(args.out) / f"{args.name}-eagle3", cfg, params, vocab.d2t(),
                                 dtype="bfloat16")
        write_card(out, "eagle3", args, data, val, log, {"draft_vocab_size": cfg.draft_vocab_size,
                                                         "feature_layers": list(cfg.feature_layers),
                                                         "ttt_steps": args.ttt_steps,
                                                         "intermediate_size": cfg.body.intermediate_size})
        return out

    columns = stored_columns(data, cfg.feature_layers, target, args)
    return Objective(params, loss_fn, runs_fn, cfg.feature_layers, lambda b: feats_of(b)[0], columns, k_eval, save,
                     frozen)


OBJECTIVES = {"dflash": dflash_objective, "eagle3": eagle3_objective}


def start_layers(params: dict, target: Target, args) -> dict:
    """A fresh drafter's layers, or with --init-top its layers started from the target's top layers."""
    if not args.init_top:
        return params
    if "layer" in params:  # EAGLE-3's one layer
        return {**params, "layer": from_target_layers([params["layer"]], target.params["layers"])[0]}
    return {**params, "layers": from_target_layers(params["layers"], target.params["layers"])}


def head_width(head: dict) -> int:
    """Number of logits the head produces (the draft vocabulary size)."""
    return head["lm_head"].shape[1] if "lm_head" in head else head["embed"].shape[0]
