"""A fork beside its parent: where it comes from, and both runs round by round."""

from __future__ import annotations

import duckdb

from populace.analysis.queries.lookup import _check_runs, _has_table, known_runs
from populace.analysis.queries.rounds import round_table
from populace.analysis.tables import RunTables, loads, run_tables


def fork_of(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    """Where a fork comes from (its manifest): ``parent, after_round, changes``; None for a run
    that is not a fork."""
    _check_runs(con, [run_id])
    if not _has_table(con, "runs"):
        return None
    row = con.execute("SELECT manifest_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    fork = (loads(row[0]) or {}).get("fork") if row else None
    if not isinstance(fork, dict) or not isinstance(fork.get("parent"), str):
        return None
    return {"parent": fork["parent"], "after_round": int(fork.get("after_round") or 0),
            "changes": fork.get("changes") or {}}


def _round_stat(rt: RunTables, r: dict) -> dict:
    out = {"n": r["n"], "n_valid": r["n_valid"], "summary": r["summary"]}
    if rt.kind == "numeric":
        out["mean"] = r["mean"]
    elif rt.kind == "categorical":
        out.update(leader=r["leader"], leader_share=r["leader_share"], shares=r["shares"])
    return out


def fork_table(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    """A fork side by side with its parent, per round (None when `run_id` is not a fork or its
    parent is not in this file)::

        parent, fork, after_round, changes, measure_kind
        rounds: [{round, parent, fork, shared, difference}]

    ``parent``/``fork`` per round: ``n, n_valid, summary`` (the round's summary) and ``mean``
    (numeric) or ``leader, leader_share, shares`` (categorical), None where that run has no such round. Rounds up to
    ``after_round`` are the parent's in both (``shared``: the fork starts from its state after
    them). ``difference``: fork mean − parent mean (numeric)."""
    origin = fork_of(con, run_id)
    if origin is None or origin["parent"] not in set(known_runs(con)):
        return None
    parent, k = origin["parent"], origin["after_round"]
    prt, frt = run_tables(con, parent), run_tables(con, run_id)
    theirs = {r["round"]: _round_stat(prt, r) for r in round_table(con, parent)}
    mine = {r["round"]: _round_stat(frt, r) for r in round_table(con, run_id)}
    rows = []
    for n in sorted(set(theirs) | set(mine)):
        shared = n <= k
        a, b = theirs.get(n), (theirs.get(n) if shared else mine.get(n))
        diff = None
        if frt.kind == "numeric" and a and b and a.get("mean") is not None and b.get("mean") is not None:
            diff = b["mean"] - a["mean"]
        rows.append({"round": n, "parent": a, "fork": b, "shared": shared, "difference": diff})
    return {"parent": parent, "fork": run_id, "after_round": k, "changes": origin["changes"],
            "measure_kind": frt.kind, "rounds": rows}
