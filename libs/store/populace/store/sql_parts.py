"""The SQL parts every table shares: a statement run with the parameters it uses, rows as dicts,
cells as Python, the run's measure as SQL, and a categorical measure's options and leader."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

import duckdb

from populace.store.tables import QueryError, RunTables, q

OTHER = "(other)"
# A categorical measure with more distinct answers than this keeps the most frequent
# MAX_OPTIONS - 1 and counts the rest as "(other)" (a free-text column must not make a table of
# a million columns).
MAX_OPTIONS = 12


def _run(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> duckdb.DuckDBPyConnection:
    """Execute with the named parameters ($name) the statement uses: DuckDB rejects extra ones,
    and the statements here are assembled from parts that use different subsets."""
    used = set(re.findall(r"\$([A-Za-z_]\w*)", sql))
    return con.execute(sql, {k: v for k, v in params.items() if k in used})


def _rows(cur: duckdb.DuckDBPyConnection) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _num(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _value(x, type_: str):
    """A summary cell as Python: JSON parsed, numbers finite or None."""
    if x is None:
        return None
    if type_ == "JSON":
        try:
            return json.loads(x) if isinstance(x, str) else x
        except ValueError:
            return x
    if type_ == "DOUBLE":
        return _num(x)
    if type_ in ("BIGINT", "INTEGER"):
        return int(x)
    return x


def _measure_expr(rt: RunTables, alias: str = "") -> str:
    """SQL for the measure: the column (numeric) or its text (categorical: VARCHAR, BOOLEAN and
    JSON answers alike)."""
    col = (alias + "." if alias else "") + q(rt.measure)
    return col if rt.kind == "numeric" else f"CAST({col} AS VARCHAR)"


def _need_measure(rt: RunTables) -> None:
    if rt.measure is None:
        raise QueryError(f"run {rt.run_id!r}: simulation {rt.spec.simulation!r} declares no measure "
                         "(an outcome column) to summarise")


def _options(con: duckdb.DuckDBPyConnection, source: str, params: dict, declared: Sequence[str] | None = None
             ) -> list[str]:
    """The answers of a categorical measure in ``source`` (SQL with a text column ``v``): the
    simulation's ``declared`` options in their order (its schema's), with OTHER last for any
    answer outside them (a run recorded before options were checked); without declared options,
    most frequent first (ties by text), and beyond MAX_OPTIONS the rarest counted as OTHER."""
    if declared:
        (outside,) = _run(con, f"SELECT count(*) FILTER (WHERE NOT list_contains($declared, v)) FROM ({source})",
                          {**params, "declared": list(declared)}).fetchone()
        return [*declared, *([OTHER] if outside else [])]
    rows = _run(con, f"SELECT v, count(*) AS c FROM ({source}) GROUP BY v ORDER BY c DESC, v "
                     f"LIMIT {MAX_OPTIONS + 1}", params).fetchall()
    opts = [r[0] for r in rows]
    if len(opts) > MAX_OPTIONS:
        opts = opts[:MAX_OPTIONS - 1] + [OTHER]
    return opts


def _answers(rt: RunTables) -> str:
    """SQL of the run's valid answers as text (column v); binds $run."""
    return (f"SELECT {_measure_expr(rt, 'o')} AS v FROM {q(rt.spec.outcomes)} o "
            f"WHERE o.run_id = $run AND o.valid AND o.{q(rt.measure)} IS NOT NULL")


def _option_expr(rt: RunTables, options: list[str], alias: str = "o") -> str:
    """SQL mapping an answer to its option label ($opts bound to the kept options)."""
    x = _measure_expr(rt, alias)
    if OTHER not in options:
        return x
    return f"CASE WHEN list_contains($opts, {x}) THEN {x} ELSE '{OTHER}' END"


def _leader(counts: dict[str, int]) -> tuple[str | None, int]:
    real = {o: c for o, c in counts.items() if o != OTHER}
    top = max(real.values(), default=0)
    leaders = [o for o, c in real.items() if c == top]
    return (leaders[0] if len(leaders) == 1 and top > 0 else None), top  # a tie has no leader
