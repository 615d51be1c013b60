"""Block view HTML and Plotly figures from hand-made traces (no model, fast)."""

from __future__ import annotations

import re
from html import escape

import plotly.graph_objects as go
import pytest

from app import plots
from app.render import (
    PROMPT_FOLD,
    PROMPT_HEAD,
    PROMPT_TAIL,
    LiveView,
    block_view,
    run_html,
    stats_html,
    step_html,
    unverified_agreement,
)

# Step 0: drafted 3, accepted 1 -> 'Hello' accepted, '<script>' rejected, 'a&b' unverified, bonus ' world'.
STEP0 = {
    "index": 0, "position": 9, "drafted": [11, 12, 13], "accepted": 1, "bonus": 21,
    "p": [0.9, 0.05, 0.01], "q": [0.8, 0.7, 0.6],
    "top5_ids": [[11, 1, 2, 3, 4], [21, 12, 5, 6, 7], [8, 9, 13, 10, 1], [1, 2, 3, 4, 5]],
    "top5_p": [[0.9, 0.05, 0.02, 0.01, 0.01], [0.6, 0.05, 0.04, 0.03, 0.02], [0.5, 0.2, 0.01, 0.01, 0.01],
               [0.2, 0.2, 0.2, 0.2, 0.2]],
    "emitted": [11, 21], "draft_ms": 1.0, "verify_ms": 30.0,
    "drafted_text": ["Hello", "<script>alert(1)</script>", "a&b"], "bonus_text": " world",
    "top5_text": [["Hello", "Hi", "Hey", "Yo", "So"], [" world", "<b>", "x", "y", "z"],
                  ["p", "q", "a&b", "r", "s"], ["1", "2", "3", "4", "5"]],
}
# Step 1: everything accepted, then a bonus.
STEP1 = {
    "index": 1, "position": 11, "drafted": [31, 32], "accepted": 2, "bonus": 33,
    "p": [0.99, 0.98], "q": [1.0, 1.0], "top5_ids": [[31], [32], [33]], "top5_p": [[0.99], [0.98], [0.97]],
    "emitted": [31, 32, 33], "draft_ms": 1.0, "verify_ms": 31.0,
    "drafted_text": ["!", "\n"], "bonus_text": "Bye", "top5_text": [["!"], ["\n"], ["Bye"]],
}


def spans(html: str, cls: str) -> list[str]:
    return re.findall(rf'<span class="tok {cls}[^"]*" title="([^"]*)"[^>]*>([^<]*)</span>', html)


def test_classes_for_accepted_rejected_unverified_and_bonus():
    html = step_html(STEP0)
    assert [t for _, t in spans(html, "acc")] == ["Hello"]
    assert [t for _, t in spans(html, "rej")] == ["&lt;script&gt;alert(1)&lt;/script&gt;"]  # the first rejection
    assert [t for _, t in spans(html, "unv")] == ["a&amp;b"] and not spans(html, "unv agree")  # never verified
    assert [t for _, t in spans(html, "bonus")] == [" world"]
    assert html.index("tok acc") < html.index("tok rej") < html.index("tok unv") < html.index("tok bonus")
    assert 'data-step="0" data-pos="1"' in html and 'data-step="0" data-pos="2"' in html


def test_markup_is_escaped_everywhere():
    html = block_view([STEP0, STEP1], prompt="<script>alert('x')</script> & <b>bold</b>")
    assert "<script" not in html and "<b>" not in html.replace("<b>prompt</b>", "")
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    assert "a&amp;b" in html
    # titles are attribute-escaped too: the '<b>' top-5 candidate must not open a tag
    assert "&#x27;&lt;b&gt;&#x27;" in html


def test_titles_show_p_q_and_top5():
    (title, _), = [s for s in spans(step_html(STEP0), "unv") if "a&amp;b" in s[1]]
    assert "unverified (after the rejection)" in title
    assert "p (target) = 0.0100" in title and "q (drafter) = 0.6000" in title
    assert "target top-5: &#x27;p&#x27; 0.500 | &#x27;q&#x27; 0.200 | &#x27;a&amp;b&#x27; 0.010" in title
    (first, _), = [s for s in spans(step_html(STEP0), "rej") if "script" in s[1]]
    assert "first rejection" in first
    (bonus, _), = spans(step_html(STEP0), "bonus")
    assert "p (target) = 0.6000" in bonus and "&#x27; world&#x27; 0.600" in bonus


