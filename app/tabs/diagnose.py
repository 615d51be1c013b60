"""Diagnose tab: the drafter doctor (experiments.doctor) on the loaded target and a chosen drafter.

A table of every check's arms with tau, per-position acceptance and verdict, a plot of per-position acceptance per
variant, and the report as Markdown to paste into an issue. Each report is stored in the history.
"""

from __future__ import annotations

import gradio as gr
import plotly.graph_objects as go

from experiments import doctor, suites

from .. import plots
from ..components import OpenDropdown
from ..device import DEVICE, on_device
from ..state import AppError, Workbench
from .common import USER_ERRORS, as_int, as_temperature, temperature_input

MIXED = "GSM8K + HumanEval + MT-Bench"
MODEL_DRAFTERS = ("dflash", "eagle3")
_DOCTORS: dict[int, doctor.Doctor] = {}  # one per loaded target: its bf16 twin and the run memo are reused


def drafter_choices(wb: Workbench) -> list[str]:
    """Loaded drafters the doctor can test: DFlash and EAGLE-3 ones (by name or checkpoint directory)."""
    return [label for label, source in wb.sources.items() if source not in ("ar", "ngram")]


def figure(report: dict) -> go.Figure:
    """Per-position acceptance P(accepted >= i) of every measured arm, one line per check and variant."""
    fig = go.Figure()
    fig.update_layout(title="Per-position acceptance per variant", xaxis_title="draft position i",
                      yaxis_title="P(accepted >= i)", **plots.LAYOUT)
    for r in report["rows"]:
        if r["per_position"]:
            name = f"{r['check']}: {r['variant']}" + (" (fault)" if r["verdict"] == "fault" else "")
            fig.add_trace(go.Scatter(x=list(range(1, len(r["per_position"]) + 1)), y=r["per_position"], name=name,
                                     mode="lines+markers", line=dict(dash="solid" if r["configured"] else "dot")))
    return fig


def table(report: dict) -> list[list]:
    return [doctor.cells(r) for r in report["rows"]]


def run_doctor(wb: Workbench, label: str, prompts: str, limit, max_new, raw: bool, temperature: float,
               progress: gr.Progress | None = None) -> tuple:
    """Diagnose the pair, store the report; (status markdown, table rows, figure, report markdown). progress: one
    tick per check, named."""
    if label not in wb.sources or label not in drafter_choices(wb):
        raise AppError(f"choose one of the DFlash / EAGLE-3 drafters: {', '.join(drafter_choices(wb)) or 'none'}")
    n, new = as_int(limit, "number of prompts", 2, 64), as_int(max_new, "new tokens per prompt", 8, 512)
    temperature = as_temperature(temperature)
    texts = doctor.load_prompts(None if prompts == MIXED else prompts, n)
    doc = _DOCTORS.get(id(wb.target))
    if doc is None or doc.max_new_tokens != new:
        doc = _DOCTORS[id(wb.target)] = doctor.Doctor(wb.target, max_new_tokens=new)
    def on_check(i: int, n_checks: int, check: str) -> None:
        if progress is not None:
            progress((i, n_checks), desc=f"check {i + 1}/{n_checks}: {check} ({len(texts)} prompts)", unit="checks")

    report = doc.diagnose(wb.sources[label], texts, raw=bool(raw), temperature=temperature,
                          k=wb.default_k.get(label), on_check=on_check)
    report["report_id"] = wb.history.write_doctor_report(report)
    found, open_ = doctor.faults(report), doctor.faults(report, "unresolved")
    status = (f"**{'faults: ' + ', '.join(found) if found else 'no fault found'}**"
              + (f" · **unresolved: {', '.join(open_)}** (a large gain inside the noise: more prompts would tell)"
                 if open_ else "")
              + f" · {len(texts)} prompts, {new} new tokens, {report['wall_s']} s · stored as report "
                f"`{report['report_id']}`\n\n{doctor.TAU_LEGEND}")
    return status, table(report), figure(report), doctor.to_markdown(report)


def build(wb: Workbench, tab: gr.Tab) -> None:
    """Lay out the Diagnose tab and wire its events."""
    gr.Markdown("Tests the loaded target with a drafter for the known causes of low acceptance: chat template, "
                "thinking mode, tap layers, mask token, shared head, dtype, RoPE, train/serve agreement and "
                "temperature. A variant that accepts clearly more (beyond the prompt-to-prompt noise) is a fault; "
                "a gain of 0.1 tau or more inside the noise is unresolved, with the number of prompts that would "
                "tell; sampling's lower acceptance is info; a check that cannot apply says not applicable.")
    choices = drafter_choices(wb)
    with gr.Row():
        drafter = OpenDropdown(choices=choices, value=choices[0] if choices else None, label="drafter",
                               elem_id="diag-drafter")
        prompts = gr.Dropdown(choices=[MIXED, *suites.SUITES], value=MIXED, label="prompts", elem_id="diag-prompts")
        limit = gr.Number(value=12, precision=0, label="number of prompts", elem_id="diag-limit")
        max_new = gr.Number(value=64, precision=0, label="new tokens per prompt", elem_id="diag-max-new")
    with gr.Row():
        raw = gr.Checkbox(value=False, label="served on raw prompts (no chat template)", elem_id="diag-raw")
        temperature = temperature_input("diag-temperature")
        run = gr.Button("Run the doctor", variant="primary", elem_id="diag-run")
    status = gr.Markdown(label="status", elem_id="diag-status")
    rows = gr.Dataframe(headers=doctor.HEADERS, label="report", interactive=False, wrap=True, elem_id="diag-table",
                        max_height=900, column_widths=["9%", "13%", "6%", "6%", "14%", "8%", "44%"])
    plot = gr.Plot(label="per-position acceptance per variant", show_label=False, elem_id="diag-plot")
    markdown = gr.Code(label="report as Markdown (paste into an issue)", language="markdown", elem_id="diag-md")

    def go_run(drafter, prompts, limit, max_new_tokens, raw_prompt, temperature, request: gr.Request,  # API names
               progress=gr.Progress()):  # noqa: B008 (Gradio injects it)
        try:
            return run_doctor(wb, drafter, prompts, limit, max_new_tokens, raw_prompt, temperature, progress)
        except (*USER_ERRORS, doctor.DoctorError, suites.SuiteError) as e:
            return f"**error:** {e}", gr.update(), gr.update(), gr.update()

    run.click(on_device(wb, "the drafter doctor", go_run), [drafter, prompts, limit, max_new, raw, temperature],
              [status, rows, plot, markdown], api_name="diagnose", **DEVICE)
    tab.select(lambda: gr.update(choices=drafter_choices(wb)), None, [drafter], api_visibility="private")
