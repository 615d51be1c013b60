"""Annotate tab: click a rejected token of a stored run, label it, list and edit annotations, export them."""

from __future__ import annotations

from datetime import datetime
from html import escape

import gradio as gr

from storage import export_annotations

from .. import queries
from ..components import OpenDropdown
from ..render import message_html, run_html, target_agrees
from ..state import AppError, Workbench
from .common import USER_ERRORS

# Clicking a rejected token fires the view's select event with its "step:pos" (Python sets the token dropdown);
# the dropdown's value comes back as a 'ds-pick' event and is outlined, again after each re-render of the view.
PICK_JS = """
const outline = () => {
  element.querySelectorAll('.picked').forEach((t) => t.classList.remove('picked'));
  const pick = element.dataset.pick;
  const token = pick && element.querySelector(`[data-pick="${pick}"]`);
  if (token) token.classList.add('picked');
};
element.addEventListener('click', (event) => {
  const token = event.target.closest('[data-pick]');
  if (token) trigger('select', { value: token.dataset.pick, index: token.dataset.pick.split(':').map(Number) });
});
document.addEventListener('ds-pick', (event) => { element.dataset.pick = event.detail || ''; outline(); });
watch('value', outline);
"""
SHOW_PICK_JS = "(pick) => { document.dispatchEvent(new CustomEvent('ds-pick', { detail: pick })); }"
ANN_COLUMNS = ["id", "run_id", "step", "pos", "token", "label", "note", "drafter", "updated (UTC)"]


def rejected_choices(run: dict, unverified: bool = False) -> list[tuple[str, str]]:
    """('step 3 · pos 1 · 'text' (p=..)', '3:1') for each step's rejected draft (the first one not accepted), and
    with `unverified` also for the drafts after it, which the target never verified."""
    out = []
    for s in run["steps"]:
        texts = s.get("drafted_text") or [str(t) for t in s["drafted"]]
        end = len(s["drafted"]) if unverified else min(s["accepted"] + 1, len(s["drafted"]))
        for i in range(s["accepted"], end):
            agree = ", target agrees" if target_agrees(s, i) else ""
            what = "rejected" if i == s["accepted"] else f"unverified{agree}"
            out.append((f"step {s['index']} · pos {i} · {texts[i]!r} (p={s['p'][i]:.3f}, q={s['q'][i]:.3f}) · {what}",
                        f"{s['index']}:{i}"))
    return out


def annotated(wb: Workbench, run_id: str) -> list[tuple[int, int]]:
    """(step, draft position) of the run's annotated tokens."""
    return [(a["step_idx"], a["draft_pos"]) for a in wb.history.list_annotations(run_id=run_id)]


def show_run(wb: Workbench, run_id: str | None, unverified: bool = False) -> tuple[str, dict]:
    """(clickable view, token dropdown update) for a run: its rejected drafts, and the unverified ones when asked."""
    if not run_id:
        return message_html("choose a run with rejected tokens"), gr.update(choices=[], value=None)
    try:
        run = wb.history.get_run(run_id)
    except USER_ERRORS as e:
        return message_html(str(e), "error"), gr.update(choices=[], value=None)
    choices = rejected_choices(run, unverified)
    return (run_html(run, clickable=True, annotated=annotated(wb, run_id), pick_unverified=unverified),
            gr.update(choices=choices, value=choices[0][1] if choices else None))


def annotation_rows(wb: Workbench, run_id: str | None, only_run: bool) -> list[list]:
    """Rows of the annotation table: all annotations, or the run's only."""
    rows = wb.history.list_annotations(run_id=run_id if only_run and run_id else None)
    return [[a["annotation_id"], a["run_id"], a["step_idx"], a["draft_pos"], repr(a["drafted_text"]), a["label"],
             a["note"], a["drafter"], f"{a['updated_at']:%Y-%m-%d %H:%M:%S}"] for a in rows]


def annotation_choices(wb: Workbench) -> list[tuple[str, int]]:
    """(label, annotation_id) for the edit dropdown."""
    return [(f"#{a['annotation_id']} · {a['label']} · step {a['step_idx']} pos {a['draft_pos']} · "
             f"{a['drafted_text']!r}", a["annotation_id"]) for a in wb.history.list_annotations()]


