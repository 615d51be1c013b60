"""Diagnose tab: the drafter doctor (experiments.doctor) on the loaded target and a chosen drafter.

A table of every check's arms with tau, per-position acceptance and verdict, a plot of per-position acceptance per
variant, and the report as Markdown to paste into an issue. Each report is stored in the history.
"""

from __future__ import annotations

import gradio as gr
import plotly.graph_objects as go

from experiments import doctor, suites

from .. import plots
from ..state import AppError, Workbench
from .common import DEVICE, USER_ERRORS, as_int, temperature_input

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


def run_doctor(wb: Workbench, label: str, prompts: str, limit, max_new, raw: bool, temperature: float) -> tuple:
    """Diagnose the pair, store the report; (status markdown, table rows, figure, report markdown)."""
    if label not in wb.sources or label not in drafter_choices(wb):
        raise AppError(f"choose one of the DFlash / EAGLE-3 drafters: {', '.join(drafter_choices(wb)) or 'none'}")
    n, new = as_int(limit, "prompts", 2, 64), as_int(max_new, "new tokens", 8, 512)
    texts = doctor.load_prompts(None if prompts == MIXED else prompts, n)
    doc = _DOCTORS.get(id(wb.target))
    if doc is None or doc.max_new_tokens != new:
        doc = _DOCTORS[id(wb.target)] = doctor.Doctor(wb.target, max_new_tokens=new)
    report = doc.diagnose(wb.sources[label], texts, raw=bool(raw), temperature=float(temperature or 0.0),
                          k=wb.default_k.get(label))
    report["report_id"] = wb.history.write_doctor_report(report)
    found = doctor.faults(report)
    status = (f"**{'faults: ' + ', '.join(found) if found else 'no fault found'}** · {len(texts)} prompts, "
              f"{new} new tokens, {report['wall_s']} s · stored as report `{report['report_id']}`")
    return status, table(report), figure(report), doctor.to_markdown(report)


def build(wb: Workbench, tab: gr.Tab) -> None:
    """Lay out the Diagnose tab and wire its events."""
    gr.Markdown("Tests the loaded target with a drafter for the known causes of low acceptance: chat template, "
                "thinking mode, tap layers, mask token, shared head, dtype, RoPE, train/serve agreement and "
                "temperature. A variant that accepts clearly more (beyond the prompt-to-prompt noise) is a fault.")
    choices = drafter_choices(wb)
    with gr.Row():
        drafter = gr.Dropdown(choices=choices, value=choices[0] if choices else None, label="drafter",
                              elem_id="diag-drafter")
        prompts = gr.Dropdown(choices=[MIXED, *suites.SUITES], value=MIXED, label="prompts", elem_id="diag-prompts")
        limit = gr.Number(value=12, precision=0, label="number of prompts", elem_id="diag-limit")
        max_new = gr.Number(value=64, precision=0, label="new tokens per prompt", elem_id="diag-max-new")
    with gr.Row():
        raw = gr.Checkbox(value=False, label="served on raw prompts (no chat template)", elem_id="diag-raw")
        temperature = temperature_input("diag-temperature")
        run = gr.Button("Run the doctor", variant="primary", elem_id="diag-run")
    status = gr.Markdown(elem_id="diag-status")
    rows = gr.Dataframe(headers=doctor.HEADERS, label="report", interactive=False, wrap=True, elem_id="diag-table")
    plot = gr.Plot(elem_id="diag-plot")
    markdown = gr.Code(label="report as Markdown (paste into an issue)", language="markdown", elem_id="diag-md")

    def go_run(drafter, prompts, limit, max_new_tokens, raw_prompt, temperature):  # API names
        try:
            return run_doctor(wb, drafter, prompts, limit, max_new_tokens, raw_prompt, temperature)
        except (*USER_ERRORS, doctor.DoctorError, suites.SuiteError) as e:
            return f"**error:** {e}", gr.update(), gr.update(), gr.update()

    run.click(go_run, [drafter, prompts, limit, max_new, raw, temperature], [status, rows, plot, markdown],
              api_name="diagnose", **DEVICE)
    tab.select(lambda: gr.update(choices=drafter_choices(wb)), None, [drafter], api_visibility="private")
