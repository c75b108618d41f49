"""Finding runs in the store's file: which runs it holds (an unknown one is a QueryError naming
the known ones)."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from populace.store.tables import QueryError, has_table


def db_name(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return str(row[0]) if row and row[0] else "the database"


def known_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run id recorded (runs table, plus any run with historic ratio-game round results),
    newest first."""
    if not has_table(con, "runs"):
        return []
    parts = ["SELECT run_id, started_at FROM runs"]
    if has_table(con, "rounds"):
        parts.append("SELECT DISTINCT run_id, NULL::TIMESTAMP FROM rounds")
    rows = con.execute(
        f"SELECT run_id, max(started_at) s FROM ({' UNION ALL '.join(parts)}) GROUP BY run_id "
        "ORDER BY s DESC NULLS LAST, run_id").fetchall()
    return [r[0] for r in rows]


def check_runs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[str]:
    """`run_ids` without repeats, each one the store holds (else a QueryError naming the known)."""
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    run_ids = list(dict.fromkeys(run_ids))
    if not run_ids:
        raise QueryError("no run ids given")
    known = known_runs(con)
    known_set = set(known)
    for rid in run_ids:
        if rid not in known_set:
            shown = ", ".join(known[:10]) + (f", … ({len(known)} in all)" if len(known) > 10 else "")
            raise QueryError(f"run {rid!r} is not in {db_name(con)}; known runs: {shown or '(none)'}")
    return run_ids
