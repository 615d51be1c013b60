"""The draftscope history: one DuckDB file of runs, steps, K-flatness sweeps and annotations.

DuckDB lets only one process hold a file open, so every public method opens a short-lived
connection, does its work and closes it; opening retries with backoff while another process holds
the file (up to `lock_timeout` seconds). A run and all its steps are written in one transaction.
Storage receives plain dicts (GenerationResult.to_dict()) and knows nothing about the engine.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from .digest import sha256

DEFAULT_PATH = "draftscope.duckdb"
DEFAULT_LOCK_TIMEOUT = 10.0

SETTINGS_KEYS = ("target", "target_path", "dtype", "drafter", "drafter_checkpoint", "k", "temperature", "top_p",
                 "seed", "max_new_tokens", "backend", "device_kind", "versions", "batch", "mesh")
STATS_KEYS = ("wall_s", "prefill_ms", "decode_s", "draft_ms", "verify_ms", "tau", "acceptance_rate", "tok_per_s",
              "n_steps", "n_generated", "n_prompt", "drafted", "accepted", "compiles", "stop_reason")
META_KEYS = ("prompt", "suite", "prompt_id", "category", "split", "source", "lossless", "comparison_group", "status",
             "baseline_run_id")
# StepTrace field -> steps column; fields with a default may be missing from a step dict.
STEP_FIELDS = ("index", "position", "drafted", "accepted", "bonus", "p", "q", "top5_ids", "top5_p", "emitted",
               "draft_ms", "verify_ms", "drafted_text", "bonus_text", "top5_text", "state_rollback")
STEP_COLUMNS = ("run_id", "idx") + STEP_FIELDS[1:]
STEP_DEFAULTS: dict[str, Any] = {"drafted_text": [], "bonus_text": "", "top5_text": [], "state_rollback": 0}
KFLAT_KEYS = ("context", "k", "verify_ms", "draft_ms", "drafter")
STATUSES = ("done", "cancelled")
# doctor report row key -> doctor_checks column
DOCTOR_FIELDS = {"check": "check_name", "variant": "variant", "configured": "configured", "tau": "tau",
                 "engine_tau": "engine_tau", "per_position": "per_position", "per_prompt": "per_prompt", "diff": "diff",
                 "margin": "margin", "verdict": "verdict", "detail": "detail"}

_LOCK_MARK = "Could not set lock"
_CORRUPT_MARKS = ("not a valid DuckDB database", "corrupt", "checksum", "Corrupt")
_init_lock = threading.Lock()


class HistoryError(Exception):
    """A history problem worth showing to a person as one message (locked, corrupt, newer schema...)."""


def _parse_schema(text: str) -> tuple[list[str], str]:
    """Split schema.sql into its numbered migrations (in order) and its views section."""
    parts = re.split(r"^-- (migration \d+|views)\b.*$", text, flags=re.MULTILINE)
    migrations: list[str] = []
    views = ""
    for head, body in zip(parts[1::2], parts[2::2], strict=True):
        if head == "views":
            views = body
        else:
            number = int(head.split()[1])
            if number != len(migrations) + 1:
                raise RuntimeError(f"schema.sql: migration {number} is out of order")
            migrations.append(body)
    return migrations, views


SCHEMA_SQL = resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")
MIGRATIONS, VIEWS_SQL = _parse_schema(SCHEMA_SQL)
SCHEMA_VERSION = len(MIGRATIONS)
_VIEWS_SHA = sha256(VIEWS_SQL.strip(), short=True)


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _dicts(cursor: duckdb.DuckDBPyConnection) -> list[dict]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _first(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> tuple | None:
    """The first row of a query, fetched to the end (DuckDB 2 streams: an unfinished result blocks the connection)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None


@contextmanager
def _atomic(con: duckdb.DuckDBPyConnection, what: str) -> Iterator[None]:
    """A transaction on `con`: committed at the end, rolled back whole on any error (DuckDB's as HistoryError)."""
    con.begin()
    try:
        yield
        con.commit()
    except BaseException as e:
        _rollback(con)
        if isinstance(e, duckdb.Error):
            raise HistoryError(f"could not {what}: {e}") from e
        raise


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    with suppress(duckdb.Error):  # nothing left to roll back (e.g. the commit failed); closing discards the rest
        con.rollback()