def add(wb: Workbench, run_id: str | None, pick: str | None, label: str | None, note: str | None) -> str:
    """Store the picked rejected token's annotation (replacing its earlier one); return a status message."""
    try:
        if not run_id or not pick:
            raise AppError("choose a run and click a rejected token (or pick one from the list)")
        if not label:
            raise AppError("choose a label (or add a new one)")
        step, pos = (int(x) for x in str(pick).split(":"))
        annotation_id = wb.history.save_annotation(run_id, step, pos, label, note or "")
    except (*USER_ERRORS, ValueError) as e:
        gr.Warning(str(e))
        return message_html(f"error: {e}", "error")
    return message_html(f"annotation #{annotation_id} stored: step {step}, position {pos}, label {label}, note "
                        f"{(note or '')[:60]!r}")


def export(wb: Workbench, folder: str, label: str | None, drafter: str | None) -> tuple[str, list[str] | None]:
    """Export (optionally filtered) annotations into a folder under the export root; (message, files)."""
    root = wb.export_root.resolve()
    name = (folder or "").strip() or f"annotations-{datetime.now():%Y%m%d-%H%M%S}"
    out = (root / name).resolve()
    try:
        if not out.is_relative_to(root):
            raise AppError(f"the export folder must be inside {root}")
        paths = export_annotations(wb.history, out, label=None if label in (None, queries.ALL) else label,
                                   drafter=None if drafter in (None, queries.ALL) else drafter)
    except (*USER_ERRORS, OSError) as e:
        gr.Warning(str(e))
        return message_html(f"error: {e}", "error"), None
    files = [str(p) for p in paths.values()]
    lines = "".join(f"<li><code>{escape(p)}</code></li>" for p in files)
    return f'<div class="ds-legend">exported to {escape(str(out))}:<ul>{lines}</ul></div>', files


