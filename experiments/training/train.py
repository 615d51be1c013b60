"""PLACEHOLDER"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from pathlib import Path

import numpy as np

from engine.target import Target, load_target
from experiments.data import distill
from experiments.suites import SealedSplitError

from .cards import evaluated_record, record_evaluation, validation_record
from .evaluate import choose_serving, evaluate_checkpoint, hint_biases, record_serving
from .loop import train_drafter
from .sequences import Sequences, concat_sequences, export_sequences, load_sequences, split_validation


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
    args.command = "python -m experiments.training.train " + shlex.join(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:  # the leak guard: train on no suite prompts; evaluate (choose checkpoints, rules) on dev slices only
        distill.check_suite_data(args.data or [], training=not args.evaluate, what="experiments.training.train")
    except SealedSplitError as e:
        raise SystemExit(f"error: {e}") from None
    target = load_target(args.target, args.dtype, args.tokenizer)
    parts = [load_sequences(args.data, not args.no_stored_features)] if args.data else []
    if args.export:
        layers = parts[0].feature_layers if parts else distill.feature_layers(target.cfg.num_layers)
        print(f"continuing the rejection prefixes of {args.export} with the target ...", flush=True)
        parts.append(export_sequences(target, Path(args.export), args.export_weight, args.max_new, layers))
    if not parts:
        raise SystemExit("no data: pass --data DIR (python -m experiments.data.distill) and/or --export DIR")
    data = concat_sequences(parts)
    # the validation split comes from the --data sequences (export rows are repeated copies: they would leak)
    n_data = len(parts[0]) if args.data else len(data)
    pool = n_data if args.val_pool is None else min(args.val_pool, n_data)
    train_rows, val_rows = split_validation(len(data), args.val, args.seed, pool)
    if args.evaluate:
        evaluate_checkpoints(target, data, n_data, val_rows, args)
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


def evaluate_checkpoints(target: Target, data: Sequences, n_data: int, val_rows: np.ndarray, args) -> None:
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
