"""Train DFlash and EAGLE-3 drafters for a target by self-distillation (JAX + optax).

    python -m experiments.train_drafter --drafter both --samples 20000 --steps 3000 --out checkpoints
Pipeline: training prompts that are not from the evaluation suites (experiments/train_data.py) ->
the target's own greedy responses (batched, on device) -> target features computed on the fly ->
DFlash (anchor sampling, loss weight exp(-(k-1)/gamma) by block position; dflash.md section 5) and
EAGLE-3 (teacher forcing with training-time test over a few draft steps) on the same sequences.
Only drafter weights train; the target is frozen. Deterministic given --seed; resumable from --work
(params + optimizer state as safetensors every --save-every steps); --max-minutes bounds wall time.
`--export DIR` adds the rejection prefixes of an annotation export (storage.export_annotations) as
extra prompts, repeated --export-weight times, to fine-tune a drafter given by --init.
Saves exactly the formats the loaders read, plus a model card.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors.numpy import load_file, save_file
from tqdm import tqdm

from engine.cache import init_cache
from engine.drafters import dflash, eagle3
from engine.drafters.layers import shared_head
from engine.model import forward
from engine.target import Target, load_target
from experiments.train_data import build_prompts, generate_batch

# ---------------------------------------------------------------- data


def build_dataset(target: Target, prompts: list[np.ndarray], max_new: int, gen_batch: int,
                  max_prompt: int) -> dict[str, np.ndarray]:
    """Self-distilled sequences: {tokens (flat int32), offsets [N+1], prompt_lens [N]}; longer prompts dropped."""
    prompts = [p for p in prompts if 2 <= len(p) <= max_prompt]
    order = np.argsort([len(p) for p in prompts], kind="stable")  # similar lengths per batch
    seqs, prompt_lens = [None] * len(prompts), np.zeros(len(prompts), np.int32)
    for lo in tqdm(range(0, len(prompts), gen_batch), desc="self-distill", unit="batch"):
        idx = order[lo:lo + gen_batch]
        batch = [prompts[i] for i in idx]
        batch += [batch[-1]] * (gen_batch - len(batch))  # static batch shape
        for i, resp in zip(idx, generate_batch(target, batch, max_new, max_prompt), strict=False):
            seqs[i] = np.concatenate([prompts[i], resp]).astype(np.int32)
            prompt_lens[i] = len(prompts[i])
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    return {"tokens": np.concatenate(seqs), "offsets": offsets, "prompt_lens": prompt_lens}


def load_or_build(path: Path | None, target: Target, args) -> dict[str, np.ndarray]:
    if path is not None and path.is_file():
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    if args.prompts:
        texts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    else:
        texts = [p["prompt"] for p in build_prompts(args.samples, args.seed)]
    prompts = [target.encode(t) for t in texts[:args.samples]]
    prompts += export_prompts(Path(args.export)) * args.export_weight if args.export else []
    data = build_dataset(target, prompts, args.max_new, args.gen_batch, args.max_prompt)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **data)
    return data


def export_prompts(export_dir: Path) -> list[np.ndarray]:
    """Rejection prefixes from an annotation export: each becomes a prompt the target continues."""
    rows = [json.loads(line) for line in (export_dir / "rejections.jsonl").read_text().splitlines() if line.strip()]
    return [np.asarray(r["prefix_ids"], np.int32) for r in rows]


def batch_of(data: dict, rows: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tokens [B, T] (zero padded/truncated), lengths [B], prompt_lens [B] for the given sequence rows."""
    tokens = np.zeros((len(rows), seq_len), np.int32)
    lengths = np.zeros(len(rows), np.int32)
    for j, r in enumerate(rows):
        s = data["tokens"][data["offsets"][r]:data["offsets"][r + 1]][:seq_len]
        tokens[j, :len(s)], lengths[j] = s, len(s)
    return tokens, lengths, np.minimum(data["prompt_lens"][rows], lengths - 1)


@partial(jax.jit, static_argnames=("cfg", "capture"))
def target_features(params: dict, tokens: jax.Array, *, cfg, capture: tuple[int, ...]) -> jax.Array:
    """Frozen target features of every token: [B, T, F*H] (layers in `capture` order)."""
    b, t = tokens.shape
    _, feats, _ = forward(params, init_cache(cfg, b, t, params["embed"].dtype), tokens, jnp.zeros(b, jnp.int32),
                          cfg=cfg, capture=capture, with_logits=False)
    return jax.lax.stop_gradient(feats.transpose(1, 2, 0, 3).reshape(b, t, -1))


