"""K-Flat tab: verify/draft latency vs K on this hardware or from stored sweeps, and the predicted speedup vs K."""

from __future__ import annotations

import gradio as gr
import jax

from engine.kflat import measure_kflat
from storage import drafter_label

from .. import plots, queries
from ..components import OpenDropdown
from ..device import DEVICE, on_device
from ..render import message_html
from ..state import AppError, Workbench
from .common import USER_ERRORS, as_int, best_drafter

NO_DRAFTER = "(none: verify only)"
MAX_KS = 16
DEFAULT_CONTEXT, DEFAULT_CACHE_ROWS = 128, 256  # where a default Generate run verifies (prompt + 128 new tokens)


def parse_ks(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8] (sorted, unique, each in 1..1024)."""
    try:
        ks = sorted({int(x) for x in str(text).replace(" ", "").split(",") if x})
    except ValueError:
        raise AppError(f"K values must be whole numbers separated by commas, got {text!r}") from None
    if not ks or len(ks) > MAX_KS or ks[0] < 1 or ks[-1] > 1024:
        raise AppError(f"give 1 to {MAX_KS} K values in 1..1024, got {text!r}")
    return ks


def figures(wb: Workbench, selected: list[str] | None, acc_drafter: str | None):
    """(latency figure, speedup figure, note) for the chosen sweeps and acceptance source (a stored drafter label:
    its kind, and its checkpoint where it has one)."""
    stored = queries.sweeps(wb.history)
    chosen = {stored[s]["short"]: stored[s]["rows"] for s in (selected or []) if s in stored}
    kind, checkpoint = acceptance_sources(wb).get(acc_drafter, (acc_drafter, None))
    curve, n = queries.survival(wb.history, wb.target.name, kind, checkpoint) if acc_drafter else ([], 0)
    source = f"{acc_drafter} on {wb.target.name}, {n} steps, measured to K={len(curve)}" if curve else "none"
    notes = []
    if chosen and acc_drafter and not curve:
        notes.append(f"no stored steps of {acc_drafter} on {wb.target.name}: generate with it first")
    elif curve and any(max(r["k"] for r in rows) > len(curve) for rows in chosen.values()):
        notes.append(f"speedup predicted only up to K={len(curve)}, the longest block {acc_drafter} was measured with")
    untimed = [label for label, rows in chosen.items() if not plots.times_drafter(rows, kind)]
    if curve and untimed:
        notes.append(f"{', '.join(untimed)} did not time {kind}'s draft step: that prediction leaves drafting "
                     f"out (run a sweep timing {kind})")
    measured = (queries.measured_speedups(wb.history, wb.target.name, kind, jax.devices()[0].device_kind,
                                          wb.template, checkpoint) if curve else [])
    notes += error_notes(wb, chosen, curve, measured, kind)
    speed = plots.speedup_figure(chosen, curve, source, kind, measured)
    return plots.kflat_figure(chosen), speed, "; ".join(notes)


def error_notes(wb: Workbench, chosen: dict[str, list[dict]], curve: list[float], measured: list[dict],
                drafter: str) -> list[str]:
    """The prediction's error on this machine: each sweep timed here against the drafter's measured runs."""
    notes = []
    for label, rows in chosen.items():
        if rows[0]["hardware"] != wb.hardware:
            continue
        errors = plots.prediction_errors(rows, curve, measured, plots.times_drafter(rows, drafter))
        if errors:
            notes.append(f"prediction error here ({label}): " + ", ".join(
                f"K={e['k']} predicted {e['predicted']:.2f}× vs measured {e['measured']:.2f}× over {e['n_pairs']} "
                f"run pair{'s' if e['n_pairs'] != 1 else ''} ({e['error']:+.0%})" for e in errors))
    return notes


def run_like(wb: Workbench, drafter: str | None) -> tuple[int, int, str]:
    """(context, cache rows, where they come from) for a sweep timed as a drafter's stored runs ran (drafter: a
    stored drafter label)."""
    source = acceptance_sources(wb).get(drafter)
    shape = queries.run_shape(wb.history, wb.target.name, *source) if source else None
    if shape is None:
        return DEFAULT_CONTEXT, DEFAULT_CACHE_ROWS, "a short prompt and 128 new tokens, as a default Generate run"
    return shape["context"], shape["cache_rows"], f"as {shape['n_runs']} stored {drafter} runs ran"


BLANK = (None, "", 0)  # a number box left empty (the page sends 0 for it): the sweep sizes it (run_like)


def blank_means(value: int, origin: str) -> str:
    """The info line of a field a sweep fills in when it is left blank (run_like)."""
    return f"blank: {value}, {origin}"


def note_html(text: str) -> str:
    """A warning line for a note on the plots, or nothing."""
    return message_html(text, "warn") if text else ""


def default_ks(wb: Workbench, drafter: str | None) -> str:
    """The K list a sweep starts from: powers of two up to 64, cut to what the timed drafter drafts (its max K
    last), so the default sweep always runs."""
    hi = 64 if drafter in (None, "", NO_DRAFTER, "ar") or drafter not in wb.sources else min(64, wb.max_k(drafter))
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k < hi] + [hi]
    return ",".join(map(str, ks))


def drafter_choices(wb: Workbench) -> list[str]:
    """Choices for timing a drafter's propose() too (ar proposes nothing)."""
    return [NO_DRAFTER] + [x for x in wb.drafter_labels if x != "ar"]


