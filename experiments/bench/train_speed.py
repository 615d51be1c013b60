"""Training throughput: trained label positions per second of a drafter's update step, one row per configuration.

    python -m experiments.bench.train_speed --drafter dflash --data data/distill-v3 --steps 6 [--target PATH] [--json] \
        --config "--anchors 48 --batch 4" --config "--anchors 512 --batch 4" --config "--anchors 512 --batch 8"
Each --config is a set of experiments.training.train flags over the shared ones after `--`. Every configuration runs
the same update step train_drafter runs for --steps steps, each blocked on its result; a step that compiles a new
shape (length bucket, anchor columns) is not timed. Without stored features (a dataset distilled without them, or
--no-stored-features in a configuration) each step includes one target prefill of its batch, also timed alone.
Configurations are interleaved step by step, so the ratios hold when other work shares the cores.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from dataclasses import replace

import jax
import numpy as np

from engine.target import load_target
from experiments.training import loop, objectives, sequences, train


def _timed(fn, *args) -> tuple[float, object]:
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", choices=["dflash", "eagle3"], default="dflash")
    ap.add_argument("--data", action="append", required=True)
    ap.add_argument("--config", action="append", required=True, help="train_drafter flags of one configuration")
    ap.add_argument("--steps", type=int, default=12, help="steps per configuration (compiling ones untimed)")
    ap.add_argument("--target", default=None, help="HF directory or .gguf (default: embedded SmolLM2-135M)")
    ap.add_argument("--json", action="store_true")
    args, shared = ap.parse_known_args(argv)
    shared = [a for a in shared if a != "--"]
    target = load_target(args.target)
    stored = sequences.load_sequences(args.data)
    bare = replace(stored, features=None, feature_layers=())
    runs = []
    for config in args.config:
        targs = train.parse_args(["--drafter", args.drafter, *shared, *shlex.split(config)])
        data = bare if targs.no_stored_features else stored
        obj = objectives.OBJECTIVES[args.drafter](target, data, targs)
        opt = loop.optimizer(targs.lr, targs.steps)
        runs.append({"config": config, "args": targs, "obj": obj, "data": data,
                     "update": loop.make_update(obj.loss_fn, opt),
                     "state": (obj.params, opt.init(obj.params)), "feats": obj.features,
                     "buckets": sequences.length_buckets(data, targs.seq_len, targs.bucket),
                     "step_s": [], "prefill_s": [], "labels": 0, "sequences": 0})
    for step in range(args.steps):
        for run in runs:
            batch = sequences.train_batch(run["data"], run["args"], step, run["obj"].columns, run["buckets"])
            compiled = run["update"]._cache_size()
            prefill_s, _ = _timed(run["feats"], batch)
            step_s, (params, opt_state, _, (_, labels)) = _timed(run["update"], *run["state"], batch, run["obj"].frozen)
            run["state"] = (params, opt_state)
            if run["update"]._cache_size() != compiled:  # this step compiled a new shape: not timed
                continue
            run["step_s"].append(step_s)
            run["prefill_s"].append(prefill_s)
            run["labels"] += int(labels)
            run["sequences"] += len(batch["tokens"])
    for r in runs:
        if not r["step_s"]:
            print(f"{r['config']}: every step compiled a new shape; raise --steps")
    runs = [r for r in runs if r["step_s"]]
    rows = [{"config": r["config"], "timed_steps": len(r["step_s"]), "step_s": round(float(np.median(r["step_s"])), 3),
             "target_prefill_s": round(float(np.median(r["prefill_s"])), 3),
             "features": "recomputed" if r["obj"].columns is None else "stored",
             "labels_per_s": round(r["labels"] / sum(r["step_s"]), 1),
             "sequences_per_s": round(r["sequences"] / sum(r["step_s"]), 2)} for r in runs]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'config':40s} {'features':>10s} {'step s':>8s} {'prefill s':>10s} {'labels/s':>10s} {'seq/s':>7s}")
    for r in rows:
        print(f"{r['config']:40s} {r['features']:>10s} {r['step_s']:8.3f} {r['target_prefill_s']:10.3f} "
              f"{r['labels_per_s']:10.1f} {r['sequences_per_s']:7.2f}")


if __name__ == "__main__":
    main()
