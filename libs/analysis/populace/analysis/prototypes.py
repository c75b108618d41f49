"""A prototype run's approximation, as recorded (tables `prototype_rounds`, `audits` and the
outcome table's `source` column): per round and prototype, how many agents called the model,
how many copied an answer, how many were audited, and how far the copies were from the audits
(the divergence with its 95% bootstrap interval, and whether the guard raised the share).

- ``prototype_table(con, run_id)``: one row per round and prototype.
- ``prototype_summary(con, run_id)``: the run's calls by source (the representatives', the
  audits'), over its outcomes, and its largest divergence: None for a run without prototypes.
"""

from __future__ import annotations

import duckdb

from populace.analysis.queries.lookup import _has_table, tables_of

COLUMNS = ("round", "prototype", "agents", "share", "representatives", "valid", "drawn", "unanswered", "audited",
           "audited_valid", "metric", "divergence", "ci_low", "ci_high", "tv", "breach", "next_share")


def has_prototypes(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    return _has_table(con, "prototype_rounds") and con.execute(
        "SELECT count(*) FROM prototype_rounds WHERE run_id = ?", [run_id]).fetchone()[0] > 0


def prototype_table(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    if not _has_table(con, "prototype_rounds"):
        return []
    rows = con.execute(f"SELECT {', '.join(COLUMNS)} FROM prototype_rounds WHERE run_id = ? ORDER BY round, prototype",
                       [run_id]).fetchall()
    return [dict(zip(COLUMNS, r)) for r in rows]


def prototype_summary(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    """The run's model calls by what made them, beside its outcomes (None: no prototypes)."""
    if not has_prototypes(con, run_id):
        return None
    spec = tables_of(con, run_id)
    by_source = dict(con.execute(f'SELECT coalesce(source, \'llm\'), count(*) FROM "{spec.spec.outcomes}" '
                                 "WHERE run_id = ? GROUP BY ALL", [run_id]).fetchall())
    audits = con.execute("SELECT count(*) FROM audits WHERE run_id = ?", [run_id]).fetchone()[0]
    worst = con.execute("SELECT round, prototype, metric, divergence, ci_low, ci_high FROM prototype_rounds "
                        "WHERE run_id = ? AND divergence IS NOT NULL ORDER BY divergence DESC LIMIT 1",
                        [run_id]).fetchone()
    raised = con.execute("SELECT count(*) FROM prototype_rounds WHERE run_id = ? AND breach", [run_id]).fetchone()[0]
    outcomes = sum(by_source.values())
    own = by_source.get("llm", 0)
    return {"outcomes": outcomes, "representatives": own, "drawn": by_source.get("prototype", 0), "audits": audits,
            "calls_share": (own + audits) / outcomes if outcomes else None, "breaches": raised,
            "worst": dict(zip(("round", "prototype", "metric", "divergence", "ci_low", "ci_high"), worst))
            if worst else None}