def stored_label(wb: Workbench, label: str) -> str:
    """How the history names the runs of the loaded drafter `label` (storage.drafter_label)."""
    loaded = wb.drafter(label)
    return drafter_label(loaded.name, loaded.checkpoint)


def timed_default(wb: Workbench, acc_drafter: str | None) -> str:
    """The drafter a sweep times by default: the loaded one the acceptance comes from, else the best one."""
    for label in drafter_choices(wb)[1:]:
        if stored_label(wb, label) == acc_drafter:
            return label
    best = best_drafter(wb)
    return NO_DRAFTER if best == "ar" else best


def sweep_choices(wb: Workbench) -> list[tuple[str, str]]:
    """(label, sweep_id) of every stored sweep, newest first."""
    return [(s["label"], sweep_id) for sweep_id, s in queries.sweeps(wb.history).items()]


def acceptance_sources(wb: Workbench) -> dict[str, tuple[str, str | None]]:
    """{stored drafter label: (kind, checkpoint)} of the drafters with stored per-position acceptance on this
    target, the preferred first: loaded ones before others, n-gram last. Two checkpoints of one kind stay apart."""
    rows = wb.history.query("SELECT DISTINCT drafter, drafter_checkpoint FROM position_acceptance WHERE target = ?",
                            [wb.target.name])
    loaded = {stored_label(wb, label) for label in drafter_choices(wb)[1:]}
    sources = {drafter_label(r["drafter"], r["drafter_checkpoint"]): (r["drafter"], r["drafter_checkpoint"])
               for r in rows}
    return dict(sorted(sources.items(), key=lambda kv: (kv[0] not in loaded, kv[1][0] == "ngram", kv[0])))


def acceptance_choices(wb: Workbench) -> list[str]:
    """Labels of acceptance_sources(), the preferred one first."""
    return list(acceptance_sources(wb))


