"""Average drafter checkpoints of one architecture (a model soup): the weighted mean of their weights.

    python -m experiments.training.average checkpoints/smollm2-135m-dflash out/story8/smollm2-135m-dflash --out out/soup

The checkpoints must share config.json (torch_dtype aside) and every tensor's name and shape; integer tensors (the
draft vocabulary map `d2t`) must be equal. Floats are averaged in float32 and stored in the first one's dtype. The
new training.json records the average as a stage whose lineage goes on with the last checkpoint's card (the run that
started from the others, when it was continued from them), and keeps the first one's ablations.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from engine.drafters.base import DrafterError
from engine.drafters.layers import read_config, read_tensors, save_checkpoint


def average_checkpoints(paths: list[str | Path], out: str | Path, weights: list[float] | None = None,
                        command: str = "") -> Path:
    """Write the weighted mean of the checkpoints `paths` (equal weights by default) to `out`."""
    paths = [Path(p) for p in paths]
    weights = [1.0 / len(paths)] * len(paths) if weights is None else [float(w) for w in weights]
    if len(paths) < 2 or len(weights) != len(paths) or min(weights) < 0 or not np.isclose(sum(weights), 1.0):
        raise DrafterError(f"give two or more checkpoints and as many weights >= 0 summing to 1, got {len(paths)} "
                           f"checkpoints and weights {weights}")
    configs = [read_config(p) for p in paths]
    if any({**c, "torch_dtype": None} != {**configs[0], "torch_dtype": None} for c in configs[1:]):
        raise DrafterError(f"{', '.join(map(str, paths))} do not share one config.json: they cannot be averaged")
    tensors = [read_tensors(p) for p in paths]
    if any(set(t) != set(tensors[0]) for t in tensors[1:]):
        raise DrafterError("the checkpoints hold different tensors: they cannot be averaged")
    mean = {}
    for name, first in tensors[0].items():
        parts = [t[name] for t in tensors]
        if any(p.shape != first.shape for p in parts):
            raise DrafterError(f"tensor {name!r} is shaped differently in one of {', '.join(map(str, paths))}")
        if not np.issubdtype(first.dtype, np.integer):  # float32, float16, bfloat16
            mean[name] = sum(w * p.astype(np.float32) for w, p in zip(weights, parts, strict=True))
        elif all(np.array_equal(first, p) for p in parts[1:]):
            mean[name] = first
        else:
            raise DrafterError(f"integer tensor {name!r} differs between the checkpoints (another draft vocabulary)")
    out = Path(out)
    save_checkpoint(out, configs[0], mean, configs[0].get("torch_dtype", "float32"))
    cards = [json.loads((p / "training.json").read_text()) if (p / "training.json").is_file() else {} for p in paths]
    card = {key: cards[-1][key] for key in ("drafter", "target", "architecture") if key in cards[-1]}
    card |= {"date": datetime.date.today().isoformat(), "command": command,
             "averaged": [{"checkpoint": str(p), "weight": w} for p, w in zip(paths, weights, strict=True)],
             "init_card": cards[-1] or None}
    if cards[0].get("ablations"):
        card["ablations"] = cards[0]["ablations"]
    (out / "training.json").write_text(json.dumps(card, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--weights", type=float, nargs="+", default=None, help="one per checkpoint, summing to 1")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    command = "python -m experiments.training.average " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        print(average_checkpoints(args.checkpoints, args.out, args.weights, command))
    except DrafterError as e:
        print(f"average: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
