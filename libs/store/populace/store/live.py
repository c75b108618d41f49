"""What the manager's run page reads of a run while it plays: a page of its agents and the
distribution of one round. The recorder runs these on its own cursor when asked over the bus
(`recorder.read.agents`, `recorder.read.distribution`); they take any DuckDB connection.

They know no simulation: the columns are the ones the run declared (``runs.tables_json``, read
with ``recorded_tables``, so the simulation is never imported), identifiers are quoted
from that validated declaration, and whatever a user typed is a bound parameter.

- ``agents_page(con, run_id, search=None, offset=0, limit=50)``: the agents matching ``search``
  (an agent id, or words that must all appear in the agent's profile or persona, any case),
  ordered by id, ``limit`` of them from ``offset``: each one's profile and persona (short), and
  per round the simulation's outcome columns, valid, the raw answer (cut to RAW_CHARS) and
  the error.
- ``round_distribution(con, run_id, round=None, bins=30)``: the measure in one round (default
  the last closed one): a histogram (the report's bins, ``populace.store.bins``) or each
  option's count and share (the report's ``round_shares``).

Fast at a million agents: the page is chosen first, by agent id from a filtered id list
(without a search the ids are the run's 0 .. agents-1 and nothing is scanned), then only that
page's rows are fetched (``agent_id BETWEEN lo AND hi``, which DuckDB's zone maps prune).
Measured on this 2-core machine with 1,000,000 agents × 3 rounds of synthetic rows (DuckDB
``range()``, a file database; ``tests/unit/test_analysis_agents.py::test_a_million_agents``
repeats it when POPULACE_BENCH=1): see MEASURED below.
"""

from __future__ import annotations

import json
import math

import duckdb

from populace.store.bins import histogram_bins
from populace.store.lookup import known_runs
from populace.store.measures import histogram_of, round_shares
from populace.store.tables import QueryError, RunTables, has_table, loads, q, recorded_tables

MEASURED = ("1,000,000 agents × 3 rounds, a file database, 2 cores: a page of 50 agents 12 ms (at agent "
            "500,000 too), an agent id 12 ms, two words searched in every profile and persona 0.37 s, the "
            "last round's histogram 25 ms")

RAW_CHARS = 240  # a raw answer is cut to this many characters (the page links nothing longer)
TEXT_CHARS = 200  # persona, profile and error texts likewise
MAX_CELLS = 2000  # agents × rounds per page: a long run shows its last rounds (a reply stays < 1 MB)
MAX_WORDS = 8


def _cut(text: str | None, n: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= n else text[: n - 1] + "…"


def _check(con: duckdb.DuckDBPyConnection, run_id: str) -> RunTables:
    if run_id not in set(known_runs(con)):
        raise QueryError(f"run {run_id!r} is not recorded (yet)")
    return recorded_tables(con, run_id)


def _cell(x):
    """A cell as JSON can carry it (a NaN or infinity as None)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return str(x)


def profile_text(profile) -> str | None:
    """'education: master's · age: 38' (a profile's attributes in order), cut to TEXT_CHARS."""
    doc = loads(profile)
    if doc is None:
        return None if profile is None else _cut(str(profile), TEXT_CHARS)
    return _cut(" · ".join(f"{k}: {v}" for k, v in doc.items()), TEXT_CHARS)


def persona_text(persona) -> str | None:
    """A persona's name and description ('Maria Lopez — A 34-year-old …'), cut to TEXT_CHARS."""
    doc = loads(persona)
    if doc is None:
        return None if persona in (None, "null") else _cut(str(persona), TEXT_CHARS)
    name, desc = doc.get("name"), doc.get("description")
    parts = [str(p) for p in (name, desc) if p]
    if not parts:
        parts = [f"{k}: {v}" for k, v in doc.items()]
    return _cut(" — ".join(parts), TEXT_CHARS)


def _agent_count(rt: RunTables, con: duckdb.DuckDBPyConnection) -> int:
    n = rt.config.get("agents")
    if isinstance(n, int) and n >= 0:
        return n
    row = con.execute("SELECT count(DISTINCT agent_id) FROM agents WHERE run_id = ?", [rt.run_id]).fetchone()
    return int(row[0]) if row else 0


