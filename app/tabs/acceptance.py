"""Acceptance tab: per-position survival and conditional acceptance, acceptance lengths and drafter calibration."""

from __future__ import annotations

import gradio as gr

from storage import drafter_label

from .. import plots, queries
from ..components import OpenDropdown
from ..state import Workbench

SUMMARY_COLUMNS = ["drafter", "dtype", "suite", "k", "temperature", "batch", "n_runs", "n_timed", "tau", "tau_std",
                   "acceptance_rate", "tok_per_s", "n_generated"]


def summary(wb: Workbench, target: str | None, drafters: list[str] | None, suite: str | None) -> list[list]:
    """drafter_comparison rows for the selection, numbers rounded for reading."""
    where, params = queries.where_clause(target, drafters, suite)
    rows = wb.history.query(f"SELECT * FROM drafter_comparison {where} ORDER BY drafter, drafter_checkpoint, suite, k, "
                            "batch", params)
    rows = [{**r, "drafter": drafter_label(r["drafter"], r["drafter_checkpoint"])} for r in rows]
    return [[round(r[c], 3) if isinstance(r[c], float) else r[c] for c in SUMMARY_COLUMNS] for r in rows]


def views(wb: Workbench, target: str | None, drafters: list[str] | None, suite: str | None) -> tuple:
    """Every figure and the summary table for a selection."""
    h = wb.history
    pos = queries.position_rows(h, target, drafters, suite)
    return (plots.position_figure(pos, "survival", "Survival: P(accepted prefix reaches position i)"),
            plots.position_figure(pos, "conditional_acceptance", "Conditional acceptance: P(accept i | accepted i-1)"),
            plots.length_histogram(queries.length_rows(h, target, drafters, suite)),
            plots.calibration_figure(queries.calibration_rows(h, target, drafters, suite)),
            summary(wb, target, drafters, suite))


def build(wb: Workbench, tab: gr.Tab) -> None:
    """Lay out the Acceptance tab and wire its events."""
    with gr.Row():
        target = OpenDropdown(choices=[wb.target.name], value=wb.target.name, label="target")
        drafters = OpenDropdown(choices=[], multiselect=True, label="drafters (empty: all)")
        suite = OpenDropdown(choices=[queries.ALL], value=queries.ALL, label="suite")
        refresh = gr.Button("Refresh")
    table = gr.Dataframe(headers=SUMMARY_COLUMNS,
                         label="finished runs per drafter / suite / K (n_runs: distinct runs, an identical repeat "
                               "counted once; n_timed: every timed run)",
                         interactive=False)
    with gr.Row():
        survival = gr.Plot(label="survival by block position", show_label=False, elem_id="acc-survival")
        conditional = gr.Plot(label="conditional acceptance", show_label=False, elem_id="acc-conditional")
    with gr.Row():
        lengths = gr.Plot(label="accepted length per step", show_label=False, elem_id="acc-lengths")
        calibration = gr.Plot(label="drafter calibration", show_label=False, elem_id="acc-calibration")
    outputs = [survival, conditional, lengths, calibration, table]

    def show(target, drafters, suite):
        return views(wb, target, drafters, suite)

    def choices(target, drafters, suite):
        h = wb.history
        targets = sorted(set(queries.distinct(h, "target")) | {wb.target.name})
        suites = [queries.ALL, queries.NO_SUITE] + queries.distinct(h, "suite", target)
        return (gr.update(choices=targets), gr.update(choices=queries.distinct(h, "drafter", target)),
                gr.update(choices=suites), *views(wb, target, drafters, suite))

    refresh.click(show, [target, drafters, suite], outputs, api_name="acceptance")
    gr.on([target.change, drafters.change, suite.change], show, [target, drafters, suite], outputs,
          api_visibility="private")
    tab.select(choices, [target, drafters, suite], [target, drafters, suite, *outputs], api_visibility="private")
