"""One generation streamed step by step and stored when it ends: 'done', or 'cancelled' when stopped.

Every run is timed warm: its shapes are compiled first (engine.warm_up, untimed) and the warm-up's XLA compiles and
seconds are reported apart (stats warmup_compiles, warmup_s). A drafter's speedup compares it with an `ar` run on the
same prompt and settings, also timed warm (stored_reference, run_reference). A run is never lost: when the history
cannot be written the run goes to <db dir>/unsaved/<uuid>.json.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TypeVar

import engine
from engine.decode import settings_of
from engine.sharding import mesh_label
from engine.tokenizer import template_label
from storage import HistoryError

from . import queries
from .render import drafter_k
from .state import Workbench

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Live:
    """A run as the UI sees it after each step."""

    label: str
    steps: list[dict]
    stats: dict
    status: str  # prefilling | running | done | cancelled
    run_id: str | None = None
    message: str = ""
    token_ids: list[int] = field(default_factory=list)
    k: int = 0  # tokens drafted per step (0: ar)

    @property
    def title(self) -> str:
        """What ran: 'ngram K=4', or 'ar'."""
        return drafter_k(self.label, self.k)

    @property
    def finished(self) -> bool:
        return self.status in ("done", "cancelled")


class PrefillStopped(Exception):
    """Stop was pressed while the prompt was prefilled: raised after the chunk that was running."""


class PrefillProgress:
    """Chunks of the prompt prefilled so far, as the engine reports them (engine.stream on_prefill); with a stop
    flag set, the prefill ends after the current chunk (PrefillStopped)."""

    POLL_S = 0.5

    def __init__(self, n_prompt: int, stop: threading.Event | None = None):
        self.n_prompt, self.done, self.total, self.t0, self.stop = n_prompt, 0, 0, time.perf_counter(), stop

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self.stop is not None and self.stop.is_set() and done < total:
            raise PrefillStopped(f"stopped while prefilling, after chunk {done}/{total}")

    def text(self) -> str:
        """'prefilling 6,696 prompt tokens: chunk 12/105, about 80 s left'."""
        head = f"prefilling {self.n_prompt:,} prompt tokens"
        if not self.done:
            return f"{head} …"
        left = (time.perf_counter() - self.t0) / self.done * (self.total - self.done)
        return f"{head}: chunk {self.done}/{self.total}, about {left:.0f} s left"


def first_step(gen: Iterator, progress: PrefillProgress, label: str, k: int,
               warm: dict) -> Generator[Live, None, object]:
    """next(gen) (the prefill, then the first verify step) in a worker thread, yielding a 'prefilling' Live each
    time the prefill's progress moves; returns the step, or raises what next(gen) raised (StopIteration too)."""
    with ThreadPoolExecutor(1) as pool:
        job, shown = pool.submit(next, gen), -1
        while not job.done():
            wait([job], timeout=PrefillProgress.POLL_S)
            if progress.done != shown and not job.done():
                shown = progress.done
                yield Live(label, [], dict(warm), "prefilling", message=progress.text(), k=k)
        return job.result()


@dataclass
class Reference:
    """The `ar` run a drafter run is compared with: same prompt and settings, timed warm."""

    run_id: str | None
    tok_per_s: float
    token_ids: list[int]
    comparison_group: str | None
    note: str
    rates: list[float] = field(default_factory=list)  # tok/s of every stored matching ar run (its spread)


def live_stats(steps: list[dict], decode_s: float) -> dict:
    """tau, acceptance rate, tokens/s and counts of the steps so far (same names as the engine's stats)."""
    n_out = sum(len(s["emitted"]) for s in steps)
    drafted = sum(len(s["drafted"]) for s in steps)
    accepted = sum(s["accepted"] for s in steps)
    return {"tau": n_out / len(steps) if steps else 0.0,
            "acceptance_rate": accepted / drafted if drafted else None,
            "tok_per_s": n_out / decode_s if decode_s > 0 else 0.0,
            "n_steps": len(steps), "n_generated": n_out, "drafted": drafted, "accepted": accepted}


def engine_settings(temperature: float, max_new_tokens: int, raw: bool = False, template: dict | None = None) -> dict:
    """The generation keywords of every app run (greedy when temperature is 0, seed 0; the chat template with its
    switches unless raw)."""
    return dict(temperature=temperature, top_p=1.0, seed=0, max_new_tokens=max_new_tokens, raw=bool(raw),
                template=dict(template or {}))


def run_settings(wb: Workbench, drafter: engine.Drafter, settings: dict) -> dict:
    """The settings a run with these generation keywords is stored with (batch 1 on the target's mesh)."""
    return settings_of(wb.target, drafter, **settings | {"template": template_label(settings.get("template"))},
                       batch=1, mesh=mesh_label(wb.target.mesh))


