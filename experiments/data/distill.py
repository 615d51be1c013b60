"""Self-distillation dataset: training prompts answered by the target's own greedy decoding, in shards.

    python -m experiments.data.distill --out data/distill --prompts 12000 [--mix math=0.45,code=0.3,...] [--max-new 192]
        [--slots 32] [--shard-size 256]

Prompts come from experiments.data.prompts.build_prompts (seeded; suites held out); responses from the engine's
lean greedy path with continuous batching (engine.continuous: the `ar` decoding without drafting or traces). The
dataset is a directory of shards plus manifest.json (prompt source, mix, seed, target, counts, sha256 per
shard). Shard i holds prompts [i*S, (i+1)*S) of the prompt list (those over --max-prompt tokens are skipped
and counted) as tokens (uint16 when the vocabulary fits), offsets [n+1], prompt_lens [n] and prompt_index [n].
A shard is written to a temporary file and renamed, then the manifest is rewritten the same way: an
interrupted run (Ctrl-C, a killed process) loses only the shards in progress, and running the same command
again resumes after the last finished shard. A larger --prompts appends shards to an existing dataset.

    python -m experiments.data.distill --out data/distill-v3 --add-features    # feature sidecars for a dataset without

computes the target features of an existing dataset (one prefill per sequence, shard by shard, resumable), so
training reads them instead of prefilling every batch again in every epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from engine import load_target
from engine.cache import init_cache
from engine.continuous import cache_len_for_queue, greedy_continuous
from engine.drafters import dflash_config, eagle3_config
from engine.model import forward
from engine.target import Target
from experiments.data.prompts import build_prompts
from experiments.suites import SealedSplitError, check_not_test, load_suite
from storage.digest import sha256

MANIFEST = "manifest.json"
STEPS_PER_CALL = 8  # greedy steps per device call: the host sees EOS at most this late


def feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """Target layers kept with the data: those the default DFlash (5 features) and EAGLE-3 drafters read, and the
    final-normed hidden state (layer id N-1: the target's next-token distribution for soft targets)."""
    ids = (dflash_config.default_target_layer_ids(num_target_layers, 5)
           + eagle3_config.default_feature_layers(num_target_layers))
    return tuple(sorted({*ids, num_target_layers - 1}))


@partial(jax.jit, static_argnames=("cfg", "capture"))
def target_features(params: dict, tokens: jax.Array, *, cfg, capture: tuple[int, ...]) -> jax.Array:
    """Frozen target features of every token: [B, T, F*H] (layers in `capture` order)."""
    b, t = tokens.shape
    _, feats, _ = forward(params, init_cache(cfg, b, t, params["embed"].dtype), tokens, jnp.zeros(b, jnp.int32),
                          cfg=cfg, capture=capture, with_logits=False)
    return jax.lax.stop_gradient(feats.transpose(1, 2, 0, 3).reshape(b, t, -1))


def prefill_features(target: Target, seqs: list[np.ndarray], capture: tuple[int, ...], batch: int = 8,
                     bucket: int = 64) -> list[np.ndarray]:
    """Target features ([len, F*H] float16) of whole sequences, one prefill each: longest first, `batch` at a time,
    padded to a multiple of `bucket` (few compiled shapes); rows past a sequence's end are never used."""
    out: list = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for lo in range(0, len(order), batch):
        rows = order[lo:lo + batch]
        width = -(-len(seqs[rows[0]]) // bucket) * bucket
        tokens = np.zeros((batch, width), np.int32)
        for j, i in enumerate(rows):
            tokens[j, :len(seqs[i])] = seqs[i]
        feats = np.asarray(target_features(target.params, jnp.asarray(tokens), cfg=target.cfg, capture=capture))
        for j, i in enumerate(rows):
            out[i] = feats[j, :len(seqs[i])].astype(np.float16)
    return out


def add_features(out: Path, target: Target, batch: int = 8) -> dict:
    """Give every shard of the dataset in `out` its feature sidecar (feature_layers(), one prefill per sequence),
    shard by shard: a shard that has it is skipped, each sidecar and then the manifest are written atomically, so
    an interrupted run resumes. Returns the manifest (each shard's feature_layers and feature_seconds set)."""
    manifest = read_manifest(out)
    if manifest is None:
        raise DatasetError(f"{out} has no {MANIFEST}: not a distill dataset (python -m experiments.data.distill)")
    if manifest["target"] != target.name:
        raise DatasetError(f"{out} was made by {manifest['target']}, not {target.name}: its features would not match")
    capture = feature_layers(target.cfg.num_layers)
    for i, shard in enumerate(tqdm(manifest["shards"], unit="shard", desc="features")):
        sidecar = out / features_name(i, capture)
        if tuple(shard.get("feature_layers") or ()) == capture and sidecar.is_file():
            continue
        with np.load(out / shard["file"], allow_pickle=False) as f:
            tokens, offsets = f["tokens"].astype(np.int32), f["offsets"]
        t0 = time.perf_counter()
        feats = prefill_features(target, [tokens[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)],
                                 capture, batch)
        _atomic_write(sidecar, lambda p, f=feats: _save_npy(p, f))
        shard["feature_layers"], shard["feature_seconds"] = list(capture), round(time.perf_counter() - t0, 1)
        _atomic_write(out / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=1)))
    return manifest
