"""Model cards: the training and evaluation records of a drafter (training.json, written by
experiments.training.train) and the README.md rendered from them.

    python -m experiments.training.cards checkpoints/smollm2-135m-dflash checkpoints/smollm2-135m-eagle3

A card says what the drafter is (format and shape), what it was trained on and how (each stage of its lineage with
its date and command, newest first), the ablations of its recipe, its offline tau_est per evaluation set and its
measured engine tau and speedup, each with the command that produced it. Nothing in it is typed by hand: edit
training.json, then rewrite the card.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import jax

from engine.drafters import dflash_checkpoint, dflash_config, domino
from engine.target import Target
from experiments.data import distill
from storage.digest import sha256

from .sequences import Sequences

FORMATS = {
    "dflash": "z-lab DFlash (`DFlashDraftModel`): {layers} Qwen3-style layers over the fused outputs of target layers "
              "{target_layer_ids}, block size {block_size} (K up to {max_k}), intermediate {intermediate_size}, draft "
              "vocabulary {draft_vocab_size} (`d2t`); embedding and LM head shared from the target",
    "eagle3": "EAGLE-3 (`LlamaForCausalLMEagle3`): one Llama layer over [embedding; fused outputs of target layers "
              "{feature_layers}], intermediate {intermediate_size}, draft vocabulary {draft_vocab_size} (`d2t`), "
              "training-time test over {ttt_steps} steps",
}


def _tau(values: list[float] | None, ks: tuple[int, ...] = (4, 7)) -> str:
    if not values:
        return "n/a"
    return " / ".join(f"{values[k - 1]:.2f}" for k in ks if k <= len(values)) + " (K=" + \
        "/".join(str(k) for k in ks if k <= len(values)) + ")"


def _stage(card: dict) -> list[str]:
    """The lines of one training stage: when, what data, the command, steps and the best validation tau_est; or,
    for weights averaged from checkpoints (experiments.training.average), which ones and how."""
    if card.get("averaged"):
        return [f"- **{card.get('date') or 'date not recorded'}**: weights averaged, "
                + " + ".join(f"{a['weight']:g} x `{a['checkpoint']}`" for a in card["averaged"]) + ".",
                f"  `{card['command']}`"]
    data, training = card.get("data") or {}, card.get("training") or {}
    best = training.get("best") or {}
    when = card.get("date") or "date not recorded"
    hardware = card.get("hardware") or {}
    where = hardware.get("device") or hardware.get("backend") or data.get("generated_on") or "hardware not recorded"
    sequences = f"{data['sequences']:,}" if isinstance(data.get("sequences"), int) else "?"
    lines = [f"- **{when}**, {where}: {sequences} training sequences"
             + (f" ({data['response_tokens']:,} response tokens)" if data.get("response_tokens") else "")
             + (f" from {', '.join(data['sources'])}" if data.get("sources") else
                f" ({data['prompts']})" if data.get("prompts") else "")
             + (f", {data['validation_sequences']} held out (validation sha256 {data.get('validation_sha256')})"
                if data.get("validation_sequences") else "") + "."]
    if card.get("command"):
        lines.append(f"  `{card['command']}`")
    lines.append(f"  {training.get('steps', '?')} steps x batch {training.get('batch', '?')}, "
                 f"{training.get('wall_s', 0):,.0f} s; best validation tau_est {_tau(best.get('tau_est'))}"
                 + (f" at step {best['step']}" if "step" in best else "") + ".")
    return lines


def ablation_table(record: dict) -> list[str]:
    """Markdown of an ablation record (experiments.training.ablate): one line per arm, deltas against the first."""
    k, base = record["k"], record["base"]
    lines = [f"| arm | flags | best tau_est K={k} | delta vs {base} | steps | wall s | labels/s | tau_est K={k} "
             f"at {record['base_wall_s']:,.0f} s |", "|" + "---|" * 8]
    for r in record["rows"]:
        at, rate = r["tau_est_at_base_wall"], r["labels_per_s"]
        lines.append(f"| {r['arm']} | `{r['flags'] or '(base)'}` | {r['tau_est']:.3f} | {r['delta']:+.3f} | "
                     f"{r['steps']:,} | {r['wall_s']:,.0f} | {'-' if rate is None else f'{rate:,.0f}'} | "
                     f"{'-' if at is None else f'{at:.3f}'} |")
    if not record["same_validation"]:
        lines.append("\nThe arms were validated on different sequences: their deltas do not compare.")
    return lines


def serving_line(serving: dict) -> str:
    """How the drafter's serving rule (hint_bias) was set: given, or chosen among candidates and where."""
    head = f"hint_bias {serving['hint_bias']:g}, {serving['chosen_on']}"
    if not serving.get("candidates"):
        return head + "."
    where = ", ".join(f"{x}" for x in serving.get("data") or [])
    scored = "; ".join(f"{c['hint_bias']:g}: {c[serving['metric']]:.3f}" for c in serving["candidates"])
    size = serving.get("validation_sequences") or serving.get("sequences")
    return (f"{head} ({size} sequences of {where}), the best {serving['metric']} at K={serving['k']} of "
            f"{scored}; {serving['date']}, `{serving['command']}`.")


