"""Training curves from drafter model cards (the training.json that experiments.training.train writes): validation
tau_est against training steps per run, and each run's best tau_est against its training sequences and depth.

    python -m experiments.training.curves out/curve/*-ckpt/* checkpoints/smollm2-135m-eagle3 --k 4 --out out/curves

Writes DIR/curves.md (one row per run) and DIR/curves.html. Runs are comparable only on the same validation
sequences: the table names each run's validation set and the report says when they differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_card(path: str | Path) -> dict:
    """One run from a checkpoint directory (or its training.json): what it trained on and its tau_est curve."""
    path = Path(path)
    card_file = path / "training.json" if path.is_dir() else path
    if not card_file.is_file():
        raise FileNotFoundError(f"no training.json in {path}")
    card = json.loads(card_file.read_text())
    if card.get("averaged"):
        sources = ", ".join(a["checkpoint"] for a in card["averaged"])
        raise ValueError(f"{card_file} records weights averaged from {sources}, not a training run: give the runs "
                         "it averaged")
    try:
        arch, data, training = card["architecture"], card["data"], card["training"]
    except KeyError as e:
        raise ValueError(f"{card_file} is not a drafter model card (no {e})") from None
    curve = [(e["step"], e["tau_est"]) for e in card.get("curve", []) if e.get("tau_est")]
    return {"run": card_file.parent.name, "drafter": card["drafter"], "layers": arch.get("layers"),
            "block_size": arch.get("block_size"), "sequences": data["sequences"],
            "response_tokens": data.get("response_tokens"), "validation": data.get("validation_sha256"),
            "steps": training["steps"], "wall_s": training["wall_s"], "curve": curve}


def tau_at(taus: list[float], k: int) -> float:
    """tau_est at K (the largest K the run measured when it measured fewer)."""
    return taus[min(k, len(taus)) - 1]


def best(run: dict, k: int) -> tuple[int, float]:
    """(step, tau_est at K) of the run's best evaluation."""
    return max(((step, tau_at(taus, k)) for step, taus in run["curve"]), key=lambda x: x[1])


def table(runs: list[dict], k: int) -> str:
    """Markdown: one row per run, sorted by drafter, depth and sequences."""
    lines = [f"| run | drafter | layers | training sequences | response tokens | steps | wall s | best step | "
             f"best tau_est K={k} | validation |", "|" + "---|" * 10]
    for r in sorted(runs, key=lambda r: (r["drafter"], r["layers"] or 0, r["sequences"])):
        step, tau = best(r, k)
        lines.append(f"| {r['run']} | {r['drafter']} | {r['layers'] or '-'} | {r['sequences']:,} | "
                     f"{r['response_tokens'] or 0:,} | {r['steps']:,} | {r['wall_s']:,.0f} | {step:,} | {tau:.2f} | "
                     f"{r['validation'] or 'not recorded'} |")
    return "\n".join(lines)


def figure(runs: list[dict], k: int):
    """Plotly: tau_est(K) vs step per run (left); best tau_est vs training sequences, one line per depth (right)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"validation tau_est K={k} vs step",
                                                        f"best tau_est K={k} vs training sequences"))
    for r in runs:
        fig.add_scatter(x=[s for s, _ in r["curve"]], y=[tau_at(t, k) for _, t in r["curve"]], mode="lines+markers",
                        name=r["run"], row=1, col=1)
    depths = sorted({(r["drafter"], r["layers"]) for r in runs}, key=lambda d: (d[0], d[1] or 0))
    for drafter, layers in depths:
        group = sorted((r for r in runs if (r["drafter"], r["layers"]) == (drafter, layers)),
                       key=lambda r: r["sequences"])
        fig.add_scatter(x=[r["sequences"] for r in group], y=[best(r, k)[1] for r in group], mode="lines+markers",
                        name=f"{drafter} {layers or ''} layers".replace("  ", " "), row=1, col=2)
    return (fig.update_xaxes(title="step", row=1, col=1).update_xaxes(title="training sequences", type="log", row=1,
                                                                      col=2)
            .update_layout(title="Drafter training curves", legend=dict(orientation="h", yanchor="top", y=-0.2)))


def write_curves(paths: list[str], k: int, out: str | Path) -> Path:
    """Write curves.md and curves.html into `out`; return the Markdown path."""
    runs = [read_card(p) for p in paths]
    runs = [r for r in runs if r["curve"]]
    if not runs:
        raise ValueError("no run with a validation tau_est curve")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figure(runs, k).write_html(out / "curves.html", include_plotlyjs="directory")
    sets = {r["validation"] for r in runs}
    warning = ("" if len(sets) == 1 and None not in sets else
               "\n\nThe runs were validated on different (or unrecorded) validation sets: compare with care.")
    text = f"# Drafter training curves\n\n{table(runs, k)}{warning}\n\n[curves.html](curves.html)\n"
    (out / "curves.md").write_text(text, encoding="utf-8")
    return out / "curves.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", help="checkpoint directories (or training.json files)")
    ap.add_argument("--k", type=int, default=4, help="the K whose tau_est to compare")
    ap.add_argument("--out", default="curves")
    a = ap.parse_args(argv)
    try:
        path = write_curves(a.checkpoints, a.k, a.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
