"""Validation without the engine: accepted runs and tau_est(K) of a drafter's greedy blocks against the target's
own continuation, and the serving rule chosen on it."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from engine.drafters import dflash
from engine.drafters.ngram import NgramDrafter
from engine.target import Target
from experiments.data.distill import target_features

from .cards import write_readme
from .objectives import eagle3_runs, picked_runs
from .sequences import Sequences, add_hints, anchored_batches, feature_columns


def valid_runs(runs_fn, params, batches: Iterable[dict[str, np.ndarray]]) -> np.ndarray:
    """Accepted-run lengths at every valid anchor of `batches` (runs_fn(params, batch) -> [B, A])."""
    runs = [np.asarray(runs_fn(params, b))[b["anchor_valid"]] for b in batches]
    return np.concatenate(runs) if runs else np.zeros(0, np.int32)


def tau_from_runs(runs: np.ndarray, max_k: int) -> list[float]:
    """tau_est(K) for K = 1..max_k from accepted-run lengths (one per anchor): 1 + mean(min(run, K))."""
    runs = np.asarray(runs)
    return [round(1.0 + float(np.minimum(runs, k).mean()), 4) if runs.size else 0.0 for k in range(1, max_k + 1)]


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
            return [pick(c, logits, b, drafter.vocab) for c in rules]
    else:
        if hint_biases is not None:
            raise SystemExit("--hint-bias is a DFlash serving rule (lookup hints); EAGLE-3 drafts without hints")
        max_k = args.block_size - 1
        embed = params.get("embed", target.params["embed"])
        eagle_runs = jax.jit(lambda p, f, b: eagle3_runs(p, drafter.cfg, embed, drafter.vocab.slots, f, b, max_k))

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
    config.json (dflash_config.hint_bias, omitted at 0 as dflash_config.config_json writes it) and, with the scores and
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
    write_readme(checkpoint)
    return bias


def choose_serving(target: Target, checkpoint: Path, data: Sequences, args, chosen_on: dict) -> float:
    """Score every --hint-bias candidate on `data` with an anchor at every response position (so the engine's walk
    is replayed) and record the best as the checkpoint's serving rule (record_serving)."""
    full = argparse.Namespace(**{**vars(args), "anchors": max(args.anchors, args.seq_len)})
    scores = evaluate_checkpoint(target, str(checkpoint), data, full, args.hint_bias)
    for bias, score in zip(args.hint_bias, scores, strict=True):
        print(json.dumps({"hint_bias": bias, "tau_est": score["tau_est"][-1], "walk_tau": score["walk_tau"] and
                          score["walk_tau"][-1]}), flush=True)
    return record_serving(checkpoint, args.hint_bias, scores, chosen_on, args.command)


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