def build(wb: Workbench, tab: gr.Tab) -> None:
    """Lay out the Annotate tab and wire its events."""
    run = OpenDropdown(choices=[], label="run (only runs with rejected tokens)", elem_id="ann-run")
    gr.Markdown("Click a rejected (struck-through) token to pick it, or choose it from the list. The drafts after a "
                "step's rejection were never verified: offer them too only when you mean to label those.")
    unverified = gr.Checkbox(value=False, label="also offer unverified drafts (after each step's rejection)",
                             elem_id="ann-unverified")
    view = gr.HTML(label="run view", elem_id="ann-view", js_on_load=PICK_JS)
    with gr.Row():
        token = OpenDropdown(choices=[], label="rejected token (step:pos)", elem_id="ann-token", scale=3)
        labels = wb.history.list_labels()
        label = OpenDropdown(choices=labels, value=labels[0] if labels else None, label="label", elem_id="ann-label")
        note = gr.Textbox(label="note", elem_id="ann-note", scale=2)
    with gr.Row():
        save = gr.Button("Save annotation", variant="primary", elem_id="ann-save")
        new_label = gr.Textbox(label="new label", scale=2)
        add_label = gr.Button("Add label")
    status = gr.HTML(label="status", elem_id="ann-status")
    with gr.Accordion("annotations", open=True):
        only_run = gr.Checkbox(value=False, label="only this run")
        listing = gr.Dataframe(headers=ANN_COLUMNS, interactive=False, label="annotations", elem_id="ann-table",
                               max_height=300)
        with gr.Row():
            chosen = OpenDropdown(choices=[], label="edit annotation", scale=3)
            edit_label = OpenDropdown(choices=labels, label="new label")
            edit_note = gr.Textbox(label="note", scale=2)
        with gr.Row():
            update = gr.Button("Update annotation")
            delete = gr.Button("Delete annotation", variant="stop")
    with gr.Accordion("export", open=True):
        with gr.Row():
            ex_label = OpenDropdown(choices=[queries.ALL] + labels, value=queries.ALL, label="export label")
            ex_drafter = OpenDropdown(choices=[queries.ALL], value=queries.ALL, label="drafter")
            folder = gr.Textbox(label=f"folder inside {wb.export_root} (empty: a new dated one)", elem_id="ann-folder")
            do_export = gr.Button("Export annotations", elem_id="ann-export")
        exported = gr.HTML(label="export status", elem_id="ann-exported")
        files = gr.File(file_count="multiple", label="exported files", elem_id="ann-files", interactive=False)

    def lists(run_id, only_this_run):
        return (annotation_rows(wb, run_id, only_this_run), gr.update(choices=annotation_choices(wb)),
                gr.update(choices=[queries.ALL] + queries.distinct(wb.history, "drafter")))

    list_outputs = [listing, chosen, ex_drafter]

    def refresh(run_id, only_this_run):
        choices = queries.run_choices(wb.history, only_rejections=True)
        ids = [c[1] for c in choices]
        run_id = run_id if run_id in ids else (ids[0] if ids else None)
        return gr.update(choices=choices, value=run_id), *lists(run_id, only_this_run)

    tab.select(refresh, [run, only_run], [run, *list_outputs], api_visibility="private")
    run.change(lambda run_id, unverified_too: show_run(wb, run_id, unverified_too), [run, unverified], [view, token],
               api_name="annotate_open")
    unverified.change(lambda run_id, unverified_too: show_run(wb, run_id, unverified_too), [run, unverified],
                      [view, token], api_visibility="private")

    def pick_token(evt: gr.SelectData) -> str:
        return evt.value

    view.select(pick_token, None, token, api_visibility="private")
    token.change(None, token, None, js=SHOW_PICK_JS, api_visibility="private")
    only_run.change(lambda run_id, only_this_run: annotation_rows(wb, run_id, only_this_run), [run, only_run], listing,
                    api_visibility="private")

    def save_annotation(run_id, rejected_token, label, note, only_this_run):
        message = add(wb, run_id, rejected_token, label, note)
        return message, show_run(wb, run_id)[0], *lists(run_id, only_this_run)

    save.click(save_annotation, [run, token, label, note, only_run], [status, view, *list_outputs],
               api_name="annotate")

    def new(name):
        try:
            wb.history.add_label(name)
        except USER_ERRORS as e:
            return message_html(str(e), "error"), gr.update(), gr.update(), gr.update()
        names = wb.history.list_labels()
        return (message_html(f"label {name.strip()!r} added"), gr.update(choices=names, value=name.strip()),
                gr.update(choices=names), gr.update(choices=[queries.ALL] + names))

    add_label.click(new, new_label, [status, label, edit_label, ex_label], api_name="add_label")

    def load(annotation_id):
        found = [a for a in wb.history.list_annotations() if a["annotation_id"] == annotation_id]
        return (found[0]["label"], found[0]["note"]) if found else (None, "")

    chosen.change(load, chosen, [edit_label, edit_note], api_visibility="private")

    def change(annotation_id, label, note, run_id, only_this_run, remove=False):
        try:
            if annotation_id is None:
                raise AppError("choose an annotation to edit")
            if remove:
                wb.history.delete_annotation(int(annotation_id))
            else:
                wb.history.update_annotation(int(annotation_id), label=label or None, note=note)
        except USER_ERRORS as e:
            return message_html(f"error: {e}", "error"), gr.update(), *lists(run_id, only_this_run)
        done = "deleted" if remove else "updated"
        return (message_html(f"annotation #{annotation_id} {done}"), show_run(wb, run_id)[0],
                *lists(run_id, only_this_run))

    edit_inputs = [chosen, edit_label, edit_note, run, only_run]
    update.click(change, edit_inputs, [status, view, *list_outputs], api_name="annotation_update")

    def remove(annotation_id, label, note, run_id, only_this_run):
        return change(annotation_id, label, note, run_id, only_this_run, remove=True)

    delete.click(remove, edit_inputs, [status, view, *list_outputs], api_name="annotation_delete")
    do_export.click(lambda folder, label, drafter: export(wb, folder, label, drafter), [folder, ex_label, ex_drafter],
                    [exported, files], api_name="export_annotations")