FIXED = ("target", "dtype", "seed", "mix", "max_new", "max_prompt", "shard_size", "prompt_source")


class DatasetError(ValueError):
    """A dataset directory that does not match the request or fails its checksums."""


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


def greedy_responses(target: Target, prompts: list[np.ndarray], max_new: int, slots: int = 32,
                     capture: tuple[int, ...] = ()) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Greedy responses (and, with capture, features: see engine.continuous) for a list of prompts, in order."""
    longest = max((len(p) for p in prompts), default=1)
    cache_len = cache_len_for_queue(longest, max_new, STEPS_PER_CALL)
    responses: list = [None] * len(prompts)
    features: list | None = [None] * len(prompts) if capture else None
    for i, resp, feats in greedy_continuous(target, enumerate(prompts), max_new, slots=min(slots, len(prompts)),
                                            cache_len=cache_len, steps_per_call=STEPS_PER_CALL, capture=capture):
        responses[i] = resp
        if capture:
            features[i] = feats
    return responses, features


def prompts_hash(rows: list[dict], idx) -> str:
    """sha256 of a shard's prompt texts: a resumed or extended dataset checks its shards' prompts are unchanged."""
    return sha256("\x00".join(rows[i]["prompt"] for i in idx), short=True)


def _write_shard(out: Path, manifest: dict, number: int, pending: dict, done: dict, capture: tuple[int, ...],
                 vocab_size: int, seconds: float, kinds: list[str]) -> None:
    """Write shard `number` (its prompts all answered), then the manifest; both atomically, shard first."""
    idx, keep, encoded, kind_of = pending["idx"], pending["keep"], pending["encoded"], pending["kinds"]
    prompts = [encoded[i] for i in keep]
    responses = [done[i][0] for i in keep]
    arrays = encode_shard(prompts, responses, keep, vocab_size)
    path = out / shard_name(number)
    if capture:
        feats = [done[i][1] for i in keep]
        _atomic_write(out / features_name(number, capture), lambda p, f=feats: _save_npy(p, f))
    _atomic_write(path, lambda p, a=arrays: _save_npz(p, a))
    manifest["shards"].append({
        "file": path.name, "first_prompt": idx[0], "prompts": len(idx), "sequences": len(keep),
        "skipped_long": len(idx) - len(keep), "tokens": int(len(arrays["tokens"])),
        "response_tokens": int(sum(len(r) for r in responses)),
        "kinds": {k: sum(kind_of[i] == k for i in keep) for k in kinds},
        "seconds": round(seconds, 1), "device": jax.devices()[0].device_kind, "feature_layers": list(capture),
        "prompts_sha256": pending["prompts_sha256"], "sha256": sha256(path)})
    _atomic_write(out / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=1)))


def suite_slice(source: str) -> tuple[str, str | None] | None:
    """(suite, slice) of a suite dataset's prompt_source ("suite:gsm8k/dev"; slice None in a legacy "suite:gsm8k"),
    None for a training dataset's."""
    if not source.startswith("suite:"):
        return None
    suite, _, split = source.removeprefix("suite:").partition("/")
    return suite, split or None


def check_suite_data(dirs: list[str | Path], *, training: bool, what: str) -> None:
    """The leak guard on datasets: `what` trains (training=True) on no dataset of suite prompts, and selects
    (checkpoints, serving rules) on the dev slice of a suite only; raises SealedSplitError naming the dataset."""
    for d in map(Path, dirs):
        manifest = read_manifest(d)
        found = manifest and suite_slice(manifest["prompt_source"])
        if not found:
            continue
        suite, split = found
        if training:
            raise SealedSplitError(f"{d} holds prompts of the {suite} suite ({manifest['prompt_source']}): {what} "
                                   "never trains on evaluation prompts; it evaluates on them (--evaluate)")
        if split is None:
            raise SealedSplitError(f"{d} records no slice of the {suite} suite: rebuild it with python -m "
                                   f"experiments.data.distill --suite {suite} --out {d} (the dev slice)")
        check_not_test(split, f"{what} on {d}")


