"""History tab: a filterable table of stored runs; open one to replay its block view, or pick runs to compare."""

from __future__ import annotations

from html import escape

import gradio as gr

from .. import queries
from ..components import OpenDropdown
from ..render import drafter_k, message_html, run_html
from ..runner import stored_speedup
from ..state import Workbench
from .common import USER_ERRORS

# run_id before the prompt preview, so that it stays in view on a laptop screen
COLUMNS = ["created (UTC)", "drafter", "K", "T", "suite", "status", "tau", "acc. rate", "tok/s", "tokens",
           "annotations", "run_id", "prompt"]
# the short columns just wide enough for their headers, run_id and the prompt wrapping in the rest: all in view
COLUMN_WIDTHS = ["8%", "7%", "3%", "3%", "6%", "6%", "5%", "8%", "5%", "6%", "9%", "17%", "17%"]


def table(wb: Workbench, drafter: str | None, suite: str | None, text: str | None) -> list[list]:
    """Rows of the run table for the filters (ALL means no filter)."""
    rows = wb.history.list_runs(drafter=None if drafter in (None, queries.ALL) else drafter,
                                suite=None if suite in (None, queries.ALL, queries.NO_SUITE) else suite,
                                text_like=(text or "").strip() or None)
    if suite == queries.NO_SUITE:
        rows = [r for r in rows if r["suite"] is None]

    def num(value, digits):
        return None if value is None else round(value, digits)

    return [[f"{r['created_at']:%m-%d %H:%M:%S}", r["drafter"], r["k"] or None, r["temperature"], r["suite"] or "",
             r["status"], num(r["tau"], 2), num(r["acceptance_rate"], 3), num(r["tok_per_s"], 1), r["n_generated"],
             r["n_annotations"], r["run_id"], r["prompt_preview"]] for r in rows]


def open_run(wb: Workbench, run_id: str | None) -> str:
    """The replayed block view of a stored run, or a message."""
    if not run_id:
        return message_html("pick a run in the table or the list above")
    try:
        run = wb.history.get_run(run_id)
        return run_html(run, speedup=stored_speedup(wb, run))
    except USER_ERRORS as e:
        return message_html(str(e), "error")


def compare_runs(wb: Workbench, run_ids: list[str] | None) -> str:
    """Picked runs side by side, each with its stats and block view."""
    if not run_ids or len(run_ids) < 2:
        return message_html("pick 2 to 4 runs to compare")
    cells = []
    for run_id in run_ids[:4]:
        try:
            run = wb.history.get_run(run_id)
        except USER_ERRORS as e:
            cells.append(message_html(str(e), "error"))
            continue
        s = run["settings"]
        cells.append(f"<div><h4>{escape(drafter_k(str(s.get('drafter')), s.get('k')))}</h4>"
                     f"{run_html(run, speedup=stored_speedup(wb, run))}</div>")
    return f'<div class="ds-grid">{"".join(cells)}</div>'


def build(wb: Workbench, tab: gr.Tab) -> None:
    """Lay out the History tab and wire its events."""
    with gr.Row():
        drafter = OpenDropdown(choices=[queries.ALL], value=queries.ALL, label="drafter")
        suite = OpenDropdown(choices=[queries.ALL], value=queries.ALL, label="suite")
        text = gr.Textbox(label="text in prompt or output", elem_id="hist-text")
        search = gr.Button("Search", elem_id="hist-search")
    runs = gr.Dataframe(headers=COLUMNS, interactive=False, label="runs (newest first; click a row to open it)",
                        elem_id="hist-table", max_height=640, wrap=True, column_widths=COLUMN_WIDTHS)
    with gr.Row():
        run = OpenDropdown(choices=[], label="open run", elem_id="hist-run", scale=2)
        picked = OpenDropdown(choices=[], multiselect=True, max_choices=4, label="runs to compare", scale=2)
        compare = gr.Button("Compare picked runs", scale=1)
    view = gr.HTML(label="run view", elem_id="hist-view")

    def refresh(drafter, suite, text):
        h = wb.history
        choices = queries.run_choices(h)
        return (table(wb, drafter, suite, text), gr.update(choices=[queries.ALL] + queries.distinct(h, "drafter")),
                gr.update(choices=[queries.ALL, queries.NO_SUITE] + queries.distinct(h, "suite")),
                gr.update(choices=choices), gr.update(choices=choices))

    outputs = [runs, drafter, suite, run, picked]
    search.click(refresh, [drafter, suite, text], outputs, api_name="history_search")
    text.submit(refresh, [drafter, suite, text], outputs, api_visibility="private")
    gr.on([drafter.change, suite.change], lambda d, s, t: table(wb, d, s, t), [drafter, suite, text], runs,
          api_visibility="private")
    tab.select(refresh, [drafter, suite, text], outputs, api_visibility="private")

    def select(evt: gr.SelectData):
        return evt.row_value[COLUMNS.index("run_id")] if evt.row_value else None

    runs.select(select, None, run, api_visibility="private")
    run.change(lambda run_id: open_run(wb, run_id), run, view, api_name="open_run")
    compare.click(lambda run_ids: compare_runs(wb, run_ids), picked, view, api_name="compare_runs")
