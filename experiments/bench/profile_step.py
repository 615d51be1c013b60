"""Where a verify step's time goes: a jax.profiler trace of the target's step (forward + acceptance + top-5, as
decode runs it) at T = K + 1 tokens, each XLA op's time summed by what it computes.

    python -m experiments.bench.profile_step [--ks 0,15] [--context 256] [--steps 20] [--dtype float32]
        [--target PATH] [--json]

K = 0 is `ar`'s plain decode step (T = 1). Per K it prints the step's median wall time, the time inside XLA ops
(summed over the threads that ran them), and that op time by HLO op kind and the JAX primitive behind it (a
fusion is named by its root: `fusion: dot_general` is a matmul with what XLA fused into it). Wall minus op time is
dispatch and the host: argument handling, launching the program, waiting for it.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import tempfile
import time
from collections import defaultdict

import jax
from jax.profiler import ProfileData

from engine import load_target
from engine.kflat import verify_hlo, verify_step

_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^=]*?\b([a-z][\w\-]*)\(.*?metadata=\{([^}]*)\}")
_META = re.compile(r'(\w+)="?([^"\s]*)"?')


def op_sources(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> what it computes: the JAX primitive its metadata names (a fusion: its root's, e.g.
    dot_general, dynamic_update_slice), after the HLO op kind (fusion, copy, dot, ...)."""
    out = {}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if m:
            op_name = dict(_META.findall(m.group(3))).get("op_name", "")
            out[m.group(1)] = f"{m.group(2)}: {op_name.rsplit('/', 1)[-1]}" if op_name else m.group(2)
    return out


def profile(target, k: int, context: int, steps: int) -> dict:
    """One K: the step's median wall ms and its XLA op ms per source label (per step)."""
    step = verify_step(target, k, context)
    for _ in range(2):
        step()  # compile, then one warm call
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(steps):
                t = time.perf_counter()
                step()
                walls.append((time.perf_counter() - t) * 1e3)
        data = ProfileData.from_file(sorted(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True))[-1])
    sources = op_sources(verify_hlo(target, k, context))
    per_label: dict[str, float] = defaultdict(float)
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if stats.get("hlo_module") != "jit_verify_block" or "hlo_op" not in stats:
                    continue
                per_label[sources.get(stats["hlo_op"], stats["hlo_op"].split(".")[0])] += event.duration_ns / 1e6
    ops = {label: ms / steps for label, ms in sorted(per_label.items(), key=lambda kv: -kv[1])}
    return {"k": k, "tokens": k + 1, "context": context, "wall_ms": statistics.median(walls),
            "op_ms": sum(ops.values()), "ops": ops}


def text_table(rows: list[dict], top: int = 12) -> str:
    lines = []
    for r in rows:
        lines.append(f"K={r['k']} (T={r['tokens']}, context {r['context']}): wall {r['wall_ms']:.1f} ms/step, "
                     f"XLA ops {r['op_ms']:.1f} ms (summed over threads)")
        for label, ms in list(r["ops"].items())[:top]:
            lines.append(f"  {label:<40} {ms:8.2f} ms  {100 * ms / r['op_ms']:5.1f} %")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench.profile_step", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="0,15", help="comma-separated K (0: ar's T = 1 step)")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="steps traced per K")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--target", default=None, help="checkpoint (default: the embedded SmolLM2-135M)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    target = load_target(args.target, args.dtype)
    rows = [profile(target, int(k), args.context, args.steps) for k in args.ks.split(",")]
    print(json.dumps(rows, indent=1) if args.json else text_table(rows))


if __name__ == "__main__":
    main()