def test_steps_are_separated_and_newlines_visible():
    html = block_view([STEP0, STEP1])
    assert html.count('<span class="ds-step"') == 2
    assert [t for _, t in spans(html, "acc")] == ["Hello", "!", "↵\n"]
    assert [t for _, t in spans(html, "bonus")] == [" world", "Bye"]
    assert "no steps yet" in block_view([])


def test_live_view_only_appends_while_running():
    view = LiveView("<p>")
    first = view.html([STEP0])
    second = view.html([STEP0, STEP1])
    final = view.html([STEP0, STEP1], done=True)
    assert second.startswith(first) and final.startswith(second)  # Gradio then streams only the new part
    assert final == block_view([STEP0, STEP1], prompt="<p>")


def test_clickable_and_annotated_tokens():
    html = step_html(STEP0, clickable=True, annotated=[(0, 1)])
    assert 'data-pick="0:1"' in html and 'data-pick="0:2"' not in html  # real rejections only, by default
    assert re.search(r'class="tok rej pick ann"[^>]*data-pos="1"', html)
    html = step_html(STEP0, clickable=True, annotated=[(0, 2)], pick_unverified=True)
    assert re.search(r'class="tok unv pick ann"[^>]*data-pos="2"', html)
    assert "data-pick" not in step_html(STEP0)


def test_unverified_drafts_the_target_agrees_with_are_marked_and_counted_per_position():
    # drafted 4, accepted 0: row 0 rejected; rows 1..3 unverified; the target's top-1 equals the draft at rows 1, 3
    step = {"index": 0, "position": 4, "drafted": [5, 6, 7, 8], "accepted": 0, "bonus": 9, "p": [0.1] * 4,
            "q": [0.9] * 4, "top5_ids": [[9], [6], [1], [8], [2]], "top5_p": [[0.5]] * 5, "emitted": [9],
            "drafted_text": ["a", "b", "c", "d"], "bonus_text": "z"}
    html = step_html(step)
    assert [t for _, t in spans(html, "unv agree")] == ["b", "d"] and len(spans(html, "unv")) == 3
    (title, _), = [x for x in spans(html, "unv agree") if x[1] == "b"]
    assert "the target&#x27;s greedy choice here agrees" in title
    later = dict(step, index=1, accepted=1, drafted=[5, 6, 7, 8])  # row 1 is now the rejection: not counted
    assert unverified_agreement([step, later]) == [0, 1, 0, 2]
    assert "unverified drafts the target agrees with</td><td>3 (pos 2: 1, pos 4: 2)" in stats_html({}, steps=[step,
                                                                                                               later])
    assert "unverified" not in stats_html({}, steps=[STEP1])


def test_cut_tokens_and_no_bonus_when_output_ended():
    step = dict(STEP1, emitted=[31])  # EOS / token limit right after the first accepted draft
    html = step_html(step)
    assert len(spans(html, "acc cut")) == 1 and not spans(html, "bonus")


def test_stats_and_run_html():
    stats = {"tau": 2.5, "acceptance_rate": 0.6, "tok_per_s": 40.0, "n_steps": 2, "n_generated": 5, "drafted": 5,
             "accepted": 3, "compiles": 0, "stop_reason": "eos"}
    assert "speedup" not in stats_html(stats)
    table = stats_html(stats, 1.5, "vs <ar>")
    assert "2.50" in table and "1.50×" in table and "&lt;ar&gt;" in table
    run = {"run_id": "r1", "status": "done", "settings": {"drafter": "ngram", "k": 3, "temperature": 0.0},
           "stats": stats, "steps": [STEP0], "prompt": "<i>hi</i>", "lossless": True}
    html = run_html(run)
    assert "lossless vs ar: True" in html and "&lt;i&gt;hi&lt;/i&gt;" in html and "tok rej" in html
    assert '<div class="ds-plain-text"></div>' in html  # no text stored: an empty plain output, not "None"
    html = run_html(dict(run, text="Hello world <b>&\nBye"))
    (plain,) = re.findall(r'<div class="ds-plain-text">(.*?)</div>', html, re.S)
    assert plain == "Hello world &lt;b&gt;&amp;\nBye"  # the output as text beside the block view, escaped
    assert "chat template" not in html  # no switches: nothing to tell apart
    thinking = dict(run, settings=run["settings"] | {"template": "enable_thinking=false"})
    assert "chat template enable_thinking=false" in run_html(thinking)  # runs with switches say which


