"""A population that changed (table `population`): per round, who played it and who came and went
after it."""

from __future__ import annotations

import duckdb

EVENTS = ("born", "arrived", "died", "left")


def population_rounds(con: duckdb.DuckDBPyConnection, run_id: str, agents: int, rounds: int) -> list[dict]:
    """One dict per round (ascending), for a run whose population changed ([] for one that did
    not, or a database from before populations changed)::

        round            the round
        living           agents alive in it: who could act (the first `agents`, with every newcomer of
                         the rounds before, less every departure of the rounds before)
        born, arrived    newcomers after it
        died, left       departures after it"""
    try:
        rows = con.execute("SELECT round, event, count(*) FROM population WHERE run_id = ? GROUP BY ALL",
                           [run_id]).fetchall()
    except duckdb.CatalogException:
        return []
    if not rows:
        return []
    counts = {(r, e): n for r, e, n in rows}
    out, living = [], agents
    for r in range(1, max(rounds, max(r for r, _, _ in rows)) + 1):
        row = {"round": r, "living": living, **{e: counts.get((r, e), 0) for e in EVENTS}}
        out.append(row)
        living += row["born"] + row["arrived"] - row["died"] - row["left"]
    return out
