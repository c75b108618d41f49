"""A consistent copy of some runs' rows, taken from the recorder's DuckDB while it goes on
writing. DuckDB lets one process hold a database file, so a reader (`populace results`,
`report`, the manager) cannot open the file of a live run; it asks the recorder, which copies
the rows it needs into a file of their own.

The copy runs on its own cursor (a connection to the same database) in one transaction: every
table is read at the same instant (DuckDB's MVCC) and the recorder's ingestion carries on."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import duckdb

# Tables a reader never needs: the ingestion ledger (one row per message ever recorded).
PRIVATE = frozenset({"_ingested"})


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def write_snapshot(con: duckdb.DuckDBPyConnection, path: str | Path, run_ids: list[str]) -> list[str]:
    """Write to `path` (a new DuckDB file) the whole `runs` table and the rows of `run_ids` in
    every other table that has a run_id column. Returns those of `run_ids` it holds a runs row
    for. Tables are created even when no row is copied, so queries on the copy find them."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(path)
    cur = con.cursor()
    alias = f"snapshot_{uuid.uuid4().hex[:12]}"  # the catalog is shared by every cursor
    literal = str(path).replace("'", "''")
    cur.execute(f"ATTACH '{literal}' AS {alias}")
    try:
        cur.execute("BEGIN TRANSACTION")
        tables = cur.execute(
            "SELECT table_name, bool_or(column_name = 'run_id') FROM duckdb_columns() "
            "WHERE database_name = current_database() AND schema_name = 'main' "
            "GROUP BY table_name ORDER BY table_name").fetchall()
        wanted = list(dict.fromkeys(run_ids))
        for table, has_run_id in tables:
            if table in PRIVATE:
                continue
            where = "" if table == "runs" or not has_run_id else " WHERE run_id IN (SELECT unnest($ids))"
            params = {"ids": wanted} if where else {}
            cur.execute(f"CREATE TABLE {alias}.{_q(table)} AS SELECT * FROM main.{_q(table)}{where}", params)
        found = [r[0] for r in cur.execute(
            "SELECT run_id FROM main.runs WHERE run_id IN (SELECT unnest($ids))", {"ids": wanted}).fetchall()]
        cur.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # no transaction left open on the shared database
            cur.execute("ROLLBACK")
        raise
    finally:
        cur.execute(f"DETACH {alias}")
        cur.close()
    return [r for r in wanted if r in set(found)]

