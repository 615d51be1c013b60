"""The annotate -> retrain loop's driving steps, over a running app's HTTP API and a domain prompt table.

    python -m experiments.training.retrain_loop suites --table experiments/data/prompt_tables/sql_tasks.json \
        --out out/retrain
    python -m experiments.training.retrain_loop annotate --url http://127.0.0.1:7860 \
        --table experiments/data/prompt_tables/sql_tasks.json --drafter dflash --k 7 --max-new-tokens 96 \
        --label sql --per-run 4 --export retrain-sql

A prompt table is JSON {"domain", "category", "annotate": [{id, prompt}], "heldout": [{id, prompt}]}: ids and
prompts distinct, and no prompt in both parts. `suites` writes each part as a JSONL suite
(`<out>/<domain>-annotate.jsonl`, `<out>/<domain>-heldout.jsonl`) for `python -m experiments.bench --suite PATH`.
`annotate` runs every prompt of the annotate part through the app's /generate with one drafter, labels up to
--per-run of each run's rejected tokens (spread over the run) through /annotate, exports the label's annotations
with /export_annotations into the app's export root and prints one JSON line per run and a summary line.
The export then feeds `python -m experiments.training.train --export DIR --init CHECKPOINT`.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

PARTS = ("annotate", "heldout")


class TableError(ValueError):
    """A prompt table that cannot be used (missing part, duplicate id or prompt, prompt in both parts)."""


def load_table(path: str | Path) -> dict:
    """The prompt table at `path`, checked: both parts present, ids and prompts distinct, no prompt in both."""
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TableError(f"cannot read prompt table {path}: {e}") from None
    missing = [k for k in ("domain", *PARTS) if k not in table]
    if missing:
        raise TableError(f"{path}: missing {', '.join(missing)} (expected domain, annotate, heldout)")
    ids, prompts = set(), {}
    for part in PARTS:
        for n, row in enumerate(table[part]):
            if not isinstance(row, dict) or not str(row.get("prompt") or "").strip() or not row.get("id"):
                raise TableError(f"{path}: {part}[{n}] needs a non-empty id and prompt, got {row!r}")
            if row["id"] in ids:
                raise TableError(f"{path}: id {row['id']!r} appears twice")
            if row["prompt"] in prompts:
                raise TableError(f"{path}: {part}[{n}] ({row['id']}) repeats the prompt of "
                                 f"{prompts[row['prompt']]}")
            ids.add(row["id"])
            prompts[row["prompt"]] = f"{part} {row['id']}"
    return table


def write_suites(table: dict, out: str | Path) -> dict[str, Path]:
    """Each part of the table as a JSONL suite {id, prompt, category}; {part: path}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part in PARTS:
        paths[part] = out / f"{table['domain']}-{part}.jsonl"
        rows = [{"id": r["id"], "prompt": r["prompt"], "category": table.get("category", table["domain"])}
                for r in table[part]]
        paths[part].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return paths


def spread(choices: list, n: int) -> list:
    """Up to n of `choices`, evenly spaced from the first to the last (all of them when there are at most n)."""
    if n <= 0 or not choices:
        return []
    if len(choices) <= n:
        return list(choices)
    if n == 1:
        return [choices[0]]
    return [choices[round(i * (len(choices) - 1) / (n - 1))] for i in range(n)]


def annotate(client, table: dict, drafter: str, k: int, max_new: int, label: str, per_run: int,
             note: str = "", limit: int | None = None) -> list[dict]:
    """Run the annotate part's prompts through /generate, label spread rejections of each run; one row per run."""
    client.predict(label, api_name="/add_label")  # an existing label is kept as it is
    rows = []
    for row in table["annotate"][:limit]:
        *_, run_id, _text, numbers = client.predict(row["prompt"], drafter, k, 0.0, max_new, False,
                                                    api_name="/generate")
        if "error" in numbers:
            raise RuntimeError(f"{row['id']}: the app refused the run: {numbers['error']}")
        _view, tokens = client.predict(run_id, False, api_name="/annotate_open")
        picks = spread([value for _, value in tokens["choices"]], per_run)
        for pick in picks:
            status = client.predict(run_id, pick, label, note or f"{table['domain']} {row['id']}", False,
                                    api_name="/annotate")[0]
            if "stored" not in status:
                raise RuntimeError(f"{row['id']}: annotating {pick} of run {run_id} failed: {status}")
        rows.append({"id": row["id"], "run_id": run_id, "tau": numbers["tau"],
                     "acceptance_rate": numbers["acceptance_rate"], "rejections": len(tokens["choices"]),
                     "annotated": len(picks)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    suites = sub.add_parser("suites", help="write the table's parts as JSONL suites for experiments.bench")
    suites.add_argument("--table", required=True)
    suites.add_argument("--out", required=True)
    ann = sub.add_parser("annotate", help="run, annotate and export the annotate part through the app")
    ann.add_argument("--table", required=True)
    ann.add_argument("--url", default="http://127.0.0.1:7860")
    ann.add_argument("--drafter", default="dflash", help="a drafter label of the app (or load one with --load)")
    ann.add_argument("--load", default=None, help="a checkpoint directory to load into the app first")
    ann.add_argument("--k", type=int, default=7)
    ann.add_argument("--max-new-tokens", type=int, default=96)
    ann.add_argument("--label", default=None, help="annotation label (default: the table's domain)")
    ann.add_argument("--note", default="")
    ann.add_argument("--per-run", type=int, default=4, help="rejected tokens annotated per run (spread over it)")
    ann.add_argument("--limit", type=int, default=None, help="first N prompts of the annotate part")
    ann.add_argument("--export", default=None, help="export folder inside the app's export root (default: label)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    try:
        table = load_table(a.table)
    except TableError as e:
        raise SystemExit(f"retrain_loop: {e}") from None
    if a.command == "suites":
        print(json.dumps({part: str(p) for part, p in write_suites(table, a.out).items()}))
        return
    from gradio_client import Client

    client = Client(a.url, verbose=False)
    drafter = a.drafter
    if a.load:
        dropdown, status = client.predict(a.load, api_name="/load_drafter")
        if "loaded drafter" not in status:
            raise SystemExit(f"retrain_loop: {status}")
        drafter = dropdown["value"]
    label = a.label or table["domain"]
    rows = annotate(client, table, drafter, a.k, a.max_new_tokens, label, a.per_run, a.note, a.limit)
    message, files = client.predict(a.export or label, label, "(all)", api_name="/export_annotations")
    if not files:
        raise SystemExit(f"retrain_loop: the export failed: {message}")
    taus = [r["tau"] for r in rows]
    folder = re.search(r"exported to (.*?):<ul>", message)
    print(json.dumps({"runs": len(rows), "annotated": sum(r["annotated"] for r in rows),
                      "mean_tau": sum(taus) / len(taus) if taus else None,
                      "export": html.unescape(folder.group(1)) if folder else None}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