def _has_profiles(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    return has_table(con, "agent_profiles") and con.execute(
        "SELECT count(*) > 0 FROM (SELECT 1 FROM agent_profiles WHERE run_id = ? LIMIT 1)", [run_id]).fetchone()[0]


def _matching(con: duckdb.DuckDBPyConnection, run_id: str, words: list[str], offset: int,
              limit: int) -> tuple[int, list[int]]:
    """(how many agents' profile and persona hold every word, those on the page by id)."""
    text = "lower(coalesce(CAST(profile AS VARCHAR), '') || ' ' || coalesce(CAST(persona AS VARCHAR), ''))"
    where = " AND ".join(f"contains({text}, $w{i})" for i in range(len(words)))  # names, not input
    params = {"run": run_id, **{f"w{i}": w.lower() for i, w in enumerate(words)}}
    rows = con.execute(
        f"SELECT agent_id, count(*) OVER () FROM agent_profiles WHERE run_id = $run AND {where} "
        "ORDER BY agent_id LIMIT $limit OFFSET $offset", {**params, "limit": limit, "offset": offset}).fetchall()
    if rows:
        return int(rows[0][1]), [int(r[0]) for r in rows]
    total = con.execute(f"SELECT count(*) FROM agent_profiles WHERE run_id = $run AND {where}", params).fetchone()[0]
    return int(total), []


def agents_page(con: duckdb.DuckDBPyConnection, run_id: str, *, search: str | None = None, offset: int = 0,
                limit: int = 50, max_cells: int = MAX_CELLS) -> dict:
    """One page of the run's agents (see the module's docstring)::

        run_id, search, offset, limit, total   total: agents matching the search
        columns      the outcome columns shown per round (the simulation's, group_id first if grouped)
        rounds       the rounds shown (the last ones when agents × rounds would pass max_cells)
        rounds_total how many rounds have outcomes
        personas     whether the run has profiles and personas (else only an id is searchable)
        agents       [{agent_id, profile, persona, rounds: [{round, values, valid, raw, error}]}]

    QueryError: the run is not recorded."""
    rt = _check(con, run_id)
    offset, limit = max(0, int(offset)), max(1, int(limit))
    search = (search or "").strip()
    personas = _has_profiles(con, run_id)
    n_agents = _agent_count(rt, con)
    if not search:
        total = n_agents
        ids = list(range(offset, min(offset + limit, total)))
    elif search.lstrip("#").isdigit():
        wanted = int(search.lstrip("#"))
        total = 1 if wanted < n_agents else 0
        ids = [wanted] if total and offset == 0 else []
    elif personas:
        total, ids = _matching(con, run_id, search.split()[:MAX_WORDS], offset, limit)
    else:
        total, ids = 0, []
    spec = rt.spec
    columns = (["group_id"] if spec.grouped else []) + [c.name for c in spec.outcome_columns]
    outcomes = q(spec.outcomes)
    rounds_all = [int(r[0]) for r in con.execute(
        f"SELECT DISTINCT round FROM {outcomes} WHERE run_id = ? ORDER BY round", [run_id]).fetchall()]
    shown = rounds_all[-max(1, max_cells // max(1, len(ids))):] if rounds_all else []
    out = {"run_id": run_id, "search": search, "offset": offset, "limit": limit, "total": total,
           "columns": columns, "rounds": shown, "rounds_total": len(rounds_all), "personas": personas,
           "agents": []}
    if not ids:
        return out
    page = {"run": run_id, "ids": ids, "lo": min(ids), "hi": max(ids)}
    in_page = "run_id = $run AND agent_id BETWEEN $lo AND $hi AND list_contains($ids, agent_id)"
    agents = {i: {"agent_id": i, "profile": None, "persona": None, "rounds": []} for i in ids}
    if personas:
        for aid, profile, persona in con.execute(
                f"SELECT agent_id, profile, persona FROM agent_profiles WHERE {in_page}", page).fetchall():
            agents[int(aid)].update(profile=profile_text(profile), persona=persona_text(persona))
    if shown:
        cols = ", ".join(q(c) for c in columns)
        rows = con.execute(
            f"SELECT agent_id, round, {cols}, valid, left(raw, {RAW_CHARS + 1}), left(error, {TEXT_CHARS + 1}) "
            f"FROM {outcomes} WHERE {in_page} AND round BETWEEN $r0 AND $r1 ORDER BY agent_id, round",
            {**page, "r0": shown[0], "r1": shown[-1]}).fetchall()
        k = len(columns)
        for row in rows:
            cells = agents[int(row[0])]["rounds"]
            cell = {"round": int(row[1]), "values": {c: _cell(v) for c, v in zip(columns, row[2:2 + k], strict=True)},
                    "valid": row[2 + k], "raw": _cut(row[3 + k], RAW_CHARS), "error": _cut(row[4 + k], TEXT_CHARS)}
            if cells and cells[-1]["round"] == cell["round"]:
                cells[-1] = cell  # a round recorded twice (a re-placed share): the later row
            else:
                cells.append(cell)
    out["agents"] = [agents[i] for i in ids]
    return out


def _closed(con: duckdb.DuckDBPyConnection, rt: RunTables) -> int | None:
    row = con.execute(f"SELECT max(round) FROM {q(rt.spec.rounds)} WHERE run_id = ?", [rt.run_id]).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _summary(con: duckdb.DuckDBPyConnection, rt: RunTables, round_: int) -> dict:
    cols = list(rt.spec.summary_columns)
    if not cols:
        return {}
    row = con.execute(f"SELECT {', '.join(q(c.name) for c in cols)} FROM {q(rt.spec.rounds)} "
                      "WHERE run_id = ? AND round = ? LIMIT 1", [rt.run_id, round_]).fetchone()
    if row is None:
        return {}
    out = {}
    for c, v in zip(cols, row, strict=True):
        if c.type == "JSON" and isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                pass
        out[c.name] = _cell(v) if not isinstance(v, (dict, list)) else v
    return out


def round_distribution(con: duckdb.DuckDBPyConnection, run_id: str, round: int | None = None,
                       bins: int = 30) -> dict:
    """The run's measure in one round (default: the last closed round)::

        run_id, round, closed (the last closed round), measure, kind, n (valid answers),
        summary (the round's summary row, when closed)
        numeric:     edges (bins + 1), counts (bins), mean, min, max
        categorical: options, counts, shares (of the valid answers), leader, leader_share

    ``round`` None and no round closed yet: ``round`` is None and nothing else is filled.
    QueryError: the run is not recorded."""
    rt = _check(con, run_id)
    closed = _closed(con, rt)
    r = closed if round is None else int(round)
    out = {"run_id": run_id, "round": r, "closed": closed, "measure": rt.measure, "kind": rt.kind, "n": 0,
           "summary": {}}
    if r is None or rt.measure is None:
        return out
    out["summary"] = _summary(con, rt, r)
    m, t = q(rt.measure), q(rt.spec.outcomes)
    if rt.kind == "numeric":
        n, lo, hi, mean = con.execute(
            f"SELECT count(*), min({m}), max({m}), avg({m}) FROM {t} "
            f"WHERE run_id = ? AND round = ? AND valid AND {m} IS NOT NULL AND isfinite({m}::DOUBLE)",
            [run_id, r]).fetchone()
        out.update(n=int(n), edges=[], counts=[], mean=_cell(mean), min=_cell(lo), max=_cell(hi))
        if not n:
            return out
        lo, hi = float(lo), float(hi)
        if rt.measure_range:
            lo, hi = min(lo, rt.measure_range[0]), max(hi, rt.measure_range[1])
        a, b, nb = histogram_bins(lo, hi, integer=rt.measure_type == "BIGINT", bins=int(bins))
        edges, counts = histogram_of(con, rt, [r], a, b, nb)
        out.update(edges=[float(e) for e in edges], counts=[int(c) for c in counts[r]])
        return out
    shares = round_shares(con, rt, r)
    out.update(n=sum(shares["counts"].values()), options=list(shares["options"]),
               counts=[shares["counts"][o] for o in shares["options"]],
               shares=[shares["shares"][o] for o in shares["options"]],
               leader=shares["leader"], leader_share=shares["leader_share"])
    return out
