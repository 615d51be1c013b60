"""Generate tab: one prompt through one drafter, streamed as a block view with live tau, tokens/s and speedup."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from ..render import LiveView, block_view, message_html, stats_html
from ..runner import Live, run_stream, speedup, stored_ar_speed
from ..state import Workbench
from .common import DEVICE, USER_ERRORS, as_int, drafter_dropdown, example_table, session_of, unavailable_md, wire_stop

MAX_NEW = 2048


def status_of(live: Live) -> str:
    """A one-line status for a run in progress or finished."""
    n = live.stats.get("n_generated", 0)
    if live.status == "running":
        return message_html(f"{live.label}: step {len(live.steps)}, {n} tokens …")
    text = (f"{live.label}: {'stopped' if live.status == 'cancelled' else 'done'} after {n} tokens; "
            f"stored as run {live.run_id}" + (" (status cancelled)" if live.status == "cancelled" else ""))
    return message_html(text + (f" — {live.message}" if live.message else ""), "warn" if live.message else "info")


def generate(wb: Workbench, prompt: str, label: str, k, temperature: float, max_new, with_ar: bool,
             request: gr.Request | None = None) -> Iterator[tuple[str, str, str, str]]:
    """Stream (block view, stats, status, run_id) after each verify step."""
    stop = wb.stop_event(session_of(request))
    view = block_view([], prompt)
    try:
        k = as_int(k, "K", 0, 1024)
        max_new = as_int(max_new, "max new tokens", 1, MAX_NEW)
        ar_tok, note, reference = None, "", None
        if with_ar and label != "ar":
            for live in run_stream(wb, prompt, "ar", None, temperature, max_new, stop):
                yield view, "", message_html(f"running the ar baseline: step {len(live.steps)} …"), ""
            if live.status != "done":
                yield view, "", status_of(live), live.run_id or ""
                return
            ar_tok, reference = live.stats["tok_per_s"], live.token_ids
            note = f"ar on this prompt: {ar_tok:.1f} tok/s, run {live.run_id}"
        elif label != "ar" and (ref := stored_ar_speed(wb)):
            ar_tok, note = ref[0], f"mean of the latest {ref[1]} stored ar runs: {ref[0]:.1f} tok/s"
        live_view = LiveView(prompt)
        for live in run_stream(wb, prompt, label, k or None, temperature, max_new, stop, reference_ids=reference):
            stats = stats_html(live.stats, *speedup(live, ar_tok, note))
            view = live_view.html(live.steps, done=live.status != "running")
            yield view, stats, status_of(live), live.run_id or ""
    except USER_ERRORS as e:
        gr.Warning(str(e))
        yield view, "", message_html(f"error: {e}", "error"), ""


def build(wb: Workbench) -> None:
    """Lay out the Generate tab and wire its events."""
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="prompt", lines=4, placeholder="Type a prompt or pick an example below",
                                elem_id="gen-prompt")
            example_table(wb, prompt)
        with gr.Column(scale=2):
            drafter = drafter_dropdown(wb, elem_id="gen-drafter", allow_custom_value=True)
            with gr.Row():
                k = gr.Number(value=wb.default_k[drafter.value], precision=0, label="K (drafted tokens per step)",
                              elem_id="gen-k")
                max_new = gr.Number(value=128, precision=0, label="max new tokens", elem_id="gen-max")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)")
            with_ar = gr.Checkbox(label="also run ar on this prompt for the speedup (otherwise: mean of the latest "
                                        "stored ar runs on this target)")
            with gr.Row():
                run = gr.Button("Generate", variant="primary", elem_id="gen-run")
                stop = gr.Button("Stop", variant="stop", elem_id="gen-stop")
            missing = f" ({len(wb.unavailable)} unavailable: {', '.join(wb.unavailable)})" if wb.unavailable else ""
            with gr.Accordion(f"drafters{missing}", open=False):
                gr.Markdown(unavailable_md(wb))
                folder = gr.Textbox(label="load a drafter from a checkpoint directory (inside --model-root)")
                load = gr.Button("Load drafter")
                load_status = gr.HTML()
    status = gr.HTML(elem_id="gen-status")
    stats = gr.HTML(elem_id="gen-stats")
    view = gr.HTML(block_view([]), elem_id="gen-view")
    run_id = gr.Textbox(label="stored run id", interactive=False, elem_id="gen-run-id")

    def start(prompt, drafter, k, temperature, max_new, with_ar, request: gr.Request):
        yield from generate(wb, prompt, drafter, k, temperature, max_new, with_ar, request)

    inputs = [prompt, drafter, k, temperature, max_new, with_ar]
    run.click(start, inputs, [view, stats, status, run_id], api_name="generate", **DEVICE)
    prompt.submit(start, inputs, [view, stats, status, run_id], api_visibility="private", **DEVICE)

    wire_stop(wb, stop, api_name="stop")
    drafter.change(lambda label: wb.default_k.get(label, 0), drafter, k, api_visibility="private")

    def load_dir(path):
        try:
            label = wb.add_drafter_dir(path)
        except USER_ERRORS as e:
            return gr.update(), message_html(str(e), "error")
        return gr.update(choices=wb.drafter_labels, value=label), message_html(f"loaded drafter {label}")

    load.click(load_dir, folder, [drafter, load_status], api_name="load_drafter", **DEVICE)
