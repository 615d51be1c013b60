"""A Markdown report of the history: drafter comparison per suite, K-Flat over all stored hardware, per-position
acceptance, and the Plotly figures as self-contained HTML (plotly.js written once beside them) and PNG.

    python -m experiments.report [--db PATH] [--out DIR]

Writes DIR/report.md, DIR/{comparison,kflat,position}.html (+ plotly.min.js) and, when kaleido can drive a
local Chromium, the same figures as PNG; otherwise the report says why PNG was skipped.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from storage import DEFAULT_PATH, History, HistoryError, open_history

MAX_POSITIONS = 16

# speedup: sum of ar decode seconds / sum of decode seconds over the prompts of the same bench round (in a batch,
# each sequence's decode time runs until it finished)
COMPARISON_SQL = """
WITH b AS (SELECT * FROM runs WHERE status = 'done' AND source = 'bench'),
ar AS (SELECT comparison_group, prompt_id, decode_s AS ar_s FROM b WHERE drafter = 'ar'),
sp AS (SELECT target, dtype, suite, drafter, k, temperature, batch, sum(ar_s) / sum(decode_s) AS speedup,
              count(*) FILTER (WHERE lossless) AS n_lossless, count(lossless) AS n_checked
       FROM b JOIN ar USING (comparison_group, prompt_id)
       GROUP BY target, dtype, suite, drafter, k, temperature, batch)