def render_card(name: str, card: dict) -> str:
    """The README.md of a drafter checkpoint from its training.json."""
    kind, arch = card["drafter"], dict(card.get("architecture") or {})
    arch.setdefault("max_k", arch.get("block_size", 1) - 1)
    title = {"dflash": "A DFlash", "eagle3": "An EAGLE-3"}[kind]
    weights = f"; {card['weights']}" if card.get("weights") else ""
    try:
        shape = FORMATS[kind].format(**arch)
    except KeyError as missing:
        shape = f"{kind} ({missing.args[0]} and the rest of its architecture not recorded in training.json)"
    if arch.get("domino"):
        shape += (", with a Domino head (`DominoDraftModel`: GRU {gru_hidden} over the block's tokens, bottleneck "
                  "{emb_dim}, drafts after the first {prefix_len} corrected)").format(**arch["domino"])
    if arch.get("lookup_hints"):
        shape += f", lookup hints (blocks start from {arch['lookup_hints']}-gram prompt lookup over the context)"
    if arch.get("hint_bias"):
        shape += f", hint bias {arch['hint_bias']:g} (a hint within that many logits of the argmax is drafted)"
    if arch.get("oov_hints"):
        shape += ", hints outside the draft vocabulary scored by the target's LM head (`oov_hints`)"
    default = name == f"smollm2-135m-{kind}"  # engine/drafters/*.DEFAULT_CHECKPOINT
    lines = [f"# {name}", "", f"{title} drafter for {card.get('target', 'its target')}, trained with draftscope.", "",
             f"- **Format**: {shape}{weights}.",
             "- **Load**: " + (f"`load_drafter(\"{kind}\", target)` (the default) or " if default else "")
             + f"`load_drafter(\"checkpoints/{name}\", target)`.", "", "## Training (newest stage first)", ""]
    stage: dict | None = card
    while stage:
        lines += _stage(stage)
        stage = stage.get("init_card")
    serving = card.get("serving")
    if serving:
        lines += ["", "## Serving rule", "", serving_line(serving)]
    evaluations = card.get("evaluations") or []
    if evaluations:
        lines += ["", "## Offline tau per evaluation set", "",
                  "tau_est weighs every response position alike; walk_tau replays the engine's greedy blocks over the"
                  " same sequences (the tau `generate` measures at that K), defined when every position is an anchor.",
                  "", "| eval set | tau_est | walk_tau | date | command |", "|---|---|---|---|---|"]
        lines += [f"| {e['data']} | {_tau(e['tau_est'])} | {_tau(e.get('walk_tau'))} "
                  f"| {e.get('date', '-')} | `{e['command']}` |" for e in evaluations]
    if card.get("ablations"):
        record = card["ablations"]
        lines += ["", "## Ablations (validation tau_est, same data and validation set)", "", *ablation_table(record),
                  "", f"Measured {record['date']} with `{record['command']}`."]
    measured = card.get("measured") or []
    if measured:
        lines += ["", "## Engine (measured)", "",
                  "| suite | slice | K | prompts | tau | speedup vs ar | lossless | device | date |", "|---" * 9 + "|"]
        lines += [f"| {m['suite']} | {m.get('split') or 'not recorded'} | {m['k']} | {m['n']} | {m['tau']:.2f} | "
                  f"{m['speedup']:.2f}x | {m['lossless']} | {m['device_kind']} | {m.get('date', '-')} |"
                  for m in measured]
        commands = sorted({m["command"] for m in measured if m.get("command")})
        lines += [""] + [f"Measured with `{c}`." for c in commands]
    return "\n".join(lines) + "\n"


def write_readme(checkpoint: str | Path) -> Path:
    """Rewrite checkpoint/README.md from checkpoint/training.json."""
    checkpoint = Path(checkpoint)
    card = json.loads((checkpoint / "training.json").read_text())
    weights = checkpoint / "model.safetensors"
    if weights.is_file():
        card["weights"] = f"model.safetensors {weights.stat().st_size / 1e6:.0f} MB"
    path = checkpoint / "README.md"
    path.write_text(render_card(checkpoint.name, card), encoding="utf-8")
    return path