def run_sweep(wb: Workbench, ks_text, context, repeats, drafter, selected, acc_drafter, cache_rows=None,
              progress: gr.Progress | None = None):
    """Measure a sweep on this machine, store it, and show it with the selected ones."""
    try:
        ks = parse_ks(ks_text)
        if context in BLANK:  # as the acceptance drafter's stored runs ran (the fields' info line)
            context, like_rows, _ = run_like(wb, acc_drafter)
            cache_rows = like_rows if cache_rows in BLANK else cache_rows
        context = as_int(context, "context length", 1, wb.target.cfg.max_position - ks[-1] - 2)
        repeats = as_int(repeats, "repeats", 1, 50)
        rows_needed = context + ks[-1] + 1
        cache_rows = (None if cache_rows in BLANK else
                      as_int(cache_rows, f"cache rows (context {context} + K={ks[-1]} + 1 need)", rows_needed,
                             wb.target.cfg.max_position + ks[-1] + 1))
        label = None if drafter in (None, "", NO_DRAFTER, "ar") else drafter
        if label and label not in wb.sources:
            raise AppError(f"drafter {label!r} is not loaded; choose one of {', '.join(wb.drafter_labels)}")
        for k in ks if label else ():  # a K the timed drafter refuses stops here, before anything is compiled
            wb.check_k(label, k)
        timed = f"verify and {label}'s draft" if label else "verify"
    except USER_ERRORS as e:
        gr.Warning(str(e))
        return (message_html(f"error: {e}", "error"), gr.update(), gr.update(), *figures(wb, selected, acc_drafter)[:2])
    rows, stored = [], {"sweep_id": None}

    def on_k(i: int, k: int) -> None:
        if progress is not None:
            progress((i, len(ks)), desc=f"K={k}: compiling, then timing {timed} x{repeats}", unit="K")

    def on_row(row: dict) -> None:  # each K is stored as soon as it is timed: a later failure loses nothing
        rows.append({**row, "context": context})
        stored["sweep_id"] = wb.history.write_kflat(rows[-1:], hardware=wb.hardware, backend=jax.default_backend(),
                                                    model=wb.target.name, dtype=wb.target.dtype,
                                                    drafter=wb.drafter(label).name if label else None,
                                                    sweep_id=stored["sweep_id"])

    try:
        measure_kflat(wb.target, ks, context, wb.sources[label] if label else None, repeats, on_k, on_row,
                      cache_rows)
    except USER_ERRORS as e:
        gr.Warning(str(e))
        kept = f"; the {len(rows)} K timed before it are stored as sweep {stored['sweep_id']}" if rows else ""
        return (message_html(f"error: {e}{kept}", "error"), gr.update(choices=sweep_choices(wb)), gr.update(),
                *figures(wb, selected, acc_drafter)[:2])
    sweep_id = stored["sweep_id"]
    selected = [sweep_id] + [s for s in (selected or []) if s != sweep_id]
    latency, speed, _ = figures(wb, selected, acc_drafter)  # its note goes to the note line (redraw)
    text = "; ".join(f"K={r['k']}: verify {r['verify_ms']:.1f} ms" + ("" if r["draft_ms"] is None else
                                                                       f", draft {r['draft_ms']:.1f} ms") for r in rows)
    status = message_html(f"sweep {sweep_id} on {wb.hardware} stored ({text})")
    return (status, gr.update(choices=sweep_choices(wb), value=selected),
            gr.update(choices=acceptance_choices(wb)), latency, speed)


