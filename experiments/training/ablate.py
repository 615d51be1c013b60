"""Ablations of the drafter recipe: one training run per arm, the same data, steps and validation set, resumable.

    python -m experiments.training.ablate --out out/ablate --arms hard,soft,anchors-512 -- --drafter dflash \
        --data data/distill-v3 --val 128 --val-pool 12800 --steps 1500 --eval-every 250 --patience 100

    python -m experiments.training.ablate --out out/curve --arms data-2.5k,data-5k \
        --arm "data-2.5k=--limit-sequences 2500" \
        --arm "data-5k=--limit-sequences 5000" -- ...                  # arms of one's own: a data-size curve

Each arm is experiments.training.train with the flags after `--` plus its own (ARMS, --arm; an arm may name another
--drafter, so EAGLE-3 and DFlash arms share one table); a finished arm (its checkpoint card exists) is skipped and
an interrupted one resumes from its work directory, so the command can be run again after a stop. Then one row per
finished arm (OUT/ablations.json, and as Markdown OUT/ablations.md): best
validation tau_est, its delta against the first arm, steps, wall time, trained label positions per second, and
tau_est at the first arm's wall time (from each curve, for arms whose steps cost more or less). `--attach
CHECKPOINT` also records the table in that drafter's training.json and card.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from experiments.training import cards, train

ARMS: dict[str, list[str]] = {
    "hard": [],  # cross-entropy on the target's greedy token
    "soft": ["--soft", "0.9"],  # 0.9 forward KL to the target's distribution + 0.1 CE
    "init-top": ["--init-top"],  # draft layers started from the target's top layers
    "hints": ["--lookup-hints", "3"],  # blocks start from prompt lookup over the context instead of MASK tokens
    "domino": ["--domino", "64:256"],  # a Domino correction head (GRU over the block's tokens, low-rank logit delta)
    "anchors-512": ["--anchors", "512"],  # every valid response position per sequence
    "layers-3": ["--layers", "3"],
    "ffn-512": ["--intermediate", "512"],
}


def card_path(out: Path, arm: str, kind: str) -> Path:
    return out / arm / f"{arm}-{kind}" / "training.json"


def run_arm(out: Path, arm: str, flags: list[str], shared: list[str]) -> None:
    """Train one arm (or resume it)."""
    argv = [*shared, *flags, "--work", str(out / arm / "work"), "--out", str(out / arm), "--name", arm]
    train.main(argv)


def tau_at_time(curve: list[dict], seconds: float, k: int) -> float | None:
    """tau_est at K of the last evaluation within `seconds` of wall time (None: none that early)."""
    done = [e for e in curve if e.get("tau_est") and e["s"] <= seconds]
    return done[-1]["tau_est"][min(k, len(done[-1]["tau_est"])) - 1] if done else None


def summary(arm_cards: dict[str, dict], flags: dict[str, list[str]], k: int, command: str) -> dict:
    """The ablation record: one row per finished arm (cards in arm order), deltas against the first."""
    def best(card: dict) -> float:
        return max(e["tau_est"][min(k, len(e["tau_est"])) - 1] for e in card["curve"] if e.get("tau_est"))

    arms = list(arm_cards)
    base, base_wall = best(arm_cards[arms[0]]), arm_cards[arms[0]]["training"]["wall_s"]
    rows = []
    for arm in arms:
        card, tau = arm_cards[arm], best(arm_cards[arm])
        rates = [e["labels_per_s"] for e in card["curve"] if e.get("labels_per_s")]
        rows.append({"arm": arm, "flags": shlex.join(flags[arm]), "tau_est": round(tau, 4),
                     "delta": round(tau - base, 4), "steps": card["training"]["steps"],
                     "wall_s": card["training"]["wall_s"],
                     "labels_per_s": round(sum(rates) / len(rates), 1) if rates else None,
                     "tau_est_at_base_wall": tau_at_time(card["curve"], base_wall, k)})
    return {"k": k, "date": time.strftime("%Y-%m-%d"), "command": command, "base": arms[0], "base_wall_s": base_wall,
            "same_validation": len({c["data"]["validation_sha256"] for c in arm_cards.values()}) == 1, "rows": rows}


def attach(checkpoint: Path, record: dict) -> None:
    """Record the ablations in a shipped drafter's training.json and rewrite its card."""
    path = checkpoint / "training.json"
    card = json.loads(path.read_text())
    card["ablations"] = record
    path.write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    cards.write_readme(checkpoint)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/ablate")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, the first is the base: {', '.join(ARMS)}")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=FLAGS",
                    help='define another arm, e.g. --arm "data-5k=--limit-sequences 5000" (repeatable)')
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--table-only", action="store_true", help="tabulate the finished arms, train nothing")
    ap.add_argument("--attach", metavar="CHECKPOINT", help="also record the table in this drafter's card")
    a, shared = ap.parse_known_args(argv)
    shared = [x for x in shared if x != "--"]
    flags = dict(ARMS)
    for spec in a.arm:
        name, sep, arm_flags = spec.partition("=")
        if not sep or not name:
            print(f"error: --arm needs NAME=FLAGS, got {spec!r}", file=sys.stderr)
            return 2
        flags[name] = shlex.split(arm_flags)
    arms = a.arms.split(",")
    unknown = [x for x in arms if x not in flags]
    if unknown:
        print(f"error: unknown arm(s) {', '.join(unknown)}; known: {', '.join(flags)}", file=sys.stderr)
        return 2
    kinds = {arm: train.parse_args([*shared, *flags[arm]]).drafter for arm in arms}
    if "both" in kinds.values():
        print("error: one drafter kind per arm (--drafter dflash or eagle3)", file=sys.stderr)
        return 2
    out = Path(a.out)
    for arm in arms:
        if not a.table_only and not card_path(out, arm, kinds[arm]).is_file():
            run_arm(out, arm, flags[arm], shared)
    arm_cards = {arm: json.loads(card_path(out, arm, kinds[arm]).read_text()) for arm in arms
             if card_path(out, arm, kinds[arm]).is_file()}
    if not arm_cards:
        print("error: no finished arm to tabulate", file=sys.stderr)
        return 2
    command = "python -m experiments.training.ablate " + shlex.join(sys.argv[1:] if argv is None else argv)
    record = summary(arm_cards, flags, a.k, command)
    (out / "ablations.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    text = "\n".join(cards.ablation_table(record))
    (out / "ablations.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    if a.attach:
        attach(Path(a.attach), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
