"""Reads from the history for the views: acceptance curves, calibration bins, survival, sweeps, run choices."""

from __future__ import annotations

from collections import Counter, defaultdict

from engine.decode import cache_len_for
from storage import History

from .render import drafter_k

NO_SUITE = "(no suite)"
ALL = "(all)"


def where_clause(target: str | None, drafters: list[str] | None, suite: str | None,
                 prefix: str = "") -> tuple[str, list]:
    """A WHERE clause and its parameters selecting a target, drafters and a suite (ALL, NO_SUITE or a name)."""
    conditions, params = [], []
    if target:
        conditions.append(f"{prefix}target = ?")
        params.append(target)
    if drafters:
        conditions.append(f"{prefix}drafter IN ({', '.join('?' * len(drafters))})")
        params += list(drafters)
    if suite == NO_SUITE:
        conditions.append(f"{prefix}suite IS NULL")
    elif suite and suite != ALL:
        conditions.append(f"{prefix}suite = ?")
        params.append(suite)
    return ("WHERE " + " AND ".join(conditions)) if conditions else "", params


def position_rows(h: History, target: str | None, drafters: list[str] | None, suite: str | None) -> list[dict]:
    """position_acceptance rows for the selection."""
    where, params = where_clause(target, drafters, suite)
    return h.query(f"SELECT * FROM position_acceptance {where} ORDER BY drafter, drafter_checkpoint, suite, k, "
                   "temperature, i", params)


def length_rows(h: History, target: str | None, drafters: list[str] | None, suite: str | None) -> list[dict]:
    """acceptance_lengths rows for the selection."""
    where, params = where_clause(target, drafters, suite)
    return h.query(f"SELECT * FROM acceptance_lengths {where} ORDER BY drafter, drafter_checkpoint, suite, k, "
                   "accepted", params)


def calibration_rows(h: History, target: str | None, drafters: list[str] | None, suite: str | None,
                     bins: int = 10) -> list[dict]:
    """Drafted tokens the verifier reached in finished runs (a repeat counted once), binned by q per drafter
    checkpoint: {drafter, drafter_checkpoint, bin, q_mean, acceptance, n}."""
    where, params = where_clause(target, drafters, suite, prefix="r.")
    where = f"{where} AND NOT r.is_repeat" if where else "WHERE NOT r.is_repeat"
    return h.query(f"""
        WITH tokens AS (
            SELECT r.drafter, r.drafter_checkpoint, s.accepted, unnest(range(len(s.q))) AS j, s.q
            FROM steps s JOIN finished_runs r USING (run_id) {where})
        SELECT drafter, drafter_checkpoint, least(floor(q[j + 1] * {bins}), {bins - 1})::INTEGER AS bin,
               avg(q[j + 1]) AS q_mean, avg(CASE WHEN j < accepted THEN 1.0 ELSE 0.0 END) AS acceptance, count(*) AS n
        FROM tokens WHERE j <= accepted GROUP BY drafter, drafter_checkpoint, bin
        ORDER BY drafter, drafter_checkpoint, bin""", params)


def survival(h: History, target: str, drafter: str, checkpoint: str | None = None) -> tuple[list[float], int]:
    """Survival per draft position of one drafter checkpoint (None: a drafter without one), pooled over every
    stored K, suite and temperature; (curve, steps)."""
    rows = h.query("SELECT i, sum(n_accepted) / sum(n_steps) AS s, sum(n_steps) AS n FROM position_acceptance "
                   "WHERE target = ? AND drafter = ? AND drafter_checkpoint IS NOT DISTINCT FROM ? GROUP BY i "
                   "ORDER BY i", [target, drafter, checkpoint])
    curve = []
    for expected, r in enumerate(rows, 1):
        if r["i"] != expected:
            break
        curve.append(float(r["s"]))
    return curve, int(rows[0]["n"]) if rows else 0


