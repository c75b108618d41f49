"""What a report shows of a run's shape, from what its simulation declared and what it recorded —
never from the simulation's name:

- ``degree_table``: a run that recorded edge edits (table ``edges``): the graph rebuilt after every
  round (``populace.sdk.edges.rebuild``'s rule, applied round by round) and its in- and
  out-degree distributions;
- ``measure_distribution``: the measure's distribution per persona group in chosen rounds (each
  option of a categorical measure, each value of a numeric one with few whole values, else bins);
- ``grid_frames``: a simulation that declares a grid (``Simulation.grid`` and ``grid_columns``):
  where each agent was in a round, coloured by the declared column, and the like-neighbour share of
  that colour (the share of an agent's occupied Moore neighbours with its colour, averaged over the
  agents with any), computed with the SDK's own ``Grid``.

Every function reads DuckDB aggregates or one round's rows at a time."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import duckdb
import numpy as np

from populace.analysis.queries.attribute_groups import NONE_GROUP, _json_path, _labels_for, _parse_attr
from populace.analysis.queries.lookup import tables_of
from populace.analysis.stats import AnalysisError
from populace.analysis.tables import has_table, q
from populace.graph.csr import Graph
from populace.sdk.space import EMPTY, Grid

MAX_VALUES = 21  # a numeric measure with at most this many whole values is shown value by value
BINS = 10  # else in this many bins of its range


# --- graphs that change --------------------------------------------------------------------------
def _histogram(degrees: np.ndarray) -> dict[int, int]:
    values, counts = np.unique(degrees, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def degree_table(con: duckdb.DuckDBPyConnection, run_id: str, base: Graph | None = None,
                 kind: str | None = None) -> list[dict]:
    """The follow graph after each round of the run: ``base`` (the run's graph, when the caller has
    it: the database does not hold it) plus the recorded edits of ``kind`` (default: the first kind
    the simulation declares) up to that round, applied in the order they were recorded. One dict
    per round of the run's summary table::

        round, adds, removes   the round's edits
        edges                  edges standing after the round
        in_degree, out_degree  {degree: agents}, every agent counted (0 included); an edge
                               author -> follower is an out-edge of nobody: the follower's
                               out-degree counts whom it follows, the author's in-degree its followers
        max_in, max_out, mean_degree

    [] for a run whose simulation declares no edge kinds."""
    rt = tables_of(con, run_id)
    kinds = rt.spec.edge_kinds
    if not kinds or not has_table(con, "edges"):
        return []
    kind = kind or kinds[0]
    if kind not in kinds:
        raise AnalysisError(f"run {run_id!r}: edge kind {kind!r} is not declared ({', '.join(kinds)})")
    agents = int(rt.config.get("agents") or 0)
    rounds = [r[0] for r in con.execute(f"SELECT DISTINCT round FROM {q(rt.spec.rounds)} WHERE run_id = ? ORDER BY 1",
                                        [run_id]).fetchall()]
    edits = con.execute("SELECT round, follower, author, op FROM edges WHERE run_id = ? AND kind = ? "
                        "ORDER BY round, rowid", [run_id, kind]).fetchall()
    if edits:
        agents = max(agents, 1 + max(max(e[1], e[2]) for e in edits))
    following: dict[int, set[int]] = {}
    if base is not None and kind == kinds[0]:
        for v in range(base.n):
            ins = base.in_neighbours(v)
            if ins.size:
                following[v] = set(np.asarray(ins).tolist())
    by_round: dict[int, list] = {}
    for e in edits:
        by_round.setdefault(e[0], []).append(e)
    out = []
    for r in sorted(set(rounds) | set(by_round)):
        adds = removes = 0
        for _, follower, author, op in by_round.get(r, ()):
            now = following.setdefault(follower, set())
            if op == "add":
                adds += 1
                now.add(author)
            else:
                removes += 1
                now.discard(author)
        out_deg = np.zeros(agents, dtype=np.int64)
        in_deg = np.zeros(agents, dtype=np.int64)
        for follower, authors in following.items():
            out_deg[follower] = len(authors)
            for a in authors:
                in_deg[a] += 1
        edges = int(out_deg.sum())
        out.append({"round": int(r), "adds": adds, "removes": removes, "edges": edges,
                    "in_degree": _histogram(in_deg), "out_degree": _histogram(out_deg),
                    "max_in": int(in_deg.max()) if agents else 0, "max_out": int(out_deg.max()) if agents else 0,
                    "mean_degree": edges / agents if agents else None})
    return out


def starting_graph(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[Graph | None, str | None]:
    """The run's `graph:` rebuilt from its recorded config (generator, seed, placement; a homophily
    graph from the recorded profiles), used only when its digest equals the one the run recorded:
    ``(graph, None)``, or ``(None, why not)``. None, None for a run without a graph."""
    from pydantic import ValidationError

    from populace.core.contracts import RunConfig
    from populace.graph.prepare import prepare_graph

    rt = tables_of(con, run_id)
    try:
        config = RunConfig.model_validate(rt.config)
    except ValidationError:
        return None, "its recorded config does not validate here"
    ref = config.graph
    if ref is None:
        return None, None
    records = None
    if has_table(con, "agent_profiles"):
        rows = con.execute("SELECT profile FROM agent_profiles WHERE run_id = ? ORDER BY agent_id", [run_id]).fetchall()
        if len(rows) == config.agents:
            records = [{"profile": json.loads(p) if isinstance(p, str) else (p or {})} for (p,) in rows]
    for placement in dict.fromkeys([ref.placement, "ids"]):
        try:
            prepared = prepare_graph(ref.spec, config.agents, seed=config.seed, placement=placement, records=records)
        except Exception as err:  # an edge list not here, a generator this release lacks …
            return None, f"it cannot be rebuilt here ({type(err).__name__}: {str(err)[:200]})"
        if ref.digest is None or prepared.digest == ref.digest:
            return prepared.graph, None
    return None, "the graph rebuilt here differs from the run's (its digest)"


# --- the measure per persona group ---------------------------------------------------------------
def _categories(con: duckdb.DuckDBPyConnection, rt, run_id: str) -> tuple[list[str], str]:
    """The categories of the run's measure and the SQL expression of an outcome's category."""
    col = f"o.{q(rt.measure)}"
    if rt.kind == "categorical":
        declared = list(rt.spec.measure_options or [])
        seen = [r[0] for r in con.execute(
            f"SELECT CAST({col} AS VARCHAR) v, count(*) c FROM {q(rt.spec.outcomes)} o WHERE run_id = ? AND valid "
            f"AND {col} IS NOT NULL GROUP BY v ORDER BY c DESC, v", [run_id]).fetchall()]
        return declared + [v for v in seen if v not in declared], f"CAST({col} AS VARCHAR)"
    lo, hi, whole = con.execute(
        f"SELECT min({col}), max({col}), bool_and({col} = round({col})) "
        f"FROM {q(rt.spec.outcomes)} o WHERE run_id = ? AND valid AND {col} IS NOT NULL", [run_id]).fetchone()
    if lo is None:
        return [], "NULL"
    if rt.measure_range is not None:
        lo, hi = min(lo, rt.measure_range[0]), max(hi, rt.measure_range[1])
    if whole and hi - lo + 1 <= MAX_VALUES:
        return [f"{v:g}" for v in np.arange(lo, hi + 1)], f"printf('%g', CAST({col} AS DOUBLE))"
    edges = np.linspace(lo, hi, BINS + 1) if hi > lo else np.array([lo, lo + 1.0])
    labels = [f"{a:.4g} to {b:.4g}" for a, b in pairwise(edges)]
    width = float(edges[1] - edges[0])
    expr = (f"list_extract($labels, 1 + least({len(labels) - 1}, "
            f"greatest(0, CAST(floor((CAST({col} AS DOUBLE) - {float(lo)!r}) / {width!r}) AS BIGINT))))")
    return labels, expr


def measure_distribution(con: duckdb.DuckDBPyConnection, run_id: str, by: str, rounds: Sequence[int]) -> dict:
    """The run's measure per group of persona attribute ``by`` in each of ``rounds``, over the
    valid answers: ``{"categories": [...], "groups": [...], "rows": [{round, group, n, counts:
    {category: count}}]}``, groups labelled as the report's other group figures label them.
    Categories: a categorical measure's options; a numeric one's whole values when it has at most
    MAX_VALUES of them (its declared range included), else BINS equal bins of its range."""
    rt = tables_of(con, run_id)
    if rt.measure is None:
        return {"categories": [], "groups": [], "rows": []}
    categories, expr = _categories(con, rt, run_id)
    if not categories or not rounds:
        return {"categories": categories, "groups": [], "rows": []}
    params = {"run": run_id, "rounds": [int(r) for r in rounds], "path": _json_path(by)}
    if "$labels" in expr:  # numeric bins are named by their labels
        params["labels"] = categories
    rows = con.execute(
        f"""SELECT o.round,
                   CAST(coalesce(json_extract(p.profile, $path), json_extract(p.persona, $path)) AS VARCHAR) AS attr,
                   {expr} AS v, count(*) AS c
            FROM {q(rt.spec.outcomes)} o
            LEFT JOIN (SELECT agent_id, any_value(profile) AS profile, any_value(persona) AS persona
                       FROM agent_profiles WHERE run_id = $run GROUP BY agent_id) p ON p.agent_id = o.agent_id
            WHERE o.run_id = $run AND o.valid AND o.{q(rt.measure)} IS NOT NULL AND list_contains($rounds, o.round)
            GROUP BY ALL""", params).fetchall() if has_table(con, "agent_profiles") else []
    texts = {a for _, a, _, _ in rows if a is not None and a != "null"}
    parsed = {t: _parse_attr(t) for t in texts}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    cells: dict[tuple[int, str], dict[str, int]] = {}
    for r, attr, v, c in rows:
        label = mapping[hashable[attr]] if attr in hashable else NONE_GROUP
        counts = cells.setdefault((int(r), label), {})
        counts[v] = counts.get(v, 0) + int(c)
    groups = [g for g in [*order, NONE_GROUP] if any(k[1] == g for k in cells)]
    groups = list(dict.fromkeys(groups))
    out = [{"round": r, "group": g, "n": sum(cells[(r, g)].values()), "counts": cells[(r, g)]}
           for r in sorted({k[0] for k in cells}) for g in groups if (r, g) in cells]
    return {"categories": categories, "groups": groups, "rows": out}


# --- spaces ---------------------------------------------------------------------------------------
@dataclass
class GridFrame:
    """Where the agents that have an outcome in a round stood, and how alike their neighbours were."""

    round: int
    colours: list[str]  # the colour column's values, in code order
    occupant_colour: np.ndarray  # (height, width): the code of the colour of the cell's agent, -1 empty
    agents: int  # agents placed
    like_share: float | None  # mean over agents with an occupied neighbour of like / occupied
    clashes: int  # agents whose cell another agent of the round also claimed (a simulation's bug)


def grid_frames(con: duckdb.DuckDBPyConnection, run_id: str, rounds: Sequence[int]) -> list[GridFrame]:
    """One frame per round of ``rounds`` for a run whose simulation declares a grid; [] for others."""
    rt = tables_of(con, run_id)
    if rt.grid is None or rt.grid_columns is None:
        return []
    grid: Grid = rt.grid  # type: ignore[assignment]
    cell_col, colour_col = rt.grid_columns
    colours = [r[0] for r in con.execute(
        f"SELECT DISTINCT CAST({q(colour_col)} AS VARCHAR) v FROM {q(rt.spec.outcomes)} WHERE run_id = ? "
        f"AND {q(cell_col)} IS NOT NULL AND {q(colour_col)} IS NOT NULL ORDER BY try_cast(v AS DOUBLE), v",
        [run_id]).fetchall()]
    out = []
    for r in rounds:
        # columns as arrays (a million agents a round), the colour as its code
        rows = con.execute(
            f"SELECT {q(cell_col)} AS cell, list_position($colours, CAST({q(colour_col)} AS VARCHAR)) - 1 AS code "
            f"FROM {q(rt.spec.outcomes)} WHERE run_id = $run AND round = $round AND {q(cell_col)} IS NOT NULL "
            f"AND {q(colour_col)} IS NOT NULL AND {q(cell_col)} >= 0 AND {q(cell_col)} < $cells ORDER BY agent_id",
            {"colours": colours, "run": run_id, "round": int(r), "cells": grid.cells}).fetchnumpy()
        cells = np.asarray(rows["cell"], dtype=np.int64)
        kind = np.asarray(rows["code"], dtype=np.int64)
        occupant = np.full(grid.cells, EMPTY, dtype=np.int64)
        occupant[cells] = np.arange(cells.size)  # a clash keeps the later agent, as the picture does
        placed = occupant[cells] == np.arange(cells.size)
        like_share = None
        if cells.size:
            like, occupied = grid.like_neighbours(cells[placed], kind, occupant)
            seen = occupied > 0
            like_share = float(np.mean(like[seen] / occupied[seen])) if seen.any() else None
        picture = np.full(grid.cells, -1, dtype=np.int64)
        picture[cells] = kind
        out.append(GridFrame(int(r), colours, picture.reshape(grid.height, grid.width), int(cells.size), like_share,
                             int((~placed).sum())))
    return out


__all__ = ["GridFrame", "degree_table", "grid_frames", "measure_distribution", "starting_graph"]