def prompt_rows(source: str, n_prompts: int, seed: int, mix: dict | None) -> list[dict]:
    """The first n_prompts prompts {prompt, kind, ...} of a dataset's prompt source (a manifest's prompt_source)."""
    found = suite_slice(source)
    if found:
        suite, split = found
        return [{"prompt": r["prompt"], "kind": suite} for r in load_suite(suite, split=split)[:n_prompts]]
    return build_prompts(n_prompts, seed, mix)


def row_kinds(*dirs: str | Path) -> np.ndarray:
    """The prompt kind (math, code, ..., or the suite) of every sequence of the datasets, in load_dataset's row
    order, from their prompt sources rebuilt. A shard whose prompts hash differs from the source's now (or that
    predates prompt hashes) gives "unknown": its generators have changed since, so the kinds cannot be trusted."""
    kinds = []
    for d in map(Path, dirs):
        manifest = read_manifest(d)
        if manifest is None:
            raise DatasetError(f"{d} has no {MANIFEST}: not a distill dataset (python -m experiments.data.distill)")
        shards = manifest["shards"]
        n = max((s["first_prompt"] + s["prompts"] for s in shards), default=0)
        rows = prompt_rows(manifest["prompt_source"], n, manifest["seed"], manifest["mix"])
        for shard in shards:
            with np.load(d / shard["file"], allow_pickle=False) as f:
                index = f["prompt_index"]
            idx = range(shard["first_prompt"], shard["first_prompt"] + shard["prompts"])
            trusted = manifest["prompt_source"].startswith("suite:") or (
                "prompts_sha256" in shard and shard["prompts_sha256"] == prompts_hash(rows, idx))
            kinds += [rows[i]["kind"] if trusted else "unknown" for i in index]
    return np.array(kinds, dtype=object)


def run(out: Path, n_prompts: int, *, target: Target, seed: int = 0, mix: dict | None = None, max_new: int = 192,
        max_prompt: int = 384, slots: int = 32, shard_size: int = 256, features: bool = True,
        suite: str | None = None) -> dict:
    """Generate (or resume, or extend) the dataset in `out` up to n_prompts prompts; returns the manifest.

    One continuous-batching stream (engine.continuous) runs across shards: prompts are admitted in order, and
    shard i is written as soon as all its prompts are answered, so a killed run loses only unfinished shards.
    features: also keep the target features of every token (feature_layers() of the target, float16, one .npy
    per shard, not committed: ~7 KB per token for SmolLM2) so drafter training needs no feature pass.
    suite: answer the first n_prompts prompts of an evaluation suite's dev slice instead (an offline evaluation set
    for tau_est per suite, for choosing checkpoints and serving rules; train_drafter refuses to train on it). The
    sealed test slice is never distilled."""
    capture = feature_layers(target.cfg.num_layers) if features else ()
    settings = {"target": target.name, "dtype": target.dtype, "seed": seed, "mix": mix, "max_new": max_new,
                "max_prompt": max_prompt, "shard_size": shard_size,
                "prompt_source": f"suite:{suite}/dev" if suite else "experiments.data.prompts.build_prompts"}
    manifest = read_manifest(out) or {**settings, "shards": []}
    changed = [k for k in FIXED if manifest.get(k) != settings[k]]
    if changed:
        were = ", ".join(f"{k}={manifest.get(k)!r}" for k in changed)
        raise DatasetError(f"{out} was made with other settings ({were}): resume with those, or use another --out")
    out.mkdir(parents=True, exist_ok=True)
    if manifest["shards"] and manifest["shards"][-1]["prompts"] < shard_size:
        manifest["shards"].pop()  # a short last shard is redone in full when the dataset grows
    rows = prompt_rows(settings["prompt_source"], n_prompts, seed, mix)
    kinds = sorted({r["kind"] for r in rows})
    for shard in manifest["shards"]:
        idx = range(shard["first_prompt"], shard["first_prompt"] + shard["prompts"])
        if "prompts_sha256" in shard and shard["prompts_sha256"] != prompts_hash(rows, idx):
            raise DatasetError(f"the prompts of {out / shard['file']} are not the ones the prompt source gives now "
                               "(its generators changed): extend it with the code that made it, or use another --out")
    first = len(manifest["shards"])
    numbers = range(first, -(-len(rows) // shard_size))
    pending: dict[int, dict] = {}  # shard number -> its prompts, encoded when the stream reaches it
    done: dict[int, tuple] = {}  # prompt index -> (response, features)
    bar = tqdm(total=len(rows), initial=min(first * shard_size, len(rows)), unit="seq", desc="self-distill",
               smoothing=0.05)
    t_run, t_shard, n_tok = time.perf_counter(), time.perf_counter(), 0

    def queue():
        for number in numbers:
            idx = list(range(number * shard_size, min((number + 1) * shard_size, len(rows))))
            encoded = {i: target.encode(rows[i]["prompt"]) for i in idx}
            keep = [i for i in idx if len(encoded[i]) <= max_prompt]
            pending[number] = {"idx": idx, "keep": keep, "encoded": encoded,
                               "kinds": {i: rows[i]["kind"] for i in idx}, "prompts_sha256": prompts_hash(rows, idx)}
            bar.update(len(idx) - len(keep))
            yield from ((i, encoded[i]) for i in keep)

    def flush() -> None:
        nonlocal t_shard
        while pending:
            number = min(pending)
            if any(i not in done for i in pending[number]["keep"]):
                return
            shard = pending.pop(number)
            now = time.perf_counter()
            _write_shard(out, manifest, number, shard, done, capture, target.cfg.vocab_size, now - t_shard, kinds)
            t_shard = now
            for i in shard["keep"]:
                del done[i]

    stream = greedy_continuous(target, queue(), max_new, slots=slots, steps_per_call=STEPS_PER_CALL,
                               cache_len=cache_len_for_queue(max_prompt, max_new, STEPS_PER_CALL), capture=capture)
    for i, response, feats in stream:
        done[i] = (response, feats)
        n_tok += len(response)
        bar.update(1)
        bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t_run):.0f}", tokens=n_tok)
        flush()
    flush()  # shards whose prompts were all too long
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
            raise DatasetError(f"{d} has no {MANIFEST}: not a distill dataset (python -m experiments.data.distill)")
        for i, shard in enumerate(manifest["shards"]):
            path = d / shard["file"]
            if not path.is_file() or sha256(path) != shard["sha256"]:
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