def test_long_prompts_fold_around_an_expandable_middle():
    short = "<b>" + "x" * (PROMPT_FOLD - 3)
    assert "<details>" not in block_view([], prompt=short) and f"&lt;b&gt;{'x' * 100}" in block_view([], prompt=short)
    prompt = "<i>head</i>" + "m" * 20_000 + "</tail>"
    html = block_view([STEP0], prompt=prompt)
    head, rest = html.split("<details>")
    middle, tail = rest.split("</details>")
    summary = re.search(r"<summary>(.*?)</summary>", middle).group(1)
    hidden = re.sub(r"<summary>.*?</summary>", "", middle)
    assert head.endswith(escape(prompt[:PROMPT_HEAD])) and tail.startswith(escape(prompt[-PROMPT_TAIL:]))
    assert hidden == escape(prompt[PROMPT_HEAD:-PROMPT_TAIL])  # nothing is lost: the middle expands in place
    assert f"{len(prompt) - PROMPT_HEAD - PROMPT_TAIL:,} more characters" in summary and "20,018 in all" in summary
    assert "&lt;i&gt;head" in head and "&lt;/tail&gt;" in tail and 'class="tok rej"' in tail


SWEEP = [{"k": 1, "verify_ms": 20.0, "draft_ms": 1.0}, {"k": 2, "verify_ms": 22.0, "draft_ms": 1.0},
         {"k": 4, "verify_ms": 30.0, "draft_ms": 2.0}, {"k": 8, "verify_ms": 60.0, "draft_ms": 2.0}]
SWEEP = [dict(r, drafter="ngram") for r in SWEEP]  # a sweep that timed ngram's draft step


def test_kflat_figure_log_x_with_draft_traces():
    fig = plots.kflat_figure({"cpu": SWEEP, "gpu": [dict(r, draft_ms=None, drafter=None) for r in SWEEP]})
    assert isinstance(fig, go.Figure) and fig.layout.xaxis.type == "log"
    names = [t.name for t in fig.data]
    assert names == ["verify · cpu", "draft (ngram) · cpu", "verify · gpu"]
    assert list(fig.data[0].x) == [1, 2, 4, 8] and list(fig.data[0].y) == [20.0, 22.0, 30.0, 60.0]


def test_predicted_speedup_and_best_k():
    survival = [0.8, 0.6, 0.4, 0.2]
    pred = plots.predict_speedup(SWEEP, survival)
    assert [p["k"] for p in pred] == [1, 2, 4]  # K=8 is beyond the measured block length
    assert pred[0]["tau"] == pytest.approx(1.8) and pred[0]["cost"] == pytest.approx(21 / 20)
    assert pred[2]["speedup"] == pytest.approx(3.0 / (32 / 20))
    fig = plots.speedup_figure({"cpu": SWEEP}, survival, "ngram", "ngram")
    curve, best = fig.data
    assert list(curve.x) == [1, 2, 4]
    assert best.marker.symbol == "star" and list(best.x) == [max(pred, key=lambda p: p["speedup"])["k"]]


