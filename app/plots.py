"""Plotly figures for K-Flat, predicted speedup, acceptance curves, acceptance lengths and calibration.

Legends sit under the plot, below the x-axis title, and wrap there; points estimated from fewer than MIN_SAMPLES
samples are drawn as grey rings off the curves, and every point's marker grows with its sample count.
"""

from __future__ import annotations

import textwrap
import zlib
from collections import defaultdict

import plotly.graph_objects as go

from storage import drafter_label

MIN_SAMPLES = 10  # fewer samples than this: a point is shown greyed, off its curve
GREY = "#9ca3af"
LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=20, t=60, b=40), showlegend=True,
              legend=dict(orientation="h", x=0, xanchor="left", y=-0.3, yanchor="top", font=dict(size=11)))
# One colour per drafter in every figure (a checkpoint directory label gets a stable colour from its name).
DRAFTER_COLOURS = {"ar": "#6b7280", "ngram": "#2563eb", "dflash": "#dc2626", "eagle3": "#059669"}
SPARE_COLOURS = ["#7c3aed", "#d97706", "#0891b2", "#db2777", "#65a30d", "#4f46e5"]
SPEEDUP_MODEL = "speedup(K) = tau(K) / ((draft(K) + verify(K)) / ar step)"
SUBTITLE_CHARS = 64  # a subtitle line that fits a half-width plot; longer ones wrap
# One marker and dash per suite, so two suites of one drafter (one colour) stay apart.
SUITE_STYLES = {"gsm8k": ("circle", "solid"), "humaneval": ("square", "dash"), "mtbench": ("diamond", "dot")}
OTHER_SUITE_STYLE = ("triangle-up", "dashdot")  # no suite, or another one
NO_SUITE_STYLE = ("x", "longdash")
SUITE_PATTERNS = {"gsm8k": "", "humaneval": "/", "mtbench": "."}  # the bars' fill per suite ("x": any other)


def subtitled(title: str, *lines: str) -> str:
    """A title with subtitle lines, each wrapped to SUBTITLE_CHARS so that none is cut at the plot's edge."""
    wrapped = [part for line in lines for part in textwrap.wrap(line, SUBTITLE_CHARS)]
    return title + "".join(f"<br><sup>{part}</sup>" for part in wrapped)


def stable_colour(name: str) -> str:
    """A colour from the spare palette fixed by the name alone, so adding a series never recolours the others."""
    return SPARE_COLOURS[zlib.crc32(name.encode()) % len(SPARE_COLOURS)]


def suite_style(suite: str | None) -> tuple[str, str]:
    """(marker symbol, line dash) of a suite's series."""
    return NO_SUITE_STYLE if not suite else SUITE_STYLES.get(suite, OTHER_SUITE_STYLE)


def _figure(title: str, x: str, y: str, log_x: bool = False) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, **LAYOUT)
    if log_x:
        fig.update_xaxes(type="log", dtick=0.30102999566, tickformat="d")  # ticks at powers of two
    return fig


