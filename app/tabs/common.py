"""Helpers shared by the tabs: user-facing errors, input parsing, choices."""

from __future__ import annotations

from typing import Any

import gradio as gr

import engine
from storage import HistoryError

from ..state import AppError, Workbench

# Errors whose message is meant for a person: shown in the UI, never a dead page.
USER_ERRORS = (engine.GenerationError, engine.DrafterError, engine.CheckpointError, AppError, HistoryError)
DEVICE = dict(concurrency_id="device", concurrency_limit=1)  # one run on the accelerator at a time
DEFAULT_MAX_NEW = 128  # max new tokens every tab starts from


def temperature_input(elem_id: str) -> gr.Number:
    """The temperature field: a number box in 0..2 (a slider's box would clamp a typed -1 to 0 and run greedy).

    An out-of-range value, typed or sent through the API, is refused with Gradio's message before anything runs,
    and logged as one line (the stock gr.Error is logged with a whole traceback)."""
    field = gr.Number(value=0.0, minimum=0.0, maximum=2.0, step=0.05, label="temperature (0 = greedy, at most 2)",
                      elem_id=elem_id)
    check = field.preprocess

    def preprocess(payload: float | None) -> float:
        try:
            if payload is None:
                raise gr.Error("temperature is empty: give a number in 0..2 (0 = greedy)")
            return check(payload)
        except gr.Error as e:
            e.print_exception = False
            print(f"draftscope: refused temperature = {payload!r}: {e.message}", flush=True)
            raise

    field.preprocess = preprocess
    return field


def output_text(wb: Workbench, steps: list[dict]) -> str:
    """The text the steps emitted so far, decoded as the engine decodes a run's output."""
    return wb.target.decode([t for s in steps for t in s["emitted"]])


def as_int(value: Any, name: str, lo: int, hi: int) -> int:
    """An integer input in lo..hi, else an AppError naming the field."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AppError(f"{name} must be a whole number in {lo}..{hi}, got {value!r}") from None
    if not number.is_integer() or not lo <= number <= hi:
        raise AppError(f"{name} must be a whole number in {lo}..{hi}, got {value!r}")
    return int(number)


def best_drafter(wb: Workbench) -> str:
    """The drafter to preselect: the loaded one with the best measured speedup over ar on this hardware
    (Workbench.measured_speedups: the history's like-for-like pairs, else the model cards); unmeasured, ngram."""
    measured = wb.measured_speedups()
    if measured:
        return max(measured, key=lambda label: measured[label][0])
    return "ngram" if "ngram" in wb.sources else "ar"


def unavailable_md(wb: Workbench) -> str:
    """Markdown list of the drafters that did not load, with the reason."""
    if not wb.unavailable:
        return "All known drafters loaded."
    lines = [f"- **{name}**: unavailable — {reason}" for name, reason in wb.unavailable.items()]
    return "Drafters not offered:\n" + "\n".join(lines)


def default_note(wb: Workbench) -> str:
    """Why the preselected drafter and its K are the defaults: which measured figure, and where it came from (runs
    paired with ar in this history, or a model card's figure measured elsewhere on this device kind)."""
    measured, best = wb.measured_speedups(), best_drafter(wb)
    if best not in measured:
        return f"preselected: {best} (no speedup over ar measured on this device kind yet)"
    speedup, k = measured[best]
    return f"preselected: {best}, {speedup:.2f}x over ar at K={k}, from {wb.speedup_source[best]}"


def drafter_dropdown(wb: Workbench, **kw) -> gr.Dropdown:
    """A dropdown of the loaded drafters, the best one preselected, saying where that choice came from."""
    return gr.Dropdown(choices=wb.drafter_labels, value=best_drafter(wb), label="drafter",
                       **{"info": default_note(wb)} | kw)


def example_table(wb: Workbench, prompt: gr.Textbox) -> gr.Examples:
    """Clickable example prompts (a few per suite) that fill the prompt box."""
    return gr.Examples(examples=[[ex["prompt"]] for ex in wb.examples], inputs=[prompt], label="example prompts",
                       example_labels=[f"{ex['suite']}: {ex['prompt'][:70]}" for ex in wb.examples],
                       examples_per_page=6)


def session_of(request: gr.Request | None) -> str:
    """The browser session's key (API calls without a session share one)."""
    return (request.session_hash if request is not None else None) or "api"


def wire_stop(wb: Workbench, button: gr.Button, api_name: str | None = None) -> None:
    """A Stop button: the session's running generation ends after its step and is stored as cancelled."""
    def stop_run(request: gr.Request) -> None:
        if wb.request_stop(session_of(request)):
            gr.Info("stopping after the current step; the run is stored as cancelled")

    button.click(stop_run, None, None, api_name=api_name, api_visibility="public" if api_name else "private")