def cache_features(target: Target, data: dict, capture: tuple[int, ...], args) -> np.ndarray:
    """Target features of every sequence, computed once: [N, seq_len, F*H] float16 in a .npy memmap
    under --work (reused when present: the file name carries the layers and sequence length)."""
    n, width = len(data["prompt_lens"]), len(capture) * target.cfg.hidden_size
    path = Path(args.work) / f"features-{'_'.join(map(str, capture))}-{args.seq_len}-{n}.npy"
    if path.is_file():
        return np.load(path, mmap_mode="r")
    path.parent.mkdir(parents=True, exist_ok=True)
    out = np.lib.format.open_memmap(path.with_suffix(".tmp.npy"), "w+", np.float16, (n, args.seq_len, width))
    step = 8
    for lo in tqdm(range(0, n, step), desc="target features", unit="batch"):
        rows = np.arange(lo, lo + step) % n
        tokens, _, _ = batch_of(data, rows, args.seq_len)
        feats = target_features(target.params, tokens, cfg=target.cfg, capture=capture)
        out[lo:lo + step] = np.asarray(feats, np.float16)[:min(step, n - lo)]
    out.flush()
    path.with_suffix(".tmp.npy").rename(path)
    return np.load(path, mmap_mode="r")


# ---------------------------------------------------------------- losses


def sample_anchors(rng: np.random.Generator, lengths: np.ndarray, prompt_lens: np.ndarray, n: int) -> np.ndarray:
    """n anchor positions per sequence, uniform over the response: [prompt_len - 1, length - 2]."""
    lo, hi = prompt_lens - 1, np.maximum(lengths - 2, prompt_lens - 1)
    return (lo[:, None] + np.floor(rng.random((len(lengths), n)) * (hi - lo + 1)[:, None])).astype(np.int32)


def dflash_loss(params, cfg, head, feats, tokens, lengths, anchors, gamma: float, to_vocab: jax.Array):
    """Cross-entropy over block rows 1..B-1, weighted exp(-(k-1)/gamma), valid rows only.

    With a training vocabulary (head["lm_head"] holding only its columns), to_vocab maps target ids to
    its indices (-1: outside, not a label)."""
    logits = dflash.dflash_train_logits(params, cfg, head, feats, tokens, anchors)  # [B, A, S-1, V]
    idx = anchors[..., None] + jnp.arange(1, cfg.block_size)
    labels = jnp.take_along_axis(tokens, jnp.minimum(idx, tokens.shape[1] - 1).reshape(tokens.shape[0], -1), 1)
    labels = to_vocab[labels]
    valid = (idx < lengths[:, None, None]) & (labels.reshape(idx.shape) >= 0)
    labels = jnp.maximum(labels, 0)
    weight = jnp.exp(-jnp.arange(cfg.block_size - 1) / gamma) * valid
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels.reshape(idx.shape))
    acc = (jnp.argmax(logits, -1) == labels.reshape(idx.shape)) * valid
    return (ce * weight).sum() / weight.sum(), acc[..., 0].sum() / valid[..., 0].sum()


def eagle3_loss(params, cfg, embed, t2d, feats, tokens, lengths, prompt_lens, steps: int):
    """Cross-entropy of every TTT step on rows whose label lies in the response."""
    logits = eagle3.eagle3_train_logits(params, cfg, embed, feats, tokens, steps)  # [B, steps, T, Vd]
    labels, valid = eagle3.eagle3_labels(tokens, t2d, steps)
    idx = jnp.arange(tokens.shape[1])[None, None, :] + 2 + jnp.arange(steps)[None, :, None]
    valid = valid & (idx < lengths[:, None, None]) & (idx >= prompt_lens[:, None, None])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    acc = (jnp.argmax(logits, -1) == labels) & valid
    return (ce * valid).sum() / jnp.maximum(valid.sum(), 1), acc[:, 0].sum() / jnp.maximum(valid[:, 0].sum(), 1)


# ---------------------------------------------------------------- training loop


def optimizer(lr: float, steps: int) -> optax.GradientTransformation:
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, int(0.04 * steps)), max(steps, 2), lr * 0.05)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))


def save_state(work: Path, params, opt_state, step: int) -> None:
    leaves = jax.tree_util.tree_flatten_with_path((params, opt_state))[0]
    work.mkdir(parents=True, exist_ok=True)
    save_file({jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}, str(work / "state.safetensors"))
    (work / "state.json").write_text(json.dumps({"step": step}))