def empty_figure(title: str, note: str) -> go.Figure:
    """A figure with no data and a note saying why."""
    fig = _figure(title, "", "")
    fig.add_annotation(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def drafter_colour(drafter: str) -> str:
    """The colour a drafter has in every plot."""
    return DRAFTER_COLOURS.get(drafter) or stable_colour(drafter)


def marker_sizes(counts: list[int], biggest: int) -> list[float]:
    """Marker diameters growing with the square root of each point's sample count (6 to 18 px)."""
    return [6 + 12 * (n / biggest) ** 0.5 if biggest else 6 for n in counts]


def add_counted_points(fig: go.Figure, x: list, y: list, counts: list[int], biggest: int, name: str,
                       hover: str, colour: str | None = None, style: tuple[str, str] = ("circle", "solid")) -> None:
    """One curve through the points with at least MIN_SAMPLES samples (in `colour`, with style's marker symbol and
    line dash), and the others as grey rings off it; marker size and hover show each point's sample count n."""
    well = [i for i, n in enumerate(counts) if n >= MIN_SAMPLES]
    few = [i for i, n in enumerate(counts) if n < MIN_SAMPLES]
    template = f"{hover}<br>n=%{{customdata}}<extra>{name}</extra>"
    trace = go.Scatter(x=[x[i] for i in well], y=[y[i] for i in well], mode="lines+markers", name=name,
                       legendgroup=name, customdata=[counts[i] for i in well], hovertemplate=template,
                       marker=dict(size=marker_sizes([counts[i] for i in well], biggest), color=colour,
                                   symbol=style[0]),
                       line=dict(color=colour, dash=style[1]))
    fig.add_trace(trace)
    if few:
        fig.add_trace(go.Scatter(x=[x[i] for i in few], y=[y[i] for i in few], mode="markers", legendgroup=name,
                                 name=f"{name} (n < {MIN_SAMPLES})", showlegend=not well,
                                 customdata=[counts[i] for i in few],
                                 hovertemplate=f"{hover}<br>n=%{{customdata}} (under {MIN_SAMPLES}: unreliable)"
                                               f"<extra>{name}</extra>",
                                 marker=dict(size=marker_sizes([counts[i] for i in few], biggest), color="white",
                                             symbol=style[0], line=dict(color=GREY, width=1.5))))


def kflat_figure(sweeps: dict[str, list[dict]]) -> go.Figure:
    """Verify ms (solid) and draft ms (dashed) against K, one colour per labelled sweep."""
    if not sweeps:
        return empty_figure("K-Flat: verify latency vs K", "run a sweep or pick stored sweeps")
    fig = _figure("K-Flat: verify latency vs K", "K (drafted tokens per block, log scale)", "ms per step", log_x=True)
    for label, rows in sweeps.items():
        rows, colour = sorted(rows, key=lambda r: r["k"]), stable_colour(label)
        fig.add_trace(go.Scatter(x=[r["k"] for r in rows], y=[r["verify_ms"] for r in rows], mode="lines+markers",
                                 name=f"verify · {label}", legendgroup=label, line=dict(color=colour)))
        drafts = [r for r in rows if r.get("draft_ms") is not None]
        if drafts:
            fig.add_trace(go.Scatter(x=[r["k"] for r in drafts], y=[r["draft_ms"] for r in drafts],
                                     mode="lines+markers", line=dict(dash="dash", color=colour),
                                     name=f"draft ({drafts[0].get('drafter') or 'drafter'}) · {label}",
                                     legendgroup=label))
    return fig


def predict_speedup(rows: list[dict], survival: list[float], with_draft: bool = True) -> list[dict]:
    """Predicted speedup per measured K: tau(K) / ((draft(K) + verify(K)) / verify(base)), tau(K) = 1 + sum of
    survival up to K. with_draft=False leaves the draft time out (an estimate for drafting that costs nothing).

    base is K=1 (the cost of an `ar` step, which also verifies a 2-token block) or the smallest K swept.
    Only K up to the longest measured block (len(survival)) are predicted.
    """
    rows = sorted(rows, key=lambda r: r["k"])
    if not rows or not survival:
        return []
    base = rows[0]["verify_ms"]
    out = []
    for r in rows:
        if r["k"] > len(survival):
            break
        tau = 1.0 + sum(survival[:r["k"]])
        draft = (r.get("draft_ms") or 0.0) if with_draft else 0.0
        cost = (r["verify_ms"] + draft) / base
        out.append({"k": r["k"], "tau": tau, "draft_ms": draft, "cost": cost, "speedup": tau / cost})
    return out


def times_drafter(rows: list[dict], drafter: str) -> bool:
    """Whether a sweep timed this drafter's draft step at every K."""
    return bool(rows) and all(r.get("drafter") == drafter and r.get("draft_ms") is not None for r in rows)


def prediction_errors(rows: list[dict], survival: list[float], measured: list[dict],
                      with_draft: bool = True) -> list[dict]:
    """Per K both predicted (from a sweep) and measured (stored runs): {k, predicted, measured, error, n_pairs},
    error = predicted / measured - 1."""
    predicted = {p["k"]: p["speedup"] for p in predict_speedup(rows, survival, with_draft)}
    return [{"k": m["k"], "predicted": predicted[m["k"]], "measured": m["speedup"], "n_pairs": m["n_pairs"],
             "error": predicted[m["k"]] / m["speedup"] - 1} for m in measured if m["k"] in predicted]


def speedup_figure(sweeps: dict[str, list[dict]], survival: list[float], source: str, drafter: str,
                   measured: list[dict] = ()) -> go.Figure:
    """Predicted speedup vs K per sweep from `drafter`'s measured survival curve; the best K is starred. A sweep
    that timed this drafter's draft step counts it (solid); any other is a verify-only estimate (dotted, so named).
    measured: the drafter's speedups from stored runs ({k, speedup, n_pairs}), drawn as points sized by count."""
    title = subtitled("Predicted speedup vs K", SPEEDUP_MODEL, "ar step = verify(K=1)", f"acceptance: {source}")
    if not sweeps or not survival:
        return empty_figure(title, "needs a sweep and stored runs of the chosen drafter")
    fig = _figure(title, "K (log scale)", "predicted speedup over ar", log_x=True)
    fig.update_layout(margin=dict(t=40 + 18 * title.count("<br>")))
    top = 1.0
    for label, rows in sweeps.items():
        with_draft = times_drafter(rows, drafter)
        pred = predict_speedup(rows, survival, with_draft)
        if not pred:
            continue
        name = f"{label} · with {drafter}'s draft time" if with_draft else \
            f"{label} · verify only: drafting cost left out"
        top = max([top] + [p["speedup"] for p in pred])
        fig.add_trace(go.Scatter(x=[p["k"] for p in pred], y=[p["speedup"] for p in pred], mode="lines+markers",
                                 name=name, line=dict(dash="solid" if with_draft else "dot",
                                                      color=stable_colour(label)),
                                 customdata=[[p["tau"], p["draft_ms"], p["cost"]] for p in pred],
                                 hovertemplate="K=%{x}<br>speedup %{y:.2f}×<br>tau %{customdata[0]:.2f}"
                                               "<br>draft %{customdata[1]:.2f} ms"
                                               "<br>cost %{customdata[2]:.2f}× ar step<extra></extra>"))
        best = max(pred, key=lambda p: p["speedup"])
        fig.add_trace(go.Scatter(x=[best["k"]], y=[best["speedup"]], mode="markers+text",
                                 marker=dict(symbol="star", size=16, color="#f59e0b"),
                                 text=[f"best K={best['k']}: {best['speedup']:.2f}×" + ("" if with_draft else
                                                                                          " (no draft cost)")],
                                 textposition=label_position(best["k"], [p["k"] for p in pred]),
                                 name=f"best K · {label}", showlegend=False))
    if measured:
        top = max([top] + [m["speedup"] for m in measured])
        counts = [m["n_pairs"] for m in measured]
        fig.add_trace(go.Scatter(x=[m["k"] for m in measured], y=[m["speedup"] for m in measured], mode="markers",
                                 name=f"measured: {drafter} runs over ar (greedy, this device)",
                                 customdata=counts, hovertemplate="K=%{x}<br>measured %{y:.2f}×<br>"
                                                                  "%{customdata} run pairs<extra></extra>",
                                 marker=dict(symbol="diamond", size=marker_sizes(counts, max(counts)),
                                             color=drafter_colour(drafter), line=dict(color="black", width=1))))
    fig.add_hline(y=1.0, line=dict(color=GREY, dash="dot"))
    fig.update_yaxes(range=[0, top * 1.25])  # from zero, with room for the best-K label
    return fig


def label_position(k: int, ks: list[int]) -> str:
    """Where a point's text label stays inside the plot: away from the edge when the point is on one."""
    return "top right" if k == ks[0] and len(ks) > 1 else "top left" if k == ks[-1] and len(ks) > 1 else "top center"


def series_label(row: dict) -> str:
    """Legend label of a (drafter checkpoint, suite, K, temperature) group."""
    return (f"{drafter_label(row['drafter'], row.get('drafter_checkpoint'))} · {row.get('suite') or 'no suite'} · "
            f"K={row['k']} · T={row['temperature']:g}")


POSITION_COUNTS = {"survival": "n_steps", "conditional_acceptance": "n_reached"}  # each metric's denominator


def position_figure(rows: list[dict], column: str, title: str) -> go.Figure:
    """A per-position curve (survival or conditional_acceptance) per drafter/suite/K group; each point's sample
    count (steps that drafted position i, or that reached it) sizes its marker and shows on hover."""
    if not rows:
        return empty_figure(title, "no stored steps for this selection")
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[series_label(r)].append(r)
    count = POSITION_COUNTS[column]
    biggest = max(r[count] for r in rows)
    fig = _figure(title, "draft position i within the block", column.replace("_", " "))
    for label, rs in groups.items():
        rs = sorted((r for r in rs if r[column] is not None), key=lambda r: r["i"])
        add_counted_points(fig, [r["i"] for r in rs], [r[column] for r in rs], [r[count] for r in rs], biggest,
                           label, "i=%{x}<br>%{y:.3f}", drafter_colour(rs[0]["drafter"]) if rs else None,
                           suite_style(rs[0].get("suite")) if rs else suite_style(None))
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[-0.05, 1.05])
    return fig


