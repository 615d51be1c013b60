"""Compare tab: one prompt through 2-4 drafters side by side, stored with one comparison_group id.

It starts from Generate's prompt and defaults: each drafter at its default K (Workbench.default_k), the same max
new tokens. Speedups are against `ar` on the same prompt and settings: ar in this comparison when it is picked, else
the stored ar run (stored_reference), else one ar run first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from html import escape

import gradio as gr

from engine.tokenizer import default_template

from ..components import DrafterChecks
from ..device import DEVICE, on_device, session_key
from ..render import LiveView, message_html, plain_html, stats_html
from ..runner import (
    ar_rates,
    engine_settings,
    reference_of,
    relay,
    run_reference,
    run_stream,
    speedup,
    stored_reference,
)
from ..state import AppError, Workbench
from .common import (
    DEFAULT_MAX_NEW,
    USER_ERRORS,
    as_int,
    as_temperature,
    best_drafter,
    example_table,
    output_text,
    temperature_input,
    wire_stop,
)
from .generate import MAX_NEW, baseline_status, status_of

SLOTS = 4


def verdict(speedups: dict[str, float], ar_rates: list[float]) -> str:
    """Which drafter of a comparison is fastest, named only when its lead is outside the baseline's own noise:
    speedups {label: x over ar} (ar itself 1.0), ar_rates the tok/s of every stored ar run on this prompt and
    settings. The lead (fastest over runner-up) must exceed the ar runs' max/min ratio, so two runs that differ by
    less than ar differs from itself are called a tie."""
    ranked = sorted({"ar": 1.0, **speedups}.items(), key=lambda kv: kv[1], reverse=True)
    (best, top), (second, runner_up) = ranked[0], ranked[1]
    if len(ar_rates) < 2:
        return (f"fastest here: {best} ({top:.2f}x ar), but no winner named: one ar run gives no noise band; "
                "compare again (ar runs again) to get one")
    noise = max(ar_rates) / min(ar_rates)
    band = f"ar's own spread over {len(ar_rates)} runs is {100 * (noise - 1):.0f}%"
    if top / runner_up > noise:
        return f"winner: {best} ({top:.2f}x ar), ahead of {second} ({runner_up:.2f}x) by more than {band}"
    return f"no winner: {best} ({top:.2f}x ar) and {second} ({runner_up:.2f}x) differ by less than {band}"


def compare(wb: Workbench, prompt: str, labels: list[str] | None, k, temperature: float, max_new,
            request: gr.Request | None = None) -> Iterator[list]:
    """Run each drafter in turn (ar first), streaming every slot's header, block view and plain output. K None:
    each drafter at its default K. Without ar picked, the speedups are against the stored ar run on this prompt and
    settings, else against an ar run made first (stored in this comparison, not shown)."""
    heads, views, texts = [""] * SLOTS, [""] * SLOTS, [""] * SLOTS
    shown = [gr.update(visible=False)] * SLOTS

    def out(status):
        return [status, *shown, *heads, *views, *texts]

    def ar_progress(live):
        return out(baseline_status(live, labels[0]))

    try:
        order = {label: i for i, label in enumerate(wb.drafter_labels)}  # the checkboxes' order, ar first
        labels = sorted(labels or [], key=lambda label: (label != "ar", order.get(label, len(order))))
        if not 2 <= len(labels) <= SLOTS:
            raise AppError(f"pick 2 to {SLOTS} drafters to compare, not {len(labels)}")
        k = None if not str(k if k is not None else "").strip() else k  # checked against each drafter below
        max_new = as_int(max_new, "max new tokens", 1, MAX_NEW)
        temperature = as_temperature(temperature)
        if not (prompt or "").strip():
            raise AppError("the prompt is empty: type some text to generate from")
        for label in labels:  # a K some drafter refuses stops here, before anything runs
            wb.drafter(label, k)
        stop = wb.stop_event(session_key(request))
        group, template = uuid.uuid4().hex, default_template(wb.target.tokenizer)
        reference = None if "ar" in labels else stored_reference(wb, prompt, temperature, max_new, template=template)
        if reference is None and "ar" not in labels:
            reference = yield from relay(run_reference(wb, prompt, temperature, max_new, stop, group,
                                                       template=template), ar_progress)
            if reference is None:
                return
        shown = [gr.update(visible=i < len(labels)) for i in range(SLOTS)]
        speedups: dict[str, float] = {}
        for slot, label in enumerate(labels):
            live_view = LiveView(legend=slot == 0)
            for live in run_stream(wb, prompt, label, k, temperature, max_new, stop, reference=reference,
                                   template=template, comparison_group=group):
                heads[slot] = f"<h4>{escape(live.title)}</h4>" + stats_html(live.stats, *speedup(live, reference),
                                                                            steps=live.steps)
                views[slot] = live_view.html(live.steps, done=live.finished)
                texts[slot] = plain_html(output_text(wb, live.steps))
                yield out(status_of(live))
            if live.status != "done":
                return
            if label == "ar":
                reference = reference_of(live, group, "ar in this comparison",
                                         ar_rates(wb, prompt, engine_settings(temperature, max_new,
                                                                              template=template)))
            else:
                speedups[live.title] = speedup(live, reference)[0] or 0.0
        yield out(message_html(f"comparison {group} stored: {len(labels)} runs; "
                               f"{verdict(speedups, reference.rates)}"))
    except USER_ERRORS as e:
        gr.Warning(str(e))
        yield out(message_html(f"error: {e}", "error"))


def k_label(wb: Workbench) -> str:
    """The K field's label, naming each drafter's default K."""
    defaults = ", ".join(f"{label} {k}" for label, k in wb.default_k.items() if label != "ar")
    return f"K for every drafter (empty: each drafter's default K, as in Generate: {defaults})"


def build(wb: Workbench, tab: gr.Tab, generate_prompt: gr.Textbox) -> None:
    """Lay out the Compare tab and wire its events; opening it takes Generate's prompt when that one changed."""
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="prompt", lines=3, elem_id="cmp-prompt")
            example_table(wb, prompt)
        with gr.Column(scale=2):
            default = ["ar", best_drafter(wb)] if best_drafter(wb) != "ar" else ["ar"]
            labels = DrafterChecks(choices=wb.drafter_labels, value=default, label="drafters (2-4)",
                                      elem_id="cmp-drafters")
            with gr.Row():
                k = gr.Textbox(value="", label=k_label(wb), placeholder="each drafter's default", elem_id="cmp-k")
                max_new = gr.Number(value=DEFAULT_MAX_NEW, precision=0, label="max new tokens", elem_id="cmp-max")
            temperature = temperature_input(elem_id="cmp-temperature")
            with gr.Row():
                run = gr.Button("Compare", variant="primary", elem_id="cmp-run")
                stop = gr.Button("Stop", variant="stop")
    status = gr.HTML(label="status", elem_id="cmp-status")
    columns, heads, views, texts = [], [], [], []
    with gr.Row():
        for i in range(SLOTS):
            with gr.Column(visible=False, min_width=240) as column:
                heads.append(gr.HTML(label=f"slot {i + 1} stats", elem_id=f"cmp-head-{i}"))
                texts.append(gr.HTML(label=f"slot {i + 1} output text", elem_id=f"cmp-text-{i}"))
                views.append(gr.HTML(label=f"slot {i + 1} block view", elem_id=f"cmp-view-{i}"))
            columns.append(column)

    def start(prompt, drafters, k, temperature, max_new_tokens, request: gr.Request):
        yield from compare(wb, prompt, drafters, k, temperature, max_new_tokens, request)

    run.click(on_device(wb, "Compare", start), [prompt, labels, k, temperature, max_new],
              [status, *columns, *heads, *views, *texts], api_name="compare", **DEVICE)
    wire_stop(wb, stop)
    taken = gr.State("")  # the Generate prompt last copied here

    def on_select(source, current, copied):
        prompt = source if source and source != copied else current
        return gr.update(choices=wb.drafter_labels), gr.update(label=k_label(wb)), prompt, source or copied

    tab.select(on_select, [generate_prompt, prompt, taken], [labels, k, prompt, taken], api_visibility="private")
