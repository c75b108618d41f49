"""Per round: ``round_table`` (counts, the measure's statistics or shares, the summary, usage),
one round's shares, a numeric measure's values and histograms, and the invalid answers."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np

from populace.analysis.queries.lookup import tables_of
from populace.analysis.queries.run_header import _simulation_error, _usage_columns, usage_value
from populace.analysis.stats import AnalysisError
from populace.analysis.tables import q
from populace.store.measures import add_shares as _add_shares
from populace.store.measures import histogram_of, round_shares  # noqa: F401 (the queries package exports them from here)
from populace.store.sql_parts import (
    _need_measure,
    _num,
    _rows,
    _value,
)


def round_table(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """One dict per round (ascending)::

        round, n, n_valid, n_invalid      from the outcome rows (else the round's result)
        n_invalid_answers                 of the invalid rows, the model's answers the simulation
                                          could not read
        n_simulation_errors               of the invalid rows, those the simulation's own code
                                          failed on (error 'agent: …')
        mean, median, std, min, max       numeric measure, over the valid answers (std: sample)
        options, counts, shares, leader, leader_share
                                          categorical measure: the options (declared order, else most frequent first),
                                          valid answers and share of the valid answers per option,
                                          the leading option (None on a tie) and its share
        summary                           {column: value} of the simulation's round summary
                                          (None while a round is not closed; JSON parsed)
        usage                             {llm_calls, prompt_tokens, completion_tokens,
                                          infra_retries, cached_tokens, dollars} of the closed
                                          round (None while open, or when the run was recorded
                                          before usage was; the last two absent in a file from
                                          before they were recorded)

    A round with a result but no recorded outcomes takes n and n_valid from the result."""
    rt = tables_of(con, run_id)
    types = rt.summary_types
    usage = _usage_columns(con, rt)
    sel = ", ".join([*(f"any_value({q(c)}) AS {q('s_' + c)}" for c in types),
                     *(f"any_value({q(c)}) AS {q('u_' + c)}" for c in usage)])
    if rt.kind == "numeric":
        m = q(rt.measure)
        stats = (f", avg({m}) FILTER (WHERE valid) AS mean, quantile_cont({m}, 0.5) FILTER (WHERE valid) AS median, "
                 f"stddev_samp({m}) FILTER (WHERE valid) AS std, min({m}) FILTER (WHERE valid) AS min, "
                 f"max({m}) FILTER (WHERE valid) AS max")
    else:
        stats = ""
    valid = f"valid AND {q(rt.measure)} IS NOT NULL" if rt.measure else "valid"
    ours = _simulation_error(con, rt)
    cur = con.execute(
        f"""
        WITH o AS (
            SELECT round, count(*) AS n, count(*) FILTER (WHERE {valid}) AS n_valid,
                   count(*) FILTER (WHERE NOT ({valid}) AND {ours}) AS n_errors_ {stats}
            FROM {q(rt.spec.outcomes)} WHERE run_id = $run GROUP BY round
        ), r AS (
            SELECT round, any_value(n) AS r_n, any_value(n_valid) AS r_n_valid{', ' + sel if sel else ''}
            FROM {q(rt.spec.rounds)} WHERE run_id = $run GROUP BY round
        )
        SELECT coalesce(o.round, r.round) AS round_, coalesce(o.n, r.r_n, 0) AS n_,
               coalesce(o.n_valid, r.r_n_valid, 0) AS n_valid_, r.round IS NOT NULL AS closed_, *
        FROM o FULL OUTER JOIN r ON o.round = r.round
        ORDER BY round_
        """, {"run": run_id})
    out = []
    for row in _rows(cur):
        d = {"round": int(row["round_"]), "n": int(row["n_"]), "n_valid": int(row["n_valid_"])}
        d["n_invalid"] = d["n"] - d["n_valid"]
        d["n_simulation_errors"] = int(row["n_errors_"] or 0)
        d["n_invalid_answers"] = d["n_invalid"] - d["n_simulation_errors"]
        if rt.kind == "numeric":
            d.update({k: _num(row[k]) for k in ("mean", "median", "std", "min", "max")})
        d["summary"] = ({c: _value(row["s_" + c], t) for c, t in types.items()} if row["closed_"] else None)
        d["usage"] = ({c: usage_value(c, row["u_" + c]) for c in usage} if row["closed_"] and usage else None)
        out.append(d)
    if rt.kind == "categorical":
        _add_shares(con, rt, out)
    return out


def measure_values(con: duckdb.DuckDBPyConnection, run_id: str, round: int | None = None) -> dict[int, np.ndarray]:
    """The valid values of a numeric measure (one round, or all) as ``{round: float array}``.
    This loads rows into memory: for notebooks on modest runs; the tables and the report
    aggregate in the database instead."""
    rt = tables_of(con, run_id)
    _need_measure(rt)
    if rt.kind != "numeric":
        raise AnalysisError(f"run {run_id!r}: measure {rt.measure!r} is categorical; use round_table's shares")
    m = q(rt.measure)
    sql = f"SELECT round, {m} AS v FROM {q(rt.spec.outcomes)} WHERE run_id = ? AND valid AND {m} IS NOT NULL"
    params: list = [run_id]
    if round is not None:
        sql += " AND round = ?"
        params.append(round)
    data = con.execute(sql + " ORDER BY round", params).fetchnumpy()
    rounds = np.asarray(data["round"])
    values = np.asarray(data["v"], dtype=float)
    return {int(r): values[rounds == r] for r in np.unique(rounds)}


guesses = measure_values  # the ratio game's name for it, kept for notebooks


def histogram(con: duckdb.DuckDBPyConnection, run_id: str, rounds: Sequence[int], lo: float, hi: float,
              bins: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """``(edges, {round: counts})``: the valid values of a numeric measure per round in ``bins``
    equal bins from ``lo`` to ``hi`` (the last bin closed, as numpy's; values outside are
    counted in the end bins). Binned in the database: one row per round and bin comes back."""
    return histogram_of(con, tables_of(con, run_id), rounds, lo, hi, bins)


def invalid_answers(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 5) -> dict:
    """``{"count": invalid answers in the run, "examples": [{"round", "agent_id", "raw", "error"}, …]}``
    (up to ``limit`` examples, earliest first; raw texts as recorded, not escaped)."""
    rt = tables_of(con, run_id)
    t = q(rt.spec.outcomes)
    count = con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ? AND NOT coalesce(valid, false)",
                        [run_id]).fetchone()[0]
    has_error = "error" in {r[0] for r in con.execute(f"DESCRIBE {t}").fetchall()}
    ex = _rows(con.execute(
        f"SELECT round, agent_id, raw{', error' if has_error else ', NULL AS error'} FROM {t} "
        "WHERE run_id = ? AND NOT coalesce(valid, false) ORDER BY round, agent_id LIMIT ?", [run_id, int(limit)]))
    return {"count": int(count), "examples": ex}
