"""The training loop: optax updates, resumable state in --work, early stopping on validation tau_est."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors.numpy import load_file, save_file
from tqdm import tqdm

from engine.target import Target

from .evaluate import tau_from_runs, valid_runs
from .objectives import OBJECTIVES
from .sequences import Sequences, anchored_batches, length_buckets, train_batch


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


def train_drafter(kind: str, target: Target, data: Sequences, val: Sequences, args, work: Path) -> Path:
    """Train one drafter kind from args (fresh or --init) and save it with its card."""
    obj = OBJECTIVES[kind](target, data, args)
    params, log = train(kind, obj.loss_fn, obj.runs_fn, obj.params, data, val, args, work / kind, obj.columns,
                        obj.max_k, obj.features, obj.frozen, obj.annotate)
    return obj.save(params, log, data, val)