def write_card(out: Path, kind: str, args, data: Sequences, val: Sequences, log: dict, arch: dict,
               serving: dict | None = None) -> None:
    """training.json beside the checkpoint: data, steps, wall time, hardware, architecture, serving rule (and where
    it was chosen), tau_est curve."""
    dev = jax.devices()[0]
    card = {"drafter": kind, "target": args.target or "embedded SmolLM2-135M-Instruct", "architecture": arch,
            "data": {"sources": args.data or [], "export": args.export, "sequences": len(data),
                     "tokens": int(len(data.tokens)), "response_tokens": int(len(data.tokens) - data.prompt_lens.sum()),
                     "validation_sequences": len(val), "validation_pool": args.val_pool, "seed": args.seed,
                     "sha256": sha256(data.tokens.tobytes(), short=True),
                     "validation_sha256": sha256(val.tokens.tobytes(), short=True)},
            "training": {"steps": log["steps"], "best": log["best"], "batch": args.batch, "seq_len": args.seq_len,
                         "bucket": args.bucket, "batch_seed": args.batch_seed,
                         "lr": args.lr, "anchors": args.anchors, "gamma": args.gamma, "soft": args.soft,
                         "wall_s": log["wall_s"],
                         "draft_vocab": args.draft_vocab, "init": args.init, "init_top": args.init_top,
                         "grow_layers": args.grow_layers},
            "hardware": {"backend": jax.default_backend(), "device": dev.device_kind, "host": platform.node()},
            "curve": log["log"]}
    if serving is not None:
        card["serving"] = serving
    card["date"], card["command"] = time.strftime("%Y-%m-%d"), args.command
    if args.init:
        card["init_card"] = init_lineage(Path(args.init))
    (out / "training.json").write_text(json.dumps(card, indent=1))
    write_readme(out)


def config_from_card(card: dict, target: Target) -> dict:
    """The config.json that a DFlash card's recorded settings (architecture and serving rule) give for `target`:
    what train_drafter saves, so a test can rebuild a shipped config from its card."""
    arch = card["architecture"]
    cfg, _ = dflash_checkpoint.init_dflash(target, arch["layers"], arch["block_size"], tuple(arch["target_layer_ids"]),
                                intermediate_size=arch["intermediate_size"])
    head = arch.get("domino")
    cfg = replace(cfg, lookup_hints=arch.get("lookup_hints", 0), oov_hints=arch.get("oov_hints", False),
                  hint_bias=float(card.get("serving", {}).get("hint_bias", 0.0)),
                  domino=None if head is None else domino.Domino(head["prefix_len"], head["emb_dim"],
                                                                 head["gru_hidden"]))
    config = dflash_config.config_json(cfg)
    if arch["draft_vocab_size"] < target.cfg.vocab_size:
        config["draft_vocab_size"] = arch["draft_vocab_size"]
    return {**config, "torch_dtype": "bfloat16"}


def validation_record(args, val: Sequences) -> dict:
    """Where a choice made on the training validation split was made."""
    return {"chosen_on": "validation", "data": args.data or [], "validation_sequences": len(val),
            "validation_pool": args.val_pool, "seed": args.seed,
            "validation_sha256": sha256(val.tokens.tobytes(), short=True)}


def evaluated_record(args, data: Sequences) -> dict:
    """Where a choice made on the evaluated datasets was made: their suite slices (dev only, by the leak guard)."""
    sources = [distill.read_manifest(Path(d))["prompt_source"] for d in args.data or []]
    slices = sorted({"/".join(x) for x in map(distill.suite_slice, sources) if x})
    return {"chosen_on": f"dev slice ({', '.join(slices)})" if slices else "evaluated data", "data": args.data or [],
            "sequences": len(data), "sha256": sha256(data.tokens.tobytes(), short=True)}


def record_evaluation(checkpoint: Path, data: str, scores: dict, command: str) -> None:
    """Put an offline evaluation (tau_est and, when defined, walk_tau; replacing one on the same data) into the
    checkpoint's card."""
    path = checkpoint / "training.json"
    card = json.loads(path.read_text())
    keep = [e for e in card.get("evaluations", []) if e.get("data") != data]
    card["evaluations"] = keep + [{"data": data, "tau_est": scores["tau_est"], "walk_tau": scores.get("walk_tau"),
                                   "date": time.strftime("%Y-%m-%d"), "command": command}]
    path.write_text(json.dumps(card, indent=1))
    write_readme(checkpoint)


def init_lineage(checkpoint: Path) -> dict | None:
    """What a fine-tune started from: the --init checkpoint's card (data, training, hardware, the checkpoints it
    averaged, its own lineage)."""
    path = checkpoint / "training.json"
    if not path.is_file():
        return None
    card = json.loads(path.read_text())
    return {k: card[k] for k in ("drafter", "date", "command", "data", "training", "hardware", "averaged", "init_card")
            if k in card}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+")
    for checkpoint in ap.parse_args(argv).checkpoints:
        print(write_readme(checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
