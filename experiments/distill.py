"""Self-distillation dataset: training prompts answered by the target's own greedy decoding, in shards.

    python -m experiments.distill --out data/distill --prompts 12000 [--max-new 192] [--batch 32] [--shard-size 256]

Prompts come from experiments.train_data.build_prompts (seeded; suites held out); responses from the engine's
lean batched greedy path (engine.decode.greedy_batch: the `ar` decoding without drafting or traces). The
dataset is a directory of shards plus manifest.json (prompt source, mix, seed, target, counts, sha256 per
shard). Shard i holds prompts [i*S, (i+1)*S) of the prompt list (those over --max-prompt tokens are skipped
and counted) as tokens (uint16 when the vocabulary fits), offsets [n+1], prompt_lens [n] and prompt_index [n].
A shard is written to a temporary file and renamed, then the manifest is rewritten the same way: an
interrupted run (Ctrl-C, a killed process) loses at most the shard in progress, and running the same command
again resumes after the last finished shard. A larger --prompts appends shards to an existing dataset.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from engine import load_target
from engine.decode import greedy_batch
from engine.drafters import dflash, eagle3
from engine.target import Target
from experiments.suites import load_suite
from experiments.train_data import build_prompts

MANIFEST = "manifest.json"


def feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """Target layers kept with the data: those the default DFlash (5 features) and EAGLE-3 drafters read."""
    ids = dflash.default_target_layer_ids(num_target_layers, 5) + eagle3.default_feature_layers(num_target_layers)
    return tuple(sorted(set(ids)))
FIXED = ("target", "dtype", "seed", "mix", "max_new", "max_prompt", "shard_size", "prompt_source")


class DatasetError(ValueError):
    """A dataset directory that does not match the request or fails its checksums."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _save_npy(path: Path, rows: list[np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.save(f, np.concatenate(rows))


def features_name(i: int, layers: tuple[int, ...]) -> str:
    """The (uncommitted) target-feature sidecar of shard i: float16 [shard tokens, F*H] aligned with its tokens."""
    return f"shard-{i:05d}.features-{'_'.join(map(str, layers))}.npy"


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)


def read_manifest(out: Path) -> dict | None:
    path = out / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.npz"


def encode_shard(prompts: list[np.ndarray], responses: list[np.ndarray], index: list[int],
                 vocab_size: int) -> dict[str, np.ndarray]:
    """A shard's arrays: every sequence (prompt + response) back to back."""
    seqs = [np.concatenate([p, r]) for p, r in zip(prompts, responses, strict=True)]
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
    return {"tokens": np.concatenate(seqs).astype(dtype) if seqs else np.zeros(0, dtype),
            "offsets": np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64),
            "prompt_lens": np.array([len(p) for p in prompts], np.int32),
            "prompt_index": np.array(index, np.int32)}


