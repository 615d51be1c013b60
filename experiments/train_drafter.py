"""Train DFlash and EAGLE-3 drafters for a target on a self-distilled dataset (JAX + optax).

    python -m experiments.distill --out data/distill --prompts 12000          # the data (resumable shards)
    python -m experiments.train_drafter --drafter dflash --data data/distill --layers 2 --block-size 8
Data: experiments/distill.py datasets (prompts with the suites held out, answered by the target's own greedy
decoding through the engine), with the target features captured while generating (else computed here once
per batch). A fixed validation split (--val sequences) is never trained on. DFlash: many anchors per sequence
(--anchors), drawn without replacement each step among the positions whose block predicts response tokens
only, loss weight exp(-(k-1)/gamma) by block position (dflash.md section 5). EAGLE-3: teacher forcing with
training-time test over a few draft steps. Every --eval-every steps the drafter's greedy blocks on the
validation sequences give tau_est(K) = 1 + E[min(accepted run, K)] against the target's own continuation
(what a greedy engine run would accept at those anchors, no engine needed); training stops when the best
tau_est has not improved for --patience evaluations (or at --steps / --max-minutes) and the best state is
exported. Only drafter weights train; the target is frozen. Deterministic given --seed; resumable from --work.
`--export DIR` adds the rejection prefixes of an annotation export (storage.export_annotations), continued by
the target through the same engine path, repeated --export-weight times, to fine-tune a drafter from --init.
Saves exactly the formats the loaders read, plus a model card (training.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors.numpy import load_file, save_file
from tqdm import tqdm

from engine.drafters import dflash, domino, eagle3
from engine.drafters.layers import from_target_layers, head_logits, shared_head
from engine.drafters.ngram import NgramDrafter
from engine.target import Target, load_target
from experiments import distill, model_card
from experiments.distill import target_features
from experiments.suites import SealedSplitError
from experiments.train_data import suite_holdout

# ---------------------------------------------------------------- data


@dataclass
class Sequences:
    """Self-distilled sequences, back to back: tokens [total] int32, offsets [N+1], prompt_lens [N]; features:
    per-sequence target features ([len, F*H] float16, layers `feature_layers`) or None (computed on the fly). Loaded
    from datasets whose feature pass is unfinished, a row may hold None: a subset keeps stored features only when
    every one of its rows has them."""

    tokens: np.ndarray
    offsets: np.ndarray
    prompt_lens: np.ndarray
    features: list | None = None
    feature_layers: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def subset(self, rows: np.ndarray) -> Sequences:
        seqs = [self.tokens[self.offsets[r]:self.offsets[r + 1]] for r in rows]
        feats = [self.features[r] for r in rows] if self.features is not None else None
        if feats is not None and any(f is None for f in feats):
            feats = None
        return Sequences(np.concatenate(seqs) if seqs else self.tokens[:0], offsets_of([len(x) for x in seqs]),
                         self.prompt_lens[rows], feats, self.feature_layers)


def offsets_of(lengths) -> np.ndarray:
    """Offsets [N+1] int64 of sequences of these lengths stored back to back."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def load_sequences(dirs: list[str], with_features: bool = True) -> Sequences:
    """Every shard of the distill datasets in `dirs`, with their feature sidecars (memory-mapped) where present:
    the rows of a shard without one hold None (its features are computed per batch)."""
    data = distill.load_dataset(*dirs)
    seqs = Sequences(data["tokens"], data["offsets"], data["prompt_lens"])
    feature_files = data["feature_files"]
    if with_features and any(f is not None for f in feature_files):
        feats = []
        for path, (lo, hi) in zip(feature_files, data["shard_ranges"], strict=True):
            if path is None:
                feats += [None] * (hi - lo)
                continue
            table = np.load(path, mmap_mode="r")
            base = data["offsets"][lo]
            feats += [table[data["offsets"][r] - base:data["offsets"][r + 1] - base] for r in range(lo, hi)]
        seqs.features, seqs.feature_layers = feats, tuple(data["feature_layers"])
    return seqs


def export_sequences(target: Target, export_dir: Path, weight: int, max_new: int,
                     capture: tuple[int, ...]) -> Sequences:
    """Rejection prefixes of an annotation export, each continued by the target (engine path), `weight` times.
    Rejections of runs on an evaluation suite's prompts (train_data.suite_holdout) are dropped: never trained on."""
    rows = [json.loads(line) for line in (export_dir / "rejections.jsonl").read_text().splitlines() if line.strip()]
    kept = trainable_rejections(rows, export_dir)
    prompts = [np.asarray(r["prefix_ids"], np.int32) for r in kept]
    responses, feats = distill.greedy_responses(target, prompts, max_new, capture=capture)
    arrays = distill.encode_shard(prompts, responses, list(range(len(prompts))), target.cfg.vocab_size)
    one = Sequences(arrays["tokens"].astype(np.int32), arrays["offsets"], arrays["prompt_lens"], feats, capture)
    return one.subset(np.tile(np.arange(len(prompts)), weight))


def trainable_rejections(rows: list[dict], export_dir: Path) -> list[dict]:
    """The rejection records of an export that may be trained on: those of runs whose prompt no evaluation suite
    holds (train_data.suite_holdout, both slices); says how many it dropped."""
    if any("prompt" not in r for r in rows):
        raise SystemExit(f"{export_dir} predates the prompt field that the suite hold-out reads: export it again "
                         "(Annotate tab or storage.export_annotations)")
    holdout = suite_holdout()
    kept = [r for r in rows if not holdout.rejects(r["prompt"] or "")]
    if len(kept) < len(rows):
        print(f"{export_dir}: {len(rows) - len(kept)} of {len(rows)} rejections are of suite prompts, dropped "
              "(evaluation prompts are never trained on)", flush=True)
    if not kept:
        raise SystemExit(f"{export_dir}: no rejection left to train on once the suite prompts are dropped")
    return kept


def concat_sequences(parts: list[Sequences]) -> Sequences:
    parts = [p for p in parts if len(p)]
    lengths = np.concatenate([np.diff(p.offsets) for p in parts])
    with_feats = all(p.features is not None and p.feature_layers == parts[0].feature_layers for p in parts)
    return Sequences(np.concatenate([p.tokens for p in parts]), offsets_of(lengths),
                     np.concatenate([p.prompt_lens for p in parts]),
                     [f for p in parts for f in p.features] if with_feats else None,
                     parts[0].feature_layers if with_feats else ())


