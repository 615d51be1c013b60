"""Block view HTML: each verify step's drafted block with accepted, rejected (struck), unverified and bonus tokens.

A step's first non-accepted draft is its rejection; the drafts after it were never verified (the target's logits
there condition on the rejected prefix). Those the target's own greedy choice agrees with are marked: they are what
re-anchoring or tree verification could still recover.

Every piece of prompt or token text goes through `html.escape`; steps are plain dicts (StepTrace.to_dict()
or History.get_run()['steps']) so the live view and the replay render the same record.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import Any

CSS = """
.ds-view { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px; line-height: 1.9;
  color: #111827; background: #ffffff; border: 1px solid #e5e7eb; border-radius: 8px; padding: 10px 12px; }
.ds-prompt { color: #374151; background: #f9fafb; border-left: 3px solid #9ca3af; padding: 4px 8px;
  margin-bottom: 8px; white-space: pre-wrap; }
.ds-prompt b, .ds-plain b { font-family: system-ui, sans-serif; font-size: 12px; color: #6b7280; }
.ds-prompt details { display: inline; }
.ds-prompt summary { display: inline; cursor: pointer; color: #1d4ed8; font-family: system-ui, sans-serif;
  font-size: 12px; }
.ds-prompt details[open] summary { display: block; }
.ds-plain { font-family: system-ui, sans-serif; font-size: 15px; line-height: 1.6; color: #111827;
  background: #ffffff; border: 1px solid #e5e7eb; border-radius: 8px; padding: 10px 12px; }
.ds-plain-text { white-space: pre-wrap; word-break: break-word; }
.ds-pair { display: grid; gap: 10px; align-items: start;
  grid-template-columns: repeat(auto-fit, minmax(min(340px, 100%), 1fr)); }
.ds-blocks { white-space: pre-wrap; word-break: break-word; direction: ltr; }
.ds-step { border-left: 2px solid #9ca3af; padding-left: 2px; margin-left: 3px; unicode-bidi: isolate; }
.ds-step:nth-child(even) .tok { outline: 1px dotted #d1d5db; }
.ds-idx { font-size: 9px; color: #6b7280; vertical-align: super; font-family: system-ui, sans-serif; }
.ds-rollback { font-size: 9px; color: #9a3412; vertical-align: super; font-family: system-ui, sans-serif; }
.tok { border-radius: 3px; padding: 0 1px; cursor: help; unicode-bidi: isolate; }
.tok.acc { background: #d1fae5; color: #065f46; }
.tok.rej { background: #fee2e2; color: #991b1b; text-decoration: line-through; }
.tok.unv { background: #f3f4f6; color: #6b7280; border-bottom: 1px dashed #9ca3af; }
.tok.unv.agree { border-bottom: 2px solid #059669; color: #065f46; }
.tok.bonus { background: #dbeafe; color: #1e3a8a; font-weight: 600; }
.tok.cut { opacity: 0.45; }
.tok .piece { opacity: 0.5; }
.tok.pick { cursor: pointer; }
.tok.pick:hover, .tok.picked { outline: 2px solid #f59e0b; }
.tok.ann { box-shadow: inset 0 -3px 0 #f59e0b; }
.ds-legend { font-family: system-ui, sans-serif; font-size: 12px; color: #4b5563; margin-bottom: 6px; }
.ds-legend .tok { cursor: default; }
.ds-empty { color: #6b7280; font-family: system-ui, sans-serif; }
.ds-stats { font-family: system-ui, sans-serif; font-size: 13px; border-collapse: collapse; }
.ds-stats td { padding: 2px 10px 2px 0; color: #111827; }
.ds-stats td:first-child { color: #6b7280; }
.ds-grid { display: grid; gap: 10px; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); }
.ds-grid h4 { margin: 4px 0; font-family: system-ui, sans-serif; }
"""

LEGEND = ('<div class="ds-legend"><span class="tok acc">accepted</span> <span class="tok rej">rejected</span> '
          '<span class="tok unv">unverified</span> <span class="tok unv agree">unverified, target agrees</span> '
          '<span class="tok bonus">bonus (target)</span> · a grey bar starts each verify step · '
          'hover a token for p, q and the target\'s top-5</div>')


PIECE_NOTE = "\nno text of its own here: a byte piece of a character that a later token completes"


def token_text(text: str, newline: str = "↵") -> str:
    """A token's text made visible and HTML-safe (newlines as ↵, no text as a thin ·)."""
    if text == "":
        return '<span class="piece">·</span>'
    return escape(text).replace("\n", newline)


def _quoted(text: str) -> str:
    return "'" + (text or "").replace("\n", "↵") + "'"


def _top5(step: dict, row: int) -> str:
    ids, probs = step.get("top5_ids") or [], step.get("top5_p") or []
    texts = step.get("top5_text") or []
    if row >= len(probs):
        return "target top-5: n/a"
    names = texts[row] if row < len(texts) else [str(i) for i in ids[row]]
    return "target top-5: " + " | ".join(f"{_quoted(t)} {p:.3f}" for t, p in zip(names, probs[row], strict=False))


def _bonus_p(step: dict) -> float | None:
    row = step["accepted"]
    ids, probs = step.get("top5_ids") or [], step.get("top5_p") or []
    if row < len(ids) and step["bonus"] in ids[row]:
        return probs[row][ids[row].index(step["bonus"])]
    return None


def _span(classes: str, text: str, title: str, attrs: str = "", newline: str = "↵") -> str:
    return f'<span class="tok {classes}" title="{escape(title, quote=True)}"{attrs}>{token_text(text, newline)}</span>'


def target_agrees(step: dict, i: int) -> bool:
    """Whether draft i of a step is the target's greedy choice at its row (given the drafted prefix)."""
    ids = step.get("top5_ids") or []
    return i < len(ids) and bool(ids[i]) and ids[i][0] == step["drafted"][i]


def unverified_agreement(steps: Iterable[dict]) -> list[int]:
    """Per block position (index 0 = first draft): unverified drafts the target's greedy choice agrees with."""
    counts: list[int] = []
    for s in steps:
        for i in range(s["accepted"] + 1, len(s["drafted"])):
            counts += [0] * (i + 1 - len(counts))
            counts[i] += target_agrees(s, i)
    return counts


def step_html(step: dict, clickable: bool = False, annotated: Iterable[tuple[int, int]] = (),
              pick_unverified: bool = False) -> str:
    """One verify step: accepted drafts, the rejection (struck through), unverified drafts, the recurrent-state
    rollback (hybrid targets: ↶ positions discarded), then the bonus token.
    clickable: the rejection can be picked (and the unverified drafts too with pick_unverified)."""
    idx, n_acc, drafted = step["index"], step["accepted"], step["drafted"]
    texts = step.get("drafted_text") or [str(t) for t in drafted]
    n_emitted = len(step.get("emitted") or [])
    marked = set(annotated)
    parts = [f'<span class="ds-step" data-step="{idx}"><span class="ds-idx">{idx}</span>']
    rejected = []
    for i, text in enumerate(texts):
        ok, unverified = i < n_acc, i > n_acc
        agree = unverified and target_agrees(step, i)
        p = step["p"][i] if i < len(step.get("p") or []) else float("nan")
        q = step["q"][i] if i < len(step.get("q") or []) else float("nan")
        what = ("accepted" if ok else "rejected (the first rejection)" if not unverified else
                "unverified (after the rejection)" + ("; the target's greedy choice here agrees" if agree else ""))
        title = (f"step {idx} · draft {i + 1}/{len(drafted)} · {what}\np (target) = {p:.4f}   q (drafter) = {q:.4f}\n"
                 f"{_top5(step, i)}" + (PIECE_NOTE if text == "" else ""))
        if ok:
            cut = " cut" if i >= n_emitted else ""
            parts.append(_span("acc" + cut, text, title, newline="↵\n"))
            continue
        classes = ("unv agree" if agree else "unv") if unverified else "rej"
        attrs = f' data-step="{idx}" data-pos="{i}"'
        if clickable and (pick_unverified or not unverified):
            classes += " pick"
            attrs += f' data-pick="{idx}:{i}"'
        if (idx, i) in marked:
            classes += " ann"
        rejected.append(_span(classes, text, title, attrs))
    parts += rejected
    rollback = step.get("state_rollback") or 0
    if rollback:
        title = (f"step {idx} · recurrent state rolled back {rollback} position{'s' if rollback != 1 else ''}: "
                 f"kept after the anchor and {n_acc} accepted, discarded past them")
        parts.append(f'<span class="ds-rollback" title="{escape(title, quote=True)}">↶{rollback}</span>')
    if n_emitted > n_acc:
        bp = _bonus_p(step)
        title = (f"step {idx} · bonus: the target's token after {n_acc} accepted\n"
                 f"p (target) = {'n/a' if bp is None else f'{bp:.4f}'}\n{_top5(step, n_acc)}")
        text = step.get("bonus_text", str(step["bonus"]))
        parts.append(_span("bonus", text, title + (PIECE_NOTE if text == "" else ""), newline="↵\n"))
    parts.append("</span>")
    return "".join(parts)


def as_dicts(steps: Iterable[Any]) -> list[dict]:
    """Steps as plain dicts (StepTrace objects are converted)."""
    return [s if isinstance(s, dict) else s.to_dict() for s in steps]


VIEW_END = "</div></div>"
PROMPT_FOLD, PROMPT_HEAD, PROMPT_TAIL = 1500, 600, 300  # a prompt longer than PROMPT_FOLD shows head ... tail


def prompt_html(prompt: str, templated: str | None = None) -> str:
    """The prompt (escaped); a long one folded to its head and tail around a <details> holding the rest. templated:
    what the target reads (the chat template applied, special tokens shown), folded under the prompt."""
    body = escape(prompt)
    if len(prompt) > PROMPT_FOLD:
        middle = prompt[PROMPT_HEAD:-PROMPT_TAIL]
        body = (f"{escape(prompt[:PROMPT_HEAD])}<details><summary> ⋯ {len(middle):,} more characters "
                f"({len(prompt):,} in all; click to show or hide) ⋯ </summary>{escape(middle)}</details>"
                f"{escape(prompt[-PROMPT_TAIL:])}")
    if templated is not None and templated != prompt:
        body += (f'<details class="ds-templated"><summary>as the target reads it (chat template applied)</summary>'
                 f"{escape(templated)}</details>")
    return f'<div class="ds-prompt"><b>prompt</b>\n{body}</div>'


def plain_html(text: str | None) -> str:
    """The output as plain text (escaped): what the run answered, without the token markup."""
    return f'<div class="ds-plain"><b>output as text</b><div class="ds-plain-text">{escape(text or "")}</div></div>'


def block_view(steps: Iterable[Any], prompt: str | None = None, clickable: bool = False,
               annotated: Iterable[tuple[int, int]] = (), legend: bool = True, pick_unverified: bool = False,
               templated: str | None = None) -> str:
    """The whole block view: a colour legend, the prompt (escaped) and every step's block."""
    view, steps = LiveView(prompt, legend, clickable, annotated, pick_unverified, templated), as_dicts(steps)
    return view.html(steps, done=True) if steps else view.head + '<span class="ds-empty">no steps yet</span>' + VIEW_END


class LiveView:
    """A block view built step by step: each update of a running view only appends to the previous HTML, so
    Gradio streams just the new steps (the unclosed divs are closed by the browser until `done`)."""

    def __init__(self, prompt: str | None = None, legend: bool = True, clickable: bool = False,
                 annotated: Iterable[tuple[int, int]] = (), pick_unverified: bool = False,
                 templated: str | None = None) -> None:
        head = prompt_html(prompt, templated) if prompt else ""
        self.head = f'<div class="ds-view">{LEGEND if legend else ""}{head}<div class="ds-blocks">'
        self.clickable, self.annotated, self.pick_unverified = clickable, list(annotated), pick_unverified
        self.parts: list[str] = []

    def html(self, steps: list[Any], done: bool = False) -> str:
        """The view of `steps` (rendering only those not seen before); closed when done."""
        self.parts += [step_html(s, self.clickable, self.annotated, self.pick_unverified)
                       for s in as_dicts(steps[len(self.parts):])]
        return self.head + "".join(self.parts) + (VIEW_END if done else "")


def drafter_k(drafter: str, k: int | None) -> str:
    """'ngram K=4', or the drafter alone where it drafts nothing (ar: no K, not K=0)."""
    return f"{drafter} K={k}" if k else drafter


def message_html(text: str, kind: str = "info") -> str:
    """A status line (escaped); kind 'error' shows it in red."""
    colour = {"error": "#b91c1c", "warn": "#b45309"}.get(kind, "#374151")
    return f'<div class="ds-msg ds-{kind}" style="color:{colour};font-family:system-ui">{escape(text)}</div>'


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def stats_html(stats: dict, speedup: float | None = None, speedup_note: str = "", steps: Iterable[Any] = ()) -> str:
    """A small table of the run's tau, acceptance, tokens/s, speedup (when given) and counts; with its steps, the
    unverified drafts the target agrees with per block position."""
    rows = [
        ("tau (tokens / step)", _fmt(stats.get("tau"), ".2f")),
        ("acceptance rate", _fmt(stats.get("acceptance_rate"), ".3f")),
        ("tokens / s", _fmt(stats.get("tok_per_s"), ".1f")),
    ]
    if speedup is not None or speedup_note:
        rows.append(("speedup vs ar", _fmt(speedup, ".2f") + ("×" if speedup is not None else "")
                     + (f" ({speedup_note})" if speedup_note else "")))
    rows += [("steps · tokens", f"{stats.get('n_steps', 0)} · {stats.get('n_generated', 0)}"),
             ("drafted · accepted", f"{stats.get('drafted', 0)} · {stats.get('accepted', 0)}")]
    agree = unverified_agreement(as_dicts(steps))
    if sum(agree):
        per = ", ".join(f"pos {i + 1}: {n}" for i, n in enumerate(agree) if n)
        rows.append(("unverified drafts the target agrees with", f"{sum(agree)} ({per})"))
    if stats.get("warmup_compiles"):
        rows.append(("XLA compiles before timing", f"{stats['warmup_compiles']} in {stats.get('warmup_s', 0.0):.1f} s "
                                                   "(not in tokens/s)"))
    if stats.get("compiles"):
        rows.append(("XLA compiles", f"{stats['compiles']} (their time is in tokens/s)"))
    if stats.get("stop_reason"):
        rows.append(("stop", str(stats["stop_reason"])))
    body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="ds-stats">{body}</table>'


def run_html(run: dict, clickable: bool = False, annotated: Iterable[tuple[int, int]] = (),
             pick_unverified: bool = False, speedup: tuple[float | None, str] = (None, "")) -> str:
    """A stored run (History.get_run): what it was, its stats (with its speedup over ar and what that is against),
    its block view replayed and its plain output."""
    s = run.get("settings") or {}
    facts = [f"run {run.get('run_id')}", drafter_k(str(s.get('drafter')), s.get('k')), f"T={s.get('temperature')}",
             f"status {run.get('status')}", f"{run.get('created_at'):%Y-%m-%d %H:%M:%S} UTC"
             if run.get("created_at") else ""]
    if s.get("raw"):
        facts.append("raw prompt")
    if s.get("template"):
        facts.append(f"chat template {s['template']}")
    if run.get("suite"):
        facts.append(f"suite {run['suite']} #{run.get('prompt_id')}")
    if run.get("lossless") is not None:
        facts.append(f"lossless vs ar: {run['lossless']}")
    if run.get("comparison_group"):
        facts.append(f"comparison {run['comparison_group'][:8]}")
    head = f'<div class="ds-legend">{escape(" · ".join(f for f in facts if f))}</div>'
    view = block_view(run.get("steps") or [], run.get("prompt"), clickable, annotated, pick_unverified=pick_unverified)
    stats = stats_html(run.get("stats") or {}, *speedup, steps=run.get("steps") or [])
    return f'{head}{stats}<div class="ds-pair">{view}{plain_html(run.get("text"))}</div>'