def load_state(work: Path, params, opt_state):
    """(params, opt_state, step) from work/, or the given ones at step 0 when there is nothing to resume."""
    if not (work / "state.json").is_file():
        return params, opt_state, 0
    saved = load_file(str(work / "state.safetensors"))
    paths, tree = jax.tree_util.tree_flatten_with_path((params, opt_state))
    leaves = [jnp.asarray(saved[jax.tree_util.keystr(p)], dtype=v.dtype) for p, v in paths]
    params, opt_state = jax.tree_util.tree_unflatten(tree, leaves)
    return params, opt_state, json.loads((work / "state.json").read_text())["step"]


def train(name: str, loss_fn, params, data: dict, args, work: Path, features: np.ndarray | None = None):
    """Optimize params of loss_fn(params, batch) -> (loss, acc); returns (params, log).

    batch: tokens [B, T], lengths [B], prompt_lens [B], anchors [B, A], and feats [B, T, F*H] when
    `features` (precomputed for every sequence, see cache_features) is given."""
    opt = optimizer(args.lr, args.steps)
    params, opt_state, step = load_state(work, params, opt.init(params))
    first = step

    @jax.jit
    def update(params, opt_state, batch):
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc

    n_seq, t0, deadline = len(data["prompt_lens"]), time.time(), time.time() + 60 * args.max_minutes
    log, bar = [], tqdm(total=args.steps, initial=step, desc=f"train {name}", unit="step")
    while step < args.steps and time.time() < deadline:
        rng = np.random.default_rng([args.seed, step])
        rows = rng.choice(n_seq, args.batch, replace=n_seq < args.batch)
        tokens, lengths, prompt_lens = batch_of(data, rows, args.seq_len)
        batch = {"tokens": tokens, "lengths": lengths, "prompt_lens": prompt_lens,
                 "anchors": sample_anchors(rng, lengths, prompt_lens, args.anchors)}
        if features is not None:
            batch["feats"] = np.asarray(features[rows])
        params, opt_state, loss, acc = update(params, opt_state, batch)
        step += 1
        if step % 25 == 0 or step == args.steps:
            loss, acc = float(loss), float(acc)
            log.append({"step": step, "loss": loss, "acc_pos1": acc, "s": round(time.time() - t0, 1)})
            tok_s = args.batch * args.seq_len * (step - first) / max(1e-9, time.time() - t0)
            bar.set_postfix(loss=f"{loss:.3f}", acc_pos1=f"{acc:.3f}", tok_s=f"{tok_s:.0f}")
        if step % args.save_every == 0:
            save_state(work, params, opt_state, step)
        bar.update(1)
    bar.close()
    save_state(work, params, opt_state, step)
    return params, {"steps": step, "wall_s": round(time.time() - t0, 1), "log": log}


# ---------------------------------------------------------------- drafters


def train_dflash(target: Target, data: dict, args, work: Path) -> Path:
    ids = dflash.default_target_layer_ids(target.cfg.num_layers, args.features)
    if args.init:
        drafter = dflash.load(target, args.init)
        cfg, params = drafter.cfg, drafter.params
    else:
        cfg, params = dflash.init_dflash(target, args.layers, args.block_size, ids, seed=args.seed,
                                         intermediate_size=args.intermediate)
    params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    head, tcfg, tparams = shared_head(target.params), target.cfg, target.params
    head, to_vocab = training_head(head, data, args.train_vocab)

    def loss_fn(p, b):
        feats = b["feats"] if "feats" in b else target_features(tparams, b["tokens"], cfg=tcfg,
                                                                  capture=cfg.target_layer_ids)
        return dflash_loss(p, cfg, head, feats.astype(jnp.float32), b["tokens"], b["lengths"], b["anchors"],
                           args.gamma, to_vocab)

    features = cache_features(target, data, cfg.target_layer_ids, args) if args.cache_features else None
    params, log = train("dflash", loss_fn, params, data, args, work / "dflash", features)
    out = dflash.save_dflash(Path(args.out) / f"{args.name}-dflash", cfg, params, dtype="bfloat16")
    write_card(out, "dflash", args, data, log, {"layers": cfg.body.num_layers, "block_size": cfg.block_size,
                                                "target_layer_ids": list(cfg.target_layer_ids),
                                                "intermediate_size": cfg.body.intermediate_size})
    return out


def training_head(head: dict, data: dict, restrict: bool) -> tuple[dict, jax.Array]:
    """The shared head for training and a target-id -> logit-column map. restrict: softmax only over the
    tokens present in the data (a sampled-softmax shortcut that cuts the LM-head cost on a CPU; the
    saved drafter is unchanged and drafts over the full vocabulary)."""
    vocab_size = head["embed"].shape[0]
    if not restrict:
        return head, jnp.arange(vocab_size, dtype=jnp.int32)
    vocab = np.unique(data["tokens"])
    w = head["lm_head"][:, vocab] if "lm_head" in head else head["embed"][vocab].T
    to_vocab = np.full(vocab_size, -1, np.int32)
    to_vocab[vocab] = np.arange(len(vocab))
    return {"embed": head["embed"], "lm_head": w}, jnp.asarray(to_vocab)