SELECT d.*, sp.speedup, sp.n_lossless, sp.n_checked
FROM drafter_comparison d LEFT JOIN sp USING (target, dtype, suite, drafter, k, temperature, batch)
WHERE d.suite IS NOT NULL
ORDER BY d.suite, d.target, d.temperature, d.batch, d.drafter <> 'ar', d.drafter, d.k
"""
POSITION_SQL = f"""
SELECT * FROM position_acceptance WHERE suite IS NOT NULL AND i <= {MAX_POSITIONS}
ORDER BY suite, target, temperature, drafter, k, i
"""


def _f(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def md_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _groups(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def comparison_section(rows: list[dict]) -> str:
    """One table per (suite, target, temperature)."""
    if not rows:
        return "No finished bench runs yet: run `python -m experiments.bench`."
    parts = []
    for (suite, target, temp), group in _groups(rows, "suite", "target", "temperature").items():
        body = [[r["drafter"], r["k"], r["batch"], r["n_runs"], _f(r["tau"]), _f(r["tau_std"]),
                 _f(r["acceptance_rate"], ".3f"), _f(r["tok_per_s"], ".1f"),
                 _f(r["speedup"]) + ("x" if r["speedup"] else ""),
                 f"{r['n_lossless']}/{r['n_checked']}" if r["n_checked"] else "-"] for r in group]
        parts.append(f"### {suite} ({target}, temperature {temp:g})\n\n"
                     + md_table(["drafter", "K", "batch", "runs", "tau", "tau std", "acceptance", "tok/s",
                                 "speedup vs ar", "lossless"], body))
    return "\n\n".join(parts)


def kflat_series(rows: list[dict]) -> dict[str, list[dict]]:
    """The latest sweep per (hardware, model, dtype, context, drafter), as series name -> rows by K."""
    latest: dict[tuple, dict] = {}
    for r in rows:  # ordered by created_at
        key = (r["hardware"], r["model"], r["dtype"], r["context"], r["drafter"])
        if latest.get(key, {}).get("sweep_id") != r["sweep_id"]:
            latest[key] = {"sweep_id": r["sweep_id"], "rows": []}
        latest[key]["rows"].append(r)
    series = {}
    for (hardware, model, dtype, context, drafter), v in latest.items():
        name = " · ".join(str(x) for x in (hardware, model, dtype, f"ctx {context}", drafter) if x)
        series[name] = sorted(v["rows"], key=lambda r: r["k"])
    return series


def kflat_section(series: dict[str, list[dict]]) -> str:
    """Rows K, one column per series: verify ms (ratio to the series' smallest K)."""
    if not series:
        return "No K-Flat sweeps yet: run `python -m experiments.kflat`."
    ks = sorted({r["k"] for rows in series.values() for r in rows})
    body = []
    for k in ks:
        cells = []
        for rows in series.values():
            by_k = {r["k"]: r for r in rows}
            r = by_k.get(k)
            cells.append("" if r is None else f"{r['verify_ms']:.2f} ({r['verify_ms'] / rows[0]['verify_ms']:.2f}x)")
        body.append([k, *cells])
    note = ("Verify ms per step (as engine.kflat measures it), in brackets the ratio to the smallest K of the same "
            "sweep; a flat column means drafting more tokens per step is free on that hardware.")
    return note + "\n\n" + md_table(["K", *series], body)


def position_section(rows: list[dict]) -> str:
    """Per (suite, drafter, K): survival (and conditional acceptance) at each draft position."""
    if not rows:
        return "No drafted steps yet."
    groups = _groups(rows, "suite", "target", "temperature", "drafter", "k")
    width = max(r["i"] for r in rows)
    body = []
    for (suite, _target, temp, drafter, k), group in groups.items():
        by_i = {r["i"]: r for r in group}
        cells = [f"{by_i[i]['survival']:.2f} / {_f(by_i[i]['conditional_acceptance'])}" if i in by_i else ""
                 for i in range(1, width + 1)]
        body.append([suite, f"{temp:g}", drafter, k, *cells])
    note = ("Cell = survival / conditional acceptance at draft position i: survival = P(accepted prefix reaches i), "
            "conditional = P(accept i | accepted i-1).")
    return note + "\n\n" + md_table(["suite", "T", "drafter", "K", *[str(i) for i in range(1, width + 1)]], body)


def figures(comparison: list[dict], series: dict[str, list[dict]], positions: list[dict]) -> dict:
    """Plotly figures by name (only those with data)."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    palette = qualitative.Plotly
    legend = dict(orientation="h", yanchor="top", y=-0.2)
    figs = {}
    if comparison:
        fig = make_subplots(rows=1, cols=2, subplot_titles=("speedup vs ar (decode time)", "tau"))
        for n, (key, group) in enumerate(_groups(comparison, "drafter", "k", "batch").items()):
            name = f"{key[0]} K={key[1]}" + (f" batch {key[2]}" if key[2] != 1 else "")
            style = dict(name=name, legendgroup=str(key), marker_color=palette[n % len(palette)])
            fig.add_bar(x=[r["suite"] for r in group], y=[r["speedup"] for r in group], row=1, col=1, **style)
            fig.add_bar(x=[r["suite"] for r in group], y=[r["tau"] for r in group], showlegend=False, row=1, col=2,
                        **style)
        figs["comparison"] = fig.update_layout(title="Drafter comparison", barmode="group", legend=legend)
    if series:
        fig = make_subplots(rows=1, cols=2, subplot_titles=("verify ms", "verify ms / smallest K"))
        for n, (name, rows) in enumerate(series.items()):
            ks, ms = [r["k"] for r in rows], [r["verify_ms"] for r in rows]
            style = dict(name=name, legendgroup=name, mode="lines+markers", line_color=palette[n % len(palette)])
            fig.add_scatter(x=ks, y=ms, row=1, col=1, **style)
            fig.add_scatter(x=ks, y=[m / ms[0] for m in ms], showlegend=False, row=1, col=2, **style)
        figs["kflat"] = (fig.update_xaxes(type="log", dtick=0.30103, title="K")
                         .update_layout(title="K-Flat", legend=legend))
    if positions:
        fig = go.Figure()
        for (suite, _t, temp, drafter, k), group in _groups(positions, "suite", "target", "temperature", "drafter",
                                                            "k").items():
            fig.add_scatter(x=[r["i"] for r in group], y=[r["survival"] for r in group], mode="lines+markers",
                            name=f"{suite} {drafter} K={k} T={temp:g}")
        figs["position"] = fig.update_layout(title="Survival by draft position", xaxis_title="draft position i",
                                             yaxis_title="P(accepted prefix reaches i)", yaxis_range=[0, 1],
                                             legend=legend)
    return figs


def write_pngs(figs: dict, out: Path) -> tuple[list[Path], str | None]:
    """PNG files via kaleido, or ([], why they were skipped)."""
    if not figs:
        return [], None
    try:
        import kaleido  # noqa: F401
        import plotly.io as pio
    except ImportError:
        return [], "kaleido is not installed (pip install kaleido==1.5.0; it drives a local Chromium)"
    paths = [out / f"{name}.png" for name in figs]
    try:
        pio.write_images(list(figs.values()), paths, width=1100, height=520)
    except Exception as e:  # noqa: BLE001 - kaleido/choreographer raise many kinds (no browser, timeouts)
        return [], f"kaleido could not render ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return paths, None


def build_report(history: History, out: str | Path) -> dict[str, Path | list[Path] | str | None]:
    """Write report.md and the figures into `out`; return {"report", "html", "png", "png_skipped"}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    comparison = history.query(COMPARISON_SQL)
    series = kflat_series(history.list_kflat())
    positions = history.query(POSITION_SQL)
    figs = figures(comparison, series, positions)
    html = []
    for name, fig in figs.items():
        html.append(out / f"{name}.html")
        fig.write_html(html[-1], include_plotlyjs="directory")
    pngs, skipped = write_pngs(figs, out)
    n_runs = history.query("SELECT count(*) AS n FROM runs WHERE source = 'bench'")[0]["n"]
    links = [f"- {p.stem}: [{p.name}]({p.name})" + (f" · ![{p.stem}]({p.stem}.png)" if pngs else "") for p in html]
    text = "\n\n".join([
        "# draftscope report",
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC from `{history.path}` ({n_runs} bench runs).",
        "## Drafter comparison",
        "tau = mean tokens per verify step (mean over runs), acceptance = pooled accepted / drafted, tok/s = mean "
        "over runs (decode only), speedup = sum of ar decode s / sum of drafter decode s over the prompts both ran in "
        "the same bench round, lossless = runs whose tokens equal ar's (greedy only).",
        comparison_section(comparison),
        "## K-Flat", kflat_section(series),
        "## Per-position acceptance", position_section(positions),
        "## Figures", "\n".join(links) if links else "No data to plot yet.",
        *([f"PNG skipped: {skipped}."] if skipped else []),
    ]) + "\n"
    report = out / "report.md"
    report.write_text(text, encoding="utf-8")
    return {"report": report, "html": html, "png": pngs, "png_skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=DEFAULT_PATH)
    ap.add_argument("--out", default="report")
    a = ap.parse_args(argv)
    try:
        paths = build_report(open_history(a.db), a.out)
    except (HistoryError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in [paths["report"], *paths["html"], *paths["png"]]:
        print(p)
    if paths["png_skipped"]:
        print(f"PNG skipped: {paths['png_skipped']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
