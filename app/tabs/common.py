"""Helpers shared by the tabs: user-facing errors, input parsing, choices."""

from __future__ import annotations

from typing import Any

import gradio as gr

import engine
from storage import HistoryError

from ..components import OpenDropdown
from ..device import busy_text, session_key
from ..render import message_html
from ..state import AppError, Workbench

# Errors whose message is meant for a person: shown in the UI, never a dead page.
USER_ERRORS = (engine.GenerationError, engine.DrafterError, engine.CheckpointError, AppError, HistoryError)
DEFAULT_MAX_NEW = 128  # max new tokens every tab starts from


MAX_TEMPERATURE = 2.0


def temperature_input(elem_id: str) -> gr.Number:
    """The temperature field: a number box (a slider's box would clamp a typed -1 to 0 and run greedy). Its range is
    checked by as_temperature in the tab's own handler, so a value out of range is an "error: ..." status line like
    every other bad input, not a toast and red badges."""
    return gr.Number(value=0.0, step=0.05, label=f"temperature (0 = greedy, at most {MAX_TEMPERATURE:g})",
                     elem_id=elem_id)


def as_temperature(value: Any) -> float:
    """A temperature in 0..MAX_TEMPERATURE, else an AppError naming the field."""
    if value is None or str(value).strip() == "":
        raise AppError(f"temperature is empty: give a number in 0..{MAX_TEMPERATURE:g} (0 = greedy)")
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not 0.0 <= number <= MAX_TEMPERATURE:
        raise AppError(f"temperature must be a number in 0..{MAX_TEMPERATURE:g} (0 = greedy), got {value!r}")
    return number


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


def drafter_dropdown(wb: Workbench, **kw) -> OpenDropdown:
    """A dropdown of the loaded drafters, the best one preselected, saying where that choice came from."""
    return OpenDropdown(choices=wb.drafter_labels, value=best_drafter(wb), label="drafter",
                        **{"info": default_note(wb)} | kw)


def example_table(wb: Workbench, prompt: gr.Textbox) -> gr.Examples:
    """Clickable example prompts (a few per suite) that fill the prompt box."""
    return gr.Examples(examples=[[ex["prompt"]] for ex in wb.examples], inputs=[prompt], label="example prompts",
                       example_labels=[f"{ex['suite']}: {ex['prompt'][:70]}" for ex in wb.examples],
                       examples_per_page=6)


def wire_stop(wb: Workbench, button: gr.Button, api_name: str | None = None) -> None:
    """A Stop button: the session's running generation ends after its step (or, prefilling, after its prompt chunk)
    and is stored as cancelled."""
    def stop_run(request: gr.Request) -> None:
        if wb.request_stop(session_key(request)):
            gr.Info("stopping after the current step or prompt chunk; the run is stored as cancelled")

    button.click(stop_run, None, None, api_name=api_name, api_visibility="public" if api_name else "private")


def device_banner(wb: Workbench) -> None:
    """A status line under the header, refreshed every second outside the queue: what holds the device when
    another session's run does, and about how long it has left (empty otherwise). A run started meanwhile waits in
    Gradio's queue; this line says for what."""
    line = gr.HTML(elem_id="ds-device")

    def refresh(request: gr.Request):
        text = busy_text(wb.device_use, session_key(request))
        return message_html(text, "warn") if text else ""

    gr.Timer(1.0).tick(refresh, None, line, queue=False, show_progress="hidden", api_visibility="private")
