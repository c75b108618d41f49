"""Per run and round, how the measure approaches the simulation's equilibrium or a leading answer."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from populace.analysis.queries.lookup import _check_runs
from populace.analysis.queries.rounds import round_table
from populace.analysis.tables import run_tables
from populace.store.sql_parts import _num


def convergence_table(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str]) -> list[dict]:
    """One dict per run and round. Numeric measure: ``run_id, round, mean, median,
    equilibrium, distance`` (|mean − equilibrium|, None without an equilibrium or a valid
    answer) and each of the simulation's trend columns by name (the ratio game: ``target``,
    ``winner_value``). Categorical: ``run_id, round, n_valid, leader, leader_share, shares``."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    out = []
    for rid in run_ids:
        rt = run_tables(con, rid)
        for r in round_table(con, rid):
            if rt.kind == "categorical":
                out.append({"run_id": rid, "round": r["round"], "n_valid": r["n_valid"], "leader": r["leader"],
                            "leader_share": r["leader_share"], "shares": r["shares"]})
                continue
            eq = rt.equilibrium
            mean = r.get("mean")
            row = {"run_id": rid, "round": r["round"], "mean": mean, "median": r.get("median"),
                   "equilibrium": eq, "distance": abs(mean - eq) if eq is not None and mean is not None else None}
            for c in rt.trend:
                if c not in row:
                    row[c] = _num((r["summary"] or {}).get(c))
            out.append(row)
    return out