def build(wb: Workbench, tab: gr.Tab) -> None:
    """Lay out the K-Flat tab and wire its events."""
    gr.Markdown(f"Times the target's verify step for blocks of K drafted tokens on **{wb.hardware}** (each K is "
                "compiled first; only warm calls are timed), and a drafter's draft step. Flat verify cost means "
                "wider blocks are free. The speedup plot combines a sweep with a drafter's measured per-position "
                "survival: speedup(K) = tau(K) / ((draft(K) + verify(K)) / ar step), tau(K) = 1 + sum of survival "
                "up to K, ar step = verify(K=1). A sweep that did not time that drafter's draft step gives a "
                "verify-only estimate, labelled as such.")
    accept = acceptance_choices(wb)
    timed = timed_default(wb, accept[0] if accept else None)
    ctx_value, rows_value, origin = run_like(wb, accept[0] if accept else None)
    with gr.Row():
        ks = gr.Textbox(value=default_ks(wb, timed), label="K values (the timed drafter's range: 1..its max K)",
                        elem_id="kf-ks")
        context = gr.Number(value=None, precision=0, label="context length", info=blank_means(ctx_value, origin),
                            elem_id="kf-context")
        cache_rows = gr.Number(value=None, precision=0, label="cache rows (verify cost grows with them)",
                               info=blank_means(rows_value, origin), elem_id="kf-cache")
        repeats = gr.Number(value=5, precision=0, label="repeats per K", elem_id="kf-rep")
        drafter = OpenDropdown(choices=drafter_choices(wb), value=timed,
                               label="also time this drafter's draft step", elem_id="kf-drafter")
        run = gr.Button("Run sweep on this hardware", variant="primary", elem_id="kf-run")
    with gr.Row():
        stored = sweep_choices(wb)
        selected = OpenDropdown(choices=stored, value=[s for _, s in stored[:1]], multiselect=True,
                                label="stored sweeps (any machine)", elem_id="kf-sweeps", scale=3)
        acc_drafter = OpenDropdown(choices=accept, value=accept[0] if accept else None,
                                   label="acceptance from drafter", scale=1,
                                   elem_id="kf-acc")
    first = figures(wb, selected.value, acc_drafter.value)
    status = gr.HTML(label="status", elem_id="kf-status")  # the last sweep's result; stays while plots are redrawn
    note = gr.HTML(note_html(first[2]), elem_id="kf-note")  # what the plots shown cannot say
    with gr.Row():
        latency = gr.Plot(first[0], label="verify (and draft) ms per step vs K", show_label=False, elem_id="kf-plot")
        speed = gr.Plot(first[1], label="speedup vs K", show_label=False, elem_id="kf-speedup")

    def start(k_values, context=None, repeats=None, drafter=None, stored_sweeps=None, acceptance_drafter=None,
              cache_rows=None, request: gr.Request = None, progress=gr.Progress()):  # noqa: B008 (Gradio injects both)
        """API names; a blank context and cache rows: sized as the acceptance drafter's stored runs ran."""
        return run_sweep(wb, k_values, context, repeats, drafter, stored_sweeps, acceptance_drafter, cache_rows,
                         progress)

    run.click(on_device(wb, "a K-Flat sweep", start),
              [ks, context, repeats, drafter, selected, acc_drafter, cache_rows],
              [status, selected, acc_drafter, latency, speed], api_name="kflat_sweep", **DEVICE)

    def redraw(selected, acc_drafter):
        latency_fig, speed_fig, text = figures(wb, selected, acc_drafter)
        return latency_fig, speed_fig, note_html(text)

    gr.on([selected.change, acc_drafter.change], redraw, [selected, acc_drafter], [latency, speed, note],
          api_visibility="private")
    def follow_acceptance(chosen):
        ctx, rows, where = run_like(wb, chosen)
        return (timed_default(wb, chosen), gr.update(info=blank_means(ctx, where)),
                gr.update(info=blank_means(rows, where)))

    def follow_timed(chosen, acceptance_drafter):
        name = stored_label(wb, chosen) if chosen in wb.sources else None
        source = name if name in acceptance_choices(wb) else acceptance_drafter
        return default_ks(wb, chosen), source

    acc_drafter.change(follow_acceptance, acc_drafter, [drafter, context, cache_rows], api_visibility="private")
    drafter.change(follow_timed, [drafter, acc_drafter], [ks, acc_drafter], api_visibility="private")

    def refresh(selected, acc_drafter):
        sweeps, choices = sweep_choices(wb), acceptance_choices(wb)
        return (gr.update(choices=sweeps, value=selected or [s for _, s in sweeps[:1]]),
                gr.update(choices=choices, value=acc_drafter or (choices[0] if choices else None)),
                gr.update(choices=drafter_choices(wb)))

    tab.select(refresh, [selected, acc_drafter], [selected, acc_drafter, drafter], api_visibility="private")
