"""Compare tab: one prompt through 2-4 drafters side by side, stored with one comparison_group id."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from html import escape

import gradio as gr

from ..render import LiveView, message_html, stats_html
from ..runner import run_stream, speedup, stored_ar_speed
from ..state import AppError, Workbench
from .common import DEVICE, USER_ERRORS, as_int, best_drafter, example_table, session_of, wire_stop
from .generate import MAX_NEW, status_of

SLOTS = 4


def compare(wb: Workbench, prompt: str, labels: list[str] | None, k, temperature: float, max_new,
            request: gr.Request | None = None) -> Iterator[list]:
    """Run each drafter in turn (ar first), streaming every slot's header and block view."""
    heads, views = [""] * SLOTS, [""] * SLOTS
    shown = [gr.update(visible=False)] * SLOTS

    def out(status):
        return [status, *shown, *heads, *views]

    try:
        labels = sorted(labels or [], key=lambda label: label != "ar")
        if not 2 <= len(labels) <= SLOTS:
            raise AppError(f"pick 2 to {SLOTS} drafters to compare, not {len(labels)}")
        k = as_int(k, "K", 0, 1024)
        max_new = as_int(max_new, "max new tokens", 1, MAX_NEW)
        if not (prompt or "").strip():
            raise AppError("the prompt is empty: type some text to generate from")
        stop = wb.stop_event(session_of(request))
        group = uuid.uuid4().hex
        ref = stored_ar_speed(wb)
        ar_tok, note = (ref[0], f"stored ar runs: {ref[0]:.1f} tok/s") if ref else (None, "")
        reference = None
        shown = [gr.update(visible=i < len(labels)) for i in range(SLOTS)]
        for slot, label in enumerate(labels):
            title = f"<h4>{escape(label)}{'' if label == 'ar' else f' · K={wb.drafter(label, k or None).k}'}</h4>"
            live_view = LiveView(legend=slot == 0)
            for live in run_stream(wb, prompt, label, k or None, temperature, max_new, stop,
                                   reference_ids=reference, comparison_group=group):
                heads[slot] = title + stats_html(live.stats, *speedup(live, ar_tok, note))
                views[slot] = live_view.html(live.steps, done=live.status != "running")
                yield out(status_of(live))
            if live.status != "done":
                return
            if label == "ar":
                ar_tok, note = live.stats["tok_per_s"], f"ar in this comparison: {live.stats['tok_per_s']:.1f} tok/s"
                reference = live.token_ids
        yield out(message_html(f"comparison {group} stored: {len(labels)} runs"))
    except USER_ERRORS as e:
        gr.Warning(str(e))
        yield out(message_html(f"error: {e}", "error"))


def build(wb: Workbench, tab: gr.Tab) -> None:
    """Lay out the Compare tab and wire its events."""
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="prompt", lines=3, elem_id="cmp-prompt")
            example_table(wb, prompt)
        with gr.Column(scale=2):
            default = ["ar", best_drafter(wb)] if best_drafter(wb) != "ar" else ["ar"]
            labels = gr.CheckboxGroup(choices=wb.drafter_labels, value=default, label="drafters (2-4)",
                                      elem_id="cmp-drafters")
            with gr.Row():
                k = gr.Number(value=8, precision=0, label="K for every drafter (0 = each one's default)")
                max_new = gr.Number(value=64, precision=0, label="max new tokens")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature")
            with gr.Row():
                run = gr.Button("Compare", variant="primary", elem_id="cmp-run")
                stop = gr.Button("Stop", variant="stop")
    status = gr.HTML(elem_id="cmp-status")
    columns, heads, views = [], [], []
    with gr.Row():
        for i in range(SLOTS):
            with gr.Column(visible=False, min_width=240) as column:
                heads.append(gr.HTML(elem_id=f"cmp-head-{i}"))
                views.append(gr.HTML(elem_id=f"cmp-view-{i}"))
            columns.append(column)

    def start(prompt, labels, k, temperature, max_new, request: gr.Request):
        yield from compare(wb, prompt, labels, k, temperature, max_new, request)

    run.click(start, [prompt, labels, k, temperature, max_new], [status, *columns, *heads, *views],
              api_name="compare", **DEVICE)
    wire_stop(wb, stop)
    tab.select(lambda: gr.update(choices=wb.drafter_labels), None, labels, api_visibility="private")
