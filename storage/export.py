"""Export annotations: Parquet (rows joined with run and step data), SpecForge JSONL, rejection records."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .history import History, _dicts, _filters, _where

# One row per annotation: the annotation, its run, its step, and the rejection record fields.
# position: absolute position of the annotated drafted token; prefix_ids: every token before it
# (prompt, the `emitted` of all earlier steps, then the drafted tokens before it in its block).
EXPORT_SELECT = """
SELECT a.annotation_id AS id, a.run_id, a.step_idx, a.draft_pos, a.label, a.note, a.created_at, a.updated_at,
       r.target, r.drafter, r.drafter_checkpoint, r.k, r.temperature, r.top_p, r.seed, r.status, r.source,
       r.suite, r.split, r.prompt_id, r.category, r.prompt, r.text, r.created_at AS run_created_at,
       s.position AS step_position, s.drafted, s.accepted, s.bonus, s.emitted, s.drafted_text, s.bonus_text,
       s.position + 1 + a.draft_pos AS position,
       s.drafted[a.draft_pos + 1] AS drafted_token,
       CASE WHEN a.draft_pos = s.accepted THEN s.bonus ELSE s.top5_ids[a.draft_pos + 1][1] END AS target_token,
       CASE WHEN a.draft_pos = s.accepted THEN s.bonus_text ELSE s.top5_text[a.draft_pos + 1][1] END AS target_text,
       s.p[a.draft_pos + 1] AS p, s.q[a.draft_pos + 1] AS q,
       s.top5_ids[a.draft_pos + 1] AS top5_ids, s.top5_p[a.draft_pos + 1] AS top5_p,
       s.top5_text[a.draft_pos + 1] AS top5_text,
       list_concat(coalesce(r.prompt_ids, []::INTEGER[]),
                   coalesce((SELECT flatten(list(e.emitted ORDER BY e.idx)) FROM steps e
                             WHERE e.run_id = a.run_id AND e.idx < a.step_idx), []::INTEGER[]),
                   s.drafted[1:a.draft_pos]) AS prefix_ids
FROM annotations a
JOIN runs r USING (run_id)
JOIN steps s ON s.run_id = a.run_id AND s.idx = a.step_idx
"""

REJECTION_FIELDS = ("id", "run_id", "step_idx", "draft_pos", "label", "note", "prefix_ids", "position",
                    "drafted_token", "target_token", "p", "q", "top5_ids", "top5_p", "drafter", "k", "temperature",
                    "target", "accepted", "drafted_text", "target_text", "prompt", "suite", "split")


def export_annotations(history: History, out_dir: str | os.PathLike, label: str | None = None,
                       drafter: str | None = None) -> dict[str, Path]:
    """Write annotations.parquet, conversations.jsonl (SpecForge) and rejections.jsonl into out_dir.

    Returns {"parquet": path, "conversations": path, "rejections": path}.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"parquet": out / "annotations.parquet", "conversations": out / "conversations.jsonl",
             "rejections": out / "rejections.jsonl"}
    where, params = _filters(("a.label", label), ("r.drafter", drafter))
    with history._connect() as con:
        con.execute(f"CREATE TEMP TABLE export_rows AS {EXPORT_SELECT} {_where(where)} "
                    "ORDER BY a.created_at, a.annotation_id", params)
        parquet = str(paths["parquet"]).replace("'", "''")
        con.execute(f"COPY export_rows TO '{parquet}' (FORMAT parquet)")
        rows = _dicts(con.execute("SELECT * FROM export_rows ORDER BY run_created_at, run_id, created_at, id"))

    with open(paths["conversations"], "w", encoding="utf-8") as f:
        seen: set[str] = set()
        for r in rows:
            if r["run_id"] not in seen:
                seen.add(r["run_id"])
                conversation = [{"role": "user", "content": r["prompt"] or ""},
                                {"role": "assistant", "content": r["text"] or ""}]
                f.write(json.dumps({"id": r["run_id"], "conversations": conversation}, ensure_ascii=False) + "\n")
    with open(paths["rejections"], "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in REJECTION_FIELDS}, ensure_ascii=False) + "\n")
    return paths
