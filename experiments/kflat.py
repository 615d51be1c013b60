"""K-Flat sweeps into the history: verify (and draft) latency over K x context, labelled with the hardware.

    python -m experiments.kflat [--ks 1,2,4,...,128] [--contexts 128,512,1024] [--drafter NAME] [--db PATH]
        [--label TEXT] [--repeats 5] [--target PATH] [--dtype float32|bfloat16] [--json]
    python -m experiments.kflat --import rows.jsonl --label "gpu: NVIDIA H200" [--backend gpu] [--model M] [--dtype D]

Measuring uses engine.kflat.measure_kflat (median of `repeats` after a warm-up, one cache size per context).
The default label is "<jax backend>: <device kind, or the CPU model from /proc/cpuinfo> (<N> cores)".
--import stores rows measured elsewhere: JSONL lines {k, context, verify_ms, draft_ms?, drafter?}.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from storage import DEFAULT_PATH, HistoryError, open_history

from .suites import SuiteError, read_jsonl


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def hardware_label() -> str:
    """e.g. "cpu: AMD EPYC (2 cores)" or "gpu: NVIDIA H200 (16 cores)"."""
    import jax

    kind = jax.devices()[0].device_kind
    name = cpu_model() if jax.default_backend() == "cpu" or kind.lower() == "cpu" else kind
    return f"{jax.default_backend()}: {name} ({os.cpu_count()} cores)"


def sweep(target, ks: list[int], contexts: list[int], drafter: str | None = None, repeats: int = 5) -> list[dict]:
    """Rows {context, k, verify_ms, draft_ms} for every context x K."""
    from engine.kflat import measure_kflat

    return [{"context": c, **row} for c in contexts for row in measure_kflat(target, ks, c, drafter, repeats)]


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
    ap.add_argument("--contexts", default="128,512,1024")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--db", default=DEFAULT_PATH)
    ap.add_argument("--label", default=None, help="hardware label (default: measured from this machine)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default float32")
    ap.add_argument("--import", dest="import_file", default=None, help="store rows measured elsewhere")
    ap.add_argument("--backend", default=None, help="with --import: the backend the rows come from")
    ap.add_argument("--model", default=None, help="with --import: the model the rows come from")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        history = open_history(a.db)
        if a.import_file:
            if not a.label:
                raise ValueError("--import needs --label naming the hardware the rows were measured on")
            rows = _show(read_rows(Path(a.import_file)), a.json)
            meta = dict(hardware=a.label, backend=a.backend, model=a.model, dtype=a.dtype, drafter=a.drafter)
        else:
            import jax

            from engine import load_target

            target = target or load_target(a.target, a.dtype or "float32")
            ks, rows = _ints(a.ks), []
            for context in _ints(a.contexts):
                rows += _show(sweep(target, ks, [context], a.drafter, a.repeats), a.json)
            meta = dict(hardware=a.label or hardware_label(), backend=jax.default_backend(), model=target.name,
                        dtype=target.dtype, drafter=a.drafter)
        command = "python -m experiments.kflat " + shlex.join(sys.argv[1:] if argv is None else argv)
        sweep_id = history.write_kflat([{**r, "command": command} for r in rows], **meta)
    except (SuiteError, HistoryError, ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"stored sweep {sweep_id} ({len(rows)} rows) as {meta['hardware']!r} in {history.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
