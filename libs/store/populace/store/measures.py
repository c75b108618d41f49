"""A run's measure counted in the database, as the live reads and the analysis' tables both
need it: a numeric measure's histogram per round, a categorical one's options and shares."""

from __future__ import annotations

import math
from collections.abc import Sequence

import duckdb
import numpy as np

from populace.store.sql_parts import _answers, _leader, _need_measure, _option_expr, _options, _run
from populace.store.tables import QueryError, RunTables, q


def add_shares(con: duckdb.DuckDBPyConnection, rt: RunTables, rows: list[dict]) -> None:
    params = {"run": rt.run_id}
    options = _options(con, _answers(rt), params, rt.spec.measure_options)
    params["opts"] = options
    counts = _run(con,
        f"SELECT round, {_option_expr(rt, options)} AS opt, count(*) FROM {q(rt.spec.outcomes)} o "
        f"WHERE o.run_id = $run AND o.valid AND o.{q(rt.measure)} IS NOT NULL GROUP BY ALL", params).fetchall()
    by_round: dict[int, dict[str, int]] = {}
    for r, opt, c in counts:
        by_round.setdefault(int(r), {})[opt] = int(c)
    for d in rows:
        got = by_round.get(d["round"], {})
        cnt = {o: got.get(o, 0) for o in options}
        total = sum(cnt.values())
        leader, top = _leader(cnt)
        d.update(options=list(options), counts=cnt,
                 shares={o: (c / total if total else None) for o, c in cnt.items()},
                 leader=leader, leader_share=top / total if total else None)


def round_shares(con: duckdb.DuckDBPyConnection, rt: RunTables, round_: int) -> dict:
    """A categorical measure in one round, as ``round_table`` gives it: ``options, counts,
    shares, leader, leader_share`` (options over the whole run: declared order, else most frequent first)."""
    _need_measure(rt)
    row = {"round": int(round_)}
    add_shares(con, rt, [row])
    return {k: v for k, v in row.items() if k != "round"}


def histogram_of(con: duckdb.DuckDBPyConnection, rt: RunTables, rounds: Sequence[int], lo: float, hi: float,
                 bins: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """``histogram`` of a run whose tables the caller has (``run_tables``, hints or not)."""
    _need_measure(rt)
    run_id = rt.run_id
    if rt.kind != "numeric":
        raise QueryError(f"run {run_id!r}: measure {rt.measure!r} is categorical, it has no histogram")
    lo, hi, bins = float(lo), float(hi), int(bins)
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo and bins >= 1):
        raise QueryError(f"histogram: needs lo < hi and bins >= 1 (got {lo}, {hi}, {bins})")
    m = q(rt.measure)
    rows = con.execute(
        f"SELECT round, least(greatest(floor(({m} - $lo) / $width), 0), $last)::BIGINT AS bin, count(*) "
        f"FROM {q(rt.spec.outcomes)} WHERE run_id = $run AND valid AND {m} IS NOT NULL "
        "AND list_contains($rounds, round) GROUP BY ALL",
        {"run": run_id, "lo": lo, "width": (hi - lo) / bins, "last": bins - 1,
         "rounds": [int(r) for r in rounds]}).fetchall()
    out = {int(r): np.zeros(bins, dtype=np.int64) for r in rounds}
    for r, b, c in rows:
        out[int(r)][int(b)] += int(c)
    return np.linspace(lo, hi, bins + 1), out
