"""The K-Flat command: verify (and draft) latency over K x context, labelled with the hardware, into the history.

    python -m experiments.bench.kflat [--ks 1,2,4,...,128] [--context 128,512,1024] [--drafter NAME] [--db PATH]
        [--label TEXT] [--repeats 5] [--target PATH] [--dtype float32|bfloat16] [--cache-rows N] [--json]
        [--no-store]
    python -m experiments.bench.kflat --target config.json --random-weights ...   # shapes only: random weights
    python -m experiments.bench.kflat --import rows.jsonl --label "gpu: NVIDIA H200" [--backend gpu] [--model M]
        [--dtype D]

Measuring uses engine.kflat.measure_kflat (median of `repeats` after a warm-up, one cache size per context).
The default label is "<jax backend>: <device kind, or the CPU model from /proc/cpuinfo> (<N> cores)".
--import stores rows measured elsewhere: JSONL lines {k, context, verify_ms, draft_ms?, drafter?}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import jax

from engine import CheckpointError, GenerationError, Target, load_target
from engine.config import config_from_hf, read_json
from engine.hardware import hardware_label
from engine.kflat import measure_kflat
from engine.weights import random_params
from storage import DEFAULT_PATH, HistoryError, open_history

from ..suites import SuiteError, read_jsonl


def sweep(target, ks: list[int], contexts: list[int], drafter: str | None = None, repeats: int = 5,
          cache_rows: int | None = None) -> list[dict]:
    """Rows {context, k, verify_ms, draft_ms, cache_rows} for every context x K."""
    return [{"context": c, **row} for c in contexts
            for row in measure_kflat(target, ks, c, drafter, repeats, cache_rows=cache_rows)]


def load_for_sweep(path: str | None, dtype: str, tokenizer: str | None, random_weights: bool) -> Target:
    """The target to time: a checkpoint (or the embedded default), or random weights of a config.json's shapes."""
    if not random_weights:
        return load_target(path, dtype, tokenizer)
    if path is None:
        raise ValueError("--random-weights needs --target pointing at a config.json")
    cfg = config_from_hf(read_json(Path(path)))
    return Target(cfg, random_params(cfg, dtype), None, Path(path), dtype, (), f"{path} (random)")


def _number(path: Path, n: int, row: dict, key: str, kind: type, required: bool = True):
    value = row.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
            kind is int and value != int(value)):
        raise SuiteError(f"{path}:{n}: {key!r} must be a positive {kind.__name__}, got {value!r}")
    return kind(value)


def read_rows(path: Path) -> list[dict]:
    """Validated K-Flat rows from a JSONL file of {k, context, verify_ms, draft_ms?, drafter?, ...}."""
    rows = []
    for n, raw in read_jsonl(path):
        row = dict(raw)
        row["k"], row["context"] = _number(path, n, raw, "k", int), _number(path, n, raw, "context", int)
        row["verify_ms"] = _number(path, n, raw, "verify_ms", float)
        row["draft_ms"] = _number(path, n, raw, "draft_ms", float, required=False)
        rows.append(row)
    if not rows:
        raise SuiteError(f"{path} holds no rows")
    return rows


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _show(rows: list[dict], as_json: bool) -> list[dict]:
    for r in rows:
        if as_json:
            print(json.dumps(r), flush=True)
        else:
            draft = "" if r.get("draft_ms") is None else f"  draft {r['draft_ms']:8.2f} ms"
            print(f"context {r['context']:5d}  K={r['k']:4d}  verify {r['verify_ms']:8.2f} ms{draft}", flush=True)
    return rows


def main(argv: list[str] | None = None, target=None) -> int:
    """CLI entry; `target` lets a caller pass an already loaded target."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--context", "--contexts", dest="contexts", default="128,512,1024",
                    help="comma-separated context lengths")
    ap.add_argument("--cache-rows", type=int, default=None,
                    help="target cache size (default: the smallest bucket holding context + the widest block)")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--db", default=DEFAULT_PATH)
    ap.add_argument("--label", default=None, help="hardware label (default: measured from this machine)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default float32")
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory overriding the checkpoint's")
    ap.add_argument("--random-weights", action="store_true",
                    help="--target is a config.json: time random weights of its shapes (latency depends on shapes)")
    ap.add_argument("--no-store", action="store_true", help="print the rows only; write nothing to the history")
    ap.add_argument("--import", dest="import_file", default=None, help="store rows measured elsewhere")
    ap.add_argument("--backend", default=None, help="with --import: the backend the rows come from")
    ap.add_argument("--model", default=None, help="with --import: the model the rows come from")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        history = None if a.no_store else open_history(a.db)
        if a.import_file:
            if not a.label:
                raise ValueError("--import needs --label naming the hardware the rows were measured on")
            rows = _show(read_rows(Path(a.import_file)), a.json)
            meta = dict(hardware=a.label, backend=a.backend, model=a.model, dtype=a.dtype, drafter=a.drafter)
        else:
            target = target or load_for_sweep(a.target, a.dtype or "float32", a.tokenizer, a.random_weights)
            ks, rows = _ints(a.ks), []
            for context in _ints(a.contexts):
                rows += _show(sweep(target, ks, [context], a.drafter, a.repeats, a.cache_rows), a.json)
            meta = dict(hardware=a.label or hardware_label(), backend=jax.default_backend(), model=target.name,
                        dtype=target.dtype, drafter=a.drafter)
        if history is None:
            return 0
        command = "python -m experiments.bench.kflat " + shlex.join(sys.argv[1:] if argv is None else argv)
        sweep_id = history.write_kflat([{**r, "command": command} for r in rows], **meta)
    except (SuiteError, HistoryError, CheckpointError, GenerationError, ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"stored sweep {sweep_id} ({len(rows)} rows) as {meta['hardware']!r} in {history.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
