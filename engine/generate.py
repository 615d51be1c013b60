"""Command-line generation with any drafter, optionally checked against the `ar` baseline.

    python -m engine.generate --prompt "..." --drafter ngram --k 8 --max-new-tokens 128 [--json]
    python -m engine.generate --prompt-file prompts.jsonl --drafter ngram --json --check-lossless [--batch 4]
    NPROC=10 XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m engine.generate --prompt "..." --mesh 1x8
Multi-host: run the same command in every process with --distributed (HOST:PORT,N,ID, or bare on TPU pods);
--mesh then spans all processes' devices.
tok/s is timed warm: each group of prompts first runs its prefill and two steps untimed (XLA compiles), and that
warm-up's compiles and seconds are reported apart (warmup_compiles, warmup_s).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax

from .config import CheckpointError
from .decode import GenerationError, generate, generate_batch, warm_up
from .drafters import DrafterError, load_drafter
from .sharding import MeshError, start_distributed
from .target import load_target
from .tokenizer import default_template, parse_template


def read_prompts(args) -> list[dict]:
    """[{"prompt": ..., "id"?: ...}] from --prompt or a JSONL --prompt-file."""
    if args.prompt is not None:
        return [{"prompt": args.prompt}]
    rows = []
    with open(args.prompt_file) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict) or "prompt" not in row:
                    raise GenerationError(f"{args.prompt_file}:{n}: each line must be an object with a 'prompt' field")
                rows.append(row)
    return rows


def timed_batches(target, prompts: list[str], drafter, batch: int, **kw) -> list[tuple]:
    """(result, warm-up compiles, warm-up seconds) per prompt: each group of `batch` prompts is warmed up
    (compiled) untimed before it is generated, so tok/s never includes compilation."""
    out = []
    for lo in range(0, len(prompts), batch):
        group = prompts[lo:lo + batch]
        compiles, seconds = warm_up(target, group, drafter, **kw)
        out += [(r, compiles, seconds) for r in generate_batch(target, group, drafter, **kw)]
    return out


def result_json(row: dict, result, lossless: bool | None) -> dict:
    out = {"text": result.text, "token_ids": result.token_ids, **result.stats, "mesh": result.settings["mesh"],
           "process": jax.process_index(), "processes": jax.process_count(),
           "steps": [{k: getattr(s, k) for k in ("drafted", "accepted", "bonus", "draft_ms", "verify_ms")}
                     for s in result.steps]}
    if "id" in row:
        out = {"id": row["id"], **out}
    if lossless is not None:
        out["lossless"] = lossless
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory overriding the checkpoint's")
    ap.add_argument("--mesh", default=None, metavar="DxM", help="shard over a data x model device mesh, e.g. 1x8")
    ap.add_argument("--distributed", nargs="?", const="auto", default=None, metavar="HOST:PORT,N,ID",
                    help="join a multi-process run (bare: let JAX find its peers, as on TPU pods)")
    ap.add_argument("--batch", type=int, default=1, help="verify this many prompts of --prompt-file together")
    ap.add_argument("--raw", action="store_true", help="no chat template")
    ap.add_argument("--template", default=None, metavar="NAME=VALUE,...",
                    help="chat-template switches, e.g. enable_thinking=false (default: thinking off where the "
                         "template has it, as the published drafters were trained)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check-lossless", action="store_true")
    a = ap.parse_args(argv)
    try:
        start_distributed(a.distributed)
        target = load_target(a.target, a.dtype, a.tokenizer, mesh=a.mesh)
        drafter = load_drafter(a.drafter, target, k=a.k)
        baseline = load_drafter("ar", target) if a.check_lossless else None
        template = default_template(target.tokenizer) if a.template is None else parse_template(a.template)
        kw = dict(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p, seed=a.seed, raw=a.raw,
                  template=template)
        if a.batch < 1:
            raise GenerationError(f"--batch must be at least 1, got {a.batch}")
        rows = read_prompts(a)
        results = timed_batches(target, [row["prompt"] for row in rows], drafter, a.batch, **kw)
        for row, (result, warm_compiles, warm_s) in zip(rows, results, strict=True):
            lossless = None
            if baseline is not None:  # each sequence against plain greedy decoding of its prompt alone
                lossless = generate(target, row["prompt"], drafter=baseline, **kw).token_ids == result.token_ids
            if a.json:
                out = result_json(row, result, lossless) | {"warmup_compiles": warm_compiles, "warmup_s": warm_s}
                print(json.dumps(out), flush=True)
            else:
                s = result.stats
                acc = "n/a" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.3f}"
                print(f"{result.text}\n--- {drafter.name} K={drafter.k}: tau {s['tau']:.2f}, acceptance {acc}, "
                      f"{s['tok_per_s']:.1f} tok/s, {s['n_generated']} tokens in {s['wall_s']:.2f} s "
                      f"(warm-up before timing: {warm_compiles} XLA compiles, {warm_s:.1f} s)"
                      + ("" if lossless is None else f", lossless {lossless}"), flush=True)
    except (GenerationError, CheckpointError, DrafterError, MeshError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
