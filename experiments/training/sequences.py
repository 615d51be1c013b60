"""Training data for drafters: distilled sequences, the validation split, padded batches, anchors and features."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from engine.drafters import dflash, dflash_config
from engine.target import Target
from experiments.data import distill
from experiments.data.distill import target_features
from experiments.data.prompts import suite_holdout


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


def add_hints(batch: dict[str, np.ndarray], cfg: dflash_config.DFlashConfig) -> dict[str, np.ndarray]:
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


def response_tokens(data: Sequences) -> np.ndarray:
    """Every response token of the data (prompts excluded)."""
    return np.concatenate([data.tokens[data.offsets[r] + data.prompt_lens[r]:data.offsets[r + 1]]
                           for r in range(len(data))])
