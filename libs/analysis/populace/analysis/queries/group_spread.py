"""How a grouped simulation's groups (its ``group_id`` column) differ, round by round."""

from __future__ import annotations

import duckdb

from populace.analysis.queries.lookup import tables_of
from populace.analysis.stats import AnalysisError
from populace.analysis.tables import q
from populace.store.sql_parts import OTHER, _answers, _need_measure, _num, _options

# Grouped simulations: one line per group up to this many groups, else the spread of group means.
MAX_GROUP_LINES = 8
SPREAD_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def group_spread(con: duckdb.DuckDBPyConnection, run_id: str, option: str | None = None) -> dict:
    """How the simulation's groups (its ``group_id`` column) differ, per round: each group's
    mean of a numeric measure, or (categorical) each group's share of ``option`` (default: the
    run's most frequent answer). Returns::

        value        what is summarised per group ("mean contribution", "share of yes")
        n_groups     distinct groups in the run
        rounds       [{round, n_groups, mean (of the group values), min, q10, q25, median, q75,
                      q90, max}]   quantiles across the groups of that round
        lines        {group_id: [(round, value), …]} when n_groups <= MAX_GROUP_LINES, else None

    Groups are reduced in the database: one row per round (plus a few lines) comes back."""
    rt = tables_of(con, run_id)
    _need_measure(rt)
    if not rt.grouped:
        raise AnalysisError(f"run {run_id!r}: simulation {rt.spec.simulation!r} has no groups")
    params: dict = {"run": run_id}
    if rt.kind == "numeric":
        x = q(rt.measure)
        what = f"mean {rt.noun}"
    else:
        if option is None:
            opts = _options(con, _answers(rt), params, rt.spec.measure_options)
            option = next((o for o in opts if o != OTHER), None)
            if option is None:
                return {"value": f"share of a {rt.noun}", "n_groups": 0, "rounds": [], "lines": None}
        params["opt"] = option
        x = f"(CAST({q(rt.measure)} AS VARCHAR) = $opt)::DOUBLE"
        what = f"share of {option}"
    per_group = (f"SELECT round, group_id, avg({x}) AS gv FROM {q(rt.spec.outcomes)} "
                 f"WHERE run_id = $run AND valid AND {q(rt.measure)} IS NOT NULL AND group_id IS NOT NULL "
                 "GROUP BY round, group_id")
    qs = list(SPREAD_QUANTILES)
    rows = con.execute(
        f"WITH g AS ({per_group}) SELECT round, count(*), avg(gv), min(gv), quantile_cont(gv, {qs}), max(gv) "
        "FROM g GROUP BY round ORDER BY round", params).fetchall()
    n_groups = con.execute(
        f"SELECT count(DISTINCT group_id) FROM {q(rt.spec.outcomes)} WHERE run_id = $run AND group_id IS NOT NULL",
        {"run": run_id}).fetchone()[0]
    table = []
    for r, n, mean, lo, quants, hi in rows:
        d = {"round": int(r), "n_groups": int(n), "mean": _num(mean), "min": _num(lo), "max": _num(hi)}
        d.update({f"q{round(p * 100):02d}": _num(v) for p, v in zip(SPREAD_QUANTILES, quants)})
        d["median"] = d.pop("q50")
        table.append(d)
    lines = None
    if 0 < n_groups <= MAX_GROUP_LINES:
        lines = {}
        for gid, r, gv in con.execute(f"WITH g AS ({per_group}) SELECT group_id, round, gv FROM g "
                                      "ORDER BY group_id, round", params).fetchall():
            lines.setdefault(int(gid), []).append((int(r), _num(gv)))
    return {"value": what, "option": option, "n_groups": int(n_groups), "rounds": table, "lines": lines}