def test_predicted_speedup_uses_the_measured_draft_time_or_says_it_does_not():
    survival = [0.8, 0.6, 0.4, 0.2]
    taus = [1.8, 2.4, 3.0]  # 1 + survival summed to K = 1, 2, 4
    fig = plots.speedup_figure({"cpu": SWEEP}, survival, "ngram, 40 steps", "ngram")
    assert plots.SPEEDUP_MODEL in fig.layout.title.text  # the model is spelled out on the plot
    curve = fig.data[0]
    assert "with ngram's draft time" in curve.name and curve.line.dash == "solid"
    costs = [(r["verify_ms"] + r["draft_ms"]) / 20.0 for r in SWEEP[:3]]  # (verify(K) + draft(K)) / verify(1)
    assert list(curve.y) == pytest.approx([t / c for t, c in zip(taus, costs, strict=True)])
    assert [d[1] for d in curve.customdata] == [1.0, 1.0, 2.0]  # the draft ms shown on hover
    # The acceptance is dflash's but the sweep timed ngram: ngram's draft time must not stand in for dflash's.
    fig = plots.speedup_figure({"cpu": SWEEP}, survival, "dflash, 40 steps", "dflash")
    curve, best = fig.data[0], fig.data[1]
    assert "verify only: drafting cost left out" in curve.name and curve.line.dash == "dot"
    assert list(curve.y) == pytest.approx([t / (r["verify_ms"] / 20.0) for t, r in zip(taus, SWEEP, strict=False)])
    assert best.text[0].endswith("(no draft cost)")
    assert plots.predict_speedup(SWEEP, survival, with_draft=False)[2]["cost"] == pytest.approx(30 / 20)


def test_acceptance_figures():
    pos = [{"drafter": "ngram", "suite": None, "k": 4, "temperature": 0.0, "i": i, "survival": s,
            "conditional_acceptance": c, "n_steps": 10, "n_reached": 10} for i, s, c in [(1, 0.5, 0.5), (2, 0.25, 0.5)]]
    fig = plots.position_figure(pos, "survival", "Survival")
    assert len(fig.data) == 1 and list(fig.data[0].y) == [0.5, 0.25] and "ngram" in fig.data[0].name
    lengths = [{"drafter": "ngram", "suite": "gsm8k", "k": 4, "temperature": 0.0, "accepted": a, "n_steps": n}
               for a, n in [(0, 6), (1, 2), (4, 2)]]
    ar = {"drafter": "ar", "suite": "gsm8k", "k": 0, "temperature": 0.0, "accepted": 0, "n_steps": 9}
    hist = plots.length_histogram([ar, *lengths])
    assert len(hist.data) == 1 and hist.data[0].type == "bar" and list(hist.data[0].y) == [0.6, 0.2, 0.2]  # no ar
    calib = plots.calibration_figure([{"drafter": "dflash", "bin": 9, "q_mean": 0.95, "acceptance": 0.7, "n": 40},
                                      {"drafter": "dflash", "bin": 2, "q_mean": 0.25, "acceptance": 0.2, "n": 10}])
    assert [t.name for t in calib.data] == ["perfectly calibrated", "dflash"]
    assert list(calib.data[1].x) == [0.25, 0.95]
    assert plots.position_figure([], "survival", "S").layout.annotations[0].text.startswith("no stored steps")


def test_points_show_their_sample_count_and_few_samples_are_greyed():
    # Conditional acceptance at i=3 comes from one step that reached it: 1.0 from a single sample.
    pos = [{"drafter": "dflash", "suite": "gsm8k", "k": 4, "temperature": 0.0, "i": i, "survival": s,
            "conditional_acceptance": c, "n_steps": 200, "n_reached": n}
           for i, s, c, n in [(1, 0.4, 0.4, 200), (2, 0.1, 0.25, 80), (3, 0.005, 1.0, 1), (4, 0.0, None, 0)]]
    fig = plots.position_figure(pos, "conditional_acceptance", "Conditional")
    curve, few = fig.data
    assert list(curve.x) == [1, 2] and list(curve.customdata) == [200, 80]  # n = steps that reached position i
    assert curve.marker.size[0] > curve.marker.size[1]  # the marker grows with the sample count
    assert "n=%{customdata}" in curve.hovertemplate
    assert list(few.x) == [3] and list(few.y) == [1.0] and few.mode == "markers" and not few.showlegend
    assert few.marker.line.color == plots.GREY and f"under {plots.MIN_SAMPLES}" in few.hovertemplate
    survival = plots.position_figure(pos, "survival", "Survival").data
    assert len(survival) == 1 and list(survival[0].customdata) == [200] * 4  # survival counts every drafting step
    legend = fig.layout.legend
    assert legend.orientation == "h" and legend.yanchor == "top" and legend.y < 0  # under the plot, wrapping


