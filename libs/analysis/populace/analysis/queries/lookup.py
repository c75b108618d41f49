"""Finding runs in the recorder's file: which runs it holds (an unknown one is an AnalysisError
naming the known ones), the tables a run declared, and its last round."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from populace.analysis.stats import AnalysisError
from populace.analysis.tables import RunTables, has_table, q, run_tables


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return has_table(con, name)


def _db_name(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return str(row[0]) if row and row[0] else "the database"


def known_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run id recorded (runs table, plus any run with historic ratio-game round results),
    newest first."""
    if not _has_table(con, "runs"):
        return []
    parts = ["SELECT run_id, started_at FROM runs"]
    if _has_table(con, "rounds"):
        parts.append("SELECT DISTINCT run_id, NULL::TIMESTAMP FROM rounds")
    rows = con.execute(
        f"SELECT run_id, max(started_at) s FROM ({' UNION ALL '.join(parts)}) GROUP BY run_id "
        "ORDER BY s DESC NULLS LAST, run_id").fetchall()
    return [r[0] for r in rows]


def _check_runs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[str]:
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    run_ids = list(dict.fromkeys(run_ids))
    if not run_ids:
        raise AnalysisError("no run ids given")
    known = known_runs(con)
    known_set = set(known)
    for rid in run_ids:
        if rid not in known_set:
            shown = ", ".join(known[:10]) + (f", … ({len(known)} in all)" if len(known) > 10 else "")
            raise AnalysisError(f"run {rid!r} is not in {_db_name(con)}; known runs: {shown or '(none)'}")
    return run_ids


def tables_of(con: duckdb.DuckDBPyConnection, run_id: str) -> RunTables:
    """The run's declared tables and its simulation's hints (AnalysisError for an unknown run)."""
    _check_runs(con, [run_id])
    return run_tables(con, run_id)


def _last_round(con: duckdb.DuckDBPyConnection, rt: RunTables) -> int | None:
    row = con.execute(f"SELECT max(round) FROM {q(rt.spec.rounds)} WHERE run_id = ?", [rt.run_id]).fetchone()
    if row and row[0] is not None:
        return int(row[0])
    row = con.execute(f"SELECT max(round) FROM {q(rt.spec.outcomes)} WHERE run_id = ?", [rt.run_id]).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def last_round(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The run's last closed round (its summary table), else the last round with outcomes."""
    return _last_round(con, tables_of(con, run_id))