def train_eagle3(target: Target, data: dict, args, work: Path) -> Path:
    if args.init:
        drafter = eagle3.load(target, args.init)
        cfg, params, d2t = drafter.cfg, drafter.params, drafter.d2t
    else:
        counts = np.bincount(data["tokens"], minlength=target.cfg.vocab_size)
        cfg, params, d2t = eagle3.init_eagle3(target, args.draft_vocab, counts, seed=args.seed,
                                              intermediate_size=args.intermediate)
    params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    t2d = jnp.asarray(eagle3.target_to_draft(np.asarray(d2t), target.cfg.vocab_size))
    embed, tcfg, tparams = params.get("embed", target.params["embed"]), target.cfg, target.params

    def loss_fn(p, b):
        feats = b["feats"] if "feats" in b else target_features(tparams, b["tokens"], cfg=tcfg,
                                                                  capture=cfg.feature_layers)
        return eagle3_loss(p, cfg, embed, t2d, feats.astype(jnp.float32), b["tokens"], b["lengths"],
                           b["prompt_lens"], args.ttt_steps)

    features = cache_features(target, data, cfg.feature_layers, args) if args.cache_features else None
    params, log = train("eagle3", loss_fn, params, data, args, work / "eagle3", features)
    out = eagle3.save_eagle3(Path(args.out) / f"{args.name}-eagle3", cfg, params, np.asarray(d2t), dtype="bfloat16")
    write_card(out, "eagle3", args, data, log, {"draft_vocab_size": cfg.draft_vocab_size,
                                                "feature_layers": list(cfg.feature_layers),
                                                "ttt_steps": args.ttt_steps,
                                                "intermediate_size": cfg.body.intermediate_size})
    return out


def write_card(out: Path, kind: str, args, data: dict, log: dict, arch: dict) -> None:
    """training.json beside the checkpoint: data, steps, wall time, hardware, architecture, loss curve."""
    dev = jax.devices()[0]
    card = {"drafter": kind, "target": args.target or "embedded SmolLM2-135M-Instruct", "architecture": arch,
            "data": {"sequences": int(len(data["prompt_lens"])), "tokens": int(len(data["tokens"])),
                     "prompts": "experiments/train_data.py (templated math, stdlib code tasks, instructions)",
                     "responses": f"target greedy, max {args.max_new} new tokens", "seed": args.seed,
                     "sha256": hashlib.sha256(data["tokens"].tobytes()).hexdigest()[:16]},
            "training": {"steps": log["steps"], "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
                         "anchors": args.anchors, "gamma": args.gamma, "wall_s": log["wall_s"]},
            "hardware": {"backend": jax.default_backend(), "device": dev.device_kind, "host": platform.node()},
            "loss_curve": log["log"]}
    (out / "training.json").write_text(json.dumps(card, indent=1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", choices=["dflash", "eagle3", "both", "none"], default="both",
                    help="none: only build the dataset")
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory overriding the checkpoint's")
    ap.add_argument("--prompts", default=None, help="JSONL of {prompt}; default: experiments/train_data.py")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--max-prompt", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--data", default=None, help="dataset .npz: loaded if present, else built and saved here")
    ap.add_argument("--export", default=None, help="annotation export dir whose rejection prefixes to add")
    ap.add_argument("--export-weight", type=int, default=20)
    ap.add_argument("--init", default=None, help="fine-tune this checkpoint instead of a fresh drafter")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--train-vocab", action="store_true", help="DFlash: softmax over the data's tokens only")
    ap.add_argument("--cache-features", action="store_true", help="compute target features once (memmap)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--features", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--max-minutes", type=float, default=math.inf)
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="smollm2-135m")
    ap.add_argument("--out", default="checkpoints")
    ap.add_argument("--work", default="out/train", help="resumable state lives here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    target = load_target(args.target, args.dtype, args.tokenizer)
    data = load_or_build(Path(args.data) if args.data else None, target, args)
    print(f"data: {len(data['prompt_lens'])} sequences, {len(data['tokens'])} tokens", flush=True)
    work = Path(args.work)
    kinds = {"both": ["dflash", "eagle3"], "none": []}.get(args.drafter, [args.drafter])
    trainers = {"dflash": train_dflash, "eagle3": train_eagle3}
    for kind in kinds:
        print("saved", trainers[kind](target, data, args, work), flush=True)


if __name__ == "__main__":
    main()
