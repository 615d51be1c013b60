"""Generate tab: one prompt through one drafter, streamed as a block view with live tau, tokens/s and speedup."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from engine.tokenizer import check_template, default_template, parse_template, template_label, template_switches

from ..device import DEVICE, on_device, session_key
from ..render import LiveView, block_view, message_html, plain_html, stats_html
from ..runner import Live, relay, run_reference, run_stream, speedup, stored_reference
from ..state import AppError, Workbench
from .common import (
    DEFAULT_MAX_NEW,
    USER_ERRORS,
    as_int,
    as_temperature,
    drafter_dropdown,
    example_table,
    output_text,
    temperature_input,
    unavailable_md,
    wire_stop,
)

MAX_NEW = 2048


def status_of(live: Live) -> str:
    """A one-line status for a run in progress or finished."""
    n = live.stats.get("n_generated", 0)
    if live.status == "prefilling":
        return message_html(f"{live.title}: {live.message}")
    if live.status == "running":
        return message_html(f"{live.title}: step {len(live.steps)}, {n} tokens …")
    text = (f"{live.title}: {'stopped' if live.status == 'cancelled' else 'done'} after {n} tokens; "
            f"stored as run {live.run_id}" + (" (status cancelled)" if live.status == "cancelled" else ""))
    return message_html(text + (f" — {live.message}" if live.message else ""), "warn" if live.message else "info")


def baseline_status(live: Live, label: str) -> str:
    """The status while the ar baseline of a `label` run runs: its progress, then that the baseline (not the run
    asked for) is done and `label` starts; stopped, the stored cancelled baseline."""
    if live.status == "prefilling":
        return message_html(f"ar baseline for the speedup: {live.message}")
    if live.status == "running":
        return message_html(f"running the ar baseline (it prefills the prompt too): step {len(live.steps)} …")
    if live.status == "done":
        return message_html(f"ar baseline done ({live.stats.get('n_generated', 0)} tokens, "
                            f"{live.stats.get('tok_per_s', 0.0):.1f} tok/s, stored as run {live.run_id}); "
                            f"starting {label} …")
    return status_of(live)


def prefill_status(wb: Workbench, label: str, prompt: str, raw: bool = False, note: str = "") -> str:
    """The status before a run's first step, while its shapes compile and the target reads the prompt."""
    return message_html(f"{label}: compiling, then prefilling {len(wb.target.encode(prompt, raw)):,} prompt tokens"
                        f"{note} …")


def k_field(wb: Workbench, label: str) -> dict:
    """The K field for a drafter: its default K and range in the info line; blank and locked for ar."""
    if label not in wb.sources or label == "ar":
        return {"value": None, "interactive": False, "info": "ar drafts nothing: no K"}
    return {"value": wb.default_k[label], "interactive": True,
            "info": f"{label}: a whole number in 1..{wb.max_k(label)} (default {wb.default_k[label]})"}


def templated_text(wb: Workbench, prompt: str, raw: bool, template: dict | None = None) -> str | None:
    """What the target reads for this prompt (special tokens shown), or None for an empty prompt."""
    if not (prompt or "").strip():
        return None
    return wb.target.tokenizer.decode(wb.target.encode(prompt, raw, template).tolist(), skip_special_tokens=False)


def template_field(wb: Workbench) -> dict:
    """The chat-template switches field: this target's default switches and the ones its template reads."""
    known = template_switches(wb.target.tokenizer)
    reads = "; ".join(f"{k}: {', '.join(str(v).lower() for v in vs)}" for k, vs in known.items())
    return {"value": template_label(default_template(wb.target.tokenizer)), "interactive": bool(known),
            "info": f"name=value, comma-separated; this target's template reads {reads}" if known else
                    "this target's chat template has no switches (thinking mode, reasoning effort): nothing to set"}


def read_template(text: str | None) -> dict:
    """The switches typed in the field, or an AppError saying how to write them."""
    try:
        return parse_template(text)
    except ValueError as e:
        raise AppError(str(e)) from None


def run_numbers(live: Live, ratio: float | None) -> dict:
    """A run's numbers as JSON for API clients: the same names as the stored run's columns."""
    keys = ("tau", "acceptance_rate", "tok_per_s", "n_steps", "n_generated", "drafted", "accepted")
    return {"run_id": live.run_id, "status": live.status, "drafter": live.label, "k": live.k or None,
            **{key: live.stats.get(key) for key in keys}, "speedup": ratio}