def parse_mix(text: str) -> dict[str, float]:
    """'math=0.45,code=0.3' -> {'math': 0.45, 'code': 0.3}."""
    try:
        return {k.strip(): float(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--mix wants kind=weight pairs separated by commas, got {text!r}") from e


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="data/distill")
    ap.add_argument("--prompts", type=int, default=None, help="dataset size in prompts (resumes / extends)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", type=parse_mix, default=None, help="prompt kinds' weights, e.g. math=0.45,code=0.3,"
                    "sharegpt=0.15,chat=0.1 (default: experiments.data.prompts.DEFAULT_MIX)")
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--max-prompt", type=int, default=384)
    ap.add_argument("--slots", type=int, default=32, help="sequences decoded at once (continuous batching)")
    ap.add_argument("--shard-size", type=int, default=256)
    ap.add_argument("--target", default=None)
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory overriding the checkpoint's")
    ap.add_argument("--suite", default=None,
                    help="distill an evaluation suite's dev-slice prompts (tau_est per suite; never trained on)")
    ap.add_argument("--no-features", action="store_true", help="do not keep target features next to the shards")
    ap.add_argument("--add-features", action="store_true",
                    help="compute the feature sidecars of an existing dataset's shards (resumable), generate nothing")
    args = ap.parse_args(argv)
    if (args.prompts is None) != args.add_features:
        ap.error("give --prompts to generate, or --add-features to compute an existing dataset's features")
    target = load_target(args.target, "float32", args.tokenizer)
    if args.add_features:
        manifest = add_features(Path(args.out), target)
        print(f"{args.out}: features of {len(manifest['shards'])} shards, "
              f"{sum(s.get('feature_seconds', 0) for s in manifest['shards']):,.0f} s", flush=True)
        return
    manifest = run(Path(args.out), args.prompts, target=target, seed=args.seed, mix=args.mix, max_new=args.max_new,
                   max_prompt=args.max_prompt, slots=args.slots, shard_size=args.shard_size,
                   features=not args.no_features, suite=args.suite)
    n_seq = sum(s["sequences"] for s in manifest["shards"])
    print(f"{args.out}: {len(manifest['shards'])} shards, {n_seq} sequences, "
          f"{sum(s['tokens'] for s in manifest['shards'])} tokens", flush=True)


if __name__ == "__main__":
    main()
