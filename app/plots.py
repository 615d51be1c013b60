"""Plotly figures for K-Flat, predicted speedup, acceptance curves, acceptance lengths and calibration."""

from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go

LAYOUT = dict(template="plotly_white", height=380, margin=dict(l=60, r=20, t=50, b=50),
              legend=dict(orientation="h", y=-0.2))


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


def kflat_figure(sweeps: dict[str, list[dict]]) -> go.Figure:
    """Verify ms (solid) and draft ms (dashed) against K, one colour per labelled sweep."""
    if not sweeps:
        return empty_figure("K-Flat: verify latency vs K", "run a sweep or pick stored sweeps")
    fig = _figure("K-Flat: verify latency vs K", "K (drafted tokens per block, log scale)", "ms per step", log_x=True)
    for label, rows in sweeps.items():
        rows = sorted(rows, key=lambda r: r["k"])
        fig.add_trace(go.Scatter(x=[r["k"] for r in rows], y=[r["verify_ms"] for r in rows], mode="lines+markers",
                                 name=f"verify · {label}", legendgroup=label))
        drafts = [r for r in rows if r.get("draft_ms") is not None]
        if drafts:
            fig.add_trace(go.Scatter(x=[r["k"] for r in drafts], y=[r["draft_ms"] for r in drafts],
                                     mode="lines+markers", line=dict(dash="dash"), name=f"draft · {label}",
                                     legendgroup=label))
    return fig


def predict_speedup(rows: list[dict], survival: list[float]) -> list[dict]:
    """Predicted speedup per measured K: (1 + sum_{i<=K} survival_i) / ((verify(K) + draft(K)) / verify(base)).

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
        cost = (r["verify_ms"] + (r.get("draft_ms") or 0.0)) / base
        out.append({"k": r["k"], "tau": tau, "cost": cost, "speedup": tau / cost})
    return out


def speedup_figure(sweeps: dict[str, list[dict]], survival: list[float], source: str) -> go.Figure:
    """Predicted speedup vs K per sweep from one drafter's measured survival curve; the best K is starred."""
    title = f"Predicted speedup vs K<br><sup>acceptance: {source}</sup>"
    if not sweeps or not survival:
        return empty_figure(title, "needs a sweep and stored runs of the chosen drafter")
    fig = _figure(title, "K (log scale)", "predicted speedup over ar", log_x=True)
    top = 1.0
    for label, rows in sweeps.items():
        pred = predict_speedup(rows, survival)
        if not pred:
            continue
        top = max([top] + [p["speedup"] for p in pred])
        fig.add_trace(go.Scatter(x=[p["k"] for p in pred], y=[p["speedup"] for p in pred], mode="lines+markers",
                                 name=label, customdata=[[p["tau"], p["cost"]] for p in pred],
                                 hovertemplate="K=%{x}<br>speedup %{y:.2f}×<br>tau %{customdata[0]:.2f}"
                                               "<br>cost %{customdata[1]:.2f}× ar step<extra></extra>"))
        best = max(pred, key=lambda p: p["speedup"])
        fig.add_trace(go.Scatter(x=[best["k"]], y=[best["speedup"]], mode="markers+text",
                                 marker=dict(symbol="star", size=16, color="#f59e0b"),
                                 text=[f"best K={best['k']}: {best['speedup']:.2f}×"], textposition="top center",
                                 name=f"best K · {label}", showlegend=False))
    fig.add_hline(y=1.0, line=dict(color="#9ca3af", dash="dot"))
    fig.update_yaxes(range=[0, top * 1.25])  # from zero, with room for the best-K label
    return fig


def series_label(row: dict) -> str:
    """Legend label of a (drafter, suite, K, temperature) group."""
    return f"{row['drafter']} · {row.get('suite') or 'no suite'} · K={row['k']} · T={row['temperature']:g}"


def position_figure(rows: list[dict], column: str, title: str) -> go.Figure:
    """A per-position curve (survival or conditional_acceptance) per drafter/suite/K group."""
    if not rows:
        return empty_figure(title, "no stored steps for this selection")
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[series_label(r)].append(r)
    fig = _figure(title, "draft position i within the block", column.replace("_", " "))
    for label, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["i"])
        fig.add_trace(go.Scatter(x=[r["i"] for r in rs], y=[r[column] for r in rs], mode="lines+markers", name=label,
                                 customdata=[r["n_steps"] for r in rs],
                                 hovertemplate="i=%{x}<br>%{y:.3f}<br>n=%{customdata}<extra></extra>"))
    fig.update_yaxes(range=[0, 1.05])
    return fig


def length_histogram(rows: list[dict]) -> go.Figure:
    """Fraction of steps by accepted-prefix length, one bar series per drafter/suite/K group."""
    title = "Acceptance length per step"
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
                             customdata=[r["n_steps"] for r in rs],
                             hovertemplate="accepted=%{x}<br>%{y:.3f} (%{customdata} steps)<extra></extra>"))
    fig.update_layout(barmode="group")
    return fig


def calibration_figure(rows: list[dict]) -> go.Figure:
    """Drafter confidence q (binned) against the observed acceptance of the reached drafted tokens."""
    title = "Drafter calibration: q vs observed acceptance"
    if not rows:
        return empty_figure(title, "no drafted tokens for this selection")
    fig = _figure(title, "draft confidence q (bin mean)", "observed acceptance")
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#9ca3af", dash="dot"),
                             name="perfectly calibrated"))
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["drafter"]].append(r)
    biggest = max(r["n"] for r in rows)
    for drafter, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["q_mean"])
        fig.add_trace(go.Scatter(x=[r["q_mean"] for r in rs], y=[r["acceptance"] for r in rs], mode="lines+markers",
                                 name=drafter, marker=dict(size=[8 + 16 * (r["n"] / biggest) ** 0.5 for r in rs]),
                                 customdata=[r["n"] for r in rs],
                                 hovertemplate="q≈%{x:.2f}<br>accepted %{y:.3f}<br>n=%{customdata}<extra></extra>"))
    fig.update_xaxes(range=[-0.02, 1.02])
    fig.update_yaxes(range=[-0.02, 1.05])
    return fig
