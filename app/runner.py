"""One generation streamed step by step and stored when it ends: 'done', or 'cancelled' when stopped.

A run is never lost: when the history cannot be written the run goes to <db dir>/unsaved/<uuid>.json.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from statistics import mean

import jax

import engine
from engine.decode import settings_of
from storage import HistoryError

from .state import Workbench


@dataclass
class Live:
    """A run as the UI sees it after each step."""

    label: str
    steps: list[dict]
    stats: dict
    status: str  # running | done | cancelled
    run_id: str | None = None
    message: str = ""
    token_ids: list[int] = field(default_factory=list)


def live_stats(steps: list[dict], decode_s: float) -> dict:
    """tau, acceptance rate, tokens/s and counts of the steps so far (same names as the engine's stats)."""
    n_out = sum(len(s["emitted"]) for s in steps)
    drafted = sum(len(s["drafted"]) for s in steps)
    accepted = sum(s["accepted"] for s in steps)
    return {"tau": n_out / len(steps) if steps else 0.0,
            "acceptance_rate": accepted / drafted if drafted else None,
            "tok_per_s": n_out / decode_s if decode_s > 0 else 0.0,
            "n_steps": len(steps), "n_generated": n_out, "drafted": drafted, "accepted": accepted}


def partial_result(wb: Workbench, drafter: engine.Drafter, prompt: str, steps: list[dict], t_start: float,
                   t_decode: float, settings: dict) -> dict:
    """A GenerationResult-shaped dict for a run stopped before its end."""
    now = time.perf_counter()
    out = [t for s in steps for t in s["emitted"]]
    prompt_ids = wb.target.encode(prompt).tolist()
    stats = live_stats(steps, now - t_decode) | {
        "wall_s": now - t_start, "prefill_ms": (t_decode - t_start) * 1e3, "decode_s": now - t_decode,
        "n_prompt": len(prompt_ids), "draft_ms": sum(s["draft_ms"] for s in steps),
        "verify_ms": sum(s["verify_ms"] for s in steps), "stop_reason": "cancelled"}
    return {"text": wb.target.decode(out), "token_ids": out, "prompt_ids": prompt_ids,
            "steps": steps, "stats": stats, "settings": settings_of(wb.target, drafter, **settings)}


def store(wb: Workbench, result: dict, **meta) -> tuple[str | None, str]:
    """Write a run in one call; (run_id, message). On failure the run is saved as JSON beside the history."""
    try:
        return wb.history.write_run(result, source="app", **meta), ""
    except HistoryError as e:
        folder = wb.history.path.parent / "unsaved"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps({"result": result, "meta": meta}, default=str))
        return None, f"the history could not be written ({e}); the run was saved to {path}"


def run_stream(wb: Workbench, prompt: str, label: str, k: int | None, temperature: float, max_new_tokens: int,
               stop: threading.Event | None = None, reference_ids: list[int] | None = None,
               **meta) -> Iterator[Live]:
    """Yield a Live after every verify step, then the stored run (status 'done' or 'cancelled').

    Input errors (GenerationError, DrafterError, AppError) raise before the first step. reference_ids: the `ar`
    output of the same prompt and settings; with temperature 0 the run is stored with lossless = equality.
    """
    drafter = wb.drafter(label, k)
    settings = dict(temperature=temperature, top_p=1.0, seed=0, max_new_tokens=max_new_tokens, raw=False)
    gen = engine.stream(wb.target, prompt, drafter, max_new_tokens=max_new_tokens, temperature=temperature)
    meta = {"prompt": prompt, **wb.example_meta(prompt), **meta}
    steps: list[dict] = []
    t_start = time.perf_counter()
    t_decode = t_start
    try:
        while True:
            try:
                step = next(gen)
            except StopIteration as done:
                result, status = done.value.to_dict(), "done"
                break
            except Exception as e:
                if not steps:
                    raise
                result = partial_result(wb, drafter, prompt, steps, t_start, t_decode, settings)
                status, meta["error"] = "cancelled", f"{type(e).__name__}: {e}"
                break
            if not steps:
                t_decode = time.perf_counter() - (step.draft_ms + step.verify_ms) / 1e3
            steps.append(step.to_dict())
            yield Live(label, steps, live_stats(steps, time.perf_counter() - t_decode), "running")
            if stop is not None and stop.is_set():
                gen.close()
                result, status = partial_result(wb, drafter, prompt, steps, t_start, t_decode, settings), "cancelled"
                break
    except GeneratorExit:  # the page went away mid-run: keep what was computed
        gen.close()
        store(wb, partial_result(wb, drafter, prompt, steps, t_start, t_decode, settings), status="cancelled",
              **meta)
        raise
    if status == "done" and reference_ids is not None and temperature == 0:
        meta["lossless"] = result["token_ids"] == reference_ids
    run_id, message = store(wb, result, status=status, **meta)
    message = message or meta.get("error", "")
    yield Live(label, result["steps"], result["stats"], status, run_id, message, result["token_ids"])


def stored_ar_speed(wb: Workbench, limit: int = 5) -> tuple[float, int] | None:
    """Mean tokens/s of the latest stored `ar` runs on this target, dtype and backend (compile-free first)."""
    rows = wb.history.query(
        "SELECT tok_per_s FROM runs WHERE drafter = 'ar' AND status = 'done' AND tok_per_s > 0 AND target = ? "
        "AND dtype = ? AND backend = ? ORDER BY coalesce(compiles, 0) > 0, created_at DESC LIMIT ?",
        [wb.target.name, wb.target.dtype, jax.default_backend(), limit])
    return (mean(r["tok_per_s"] for r in rows), len(rows)) if rows else None


def speedup(live: Live, ar_tok_s: float | None, note: str) -> tuple[float | None, str]:
    """This run's tokens/s over the ar reference, and the note saying what the reference is."""
    if live.label == "ar":
        return 1.0, "this is the ar baseline"
    if not ar_tok_s:
        return None, note or "no stored ar run on this target yet: tick 'also run ar' once"
    return live.stats.get("tok_per_s", 0.0) / ar_tok_s, note
