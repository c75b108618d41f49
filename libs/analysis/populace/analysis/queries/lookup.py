"""Finding runs in the recorder's file: which runs it holds (an unknown one is an AnalysisError
naming the known ones: populace.store.lookup), the tables a run declared, and its last round."""

from __future__ import annotations

import duckdb

from populace.analysis.tables import RunTables, has_table, q, run_tables
from populace.store.lookup import check_runs as _check_runs
from populace.store.lookup import db_name as _db_name  # noqa: F401 (kept importable)
from populace.store.lookup import known_runs  # noqa: F401 (the queries package exports it from here)


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return has_table(con, name)


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