def partial_result(wb: Workbench, drafter: engine.Drafter, prompt: str, steps: list[dict], t_start: float,
                   t_decode: float, settings: dict) -> dict:
    """A GenerationResult-shaped dict for a run stopped before its end."""
    now = time.perf_counter()
    out = [t for s in steps for t in s["emitted"]]
    prompt_ids = wb.target.encode(prompt, settings["raw"], settings["template"]).tolist()
    stats = live_stats(steps, now - t_decode) | {
        "wall_s": now - t_start, "prefill_ms": (t_decode - t_start) * 1e3, "decode_s": now - t_decode,
        "n_prompt": len(prompt_ids), "draft_ms": sum(s["draft_ms"] for s in steps),
        "verify_ms": sum(s["verify_ms"] for s in steps), "stop_reason": "cancelled"}
    return {"text": wb.target.decode(out), "token_ids": out, "prompt_ids": prompt_ids,
            "steps": steps, "stats": stats, "settings": run_settings(wb, drafter, settings)}


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
               stop: threading.Event | None = None, reference: Reference | None = None, raw: bool = False,
               template: dict | None = None, **meta) -> Iterator[Live]:
    """Compile this run's shapes (untimed), then yield a Live after every verify step, then the stored run (status
    'done' or 'cancelled'). K: see Workbench.drafter.

    Input errors (GenerationError, DrafterError, AppError) raise before the first step. reference: the `ar` run of
    the same prompt and settings; with temperature 0 the run is stored with lossless = equality of the outputs, and
    in the reference's comparison group unless meta names one.
    """
    drafter = wb.drafter(label, k)
    settings = engine_settings(temperature, max_new_tokens, raw, template)
    compiles, seconds = engine.warm_up(wb.target, [prompt], drafter, **settings)
    warm = {"warmup_compiles": compiles, "warmup_s": seconds}
    progress = PrefillProgress(len(wb.target.encode(prompt, raw, template)), stop)
    gen = engine.stream(wb.target, prompt, drafter, on_prefill=progress.update, **settings)
    meta = {"prompt": prompt, **wb.example_meta(prompt), **meta}
    if reference is not None:
        meta.setdefault("comparison_group", reference.comparison_group)
        if label != "ar":  # the speedup is pinned to this ar run, for good (stored_speedup)
            meta.setdefault("baseline_run_id", reference.run_id)
    steps: list[dict] = []
    note = ""  # why a run stopped early, beside its status
    t_start = time.perf_counter()
    t_decode = t_start

    def doing() -> str:  # this run's progress, for the users waiting for the device (app.device)
        title = drafter_k(label, drafter.k)
        if not steps:
            return f"{title}: {progress.text()}"
        stats = live_stats(steps, time.perf_counter() - t_decode)
        left = (max_new_tokens - stats["n_generated"]) / stats["tok_per_s"] if stats["tok_per_s"] else None
        return (f"{title}: {stats['n_generated']}/{max_new_tokens} tokens"
                + ("" if left is None else f", at most about {left:.0f} s left"))

    if wb.device_use is not None:
        wb.device_use.doing = doing
    try:
        while True:
            try:
                step = (yield from first_step(gen, progress, label, drafter.k, warm)) if not steps else next(gen)
            except StopIteration as done:
                result, status = done.value.to_dict(), "done"
                break
            except PrefillStopped as e:
                result = partial_result(wb, drafter, prompt, steps, t_start, time.perf_counter(), settings)
                status, note = "cancelled", str(e)
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
            yield Live(label, steps, live_stats(steps, time.perf_counter() - t_decode) | warm, "running", k=drafter.k)
            if stop is not None and stop.is_set():
                gen.close()
                result, status = partial_result(wb, drafter, prompt, steps, t_start, t_decode, settings), "cancelled"
                break
    except GeneratorExit:  # the page went away mid-run: keep what was computed
        gen.close()
        result = partial_result(wb, drafter, prompt, steps, t_start, t_decode, settings)
        result["stats"] |= warm
        store(wb, result, status="cancelled", **meta)
        raise
    if status == "done" and reference is not None and temperature == 0:
        meta["lossless"] = result["token_ids"] == reference.token_ids
    result["stats"] |= warm
    run_id, message = store(wb, result, status=status, **meta)
    message = message or meta.get("error", "") or note
    yield Live(label, result["steps"], result["stats"], status, run_id, message, result["token_ids"], drafter.k)


def ar_rates(wb: Workbench, prompt: str, settings: dict) -> list[float]:
    """tok/s of every stored `ar` run on this prompt and settings, timed warm."""
    full = run_settings(wb, wb.drafter("ar"), settings)
    return [r["tok_per_s"] for r in queries.matching_ar_runs(wb.history, prompt, full)]


def reference_of(live: Live, comparison_group: str | None, note: str, rates: list[float] | None = None) -> Reference:
    """A finished `ar` Live as the reference of the drafter runs after it."""
    tok_per_s = live.stats["tok_per_s"]
    return Reference(live.run_id, tok_per_s, live.token_ids, comparison_group, f"{note}: {tok_per_s:.1f} tok/s",
                     rates or [])