def distill_shard(target: Target, prompts: list[np.ndarray], max_new: int, batch: int, capture: tuple[int, ...] = (),
                  on_batch=None) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Greedy responses (and, with capture, features: see greedy_batch) for prompts, in batches of similar
    length (a fixed batch size: the last batch is padded with copies, so shapes repeat and nothing recompiles
    beyond one program per cache bucket). on_batch(sequences, response tokens) is called after each batch."""
    order = np.argsort([len(p) for p in prompts], kind="stable")
    responses: list = [None] * len(prompts)
    features: list | None = [None] * len(prompts) if capture else None
    for lo in range(0, len(order), batch):
        rows = list(order[lo:lo + batch])
        group = [prompts[i] for i in rows] + [prompts[rows[-1]]] * (batch - len(rows))
        resp, feats = greedy_batch(target, group, max_new, capture=capture)
        for j, i in enumerate(rows):
            responses[i] = resp[j]
            if capture:
                features[i] = feats[j]
        if on_batch is not None:
            on_batch(len(rows), sum(len(responses[i]) for i in rows))
    return responses, features


def run(out: Path, n_prompts: int, *, target: Target, seed: int = 0, mix: dict | None = None, max_new: int = 192,
        max_prompt: int = 384, batch: int = 32, shard_size: int = 256, features: bool = True,
        suite: str | None = None) -> dict:
    """Generate (or resume, or extend) the dataset in `out` up to n_prompts prompts; returns the manifest.

    features: also keep the target features of every token (feature_layers() of the target, float16, one .npy
    per shard, not committed: ~7 KB per token for SmolLM2) so drafter training needs no feature pass.
    suite: answer the first n_prompts prompts of an evaluation suite instead (an offline evaluation set for
    tau_est per suite: never train on it)."""
    capture = feature_layers(target.cfg.num_layers) if features else ()
    settings = {"target": target.name, "dtype": target.dtype, "seed": seed, "mix": mix, "max_new": max_new,
                "max_prompt": max_prompt, "shard_size": shard_size,
                "prompt_source": f"suite:{suite}" if suite else "experiments.train_data.build_prompts"}
    manifest = read_manifest(out) or {**settings, "shards": []}
    changed = [k for k in FIXED if manifest.get(k) != settings[k]]
    if changed:
        were = ", ".join(f"{k}={manifest.get(k)!r}" for k in changed)
        raise DatasetError(f"{out} was made with other settings ({were}): resume with those, or use another --out")
    out.mkdir(parents=True, exist_ok=True)
    if manifest["shards"] and manifest["shards"][-1]["prompts"] < shard_size:
        manifest["shards"].pop()  # a short last shard is redone in full when the dataset grows
    rows = ([{"prompt": r["prompt"], "kind": suite} for r in load_suite(suite)[:n_prompts]] if suite
            else build_prompts(n_prompts, seed, mix))
    done = len(manifest["shards"]) * shard_size
    todo = range(done, len(rows), shard_size)
    bar = tqdm(total=len(rows), initial=min(done, len(rows)), unit="seq", desc="self-distill", smoothing=0.1)
    t_run, n_tok = time.perf_counter(), 0

    def on_batch(n_seq: int, n_new: int) -> None:
        nonlocal n_tok
        n_tok += n_new
        bar.update(n_seq)
        bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t_run):.0f}", tokens=n_tok)

    for lo in todo:
        idx = list(range(lo, min(lo + shard_size, len(rows))))
        encoded = [target.encode(rows[i]["prompt"]) for i in idx]
        keep = [j for j, ids in enumerate(encoded) if len(ids) <= max_prompt]
        prompts = [encoded[j] for j in keep]
        t0 = time.perf_counter()
        responses, feats = distill_shard(target, prompts, max_new, batch, capture, on_batch) if prompts else ([], [])
        bar.update(len(idx) - len(prompts))
        arrays = encode_shard(prompts, responses, [idx[j] for j in keep], target.cfg.vocab_size)
        path = out / shard_name(lo // shard_size)
        if feats:
            _atomic_write(out / features_name(lo // shard_size, capture), lambda p, f=feats: _save_npy(p, f))
        _atomic_write(path, lambda p, a=arrays: _save_npz(p, a))
        n_resp = int(sum(len(r) for r in responses))
        manifest["shards"].append({
            "file": path.name, "first_prompt": lo, "prompts": len(idx), "sequences": len(prompts),
            "skipped_long": len(idx) - len(prompts), "tokens": int(len(arrays["tokens"])), "response_tokens": n_resp,
            "kinds": {k: sum(rows[idx[j]]["kind"] == k for j in keep) for k in sorted({r["kind"] for r in rows})},
            "seconds": round(time.perf_counter() - t0, 1), "device": jax.devices()[0].device_kind,
            "feature_layers": list(capture),
            "sha256": _sha256(path)})
        _atomic_write(out / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=1)))
    bar.close()
    return manifest


def load_dataset(*dirs: str | Path) -> dict:
    """Every shard of the given dataset directories, checksums verified: {tokens int32 flat, offsets [N+1],
    prompt_lens [N], shard_ranges [(first, end) sequence rows per shard], feature_files [path or None per shard],
    feature_layers (of the sidecars)}."""
    tokens, lengths, prompt_lens, ranges, feature_files, layers, n = [], [], [], [], [], (), 0
    for d in map(Path, dirs):
        manifest = read_manifest(d)
        if manifest is None:
            raise DatasetError(f"{d} has no {MANIFEST}: not a distill dataset (python -m experiments.distill)")
        for i, shard in enumerate(manifest["shards"]):
            path = d / shard["file"]
            if not path.is_file() or _sha256(path) != shard["sha256"]:
                raise DatasetError(f"{path} is missing or does not match its checksum in {d / MANIFEST}")
            with np.load(path, allow_pickle=False) as f:
                tokens.append(f["tokens"].astype(np.int32))
                lengths.append(np.diff(f["offsets"]))
                prompt_lens.append(f["prompt_lens"])
            ranges.append((n, n + len(prompt_lens[-1])))
            n += len(prompt_lens[-1])
            shard_layers = tuple(shard.get("feature_layers") or ())
            sidecar = d / features_name(i, shard_layers) if shard_layers else None
            feature_files.append(sidecar if sidecar is not None and sidecar.is_file() else None)
            layers = layers or shard_layers
            if shard_layers and shard_layers != layers:
                feature_files[-1] = None  # sidecars with other layers than the first shard's are not used
    lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return {"tokens": np.concatenate(tokens) if tokens else np.zeros(0, np.int32),
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "prompt_lens": np.concatenate(prompt_lens) if prompt_lens else np.zeros(0, np.int32),
            "shard_ranges": ranges, "feature_files": feature_files, "feature_layers": layers}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="data/distill")
    ap.add_argument("--prompts", type=int, required=True, help="dataset size in prompts (resumes / extends)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--max-prompt", type=int, default=384)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--shard-size", type=int, default=256)
    ap.add_argument("--target", default=None)
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory overriding the checkpoint's")
    ap.add_argument("--suite", default=None, help="distill an evaluation suite's prompts (tau_est per suite)")
    ap.add_argument("--no-features", action="store_true", help="do not keep target features next to the shards")
    args = ap.parse_args(argv)
    target = load_target(args.target, "float32", args.tokenizer)
    manifest = run(Path(args.out), args.prompts, target=target, seed=args.seed, max_new=args.max_new,
                   max_prompt=args.max_prompt, batch=args.batch, shard_size=args.shard_size,
                   features=not args.no_features, suite=args.suite)
    n_seq = sum(s["sequences"] for s in manifest["shards"])
    print(f"{args.out}: {len(manifest['shards'])} shards, {n_seq} sequences, "
          f"{sum(s['tokens'] for s in manifest['shards'])} tokens", flush=True)


if __name__ == "__main__":
    main()