def length_histogram(rows: list[dict]) -> go.Figure:
    """Fraction of steps by accepted-prefix length, one bar series per drafter/suite/K group (ar, K=0, drafts
    nothing and is left out)."""
    title = "Acceptance length per step"
    rows = [r for r in rows if r["k"]]
    if not rows:
        return empty_figure(title, "no stored steps for this selection")
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[series_label(r)].append(r)
    fig = _figure(title, "accepted tokens in the step", "fraction of steps")
    for label, rs in groups.items():
        total = sum(r["n_steps"] for r in rs)
        rs = sorted(rs, key=lambda r: r["accepted"])
        fig.add_trace(go.Bar(x=[r["accepted"] for r in rs], y=[r["n_steps"] / total for r in rs], name=label,
                             marker_color=drafter_colour(rs[0]["drafter"]),
                             marker_pattern_shape=SUITE_PATTERNS.get(rs[0].get("suite") or "", "x"),
                             customdata=[r["n_steps"] for r in rs],
                             hovertemplate="accepted=%{x}<br>%{y:.3f} (%{customdata} steps)<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(dtick=1)
    return fig


def calibration_figure(rows: list[dict]) -> go.Figure:
    """Drafter confidence q (binned) against the observed acceptance of the reached drafted tokens."""
    title = "Drafter calibration: q vs observed acceptance"
    if not rows:
        return empty_figure(title, "no drafted tokens for this selection")
    fig = _figure(title, "draft confidence q (bin mean)", "observed acceptance")
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color=GREY, dash="dot"),
                             name="perfectly calibrated"))
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[drafter_label(r["drafter"], r.get("drafter_checkpoint"))].append(r)
    biggest = max(r["n"] for r in rows)
    for label, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["q_mean"])
        add_counted_points(fig, [r["q_mean"] for r in rs], [r["acceptance"] for r in rs], [r["n"] for r in rs],
                           biggest, label, "q≈%{x:.2f}<br>accepted %{y:.3f}", drafter_colour(rs[0]["drafter"]))
    fig.update_xaxes(range=[-0.02, 1.02])
    fig.update_yaxes(range=[-0.02, 1.05])
    return fig