def split_validation(n: int, n_val: int, seed: int, pool: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows): a fixed random n_val of the first `pool` sequences (default all) held out.
    A fixed pool keeps the split when the dataset grows by appended shards, so runs on more data stay comparable."""
    pool = n if pool is None else min(pool, n)
    order = np.random.default_rng([seed, 7]).permutation(pool)
    n_val = min(n_val, pool // 5) if pool > 1 else 0
    val = np.sort(order[:n_val])
    return np.setdiff1d(np.arange(n), val), val


def batch_of(data: Sequences, rows: np.ndarray, seq_len: int,
             columns: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """tokens [B, T] (zero padded/truncated), lengths [B], prompt_lens [B] and, when the data has features and
    `columns` selects a drafter's layers from them, feats [B, T, F*H] float16."""
    tokens = np.zeros((len(rows), seq_len), np.int32)
    lengths = np.zeros(len(rows), np.int32)
    feats = np.zeros((len(rows), seq_len, len(columns)), np.float16) if columns is not None else None
    for j, r in enumerate(rows):
        s = data.tokens[data.offsets[r]:data.offsets[r + 1]][:seq_len]
        tokens[j, :len(s)], lengths[j] = s, len(s)
        if feats is not None:
            feats[j, :len(s)] = data.features[r][:seq_len][:, columns]
    out = {"tokens": tokens, "lengths": lengths, "prompt_lens": np.minimum(data.prompt_lens[rows], lengths - 1)}
    if feats is not None:
        out["feats"] = feats
    return out


def stored_columns(data: Sequences, layers: tuple[int, ...], target: Target, args) -> np.ndarray | None:
    """The stored feature columns a drafter's step reads (with --soft also the final hidden state), or None."""
    wanted = with_final(layers, target.cfg.num_layers) if args.soft else layers
    return feature_columns(data, wanted, target.cfg.hidden_size)


def feature_columns(data: Sequences, layers: tuple[int, ...], hidden: int) -> np.ndarray | None:
    """Columns of the stored features that hold `layers` in that order (None: not stored, compute them)."""
    if data.features is None or any(f is None for f in data.features) or not set(layers) <= set(data.feature_layers):
        return None
    return np.concatenate([np.arange(hidden) + data.feature_layers.index(i) * hidden for i in layers])


def sample_anchors(rng: np.random.Generator, lengths: np.ndarray, prompt_lens: np.ndarray,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """(anchors [B, n] int32, valid [B, n] bool): per sequence up to n distinct positions drawn without
    replacement from [prompt_len - 1, length - 2], the anchors whose block predicts response tokens only
    (the first is the prompt's last token: the engine's first anchor). Short responses leave slots invalid."""
    anchors, valid = np.zeros((len(lengths), n), np.int32), np.zeros((len(lengths), n), bool)
    for j, (length, p) in enumerate(zip(lengths, prompt_lens, strict=True)):
        pool = np.arange(max(p - 1, 0), max(length - 1, 0))
        pick = np.sort(rng.choice(pool, min(n, len(pool)), replace=False)) if len(pool) else pool
        anchors[j, :len(pick)], valid[j, :len(pick)] = pick, True
    return anchors, valid


def anchored_batches(data: Sequences, args, columns: np.ndarray | None) -> Iterator[dict[str, np.ndarray]]:
    """Every sequence of `data` once, in batches of args.batch (the last padded with invalid rows, so one shape
    compiles), with args.anchors fixed anchors per sequence: the evaluation batches of tau_est."""
    for lo in range(0, len(data), args.batch):
        n = min(args.batch, len(data) - lo)
        batch = batch_of(data, np.arange(lo, lo + args.batch).clip(max=lo + n - 1), args.seq_len, columns)
        batch["anchors"], batch["anchor_valid"] = sample_anchors(np.random.default_rng([args.seed, 99, lo]),
                                                                 batch["lengths"], batch["prompt_lens"], args.anchors)
        batch["anchor_valid"][n:] = False
        yield batch


def valid_runs(runs_fn, params, batches: Iterable[dict[str, np.ndarray]]) -> np.ndarray:
    """Accepted-run lengths at every valid anchor of `batches` (runs_fn(params, batch) -> [B, A])."""
    runs = [np.asarray(runs_fn(params, b))[b["anchor_valid"]] for b in batches]
    return np.concatenate(runs) if runs else np.zeros(0, np.int32)


def with_final(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """`layers` and then the final-normed hidden state (layer id N-1) unless they hold it: the features a soft-target
    step reads, in the order features_fn lays them out."""
    return layers + (() if num_layers - 1 in layers else (num_layers - 1,))


def features_fn(target: Target, layers: tuple[int, ...]):
    """feats_of(batch, with_last, params) -> (features [B, T, F*H] of `layers`, final-normed hidden [B, T, H] or
    None): the batch's stored features when it has them (columns of `layers`, or of with_final(layers) for
    with_last), else one forward of the target with `params` (default its own; inside a jitted step pass them as an
    argument, so they are not compiled in as constants)."""
    last = target.cfg.num_layers - 1
    capture = with_final(layers, target.cfg.num_layers)
    width, h = len(layers) * target.cfg.hidden_size, target.cfg.hidden_size

    def feats_of(b, with_last: bool = False, params: dict | None = None):
        if "feats" in b:
            full = b["feats"].astype(jnp.float32)
        else:
            params = target.params if params is None else params
            full = target_features(params, b["tokens"], cfg=target.cfg, capture=capture if with_last else layers)
        if not with_last:
            return full[..., :width], None
        i = capture.index(last) * h
        return full[..., :width], full[..., i:i + h]

    return feats_of


# ---------------------------------------------------------------- losses and the offline acceptance metric


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


def add_hints(batch: dict[str, np.ndarray], cfg: dflash.DFlashConfig) -> dict[str, np.ndarray]:
    """The batch with batch["hints"] [B, A, block-1]: each valid anchor's block start under cfg.lookup_hints, from
    the tokens up to the anchor, as the engine starts it (dflash.lookup_hints); MASK elsewhere. Unchanged for a
    drafter without lookup hints."""
    if not cfg.lookup_hints:
        return batch
    hints = np.full((*batch["anchors"].shape, cfg.block_size - 1), cfg.mask_token_id, np.int32)
    rows, slots = np.nonzero(batch["anchor_valid"])
    if len(rows):
        hints[rows, slots] = dflash.lookup_hints(cfg, [batch["tokens"][r, :batch["anchors"][r, a] + 1]
                                                       for r, a in zip(rows, slots, strict=True)])
    return {**batch, "hints": hints}


def dflash_runs(params, cfg, head, feats, batch, draft_ids: jax.Array | None = None) -> jax.Array:
    """Accepted-run length [B, A] of the drafter's greedy block at each anchor against the sequence's own
    continuation (the target's greedy tokens): what a greedy engine step anchored there accepts at K = B-1.
    draft_ids: target ids of a restricted head's columns (as DFlashDrafter drafts)."""
    logits = dflash.dflash_train_logits(params, cfg, head, feats, batch["tokens"], batch["anchors"],
                                        hints=batch.get("hints"))
    return picked_runs(cfg, logits, batch, draft_ids)


def picked_runs(cfg, logits, batch, draft_ids: jax.Array | None = None) -> jax.Array:
    """Accepted-run lengths [B, A] of the drafts cfg's serving rule (pick_drafts: argmax, or a lookup hint within
    cfg.hint_bias) picks from block logits [B, A, block-1, V]."""
    drafts, _ = dflash.pick_drafts(cfg, logits, batch.get("hints"), draft_ids)
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


def tau_from_runs(runs: np.ndarray, max_k: int) -> list[float]:
    """tau_est(K) for K = 1..max_k from accepted-run lengths (one per anchor): 1 + mean(min(run, K))."""
    runs = np.asarray(runs)
    return [round(1.0 + float(np.minimum(runs, k).mean()), 4) if runs.size else 0.0 for k in range(1, max_k + 1)]


def accepted_runs(match: jax.Array) -> jax.Array:
    """Leading matches per row: match [..., K] bool -> [...] int32."""
    return jnp.cumprod(match.astype(jnp.int32), axis=-1).sum(-1)


# ---------------------------------------------------------------- training loop


def optimizer(lr: float, steps: int) -> optax.GradientTransformation:
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, int(0.04 * steps)), max(steps, 2), lr * 0.05)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))