def _json(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else json.dumps(value, default=str)


def _lock_holder(message: str) -> str:
    m = re.search(r"held in (.*?) \(PID (\d+)\)", message)
    return f"pid {m.group(2)}, {m.group(1)}" if m else "pid unknown"


def _open_connection(path: Path, lock_timeout: float) -> duckdb.DuckDBPyConnection:
    """Open `path`, retrying with backoff while another process holds it; HistoryError on failure."""
    deadline = time.monotonic() + lock_timeout
    delay = 0.005
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.Error as e:
            message = str(e)
            if _LOCK_MARK in message:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HistoryError(
                        f"history {path} is in use by another process ({_lock_holder(message)}) and stayed locked "
                        f"for {lock_timeout:g} s; close that program or wait for it to finish") from None
                time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
                delay = min(delay * 2, 0.05)
                continue
            if any(mark in message for mark in _CORRUPT_MARKS):
                raise HistoryError(f"{path} is not a draftscope history (not a valid DuckDB file, or corrupt); "
                                   "it was left untouched: move it away or choose another path") from None
            raise HistoryError(f"cannot open history {path}: {message}") from None


class History:
    """A draftscope history file. Construct with `open_history(path)`; each method is one short connection."""

    def __init__(self, path: str | os.PathLike = DEFAULT_PATH, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        self.path = Path(path).expanduser().absolute()
        self.lock_timeout = lock_timeout
        self._check_path()
        with _init_lock:
            if not self.path.exists():
                self._create()
            with self._connect() as con:
                _migrate(con, self.path)

    def __repr__(self) -> str:
        return f"History({str(self.path)!r})"

    # -- connections --------------------------------------------------------------------------------

    def _check_path(self) -> None:
        if self.path.is_dir():
            raise HistoryError(f"history path {self.path} is a directory, not a file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HistoryError(f"cannot create the directory for history {self.path}: {e.strerror or e}") from None
        target = self.path if self.path.exists() else self.path.parent
        if not os.access(target, os.W_OK):
            raise HistoryError(f"history {self.path} is not writable ({target} denies writing)")

    def _create(self) -> None:
        """Build a new file beside the target and link it into place, so no process sees a half-made file."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
        try:
            con = _open_connection(tmp, self.lock_timeout)
            try:
                _migrate(con, tmp)
                con.execute("CHECKPOINT")
            finally:
                con.close()
            try:
                os.link(tmp, self.path)  # atomic; fails if another process created the file first
            except FileExistsError:
                pass
            except OSError:  # no hard links on this filesystem
                if not self.path.exists():
                    os.replace(tmp, self.path)
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                leftover.unlink(missing_ok=True)

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        con = _open_connection(self.path, self.lock_timeout)
        try:
            yield con
        finally:
            con.close()

    @contextmanager
    def _transaction(self, what: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """One connection, one transaction: committed at the end, rolled back whole on any error."""
        with self._connect() as con, _atomic(con, what):
            yield con

    # -- runs -----------------------------------------------------------------------------------------

    def write_run(self, result: dict, **meta: Any) -> str:
        """Store a GenerationResult.to_dict() with all its steps in one transaction; return the run_id.

        meta: prompt, suite, prompt_id, category, split, source, lossless, comparison_group, status ('done' |
        'cancelled', default 'done'), baseline_run_id (the ar run its speedup is measured against), optionally run_id
        and created_at; other keys are kept in `extra`.
        """
        settings = dict(result.get("settings") or {})
        stats = dict(result.get("stats") or {})
        meta = dict(meta)
        run_id = meta.pop("run_id", None)
        created_at = meta.pop("created_at", None) or _utcnow()
        status = meta.setdefault("status", "done")
        if status not in STATUSES:
            raise HistoryError(f"run status must be one of {STATUSES}, not {status!r}")
        if meta.get("prompt_id") is not None:
            meta["prompt_id"] = str(meta["prompt_id"])
        row: dict[str, Any] = {k: settings.pop(k, None) for k in SETTINGS_KEYS}
        row |= {k: stats.pop(k, None) for k in STATS_KEYS}
        row |= {k: meta.pop(k, None) for k in META_KEYS}
        row["versions"] = _json(row["versions"])
        extra = {name: rest for name, rest in (("settings", settings), ("stats", stats), ("meta", meta)) if rest}
        row |= {"created_at": created_at, "text": result.get("text"), "token_ids": result.get("token_ids"),
                "prompt_ids": result.get("prompt_ids"), "extra": _json(extra) if extra else None}
        steps = result.get("steps") or []

        with self._transaction("write the run") as con:
            run_id = run_id or _first(con, "SELECT uuidv7()::VARCHAR")[0]
            row["run_id"] = run_id
            columns, marks = ", ".join(row), ", ".join("?" * len(row))
            con.execute(f"INSERT INTO runs ({columns}) VALUES ({marks})", list(row.values())).fetchall()
            if steps:
                rows = [_step_row(run_id, i, s) for i, s in enumerate(steps)]
                with con.appender("steps", columns=list(STEP_COLUMNS)) as appender:
                    appender.append_rows(rows)
        return run_id

    def get_run(self, run_id: str) -> dict:
        """A stored run in the shape it was written (text, token_ids, prompt_ids, steps, stats, settings) + meta."""
        with self._connect() as con:
            rows = _dicts(con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]))
            if not rows:
                raise HistoryError(f"no run {run_id!r} in {self.path}")
            steps = _dicts(con.execute("SELECT * EXCLUDE (run_id) FROM steps WHERE run_id = ? ORDER BY idx", [run_id]))
        row = rows[0]
        extra = json.loads(row["extra"]) if row["extra"] else {}
        settings = {k: row[k] for k in SETTINGS_KEYS} | extra.get("settings", {})
        settings["versions"] = json.loads(settings["versions"]) if settings["versions"] else {}
        stats = {k: row[k] for k in STATS_KEYS} | extra.get("stats", {})
        for step in steps:
            step["index"] = step.pop("idx")
        return {"run_id": row["run_id"], "created_at": row["created_at"], "text": row["text"],
                "token_ids": row["token_ids"], "prompt_ids": row["prompt_ids"],
                "steps": [{f: s[f] for f in STEP_FIELDS} for s in steps], "stats": stats, "settings": settings,
                **{k: row[k] for k in META_KEYS}, **extra.get("meta", {})}

    def list_runs(self, drafter: str | None = None, suite: str | None = None, target: str | None = None,
                  text_like: str | None = None, limit: int = 200) -> list[dict]:
        """run_summary rows, newest first; text_like matches prompt or output text, case-insensitively."""
        where, params = _filters(("rs.drafter", drafter), ("rs.suite", suite), ("rs.target", target))
        if text_like:
            where.append("(contains(lower(r.prompt), lower(?)) OR contains(lower(r.text), lower(?)))")
            params += [text_like, text_like]
        sql = (f"SELECT rs.* FROM run_summary rs JOIN runs r USING (run_id) {_where(where)} "
               "ORDER BY rs.created_at DESC, rs.run_id DESC LIMIT ?")
        return self.query(sql, params + [int(limit)])

    # -- K-flatness ---------------------------------------------------------------------------------

    def write_kflat(self, rows: list[dict], hardware: str, backend: str | None, model: str | None,
                    dtype: str | None, drafter: str | None = None, sweep_id: str | None = None) -> str:
        """Store one sweep of {context, k, verify_ms, draft_ms?, drafter?, ...} rows; return its sweep_id.

        sweep_id: add the rows to that stored sweep (a sweep written K by K as each completes)."""
        with self._transaction("write the K-flatness sweep") as con:
            created_at = (_first(con, "SELECT min(created_at) FROM kflat WHERE sweep_id = ?", [sweep_id])[0]
                          if sweep_id else None) or _utcnow()
            sweep_id = sweep_id or _first(con, "SELECT uuidv7()::VARCHAR")[0]
            table = []
            for r in rows:
                extra = {k: v for k, v in r.items() if k not in KFLAT_KEYS}
                table.append((sweep_id, created_at, hardware, backend, model, dtype, r["context"], r["k"],
                              r.get("verify_ms"), r.get("draft_ms"), r.get("drafter", drafter),
                              _json(extra) if extra else None))
            with con.appender("kflat") as appender:
                appender.append_rows(table)
        return sweep_id

    def list_kflat(self, hardware: str | None = None, model: str | None = None) -> list[dict]:
        """K-flatness rows (extra parsed to a dict), ordered by sweep time, context, k."""
        where, params = _filters(("hardware", hardware), ("model", model))
        rows = self.query(f"SELECT * FROM kflat {_where(where)} ORDER BY created_at, sweep_id, context, k", params)
        for r in rows:
            r["extra"] = json.loads(r["extra"]) if r["extra"] else {}
        return rows

    # -- annotations and labels ---------------------------------------------------------------------

    def save_annotation(self, run_id: str, step_idx: int, draft_pos: int, label: str, note: str = "") -> int:
        """Annotate drafted token `draft_pos` (0-based) of step `step_idx`, replacing the label and note of the
        token's annotation when it has one (one per token); return the annotation_id."""
        with self._transaction("save the annotation") as con:
            found = _first(con, "SELECT len(drafted) FROM steps WHERE run_id = ? AND idx = ?", [run_id, step_idx])
            if found is None:
                raise HistoryError(f"no step {step_idx} in run {run_id!r}")
            if not 0 <= draft_pos < found[0]:
                raise HistoryError(f"draft_pos {draft_pos} is outside the {found[0]} drafted tokens of step {step_idx}")
            _check_label(con, label)
            now = _utcnow()
            return _first(
                con, "INSERT INTO annotations (run_id, step_idx, draft_pos, label, note, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, step_idx, draft_pos) DO UPDATE SET label = "
                "excluded.label, note = excluded.note, updated_at = excluded.updated_at RETURNING annotation_id",
                [run_id, step_idx, draft_pos, label, note or "", now, now])[0]

    def update_annotation(self, annotation_id: int, label: str | None = None, note: str | None = None) -> None:
        """Change an annotation's label and/or note."""
        with self._transaction("update the annotation") as con:
            if label is not None:
                _check_label(con, label)
            found = con.execute(
                "UPDATE annotations SET label = coalesce(?, label), note = coalesce(?, note), updated_at = ? "
                "WHERE annotation_id = ? RETURNING annotation_id", [label, note, _utcnow(), annotation_id]).fetchall()
            if not found:
                raise HistoryError(f"no annotation {annotation_id}")

    def delete_annotation(self, annotation_id: int) -> None:
        """Delete an annotation."""
        with self._transaction("delete the annotation") as con:
            found = con.execute("DELETE FROM annotations WHERE annotation_id = ? RETURNING annotation_id",
                                [annotation_id]).fetchall()
            if not found:
                raise HistoryError(f"no annotation {annotation_id}")

    def list_annotations(self, label: str | None = None, drafter: str | None = None,
                         run_id: str | None = None) -> list[dict]:
        """Annotations with their run's drafter/target/suite and the annotated token, oldest first."""
        where, params = _filters(("a.label", label), ("r.drafter", drafter), ("a.run_id", run_id))
        return self.query(f"{ANNOTATION_SELECT} {_where(where)} ORDER BY a.created_at, a.annotation_id", params)

    def list_labels(self) -> list[str]:
        """The label list, in the order labels were added."""
        return [r["name"] for r in self.query("SELECT name FROM labels ORDER BY created_at, name")]

    def add_label(self, name: str) -> None:
        """Add a label to the list (no-op when it exists)."""
        name = (name or "").strip()
        if not name:
            raise HistoryError("a label needs a name")
        with self._transaction("add the label") as con:
            con.execute("INSERT INTO labels VALUES (?, ?) ON CONFLICT DO NOTHING", [name, _utcnow()])

    # -- drafter doctor reports -----------------------------------------------------------------------

    def write_doctor_report(self, report: dict) -> str:
        """Store a drafter doctor report {identity, settings, rows, wall_s} (experiments.doctor) in one
        transaction; return its report_id."""
        identity, rows = report["identity"], report["rows"]
        faults = [r["check"] for r in rows if r["configured"] and r["verdict"] == "fault"]
        with self._transaction("write the doctor report") as con:
            report_id = report.get("report_id") or _first(con, "SELECT uuidv7()::VARCHAR")[0]
            con.execute("INSERT INTO doctor_reports VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [report_id, report.get("created_at") or _utcnow(), identity.get("target"),
                         identity.get("target_path"), identity.get("drafter"), identity.get("drafter_path"), faults,
                         report.get("wall_s"), _json(identity), _json(report["settings"])])
            table = [(report_id, i, *(r[k] for k in DOCTOR_FIELDS)) for i, r in enumerate(rows)]
            if table:
                con.executemany(f"INSERT INTO doctor_checks (report_id, idx, {', '.join(DOCTOR_FIELDS.values())}) "
                                f"VALUES ({', '.join('?' * (len(DOCTOR_FIELDS) + 2))})", table)
        return report_id

    def get_doctor_report(self, report_id: str) -> dict:
        """A stored doctor report in the shape it was written, plus report_id and created_at."""
        with self._connect() as con:
            head = _dicts(con.execute("SELECT * FROM doctor_reports WHERE report_id = ?", [report_id]))
            if not head:
                raise HistoryError(f"no doctor report {report_id!r} in {self.path}")
            checks = _dicts(con.execute("SELECT * FROM doctor_checks WHERE report_id = ? ORDER BY idx", [report_id]))
        h = head[0]
        return {"report_id": h["report_id"], "created_at": h["created_at"], "identity": json.loads(h["identity"]),
                "settings": json.loads(h["settings"]), "wall_s": h["wall_s"],
                "rows": [{key: c[column] for key, column in DOCTOR_FIELDS.items()} for c in checks]}

    def list_doctor_reports(self, drafter: str | None = None, limit: int = 200) -> list[dict]:
        """Stored doctor reports (report_id, created_at, target, drafter, drafter_path, faults, wall_s), newest
        first."""
        where, params = _filters(("drafter", drafter))
        return self.query("SELECT report_id, created_at, target, drafter, drafter_path, faults, wall_s FROM "
                          f"doctor_reports {_where(where)} ORDER BY created_at DESC, report_id DESC LIMIT ?",
                          params + [int(limit)])

    # -- SQL ------------------------------------------------------------------------------------------

    def query(self, sql: str, params: list | dict | None = None) -> list[dict]:
        """Run a read query (views, plots) and return rows as dicts; any change it makes is rolled back."""
        with self._connect() as con:
            con.begin()
            try:
                return _dicts(con.execute(sql, params) if params is not None else con.execute(sql))
            except duckdb.Error as e:
                raise HistoryError(f"query failed: {e}") from e
            finally:
                _rollback(con)


ANNOTATION_SELECT = """
SELECT a.annotation_id, a.run_id, a.step_idx, a.draft_pos, a.label, a.note, a.created_at, a.updated_at,
       r.drafter, r.target, r.suite, r.prompt_id, r.k, r.temperature,
       s.position + 1 + a.draft_pos AS position, s.accepted,
       s.drafted[a.draft_pos + 1] AS drafted_token, s.drafted_text[a.draft_pos + 1] AS drafted_text
FROM annotations a
LEFT JOIN runs r USING (run_id)
LEFT JOIN steps s ON s.run_id = a.run_id AND s.idx = a.step_idx
"""


def drafter_label(drafter: str, checkpoint: str | None) -> str:
    """A stored run's drafter as tables and legends name it: its kind, and where it has a checkpoint the last two
    parts of its path (`dflash (checkpoints/smollm2-135m-dflash)`), so that two checkpoints of one kind stay apart
    even where training gave both the same folder name."""
    return f"{drafter} ({'/'.join(Path(checkpoint).parts[-2:])})" if checkpoint else drafter


def open_history(path: str | os.PathLike | None = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> History:
    """Open (creating or migrating) the history at `path` (default ./draftscope.duckdb)."""
    return History(DEFAULT_PATH if path is None else path, lock_timeout=lock_timeout)


def _step_row(run_id: str, position: int, step: dict) -> tuple:
    missing = [f for f in STEP_FIELDS if f not in step and f not in STEP_DEFAULTS]
    if missing:
        raise HistoryError(f"step {position} lacks {', '.join(missing)}")
    return (run_id,) + tuple(step.get(f, STEP_DEFAULTS.get(f)) for f in STEP_FIELDS)


def _filters(*pairs: tuple[str, Any]) -> tuple[list[str], list]:
    where = [f"{column} = ?" for column, value in pairs if value is not None]
    return where, [value for _, value in pairs if value is not None]


def _where(conditions: list[str]) -> str:
    return f"WHERE {' AND '.join(conditions)}" if conditions else ""


def _check_label(con: duckdb.DuckDBPyConnection, label: str) -> None:
    if _first(con, "SELECT 1 FROM labels WHERE name = ?", [label]) is None:
        raise HistoryError(f"unknown label {label!r}; add it with add_label first")


def _migrate(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Bring the file to SCHEMA_VERSION (one transaction) and refresh the views when their text changed."""
    try:
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()").fetchall()}
        if "meta" in tables:
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
            version = int(meta.get("schema_version", 0))
        elif tables:
            raise HistoryError(f"{path} is a DuckDB database but not a draftscope history (no meta table); "
                               "it was left untouched")
        else:
            meta, version = {}, 0
    except duckdb.Error as e:
        raise HistoryError(f"{path} could not be read as a draftscope history (corrupt?): {e}") from None
    if version > SCHEMA_VERSION:
        raise HistoryError(f"{path} was written by a newer draftscope (schema v{version}, this version knows "
                           f"v{SCHEMA_VERSION}); upgrade draftscope to open it")
    if version == SCHEMA_VERSION and meta.get("views_sha") == _VIEWS_SHA:
        return
    with _atomic(con, f"migrate {path} from schema v{version} to v{SCHEMA_VERSION}"):
        for sql in MIGRATIONS[version:]:
            con.execute(sql)
        con.execute(VIEWS_SQL)
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?), ('views_sha', ?)",
                    [str(SCHEMA_VERSION), _VIEWS_SHA])