def stored_reference(wb: Workbench, prompt: str, temperature: float, max_new_tokens: int, raw: bool = False,
                     template: dict | None = None) -> Reference | None:
    """The newest stored `ar` run on this prompt and settings, timed warm (queries.matching_ar_run), or None."""
    settings = engine_settings(temperature, max_new_tokens, raw, template)
    rows = queries.matching_ar_runs(wb.history, prompt, run_settings(wb, wb.drafter("ar"), settings))
    if not rows:
        return None
    row = rows[0]
    return Reference(row["run_id"], row["tok_per_s"], row["token_ids"], row["comparison_group"],
                     f"stored ar run …{row['run_id'][-8:]}, same prompt and settings: {row['tok_per_s']:.1f} tok/s",
                     [r["tok_per_s"] for r in rows])


def run_reference(wb: Workbench, prompt: str, temperature: float, max_new_tokens: int,
                  stop: threading.Event | None = None, comparison_group: str | None = None,
                  raw: bool = False, template: dict | None = None) -> Generator[Live, None, Reference | None]:
    """Run `ar` on this prompt and settings in comparison_group (default: a new group), yielding its Lives; return
    it as the Reference, or None when it was stopped."""
    group = comparison_group or uuid.uuid4().hex
    for live in run_stream(wb, prompt, "ar", None, temperature, max_new_tokens, stop, raw=raw, template=template,
                           comparison_group=group):
        yield live
    if live.status != "done":
        return None
    rates = ar_rates(wb, prompt, engine_settings(temperature, max_new_tokens, raw, template))
    return reference_of(live, group, "ar on this prompt and settings, just run", rates)


def relay(lives: Generator[Live, None, R], show: Callable[[Live], T]) -> Generator[T, None, R]:
    """Yield show(live) for each Live of a generator, then return the generator's own return value."""
    while True:
        try:
            live = next(lives)
        except StopIteration as done:
            return done.value
        yield show(live)


def speedup(live: Live, reference: Reference | None) -> tuple[float | None, str]:
    """This run's tokens/s over its `ar` reference's, and the note saying what the reference is; with two or more
    stored ar runs, the range against the fastest and slowest of them, and whether 1.0x lies inside it (then the
    run is not faster than ar beyond the baseline's own noise)."""
    if live.label == "ar":
        return 1.0, "this is the ar baseline"
    if reference is None or not reference.tok_per_s:
        return None, "no ar run on this prompt and settings"
    tok_per_s = live.stats.get("tok_per_s", 0.0)
    if not tok_per_s:  # prefilling, or stopped before a token: nothing decoded to compare yet
        return None, f"none yet: nothing decoded; the reference is {reference.note}"
    note = reference.note
    lo, hi = spread(tok_per_s, reference.rates)
    if lo is not None:
        note += (f"; {lo:.2f}-{hi:.2f}x against all {len(reference.rates)} stored ar runs"
                 + (": within noise" if lo <= 1.0 <= hi else ""))
    return tok_per_s / reference.tok_per_s, note


def spread(tok_per_s: float, ar_rates: list[float]) -> tuple[float | None, float | None]:
    """The speedup against the fastest and the slowest of >= 2 ar runs (None, None with fewer)."""
    if len(ar_rates) < 2 or not tok_per_s:
        return None, None
    return tok_per_s / max(ar_rates), tok_per_s / min(ar_rates)


def stored_speedup(wb: Workbench, run: dict) -> tuple[float | None, str]:
    """A stored run's speedup over the `ar` run it was measured against (its baseline_run_id, stored with it), with
    the spread of the stored ar runs on its prompt and settings beside it; a run stored without one (older
    histories, runs with no reference) against the newest such ar run, and says so."""
    settings = run.get("settings") or {}
    if settings.get("drafter") == "ar" or run.get("status") != "done" or not run.get("prompt"):
        return (1.0, "this is the ar baseline") if settings.get("drafter") == "ar" else (None, "")
    rows = queries.matching_ar_runs(wb.history, run["prompt"], settings)
    pinned = run.get("baseline_run_id") and queries.ar_run(wb.history, run["baseline_run_id"])
    if pinned:
        note = f"ar run …{pinned['run_id'][-8:]} it was measured against: {pinned['tok_per_s']:.1f} tok/s"
    elif rows:
        pinned = rows[0]
        note = (f"no baseline stored with it; the newest ar run …{pinned['run_id'][-8:]}: "
                f"{pinned['tok_per_s']:.1f} tok/s")
    else:
        return None, "no stored ar run on this prompt and settings"
    reference = Reference(pinned["run_id"], pinned["tok_per_s"], pinned["token_ids"], pinned["comparison_group"],
                          note, [r["tok_per_s"] for r in rows])
    live = Live(settings.get("drafter") or "", run.get("steps") or [], run.get("stats") or {}, "done")
    return speedup(live, reference)