def sweeps(h: History) -> dict[str, dict]:
    """Stored K-Flat sweeps, newest first: sweep_id -> {rows, label (everything, for choosing), short (hardware,
    context and time, for legends)}."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in h.list_kflat():
        groups[r["sweep_id"]].append(r)
    out = {}
    for sweep_id, rows in sorted(groups.items(), key=lambda kv: kv[1][0]["created_at"], reverse=True):
        r = rows[0]
        ks = [x["k"] for x in rows]
        drafter = f"draft {r['drafter']}" if r["drafter"] else "verify only"
        when, tag = f"{r['created_at']:%m-%d %H:%M:%S}", sweep_id[-4:]  # uuidv7: random tail, unique per sweep
        out[sweep_id] = {"rows": rows,
                         "short": f"{r['hardware']} · {drafter} · K {min(ks)}-{max(ks)} · ctx {r['context']} · {when}"
                                  f" · {tag}",
                         "label": f"{r['hardware']} · {r['model']} {r['dtype']} · {drafter} · K {min(ks)}-{max(ks)} · "
                                  f"ctx {r['context']} · {r['created_at']:%Y-%m-%d} {when[6:]} · {tag}"}
    return out


def distinct(h: History, column: str, target: str | None = None) -> list[str]:
    """Distinct non-null values of a runs column (drafter, suite, target)."""
    where, params = ("WHERE target = ?", [target]) if target else ("", [])
    rows = h.query(f"SELECT DISTINCT {column} AS v FROM runs {where} ORDER BY v", params)
    return [r["v"] for r in rows if r["v"] is not None]


def run_choices(h: History, only_rejections: bool = False, limit: int = 200) -> list[tuple[str, str]]:
    """(label, run_id) pairs, newest first; only runs with a rejected draft when asked."""
    having = "WHERE drafted > accepted" if only_rejections else ""
    rows = h.query(f"SELECT run_id, created_at, drafter, k, status, prompt_preview FROM run_summary {having} "
                   "ORDER BY created_at DESC, run_id DESC LIMIT ?", [limit])
    return [(f"{r['created_at']:%m-%d %H:%M:%S} · {drafter_k(r['drafter'], r['k'])} · {r['status']} · "
             f"{(r['prompt_preview'] or '')[:40]} · …{r['run_id'][-8:]}", r["run_id"]) for r in rows]



AR_MATCH_KEYS = ("target", "dtype", "device_kind", "mesh", "batch", "temperature", "top_p", "seed", "max_new_tokens")


def matching_ar_run(h: History, prompt: str, settings: dict) -> dict | None:
    """The newest finished `ar` run on this prompt with the same settings (AR_MATCH_KEYS of a run's settings) and
    timed warm (no XLA compile inside it): {run_id, tok_per_s, token_ids, comparison_group}, or None."""
    rows = matching_ar_runs(h, prompt, settings, limit=1)
    return rows[0] if rows else None


def ar_run(h: History, run_id: str) -> dict | None:
    """One finished `ar` run by id: {run_id, tok_per_s, token_ids, comparison_group}, or None."""
    rows = h.query("SELECT run_id, tok_per_s, token_ids, comparison_group FROM runs WHERE run_id = ? "
                   "AND drafter = 'ar' AND status = 'done' AND tok_per_s > 0", [run_id])
    return rows[0] if rows else None


def matching_ar_runs(h: History, prompt: str, settings: dict, limit: int = 50) -> list[dict]:
    """Every such `ar` run (see matching_ar_run), newest first: the spread of the baseline on this machine."""
    same = " AND ".join(f"{key} = ?" for key in AR_MATCH_KEYS)
    raw = "coalesce(json_extract(extra, '$.settings.raw')::BOOLEAN, false) = ?"  # chat template or not
    template = "coalesce(json_extract_string(extra, '$.settings.template'), '') = ?"  # and its switches
    rows = h.query(f"SELECT run_id, tok_per_s, token_ids, comparison_group FROM runs WHERE drafter = 'ar' "
                   f"AND status = 'done' AND compiles = 0 AND tok_per_s > 0 AND prompt = ? AND {same} AND {raw} "
                   f"AND {template} ORDER BY created_at DESC LIMIT ?",
                   [prompt, *(settings[key] for key in AR_MATCH_KEYS), bool(settings.get("raw")),
                    settings.get("template") or "", int(limit)])
    return rows


def run_shape(h: History, target: str, drafter: str, checkpoint: str | None = None, limit: int = 50) -> dict | None:
    """How the newest finished batch-1 runs of a drafter checkpoint on a target ran: {context: the median block
    position, cache_rows: the cache size most of them used, n_runs}, or None without runs. What K-Flat times by
    default."""
    rows = h.query("SELECT r.n_prompt, r.max_new_tokens, r.k, median(s.position) AS position FROM runs r "
                   "JOIN steps s USING (run_id) WHERE r.target = ? AND r.drafter = ? "
                   "AND r.drafter_checkpoint IS NOT DISTINCT FROM ? AND r.status = 'done' AND r.batch = 1 "
                   "GROUP BY r.run_id, r.n_prompt, r.max_new_tokens, r.k, r.created_at "
                   "ORDER BY r.created_at DESC LIMIT ?", [target, drafter, checkpoint, int(limit)])
    if not rows:
        return None
    sizes = Counter(cache_len_for(r["n_prompt"], r["max_new_tokens"], max(r["k"] or 0, 1) + 1) for r in rows)
    positions = sorted(r["position"] for r in rows)
    return {"context": int(positions[len(positions) // 2]), "cache_rows": sizes.most_common(1)[0][0],
            "n_runs": len(rows)}


def measured_speedups(h: History, target: str, drafter: str, device_kind: str, template: str = "",
                      checkpoint: str | None = None) -> list[dict]:
    """Greedy batch-1 speedups of one drafter checkpoint measured on this device kind with these chat-template
    switches, per K ({k, speedup, tau, n_pairs}; the row with the most pairs where several ran at one K): what a
    K-Flat prediction is checked against."""
    rows = h.query("SELECT k, speedup, tau, n_pairs FROM measured_speedup WHERE target = ? AND drafter = ? "
                   "AND drafter_checkpoint IS NOT DISTINCT FROM ? AND device_kind = ? AND batch = 1 "
                   "AND temperature = 0 AND speedup IS NOT NULL AND template = ? ORDER BY k, n_pairs DESC",
                   [target, drafter, checkpoint, device_kind, template])
    best: dict[int, dict] = {}
    for r in rows:
        best.setdefault(r["k"], r)
    return list(best.values())