def generate(wb: Workbench, prompt: str, label: str, k, temperature: float, max_new, with_ar: bool,
             raw: bool = False, template_text: str | None = None,
             request: gr.Request | None = None) -> Iterator[tuple[str, str, str, str, str, dict]]:
    """Stream (block view, stats, status, run_id, plain output, run numbers) after each verify step. raw: the
    prompt as typed, without the chat template; template_text: the template's switches ('enable_thinking=false')."""
    stop = wb.stop_event(session_key(request))
    view, text = block_view([], prompt), plain_html("")

    def ar_progress(live: Live) -> tuple[str, str, str, str, str, dict]:
        return view, "", baseline_status(live, label), live.run_id or "", text, run_numbers(live, 1.0)

    try:
        k = None if label == "ar" else wb.check_k(label, k)
        max_new = as_int(max_new, "max new tokens", 1, MAX_NEW)
        temperature = as_temperature(temperature)
        template = read_template(template_text)
        problem = check_template(wb.target.tokenizer, template)
        if problem:
            raise AppError(problem)
        wb.drafter(label, k)  # a K this drafter refuses stops here, before any ar run
        reference = None
        if label != "ar":  # speedup against ar on this prompt and settings: a stored run, else one run now
            reference = None if with_ar else stored_reference(wb, prompt, temperature, max_new, raw, template)
            if reference is None:
                yield view, "", prefill_status(wb, "ar", prompt, raw, " (the speedup's reference; the drafter's run "
                                                                    "prefills the prompt again)"), "", text, {}
                reference = yield from relay(run_reference(wb, prompt, temperature, max_new, stop, raw=raw,
                                                           template=template),
                                             ar_progress)
                if reference is None:
                    return
        live_view = LiveView(prompt, templated=templated_text(wb, prompt, raw, template))
        yield view, "", prefill_status(wb, label, prompt, raw), "", text, {}
        for live in run_stream(wb, prompt, label, k, temperature, max_new, stop, reference=reference, raw=raw,
                               template=template):
            ratio, note = speedup(live, reference)
            stats = stats_html(live.stats, ratio, note, steps=live.steps)
            view = live_view.html(live.steps, done=live.finished)
            yield (view, stats, status_of(live), live.run_id or "", plain_html(output_text(wb, live.steps)),
                   run_numbers(live, ratio))
    except USER_ERRORS as e:
        gr.Warning(str(e))
        yield view, "", message_html(f"error: {e}", "error"), "", text, {"error": str(e)}


def build(wb: Workbench) -> gr.Textbox:
    """Lay out the Generate tab and wire its events; return its prompt box (Compare starts from it)."""
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="prompt", lines=4, placeholder="Type a prompt or pick an example below",
                                elem_id="gen-prompt")
            example_table(wb, prompt)
        with gr.Column(scale=2):
            drafter = drafter_dropdown(wb, elem_id="gen-drafter")
            with gr.Row():
                k = gr.Number(**k_field(wb, drafter.value), label="K: drafted tokens per step", elem_id="gen-k")
                max_new = gr.Number(value=DEFAULT_MAX_NEW, precision=0, label="max new tokens", elem_id="gen-max")
            temperature = temperature_input(elem_id="gen-temperature")
            with_ar = gr.Checkbox(label="run ar on this prompt again for the speedup (otherwise the stored ar run "
                                        "with this prompt and settings is used, and ar runs first when there is none)")
            raw = gr.Checkbox(label="raw prompt: no chat template (the block view shows what the target reads)",
                              elem_id="gen-raw")
            template = gr.Textbox(**template_field(wb), label="chat-template switches", elem_id="gen-template")
            with gr.Row():
                run = gr.Button("Generate", variant="primary", elem_id="gen-run")
                stop = gr.Button("Stop", variant="stop", elem_id="gen-stop")
            missing = f" ({len(wb.unavailable)} unavailable: {', '.join(wb.unavailable)})" if wb.unavailable else ""
            with gr.Accordion(f"drafters{missing}", open=False):
                gr.Markdown(unavailable_md(wb))
                folder = gr.Textbox(label="load a drafter from a checkpoint directory (inside --model-root)")
                load = gr.Button("Load drafter")
                load_status = gr.HTML(label="load status")
    status = gr.HTML(label="status", elem_id="gen-status")
    stats = gr.HTML(label="stats", elem_id="gen-stats")
    with gr.Row(equal_height=False):
        view = gr.HTML(block_view([]), label="block view", elem_id="gen-view", scale=3)
        text = gr.HTML(plain_html(""), label="output text", elem_id="gen-text", scale=2)
    run_id = gr.Textbox(label="stored run id", interactive=False, elem_id="gen-run-id")
    with gr.Accordion("run numbers (JSON, as the API returns them)", open=False):
        numbers = gr.JSON(label="run numbers", elem_id="gen-numbers")

    def start(prompt, drafter, k, temperature, max_new_tokens, run_ar_again, raw_prompt, template_switches,
              request: gr.Request):
        yield from generate(wb, prompt, drafter, k, temperature, max_new_tokens, run_ar_again, raw_prompt,
                            template_switches, request)

    inputs = [prompt, drafter, k, temperature, max_new, with_ar, raw, template]
    outputs = [view, stats, status, run_id, text, numbers]
    start = on_device(wb, "Generate", start)
    run.click(start, inputs, outputs, api_name="generate", **DEVICE)
    prompt.submit(start, inputs, outputs, api_visibility="private", **DEVICE)

    wire_stop(wb, stop, api_name="stop")
    drafter.change(lambda label: gr.update(**k_field(wb, label)), drafter, k, api_visibility="private")

    def load_dir(checkpoint_dir):
        try:
            label = wb.add_drafter_dir(checkpoint_dir)
        except USER_ERRORS as e:
            return gr.update(), message_html(str(e), "error")
        return gr.update(choices=wb.drafter_labels, value=label), message_html(f"loaded drafter {label}")

    load.click(on_device(wb, "loading a drafter", load_dir), folder, [drafter, load_status], api_name="load_drafter",
               **DEVICE)
    return prompt