def test_each_drafter_has_one_colour_in_every_acceptance_plot():
    def pos(drafter, suite):
        return [{"drafter": drafter, "suite": suite, "k": 4, "temperature": 0.0, "i": i, "survival": 0.5,
                 "conditional_acceptance": 0.5, "n_steps": 20, "n_reached": 20} for i in (1, 2)]

    def lengths(drafter):
        return [{"drafter": drafter, "suite": "gsm8k", "k": 4, "temperature": 0.0, "accepted": a, "n_steps": 5}
                for a in (0, 1)]

    calib_rows = [{"drafter": d, "bin": 5, "q_mean": 0.5, "acceptance": 0.4, "n": 30} for d in ("eagle3", "dflash")]
    figures = [plots.position_figure(pos("eagle3", "a") + pos("dflash", "a") + pos("dflash", "b"), "survival", "S"),
               plots.length_histogram(lengths("dflash") + lengths("eagle3")), plots.calibration_figure(calib_rows)]
    seen: dict[str, set] = {}
    for fig in figures:
        for trace in fig.data:
            drafter = trace.name.split(" ")[0]
            if drafter in ("dflash", "eagle3"):
                seen.setdefault(drafter, set()).add(trace.marker.color)
    assert seen == {"dflash": {plots.drafter_colour("dflash")}, "eagle3": {plots.drafter_colour("eagle3")}}
    assert plots.drafter_colour("dflash") != plots.drafter_colour("eagle3")


def test_two_suites_of_one_drafter_keep_its_colour_but_not_its_marker():
    def pos(suite):
        return [{"drafter": "dflash", "suite": suite, "k": 4, "temperature": 0.0, "i": i, "survival": 0.5,
                 "conditional_acceptance": 0.5, "n_steps": 20, "n_reached": 20} for i in (1, 2)]

    fig = plots.position_figure(pos("gsm8k") + pos(None), "survival", "S")
    gsm8k, none = fig.data
    assert gsm8k.marker.color == none.marker.color == plots.drafter_colour("dflash")
    assert (gsm8k.marker.symbol, gsm8k.line.dash) != (none.marker.symbol, none.line.dash)
    bars = plots.length_histogram([{"drafter": "dflash", "suite": s, "k": 4, "temperature": 0.0, "accepted": 1,
                                    "n_steps": 5} for s in ("gsm8k", None)])
    assert bars.data[0].marker.pattern.shape != bars.data[1].marker.pattern.shape


def test_a_sweep_keeps_its_colour_when_another_is_added_and_subtitles_fit():
    one = plots.kflat_figure({"cpu a": SWEEP})
    two = plots.kflat_figure({"cpu b": SWEEP, "cpu a": SWEEP})
    colour = {t.name: t.line.color for t in two.data}
    assert all(colour[t.name] == t.line.color for t in one.data)
    assert colour["verify · cpu a"] != colour["verify · cpu b"]
    fig = plots.speedup_figure({"cpu a": SWEEP}, [0.8, 0.6, 0.4, 0.2], "dflash (checkpoints/smollm2-135m-dflash) on "
                               "SmolLM2-135M-Instruct.Q4_1, 4,210 steps, measured to K=7", "ngram")
    lines = re.findall(r"<sup>(.*?)</sup>", fig.layout.title.text)
    assert len(lines) >= 3 and all(len(line) <= plots.SUBTITLE_CHARS for line in lines), lines


def test_speedup_says_its_range_over_the_stored_ar_runs_and_when_it_is_within_noise():
    from app.runner import Live, Reference, speedup

    live = Live("ngram", [], {"tok_per_s": 11.0}, "done")
    one = Reference("r1", 10.0, [], None, "stored ar run")
    assert speedup(live, one) == (pytest.approx(1.1), "stored ar run")  # one ar run: no spread to show
    noisy = Reference("r1", 10.0, [], None, "stored ar run", [10.0, 9.2, 11.7])
    value, note = speedup(live, noisy)
    assert value == pytest.approx(1.1) and "0.94-1.20x against all 3 stored ar runs: within noise" in note
    clear = Reference("r1", 10.0, [], None, "stored ar run", [10.0, 9.8, 10.3])
    assert "1.07-1.12x against all 3 stored ar runs" in speedup(live, clear)[1]
    assert "within noise" not in speedup(live, clear)[1]