def save_state(work: Path, params, opt_state, meta: dict, best=None) -> None:
    """params + optimizer state (and the best params so far) as safetensors, progress in state.json."""
    work.mkdir(parents=True, exist_ok=True)
    tree = {"state": (params, opt_state), **({"best": best} if best is not None else {})}
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    save_file({jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}, str(work / "state.safetensors"))
    (work / "state.json").write_text(json.dumps(meta))


def load_state(work: Path, params, opt_state):
    """(params, opt_state, best params or None, meta) from work/, or the given ones at step 0."""
    if not (work / "state.json").is_file():
        return params, opt_state, None, {"step": 0, "log": [], "best": None, "wall_s": 0.0}
    saved = load_file(str(work / "state.safetensors"))
    meta = json.loads((work / "state.json").read_text())

    def restore(tree):
        paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
        return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(saved[jax.tree_util.keystr(p)], dtype=v.dtype)
                                                      for p, v in paths])

    state = restore({"state": (params, opt_state)})["state"]
    best = restore({"best": params})["best"] if meta.get("best") is not None else None
    return state[0], state[1], best, meta


def length_buckets(data: Sequences, seq_len: int, width: int) -> list[np.ndarray]:
    """Training rows grouped by padded length (a multiple of `width`, at most seq_len); width 0: one group."""
    lengths = np.minimum(np.diff(data.offsets), seq_len)
    if not width:
        return [np.arange(len(data))]
    padded = np.minimum(-(-lengths // width) * width, seq_len)
    return [np.flatnonzero(padded == p) for p in np.unique(padded)]


def padded_length(data: Sequences, rows: np.ndarray, args) -> int:
    """The length a batch of these rows is padded to: its longest, rounded up to args.bucket, at most args.seq_len."""
    if not args.bucket:
        return args.seq_len
    return min(args.seq_len, -(-int(np.diff(data.offsets)[rows].max()) // args.bucket) * args.bucket)


def train_batch(data: Sequences, args, step: int, columns: np.ndarray | None,
                buckets: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The training batch of `step`, drawn from (seed, step): a length bucket (chosen in proportion to its size, so
    every sequence is as likely as in uniform draws), args.batch of its sequences padded to the bucket's longest,
    and up to args.anchors anchors each (as many anchor columns as the fullest sequence needs, rounded up to the
    bucket, so asking for every position computes few empty blocks)."""
    rng = np.random.default_rng([args.seed if args.batch_seed is None else args.batch_seed, step])
    sizes = np.array([len(b) for b in buckets], np.float64)
    pool = buckets[rng.choice(len(buckets), p=sizes / sizes.sum())]
    rows = rng.choice(pool, args.batch, replace=len(pool) < args.batch)
    batch = batch_of(data, rows, padded_length(data, rows, args), columns)
    anchors, valid = sample_anchors(rng, batch["lengths"], batch["prompt_lens"], args.anchors)
    if args.bucket:  # valid anchors come first: drop the columns no sequence fills, to a multiple of the bucket
        width = min(args.anchors, -(-int(valid.sum(1).max()) // args.bucket) * args.bucket)
        anchors, valid = anchors[:, :width], valid[:, :width]
    batch["anchors"], batch["anchor_valid"] = anchors, valid
    batch["progress"] = np.float32(step / max(args.steps, 1))  # for losses with a schedule (domino_lambda)
    return batch


def make_update(loss_fn, opt: optax.GradientTransformation):
    """The jitted step (params, opt_state, batch, frozen) -> (params, opt_state, loss, (acc, trained label
    positions)); frozen (the target's weights, the head) is an argument, never a compiled-in constant."""

    @jax.jit
    def update(params, opt_state, batch, frozen):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, frozen)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, aux

    return update


def train(name: str, loss_fn, runs_fn, params, data: Sequences, val: Sequences, args, work: Path,
          columns: np.ndarray | None, max_k: int, features: Callable | None = None, frozen=None,
          annotate: Callable[[dict], dict] | None = None):
    """Optimize params of loss_fn(params, batch, frozen) -> (loss, (acc, trained label positions)) with early
    stopping on tau_est; each evaluation logs the training throughput since the last one (label positions per
    second, the time of the steps alone, evaluations excluded).

    runs_fn(params, batch, frozen) -> accepted-run lengths [B, A] (valid where batch["anchor_valid"]) on validation
    batches, which hold their target features (features(batch)) when the data stores none; annotate(batch) ->
    batch adds what the drafter's blocks start from (add_hints) to every batch; returns (best params, log)."""
    opt = optimizer(args.lr, args.steps)
    params, opt_state, best, meta = load_state(work, params, opt.init(params))
    step = meta["step"]
    update = make_update(loss_fn, opt)
    buckets = length_buckets(data, args.seq_len, args.bucket)
    runs_jit = jax.jit(runs_fn)
    annotate = annotate or (lambda b: b)
    val_columns = columns if val.features is not None else None
    val_batches = [annotate(b) for b in anchored_batches(val, args, val_columns)]
    if features is not None and val_columns is None:  # the frozen target's features of the fixed validation set, once
        for b in val_batches:
            b["feats"] = np.asarray(features(b))

    def evaluate(params) -> list[float]:
        return tau_from_runs(valid_runs(lambda p, b: runs_jit(p, b, frozen), params, val_batches), max_k)

    t0, wall0, deadline = time.time(), meta["wall_s"], time.time() + 60 * args.max_minutes
    since_best = 0 if meta["best"] is None else sum(1 for e in meta["log"] if "tau_est" in e
                                                      and e["step"] > meta["best"]["step"])
    interval = {"t": time.time(), "labels": 0, "steps": 0}

    def record(step: int, loss, acc) -> None:
        """Evaluate tau_est, log it, keep the best params (loss and acc are None for the --init checkpoint)."""
        nonlocal best, since_best
        train_s = time.time() - interval["t"]
        tau = evaluate(params) if val_batches else []
        entry = {"step": step, "loss": None if loss is None else round(float(loss), 4),
                 "acc_pos1": None if acc is None else round(float(acc), 4),
                 "s": round(wall0 + time.time() - t0, 1), "tau_est": tau}
        if interval["steps"]:
            entry["labels_per_s"] = round(int(interval["labels"]) / train_s, 1)
        meta["log"].append(entry)
        score = max(tau) if tau else -float(loss)
        if meta["best"] is None or score > meta["best"]["score"]:
            meta["best"], best, since_best = {"step": step, "score": score, "tau_est": tau}, params, 0
        else:
            since_best += 1
        tqdm.write(f"{name} step {step}: loss {entry['loss']} acc_pos1 {entry['acc_pos1']} tau_est(K=1..) {tau} "
                   f"labels/s {entry.get('labels_per_s')}")
        interval.update(t=time.time(), labels=0, steps=0)

    if step == 0 and args.init and val_batches:  # the starting point of a fine-tune, and the state to beat
        record(0, None, None)
    bar = tqdm(total=args.steps, initial=step, desc=f"train {name}", unit="step")
    while step < args.steps and time.time() < deadline and since_best < args.patience:
        batch = annotate(train_batch(data, args, step, columns, buckets))
        params, opt_state, loss, (acc, labels) = update(params, opt_state, batch, frozen)
        interval["labels"] += labels
        interval["steps"] += 1
        step += 1
        bar.update(1)
        if step % args.eval_every == 0 or step == args.steps:
            jax.block_until_ready(loss)
            record(step, loss, acc)
            bar.set_postfix(loss=f"{float(loss):.3f}", acc1=f"{float(acc):.3f}", best=f"{meta['best']['score']:.2f}")
        if step % args.save_every == 0:
            meta.update(step=step, wall_s=round(wall0 + time.time() - t0, 1))
            save_state(work, params, opt_state, meta, best)
    bar.close()
    if interval["steps"]:  # steps since the last evaluation (a --max-minutes or patience stop) are evaluated too
        jax.block_until_ready(loss)
        record(step, loss, acc)
    meta.update(step=step, wall_s=round(wall0 + time.time() - t0, 1))
    save_state(work, params, opt_state, meta, best)
    return (best if best is not None else params), {"steps": step, "wall_s": meta["wall_s"], "log": meta["log"],
                                                     "best": meta["best"]}


# ---------------------------------------------------------------- drafters


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
        draft_ids = None if drafter.draft_ids is None else np.asarray(drafter.draft_ids)
        if args.grow_layers:
            cfg, params = dflash.append_layers(cfg, params, args.grow_layers, args.seed)
    else:
        ids = dflash.default_target_layer_ids(target.cfg.num_layers, args.features)
        cfg, params = dflash.init_dflash(target, args.layers, args.block_size, ids, seed=args.seed,
                                         intermediate_size=args.intermediate)
        params = start_layers(params, target, args)
        draft_ids = None
        if args.draft_vocab < vocab_size:  # the most frequent response tokens of the training data
            counts = np.bincount(response_tokens(data), minlength=vocab_size)
            draft_ids = np.arange(args.draft_vocab) + eagle3.draft_vocab_map(counts, args.draft_vocab)
    head = shared_head(target.params)
    if draft_ids is not None:
        head = dflash.restricted_head(head, draft_ids)
    if args.lookup_hints and not cfg.lookup_hints:
        cfg = replace(cfg, lookup_hints=args.lookup_hints)
    if args.oov_hints:
        if not cfg.lookup_hints or draft_ids is None:
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
    to_vocab = np.full(vocab_size, -1, np.int32)
    to_vocab[np.arange(vocab_size) if draft_ids is None else draft_ids] = np.arange(head_width(head))
    to_vocab, ids_map = jnp.asarray(to_vocab), None if draft_ids is None else jnp.asarray(draft_ids, jnp.int32)
    feats_of = features_fn(target, cfg.target_layer_ids)
    frozen = {"target": target.params, "head": head, "to_vocab": to_vocab, "ids_map": ids_map}

    def loss_fn(p, b, fz):
        feats, last = feats_of(b, bool(args.soft), fz["target"])
        return dflash_loss(p, cfg, fz["head"], feats, b, args.gamma, fz["to_vocab"], last, args.soft)

    def runs_fn(p, b, fz):
        return dflash_runs(p, cfg, fz["head"], feats_of(b, False, fz["target"])[0], b, fz["ids_map"])

    def save(params, log: dict, data: Sequences, val: Sequences) -> Path:
        d2t = None if draft_ids is None else draft_ids - np.arange(len(draft_ids))
        out = dflash.save_dflash(Path(args.out) / f"{args.name}-dflash", cfg, params, dtype="bfloat16", d2t=d2t)
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
        cfg, params, d2t = drafter.cfg, drafter.params, drafter.d2t
    else:
        counts = np.bincount(data.tokens, minlength=target.cfg.vocab_size)
        cfg, params, d2t = eagle3.init_eagle3(target, args.draft_vocab, counts, seed=args.seed,
                                              intermediate_size=args.intermediate)
        params = start_layers(params, target, args)
    params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    t2d = jnp.asarray(eagle3.target_to_draft(np.asarray(d2t), target.cfg.vocab_size))
    embed = params.get("embed", target.params["embed"])
    feats_of = features_fn(target, cfg.feature_layers)
    target_head = dflash.restricted_head(shared_head(target.params), np.arange(len(d2t)) + np.asarray(d2t))
    k_eval = args.block_size - 1
    frozen = {"target": target.params, "embed": embed, "t2d": t2d, "target_head": target_head}

    def loss_fn(p, b, fz):
        feats, last = feats_of(b, bool(args.soft), fz["target"])
        return eagle3_loss(p, cfg, fz["embed"], fz["t2d"], feats, b, args.ttt_steps, fz["target_head"], last,
                           args.soft)

    def runs_fn(p, b, fz):
        return eagle3_runs(p, cfg, fz["embed"], fz["t2d"], feats_of(b, False, fz["target"])[0], b, k_eval)

    def save(params, log: dict, data: Sequences, val: Sequences) -> Path:
        out = eagle3.save_eagle3(Path(args.out) / f"{args.name}-eagle3", cfg, params, np.asarray(d2t),
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


def train_drafter(kind: str, target: Target, data: Sequences, val: Sequences, args, work: Path) -> Path:
    """Train one drafter kind from args (fresh or --init) and save it with its card."""
    obj = OBJECTIVES[kind](target, data, args)
    params, log = train(kind, obj.loss_fn, obj.runs_fn, obj.params, data, val, args, work / kind, obj.columns,
                        obj.max_k, obj.features, obj.frozen, obj.annotate)
    return obj.save(params, log, data, val)


def head_width(head: dict) -> int:
    """Number of logits the head produces (the draft vocabulary size)."""
    return head["lm_head"].shape[1] if "lm_head" in head else head["embed"].shape[0]


def response_tokens(data: Sequences) -> np.ndarray:
    """Every response token of the data (prompts excluded)."""
    return np.concatenate([data.tokens[data.offsets[r] + data.prompt_lens[r]:data.offsets[r + 1]]
                           for r in range(len(data))])


def ngram_runs(batch: dict[str, np.ndarray], k: int) -> np.ndarray:
    """Accepted-run length [B, A] of prompt-lookup drafting (the engine's n-gram drafter at K=k) at each valid
    anchor against the sequence's own continuation: the copying that the context alone predicts."""
    drafter, runs = NgramDrafter(k), np.zeros(batch["anchors"].shape, np.int32)
    for row, slot in zip(*np.nonzero(batch["anchor_valid"]), strict=True):
        anchor = int(batch["anchors"][row, slot])
        ids, n = drafter.lookup(batch["tokens"][row, :anchor + 1])
        truth = batch["tokens"][row, anchor + 1:min(anchor + 1 + n, int(batch["lengths"][row]))]
        runs[row, slot] = int(np.cumprod(ids[:len(truth)] == truth).sum())
    return runs


def copy_split(runs: np.ndarray, ngram: np.ndarray, max_k: int) -> dict:
    """tau_est of a drafter and of n-gram lookup over the same anchors, split by whether the context predicts the
    next token (n-gram's first proposal is right: a copy anchor) or not."""
    copy = ngram >= 1
    return {"ngram_tau_est": tau_from_runs(ngram, max_k), "copy_fraction": round(float(copy.mean()), 4),
            "copy_tau_est": tau_from_runs(runs[copy], max_k), "copy_ngram_tau_est": tau_from_runs(ngram[copy], max_k),
            "other_tau_est": tau_from_runs(runs[~copy], max_k)}


def walk_taus(batch: dict[str, np.ndarray], runs: np.ndarray, k: int) -> list[float] | None:
    """The engine's greedy tau (response tokens / verify steps) on each sequence of the batch at K=k, replayed
    from accepted-run lengths [B, A]: from the prompt's last token each step keeps min(run, k) drafts and the
    target's bonus token, and the next block starts after them. Greedy decoding writes these very sequences, so
    the walk meets the anchors the engine meets, which uniform anchors (tau_est) do not weigh: the engine crosses
    an easy stretch in few steps and spends many on a hard one. None when the walk needs an anchor that was not
    drawn (fewer --anchors than response tokens)."""
    taus = []
    for row in np.flatnonzero(batch["anchor_valid"].any(1)):
        valid = batch["anchor_valid"][row]
        run_at = dict(zip(batch["anchors"][row][valid].tolist(), runs[row][valid].tolist(), strict=True))
        start, end = int(batch["prompt_lens"][row]) - 1, int(batch["lengths"][row]) - 1
        anchor, steps = start, 0
        while anchor < end:
            if anchor not in run_at:
                return None
            anchor, steps = anchor + min(run_at[anchor], k) + 1, steps + 1
        taus.append((end - start) / steps)
    return taus


def evaluate_checkpoint(target: Target, checkpoint: str, data: Sequences, args,
                        hint_biases: tuple[float, ...] | None = None) -> list[dict]:
    """Scores of a saved DFlash or EAGLE-3 checkpoint on every sequence of `data` (no training), one dict per
    serving rule: the checkpoint's own (hint_biases None), else one per DFlash hint_bias (the block logits computed
    once, each rule picking its drafts from them). Each: tau_est(K = 1..max), with n-gram lookup's on the same
    anchors and both split by copy anchors (copy_split), and the engine's greedy tau replayed on the sequences
    (walk_taus, mean over sequences as the bench reports it; None unless every response position is an anchor)."""
    from engine.drafters import load_drafter

    drafter = load_drafter(checkpoint, target)
    params = jax.tree.map(lambda a: a.astype(jnp.float32), drafter.params)
    columns = feature_columns(data, drafter.feature_layers, target.cfg.hidden_size)
    if drafter.name == "dflash":
        max_k = drafter.cfg.block_size - 1
        rules = [drafter.cfg] if hint_biases is None else [replace(drafter.cfg, hint_bias=float(v))
                                                           for v in hint_biases]
        if any(c.hint_bias for c in rules) and not drafter.cfg.lookup_hints:
            raise SystemExit(f"--hint-bias needs a DFlash with lookup hints; {checkpoint} has none")
        logits_of = jax.jit(lambda p, f, b: dflash.dflash_train_logits(p, drafter.cfg, drafter.head, f, b["tokens"],
                                                                       b["anchors"], hints=b.get("hints")))
        pick = jax.jit(picked_runs, static_argnames=("cfg",))

        def runs(p, f, b):
            logits = logits_of(p, f, b)
            return [pick(c, logits, b, drafter.draft_ids) for c in rules]
    else:
        if hint_biases is not None:
            raise SystemExit("--hint-bias is a DFlash serving rule (lookup hints); EAGLE-3 drafts without hints")
        max_k = args.block_size - 1
        t2d = jnp.asarray(eagle3.target_to_draft(np.asarray(drafter.d2t), target.cfg.vocab_size))
        embed = params.get("embed", target.params["embed"])
        eagle_runs = jax.jit(lambda p, f, b: eagle3_runs(p, drafter.cfg, embed, t2d, f, b, max_k))

        def runs(p, f, b):
            return [eagle_runs(p, f, b)]

    def runs_of(p, b):
        feats = b["feats"].astype(jnp.float32) if "feats" in b else target_features(
            target.params, b["tokens"], cfg=target.cfg, capture=drafter.feature_layers)
        return [np.asarray(r) for r in runs(p, feats, b)]

    batches = list(anchored_batches(data, args, columns))
    if drafter.name == "dflash":
        batches = [add_hints(b, drafter.cfg) for b in batches]
    per_batch = [runs_of(params, b) for b in batches]
    ngram = np.concatenate([ngram_runs(b, max_k)[b["anchor_valid"]] for b in batches])
    scores = []
    for rule in range(len(per_batch[0]) if per_batch else 1):
        batch_runs = [r[rule] for r in per_batch]
        flat = np.concatenate([r[b["anchor_valid"]] for r, b in zip(batch_runs, batches, strict=True)])
        walks = [[walk_taus(b, r, k) for b, r in zip(batches, batch_runs, strict=True)] for k in range(1, max_k + 1)]
        walk_tau = None if any(w is None for ws in walks for w in ws) else [
            round(float(np.mean([t for w in ws for t in w])), 4) for ws in walks]
        scores.append({"tau_est": tau_from_runs(flat, max_k), "walk_tau": walk_tau,
                       **copy_split(flat, ngram, max_k)})
    return scores


def choose_hint_bias(candidates: tuple[float, ...], scores: list[dict]) -> tuple[float, str]:
    """The hint_bias whose scores are best: walk_tau at the largest K where every candidate has one, else tau_est
    (ties: the smaller bias, the plainer rule); returns (bias, the metric it was chosen by)."""
    metric = "walk_tau" if all(s["walk_tau"] for s in scores) else "tau_est"
    best = max(range(len(candidates)), key=lambda i: (scores[i][metric][-1], -candidates[i]))
    return candidates[best], metric


def record_serving(checkpoint: Path, candidates: tuple[float, ...], scores: list[dict], chosen_on: dict,
                   command: str) -> float:
    """Choose the checkpoint's hint_bias among `candidates` by their scores (choose_hint_bias), write it into its
    config.json (dflash_config.hint_bias, omitted at 0 as dflash.config_json writes it) and, with the scores and
    where they were measured (`chosen_on`: the data, its slice or validation split, sequences), into training.json
    as its `serving` record; rewrite the card. Returns the bias."""
    bias, metric = choose_hint_bias(candidates, scores)
    config_path = checkpoint / "config.json"
    config = json.loads(config_path.read_text())
    config["dflash_config"].pop("hint_bias", None)
    if bias:
        config["dflash_config"]["hint_bias"] = bias
    config_path.write_text(json.dumps(config, indent=1) + "\n")
    path = checkpoint / "training.json"
    card = json.loads(path.read_text())
    card["architecture"]["hint_bias"] = bias
    card["serving"] = {"hint_bias": bias, "metric": metric, "k": len(scores[0]["tau_est"]), **chosen_on,
                       "candidates": [{"hint_bias": c, "tau_est": s["tau_est"][-1],
                                       "walk_tau": s["walk_tau"][-1] if s["walk_tau"] else None}
                                      for c, s in zip(candidates, scores, strict=True)],
                       "date": time.strftime("%Y-%m-%d"), "command": command}
    path.write_text(json.dumps(card, indent=1))
    model_card.write_card(checkpoint)
    return bias


def write_card(out: Path, kind: str, args, data: Sequences, val: Sequences, log: dict, arch: dict,
               serving: dict | None = None) -> None:
    """training.json beside the checkpoint: data, steps, wall time, hardware, architecture, serving rule (and where
    it was chosen), tau_est curve."""
    dev = jax.devices()[0]
    card = {"drafter": kind, "target": args.target or "embedded SmolLM2-135M-Instruct", "architecture": arch,
            "data": {"sources": args.data or [], "export": args.export, "sequences": len(data),
                     "tokens": int(len(data.tokens)), "response_tokens": int(len(data.tokens) - data.prompt_lens.sum()),
                     "validation_sequences": len(val), "validation_pool": args.val_pool, "seed": args.seed,
                     "sha256": hashlib.sha256(data.tokens.tobytes()).hexdigest()[:16],
                     "validation_sha256": hashlib.sha256(val.tokens.tobytes()).hexdigest()[:16]},
            "training": {"steps": log["steps"], "best": log["best"], "batch": args.batch, "seq_len": args.seq_len,
                         "bucket": args.bucket, "batch_seed": args.batch_seed,
                         "lr": args.lr, "anchors": args.anchors, "gamma": args.gamma, "soft": args.soft,
                         "wall_s": log["wall_s"],
                         "draft_vocab": args.draft_vocab, "init": args.init, "init_top": args.init_top,
                         "grow_layers": args.grow_layers},
            "hardware": {"backend": jax.default_backend(), "device": dev.device_kind, "host": platform.node()},
            "curve": log["log"]}
    if serving is not None:
        card["serving"] = serving
    card["date"], card["command"] = time.strftime("%Y-%m-%d"), args.command
    if args.init:
        card["init_card"] = init_lineage(Path(args.init))
    (out / "training.json").write_text(json.dumps(card, indent=1))
    model_card.write_card(out)


def config_from_card(card: dict, target: Target) -> dict:
    """The config.json that a DFlash card's recorded settings (architecture and serving rule) give for `target`:
    what train_drafter saves, so a test can rebuild a shipped config from its card."""
    arch = card["architecture"]
    cfg, _ = dflash.init_dflash(target, arch["layers"], arch["block_size"], tuple(arch["target_layer_ids"]),
                                intermediate_size=arch["intermediate_size"])
    head = arch.get("domino")
    cfg = replace(cfg, lookup_hints=arch.get("lookup_hints", 0), oov_hints=arch.get("oov_hints", False),
                  hint_bias=float(card.get("serving", {}).get("hint_bias", 0.0)),
                  domino=None if head is None else domino.Domino(head["prefix_len"], head["emb_dim"],
                                                                 head["gru_hidden"]))
    config = dflash.config_json(cfg)
    if arch["draft_vocab_size"] < target.cfg.vocab_size:
        config["draft_vocab_size"] = arch["draft_vocab_size"]
    return {**config, "torch_dtype": "bfloat16"}


def choose_serving(target: Target, checkpoint: Path, data: Sequences, args, chosen_on: dict) -> float:
    """Score every --hint-bias candidate on `data` with an anchor at every response position (so the engine's walk
    is replayed) and record the best as the checkpoint's serving rule (record_serving)."""
    full = argparse.Namespace(**{**vars(args), "anchors": max(args.anchors, args.seq_len)})
    scores = evaluate_checkpoint(target, str(checkpoint), data, full, args.hint_bias)
    for bias, score in zip(args.hint_bias, scores, strict=True):
        print(json.dumps({"hint_bias": bias, "tau_est": score["tau_est"][-1], "walk_tau": score["walk_tau"] and
                          score["walk_tau"][-1]}), flush=True)
    return record_serving(checkpoint, args.hint_bias, scores, chosen_on, args.command)


def validation_record(args, val: Sequences) -> dict:
    """Where a choice made on the training validation split was made."""
    return {"chosen_on": "validation", "data": args.data or [], "validation_sequences": len(val),
            "validation_pool": args.val_pool, "seed": args.seed,
            "validation_sha256": hashlib.sha256(val.tokens.tobytes()).hexdigest()[:16]}


def evaluated_record(args, data: Sequences) -> dict:
    """Where a choice made on the evaluated datasets was made: their suite slices (dev only, by the leak guard)."""
    sources = [distill.read_manifest(Path(d))["prompt_source"] for d in args.data or []]
    slices = sorted({"/".join(x) for x in map(distill.suite_slice, sources) if x})
    return {"chosen_on": f"dev slice ({', '.join(slices)})" if slices else "evaluated data", "data": args.data or [],
            "sequences": len(data), "sha256": hashlib.sha256(data.tokens.tobytes()).hexdigest()[:16]}


def record_evaluation(checkpoint: Path, data: str, scores: dict, command: str) -> None:
    """Put an offline evaluation (tau_est and, when defined, walk_tau; replacing one on the same data) into the
    checkpoint's card."""
    path = checkpoint / "training.json"
    card = json.loads(path.read_text())
    keep = [e for e in card.get("evaluations", []) if e.get("data") != data]
    card["evaluations"] = keep + [{"data": data, "tau_est": scores["tau_est"], "walk_tau": scores.get("walk_tau"),
                                   "date": time.strftime("%Y-%m-%d"), "command": command}]
    path.write_text(json.dumps(card, indent=1))
    model_card.write_card(checkpoint)


def init_lineage(checkpoint: Path) -> dict | None:
    """What a fine-tune started from: the --init checkpoint's card (data, training, hardware, the checkpoints it
    averaged, its own lineage)."""
    path = checkpoint / "training.json"
    if not path.is_file():
        return None
    card = json.loads(path.read_text())
    return {k: card[k] for k in ("drafter", "date", "command", "data", "training", "hardware", "averaged", "init_card")
            if k in card}


def hint_biases(text: str) -> tuple[float, ...]:
    """'0,0.5,1' -> (0.0, 0.5, 1.0): finite, >= 0, distinct."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not 0 <= v < math.inf for v in values) or len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"--hint-bias wants distinct finite numbers >= 0 separated by commas, "
                                         f"got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", choices=["dflash", "eagle3", "both"], default="dflash")
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory overriding the checkpoint's")
    ap.add_argument("--data", action="append", default=None, help="a distill dataset directory (repeatable)")
    ap.add_argument("--limit-sequences", type=int, default=None, help="train on the first N training sequences")
    ap.add_argument("--no-stored-features", action="store_true", help="compute target features per batch")
    ap.add_argument("--val", type=int, default=128, help="validation sequences held out (at most a fifth)")
    ap.add_argument("--val-pool", type=int, default=None,
                    help="draw the validation split from the first N sequences (keeps it fixed as shards are added)")
    ap.add_argument("--export", default=None, help="annotation export dir whose rejection prefixes to add")
    ap.add_argument("--export-weight", type=int, default=20)
    ap.add_argument("--max-new", type=int, default=192, help="response length for --export prefixes")
    ap.add_argument("--init", default=None, help="fine-tune this checkpoint instead of a fresh drafter")
    ap.add_argument("--grow-layers", type=int, default=0, metavar="N",
                    help="with --init (DFlash): append N layers that start as the identity (drafts unchanged)")
    ap.add_argument("--init-top", action="store_true",
                    help="start a fresh drafter's layers from the target's top layers (same-named tensors copied)")
    ap.add_argument("--steps", type=int, default=20000, help="upper bound; early stopping usually ends sooner")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--patience", type=int, default=4, help="evaluations without a better tau_est before stopping")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=448)
    ap.add_argument("--bucket", type=int, default=64,
                    help="batch sequences of similar length, padded to a multiple of this (0: all to --seq-len)")
    ap.add_argument("--anchors", type=int, default=48, help="blocks per sequence per step (without replacement)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--soft", type=float, default=0.0,
                    help="weight of KL to the target's own distribution (0: hard labels only, 1: soft only)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--features", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=8, help="DFlash block (K up to block-1); EAGLE-3 eval K+1")
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--draft-vocab", type=int, default=8192,
                    help="draft vocabulary: the most frequent response tokens (DFlash: d2t; >= vocab: the full one)")
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--domino", default=None, metavar="EMB:GRU",
                    help="DFlash: add a Domino correction head (bottleneck EMB, GRU width GRU), e.g. 64:256")
    ap.add_argument("--domino-prefix", type=int, default=1, help="drafts without Domino correction (P)")
    ap.add_argument("--lookup-hints", type=int, default=0, metavar="N",
                    help="DFlash: start each block from prompt lookup (n-grams up to N) instead of MASK tokens")
    ap.add_argument("--oov-hints", action="store_true",
                    help="DFlash: score a lookup hint outside the draft vocabulary with the target's LM head and "
                         "train on it (dflash_config.oov_hints)")
    ap.add_argument("--hint-bias", default=None, type=hint_biases, metavar="B[,B...]",
                    help="DFlash with --lookup-hints: draft a lookup hint whose logit is within B of the argmax (a "
                         "serving rule, dflash_config.hint_bias; default 0). Several values: each is scored after "
                         "training on the validation split (with --evaluate: on the evaluated rows; --update-card "
                         "records it) and the best is written into config.json and the card with where it was chosen")
    ap.add_argument("--max-minutes", type=float, default=math.inf)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-seed", type=int, default=None,
                    help="draw training batches from this seed instead of --seed: a continued run (--init) sees new "
                         "batches and keeps the validation split")
    ap.add_argument("--name", default="smollm2-135m")
    ap.add_argument("--out", default="checkpoints")
    ap.add_argument("--work", default="out/train", help="resumable state lives here")
    ap.add_argument("--evaluate", action="append", default=None,
                    help="only print tau_est of this checkpoint on all of --data (repeatable)")
    ap.add_argument("--update-card", action="store_true", help="with --evaluate: record it in the checkpoint's card")
    ap.add_argument("--evaluate-validation", action="store_true",
                    help="with --evaluate: only the validation split (--val, --val-pool, --seed) training holds out")
    ap.add_argument("--by-kind", action="store_true",
                    help="with --evaluate: score each prompt kind (math, code, ..., suite) of the data on its own")
    args = ap.parse_args(argv)
    if args.domino is not None and not re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", args.domino):
        ap.error(f"--domino needs EMB:GRU, two positive integers such as 64:256; got {args.domino!r}")
    if args.grow_layers < 0:
        ap.error(f"--grow-layers needs N >= 1 (layers to append), got {args.grow_layers}")
    if args.grow_layers and not (args.init and args.drafter == "dflash"):
        ap.error("--grow-layers deepens a DFlash --init checkpoint: pass --drafter dflash --init DIR")
    if args.hint_bias is not None and args.drafter != "dflash":
        ap.error("--hint-bias is a DFlash serving rule (lookup hints): pass --drafter dflash")
    args.command = "python -m experiments.train_drafter " + shlex.join(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:  # the leak guard: train on no suite prompts; evaluate (choose checkpoints, rules) on dev slices only
        distill.check_suite_data(args.data or [], training=not args.evaluate, what="train_drafter")
    except SealedSplitError as e:
        raise SystemExit(f"error: {e}") from None
    target = load_target(args.target, args.dtype, args.tokenizer)
    parts = [load_sequences(args.data, not args.no_stored_features)] if args.data else []
    if args.export:
        layers = parts[0].feature_layers if parts else distill.feature_layers(target.cfg.num_layers)
        print(f"continuing the rejection prefixes of {args.export} with the target ...", flush=True)
        parts.append(export_sequences(target, Path(args.export), args.export_weight, args.max_new, layers))
    if not parts:
        raise SystemExit("no data: pass --data DIR (python -m experiments.distill) and/or --export DIR")
    data = concat_sequences(parts)
    # the validation split comes from the --data sequences (export rows are repeated copies: they would leak)
    n_data = len(parts[0]) if args.data else len(data)
    pool = n_data if args.val_pool is None else min(args.val_pool, n_data)
    train_rows, val_rows = split_validation(len(data), args.val, args.seed, pool)
    if args.evaluate:
        evaluate(target, data, n_data, val_rows, args)
        return
    if args.limit_sequences:  # limits the --data sequences; every export row stays
        train_rows = np.concatenate([train_rows[train_rows < n_data][:args.limit_sequences],
                                     train_rows[train_rows >= n_data]])
    train_set, val = data.subset(train_rows), data.subset(val_rows)
    print(f"data: {len(train_set)} training sequences ({len(train_set.tokens)} tokens), {len(val)} validation; "
          f"features {'stored' if train_set.features is not None else 'computed per batch'} (training), "
          f"{'stored' if val.features is not None else 'computed once'} (validation)", flush=True)
    work = Path(args.work)
    kinds = ["dflash", "eagle3"] if args.drafter == "both" else [args.drafter]
    for kind in kinds:
        out = train_drafter(kind, target, train_set, val, args, work)
        if kind == "dflash" and args.hint_bias and len(args.hint_bias) > 1:
            print(f"serving rule: hint_bias {choose_serving(target, out, val, args, validation_record(args, val))} "
                  "(chosen on validation)", flush=True)
        print("saved", out, flush=True)


def evaluate(target: Target, data: Sequences, n_data: int, val_rows: np.ndarray, args) -> None:
    """--evaluate: score each checkpoint on the data (or its validation split), per kind with --by-kind, per
    --hint-bias candidate when given; --update-card records the scores (and the chosen rule) in its card."""
    rows = val_rows if args.evaluate_validation else np.arange(len(data))
    groups = {"all": rows}
    if args.by_kind:  # export rows (after the --data rows) are their own kind
        kinds = np.concatenate([distill.row_kinds(*args.data or []), ["export"] * (len(data) - n_data)])
        groups = {kind: rows[kinds[rows] == kind] for kind in sorted(set(kinds[rows]))}
    for checkpoint in args.evaluate:
        for kind, group in groups.items():
            subset = data.subset(group)
            scores = evaluate_checkpoint(target, checkpoint, subset, args, args.hint_bias)
            for bias, score in zip(args.hint_bias or (None,), scores, strict=True):
                print(json.dumps({"checkpoint": checkpoint, "data": args.data, "kind": kind, "sequences": len(group),
                                  **({"hint_bias": bias} if bias is not None else {}), **score}), flush=True)
            if not args.update_card or args.by_kind:
                continue
            if args.hint_bias:
                where = validation_record(args, subset) if args.evaluate_validation else evaluated_record(args, subset)
                bias = record_serving(Path(checkpoint), args.hint_bias, scores, where, args.command)
                print(f"{checkpoint}: hint_bias {bias} (chosen on {where['chosen_on']})", flush=True)
            elif not args.evaluate_validation:
                record_evaluation(Path(checkpoint), ",".join(args.data or []), scores[0], args.command)


if __name__ == "__main__":
    main()
