"""Tables computed from the recorder's DuckDB file, for any simulation.

Each run's results are in the tables its simulation declared (``runs.tables_json``, see
``populace.analysis.tables``): one outcome row per agent per round, one summary row per round.
Analysis summarises the declared *measure* (a numeric or a categorical outcome column). Every
per-round and per-group statistic is aggregated in DuckDB: a run may hold millions of rows, and
only aggregates (one row per round, group or option) come back to Python.

Every function takes an open DuckDB connection (read-only is enough) and returns plain Python
data: lists of dicts with fixed keys, ready to print, serialise or plot.

- ``run_info(con, run_id)``: the run's header (config, status, manifest, its simulation's
  measure, summary titles, equilibrium …).
- ``round_table(con, run_id)``: per round n, n_valid, and the measure's mean/median/std/min/max
  (numeric) or each option's count and share (categorical), plus the simulation's summary.
- ``group_table(con, run_ids, by, round=None)``: per group of a profile/persona attribute, the
  mean with a Student-t 95% CI (numeric) or each option's share with a Wilson 95% CI
  (categorical), across agents and, with several runs, across runs (seeds).
- ``convergence_table(con, run_ids)``: per run and round the measure's centre, the
  simulation's reference columns and the distance to its equilibrium.
- ``group_spread(con, run_id)``: for grouped simulations, the measure per round per group.
- ``attributes(con, run_id)`` / ``group_attributes(con, run_id)``: what one can group by.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from itertools import pairwise

import duckdb
import numpy as np

from populace.analysis.stats import AnalysisError, mean_ci, share_ci, t_interval
from populace.analysis.tables import RunTables, has_table, loads, q, run_tables, table_columns
from populace.core.contracts import Usage

NONE_GROUP = "(none)"
OTHER = "(other)"
LEVEL = 0.95
# A categorical measure with more distinct answers than this keeps the most frequent
# MAX_OPTIONS - 1 and counts the rest as "(other)" (a free-text column must not make a table of
# a million columns).
MAX_OPTIONS = 12
# Grouped simulations: one line per group up to this many groups, else the spread of group means.
MAX_GROUP_LINES = 8
SPREAD_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)

# Ages are binned by decade, adults starting at 18, as survey tables do.
AGE_EDGES = (18, 30, 40, 50, 60, 70, 80)
# An ordinal ladder for education attributes (matched by substring, lower case); used only
# when every value of an attribute whose name mentions "educ" matches a rung.
EDUCATION_LADDER = (
    ("no formal", "none"), ("elementary", "primary"), ("middle school", "junior high"),
    ("high school", "secondary"), ("vocational", "associate", "college"), ("bachelor",),
    ("master", "mba"), ("ph.d", "phd", "doctor"),
)
# Numeric attributes with at most this many distinct values get one group per value.
MAX_EXACT_NUMERIC = 8
NUMERIC_BINS = 5
PLATFORM_KEYS = ("simulation", "name", "agents", "rounds", "seed", "model", "placement", "population", "budget",
                 "graph", "broadcasts")


# --- helpers --------------------------------------------------------------------------
def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return has_table(con, name)


def _db_name(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return str(row[0]) if row and row[0] else "the database"


def known_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run id recorded (runs table, plus any run with historic ratio-game round results),
    newest first."""
    if not _has_table(con, "runs"):
        return []
    parts = ["SELECT run_id, started_at FROM runs"]
    if _has_table(con, "rounds"):
        parts.append("SELECT DISTINCT run_id, NULL::TIMESTAMP FROM rounds")
    rows = con.execute(
        f"SELECT run_id, max(started_at) s FROM ({' UNION ALL '.join(parts)}) GROUP BY run_id "
        "ORDER BY s DESC NULLS LAST, run_id").fetchall()
    return [r[0] for r in rows]


def _check_runs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[str]:
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    run_ids = list(dict.fromkeys(run_ids))
    if not run_ids:
        raise AnalysisError("no run ids given")
    known = known_runs(con)
    known_set = set(known)
    for rid in run_ids:
        if rid not in known_set:
            shown = ", ".join(known[:10]) + (f", … ({len(known)} in all)" if len(known) > 10 else "")
            raise AnalysisError(f"run {rid!r} is not in {_db_name(con)}; known runs: {shown or '(none)'}")
    return run_ids


def tables_of(con: duckdb.DuckDBPyConnection, run_id: str) -> RunTables:
    """The run's declared tables and its simulation's hints (AnalysisError for an unknown run)."""
    _check_runs(con, [run_id])
    return run_tables(con, run_id)


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
        raise AnalysisError(f"run {rt.run_id!r}: simulation {rt.spec.simulation!r} declares no measure "
                            "(an outcome column) to summarise")


# --- run header -----------------------------------------------------------------------
def run_info(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """The run's header: ``run_id, name, simulation, status, reason, started_at, finished_at,
    hosts, agents, rounds, seed, model`` (dict)``, prompt`` (dict or None)``, population`` (dict
    or None)``, params`` (the simulation's own config sections)``, config`` (the whole
    RunConfig as a dict)``, manifest`` (dict or None), and how to read its results:
    ``outcome_table, summary_table, measure, measure_kind`` (numeric|categorical|None)``,
    grouped, noun`` ("guess")``, labels`` (summary column -> title)``, reference_columns,
    trend_columns, equilibrium, measure_range, measure_type, loaded`` (its class was importable here)``,
    note`` (why hints are missing)``, legacy`` (a run from before tables_json),
    description`` (the simulation's one line on what was played, or None)``, usage`` (``run_usage``)."""
    _check_runs(con, [run_id])
    rt = run_tables(con, run_id)
    row = _rows(con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])) if _has_table(con, "runs") else []
    r = row[0] if row else {"run_id": run_id}
    cfg = rt.config
    prompt = cfg.get("prompt")
    population = cfg.get("population")
    return {
        "run_id": run_id,
        "name": cfg.get("name"),
        "simulation": rt.simulation,
        "status": r.get("status"),
        "reason": r.get("reason"),
        "started_at": r.get("started_at"),
        "finished_at": r.get("finished_at"),
        "hosts": list(r.get("hosts") or []),
        "agents": cfg.get("agents"),
        "rounds": cfg.get("rounds"),
        "seed": cfg.get("seed"),
        "model": cfg.get("model") if isinstance(cfg.get("model"), dict) else {},
        "prompt": prompt if isinstance(prompt, dict) else ({"variant": prompt} if prompt else None),
        "population": population if isinstance(population, dict) else (
            {"source": population} if population else None),
        "params": rt.params or {k: v for k, v in cfg.items() if k not in PLATFORM_KEYS},
        "outcome_table": rt.spec.outcomes,
        "summary_table": rt.spec.rounds,
        "measure": rt.measure,
        "measure_kind": rt.kind,
        "measure_type": rt.measure_type,
        "grouped": rt.grouped,
        "noun": rt.noun,
        "labels": dict(rt.labels),
        "reference_columns": list(rt.reference),
        "trend_columns": list(rt.trend),
        "equilibrium": rt.equilibrium,
        "measure_range": list(rt.measure_range) if rt.measure_range else None,
        "loaded": rt.loaded,
        "note": rt.note,
        "legacy": rt.legacy,
        "description": rt.description,
        "config": cfg,
        "manifest": loads(r.get("manifest_json")),
        "usage": run_usage(con, run_id),
        "graph": graph_info(con, run_id, loads(r.get("manifest_json")), len(r.get("hosts") or [])),
    }


def graph_info(con: duckdb.DuckDBPyConnection, run_id: str, manifest: dict | None, hosts: int) -> dict | None:
    """A run with a graph: what the manifest says of it (generator, edges, how agents were
    numbered), the fraction of edges cut by an even split over the run's hosts — with the
    graph-aware numbering and with the generator's own ids — and its posts: how many were
    stored and how many an agent heard on average."""
    g = (manifest or {}).get("graph")
    if not g:
        return None
    k = str(max(hosts, 1))
    cut = (g.get("edge_cut") or {}).get(k)
    ids = (g.get("edge_cut_ids") or {}).get(k)
    posts = None
    if _has_table(con, "posts"):
        row = con.execute("SELECT count(*), count(text), avg(heard) FILTER (WHERE round > 1) FROM posts "
                          "WHERE run_id = ?", [run_id]).fetchone()
        posts = {"rows": row[0], "posts": row[1], "mean_heard": row[2]}
    return {**g, "hosts": int(k), "cut": cut, "cut_ids": ids, "stored": posts}


def _last_round(con: duckdb.DuckDBPyConnection, rt: RunTables) -> int | None:
    row = con.execute(f"SELECT max(round) FROM {q(rt.spec.rounds)} WHERE run_id = ?", [rt.run_id]).fetchone()
    if row and row[0] is not None:
        return int(row[0])
    row = con.execute(f"SELECT max(round) FROM {q(rt.spec.outcomes)} WHERE run_id = ?", [rt.run_id]).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def last_round(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The run's last closed round (its summary table), else the last round with outcomes."""
    return _last_round(con, tables_of(con, run_id))


# --- categorical options --------------------------------------------------------------
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


def _usage_columns(con: duckdb.DuckDBPyConnection, rt: RunTables) -> tuple[str, ...]:
    """The round table's usage columns: all of them, or none in a file from before they existed."""
    have = set(table_columns(con, rt.spec.rounds))
    return Usage.RECORDED if have.issuperset(Usage.RECORDED) else ()


def _simulation_error(con: duckdb.DuckDBPyConnection, rt: RunTables) -> str:
    """SQL: the row's error is the simulation's own (its turn raised, or returned a value that
    does not fit its column, options or range: 'agent: …'), not the model's invalid answer."""
    return "coalesce(error LIKE 'agent:%', false)" if "error" in table_columns(con, rt.spec.outcomes) else "false"


def run_usage(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    """The run's LLM work over its closed rounds and what went wrong, in three classes:
    ``llm_calls, prompt_tokens, completion_tokens``; ``infra_retries`` (prompts asked again
    because no model answered: the infrastructure's failures, never recorded as answers);
    ``invalid_answers`` (recorded rows the model answered and the simulation could not read:
    the model's failures); ``simulation_errors`` (rows the simulation's own code failed on,
    error 'agent: …': the author's bugs, the model was not at fault). None for a run recorded
    before usage was."""
    _check_runs(con, [run_id])
    rt = run_tables(con, run_id)
    usage = _usage_columns(con, rt)
    if not usage:
        return None
    sums = con.execute(f"SELECT {', '.join(f'coalesce(sum({q(c)}), 0)' for c in usage)} FROM {q(rt.spec.rounds)} "
                       "WHERE run_id = ?", [run_id]).fetchone()
    out = {c: int(v) for c, v in zip(usage, sums, strict=True)}
    ours = _simulation_error(con, rt)
    invalid, errors = con.execute(f"SELECT count(*) FILTER (WHERE NOT valid AND NOT {ours}), "
                                  f"count(*) FILTER (WHERE NOT valid AND {ours}) FROM {q(rt.spec.outcomes)} "
                                  "WHERE run_id = ?", [run_id]).fetchone()
    out["invalid_answers"], out["simulation_errors"] = int(invalid), int(errors)
    return out


def _leader(counts: dict[str, int]) -> tuple[str | None, int]:
    real = {o: c for o, c in counts.items() if o != OTHER}
    top = max(real.values(), default=0)
    leaders = [o for o, c in real.items() if c == top]
    return (leaders[0] if len(leaders) == 1 and top > 0 else None), top  # a tie has no leader


# --- per round ------------------------------------------------------------------------
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
                                          infra_retries} of the closed round (None while open,
                                          or when the run was recorded before usage was)

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
        d["usage"] = ({c: int(row["u_" + c] or 0) for c in usage} if row["closed_"] and usage else None)
        out.append(d)
    if rt.kind == "categorical":
        _add_shares(con, rt, out)
    return out


def _add_shares(con: duckdb.DuckDBPyConnection, rt: RunTables, rows: list[dict]) -> None:
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
    _add_shares(con, rt, [row])
    return {k: v for k, v in row.items() if k != "round"}


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


def histogram_of(con: duckdb.DuckDBPyConnection, rt: RunTables, rounds: Sequence[int], lo: float, hi: float,
                 bins: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """``histogram`` of a run whose tables the caller has (``run_tables``, hints or not)."""
    _need_measure(rt)
    run_id = rt.run_id
    if rt.kind != "numeric":
        raise AnalysisError(f"run {run_id!r}: measure {rt.measure!r} is categorical, it has no histogram")
    lo, hi, bins = float(lo), float(hi), int(bins)
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo and bins >= 1):
        raise AnalysisError(f"histogram: needs lo < hi and bins >= 1 (got {lo}, {hi}, {bins})")
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


# --- attributes and grouping ----------------------------------------------------------
def _keys_in(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], column: str) -> list[str]:
    if not _has_table(con, "agent_profiles"):
        return []
    rows = con.execute(
        f"SELECT json_keys({column}) AS k, min(agent_id) AS first FROM agent_profiles "
        f"WHERE run_id IN (SELECT unnest($1)) AND json_type({column}) = 'OBJECT' "
        "GROUP BY k ORDER BY first", [list(run_ids)]).fetchall()
    seen: dict[str, None] = {}
    for keys, _ in rows:
        for k in keys or []:
            seen.setdefault(k, None)
    return list(seen)


def attributes(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """The profile attribute names present in the run (as sampled from the population config,
    e.g. ``["education", "age", "gender"]``), in the order the first profile lists them;
    ``[]`` for a run without a population."""
    _check_runs(con, [run_id])
    return _keys_in(con, [run_id], "profile")


def group_attributes(con: duckdb.DuckDBPyConnection, run_id: str | Sequence[str]) -> list[str]:
    """Everything ``group_table`` accepts as ``by``: profile attributes, then the persona's
    own fields (name, gender, age, description, …) not already in the profile."""
    run_ids = _check_runs(con, [run_id] if isinstance(run_id, str) else run_id)
    out = dict.fromkeys(_keys_in(con, run_ids, "profile"))
    out.update(dict.fromkeys(_keys_in(con, run_ids, "persona")))
    return list(out)


def _json_path(key: str) -> str:
    return '$."' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _age_label(x: float) -> tuple[str, float]:
    """An age → ("18-29", sort key)."""
    if x < AGE_EDGES[0]:
        return f"under {AGE_EDGES[0]}", -1.0
    for lo, hi in pairwise(AGE_EDGES):
        if x < hi:
            return f"{lo}-{hi - 1}", float(lo)
    return f"{AGE_EDGES[-1]}+", float(AGE_EDGES[-1])


def _education_rank(label: str) -> int | None:
    low = label.lower()
    for rank, keys in enumerate(EDUCATION_LADDER):
        if any(k in low for k in keys):
            return rank
    return None


def _labels_for(by: str, raw_values: list) -> tuple[dict, list[str]]:
    """Map each distinct parsed attribute value to a group label, and order the labels.

    Strings and booleans are their own groups. Numbers: ``age``-like attributes in decade bins
    (18-29, 30-39, …, 80+); other numeric attributes with few distinct values one group each,
    else five equal-width bins. Missing → "(none)", always last."""
    present = [v for v in raw_values if v is not None]
    mapping: dict = {}
    keys: dict[str, tuple] = {}
    numeric = bool(present) and all(_is_number(v) for v in present)
    name = by.lower()
    if numeric and (name == "age" or name.startswith("age_") or name.endswith("_age")):
        for v in present:
            label, k = _age_label(float(v))
            mapping[v] = label
            keys[label] = (0, k, label)
    elif numeric and len(set(present)) <= MAX_EXACT_NUMERIC:
        for v in present:
            label = _fmt_num(float(v))
            mapping[v] = label
            keys[label] = (0, float(v), label)
    elif numeric:
        arr = np.array([float(v) for v in present])
        lo, hi = float(arr.min()), float(arr.max())
        integer = all(float(v).is_integer() for v in present)
        edges = np.linspace(lo, hi, NUMERIC_BINS + 1)
        if integer:
            edges = np.unique(np.round(edges))
        for v in present:
            i = min(int(np.searchsorted(edges, float(v), side="right")) - 1, len(edges) - 2)
            a, b = edges[i], edges[i + 1]
            last = i == len(edges) - 2
            if integer:
                label = f"{_fmt_num(a)}-{_fmt_num(b if last else b - 1)}"
            else:
                label = f"{a:.3g}-{b:.3g}"
            mapping[v] = label
            keys[label] = (0, float(a), label)
    else:
        def text(v) -> str:
            if isinstance(v, str):
                return v
            return json.dumps(v, ensure_ascii=False)
        labels = {v if not isinstance(v, (dict, list)) else json.dumps(v, sort_keys=True): text(v)
                  for v in present}
        ranks = {lab: _education_rank(lab) for lab in labels.values()}
        ordinal = "educ" in name and all(r is not None for r in ranks.values())
        for v, lab in labels.items():
            mapping[v] = lab
            keys[lab] = (0, ranks[lab] if ordinal else 0, lab.lower(), lab)
    mapping[None] = NONE_GROUP
    keys.setdefault(NONE_GROUP, (1,))
    order = sorted(keys, key=lambda lab: keys[lab])
    return mapping, order


def _parse_attr(text: str | None):
    if text is None:
        return None
    try:
        v = json.loads(text)
    except ValueError:
        return text
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _same_tables(rts: list[RunTables]) -> RunTables:
    first = rts[0]
    for rt in rts[1:]:
        if (rt.spec.outcomes, rt.measure, rt.kind) != (first.spec.outcomes, first.measure, first.kind):
            raise AnalysisError(
                f"runs {first.run_id!r} and {rt.run_id!r} cannot be compared: {first.run_id} records "
                f"{first.measure!r} in {first.spec.outcomes!r} ({first.spec.simulation}), {rt.run_id} records "
                f"{rt.measure!r} in {rt.spec.outcomes!r} ({rt.spec.simulation})")
    return first


def _picks(con: duckdb.DuckDBPyConnection, rts: list[RunTables], round: int | None) -> list[tuple[str, int]]:
    """(run, round) to compare: the given round (checked) or each run's last."""
    picks = []
    for rt in rts:
        if round is not None:
            have = [x[0] for x in con.execute(
                f"SELECT DISTINCT round FROM {q(rt.spec.outcomes)} WHERE run_id = ? ORDER BY 1",
                [rt.run_id]).fetchall()]
            if round not in have:
                span = f"rounds {have[0]}..{have[-1]}" if have else f"no {rt.nouns}"
                raise AnalysisError(f"round {round} is not in run {rt.run_id!r} ({span})")
            picks.append((rt.run_id, int(round)))
        else:
            r = _last_round(con, rt)
            if r is not None:  # a run without any outcome contributes nothing
                picks.append((rt.run_id, r))
    return picks


def _grouped_base(rt: RunTables, value_expr: str) -> str:
    """SQL (a CTE body) of the valid answers of the picked (run, round)s with the attribute's
    JSON text: columns run_id, attr, v. Binds $runs, $rounds, $path."""
    return f"""
        SELECT o.run_id,
               CAST(coalesce(json_extract(p.profile, $path), json_extract(p.persona, $path)) AS VARCHAR) AS attr,
               {value_expr} AS v
        FROM {q(rt.spec.outcomes)} o
        JOIN (SELECT unnest($runs) AS run_id, unnest($rounds) AS round) k
          ON o.run_id = k.run_id AND o.round = k.round
        LEFT JOIN (SELECT run_id, agent_id, any_value(profile) AS profile, any_value(persona) AS persona
                   FROM agent_profiles WHERE run_id IN (SELECT unnest($runs)) GROUP BY run_id, agent_id) p
          ON p.run_id = o.run_id AND p.agent_id = o.agent_id
        WHERE o.valid AND o.{q(rt.measure)} IS NOT NULL"""


def group_points(con: duckdb.DuckDBPyConnection, run_id: str, by: str, round_: int | None = None
                 ) -> dict[str, list[float]]:
    """``{group label: [value, …]}`` of a numeric measure in one round (default: the last),
    labelled as ``group_table(con, run_id, by)`` labels its groups (the same helpers, so a figure's
    points and its table cannot disagree): what a figure shows of a small group beside its mean."""
    rt = tables_of(con, run_id)
    round_ = last_round(con, run_id) if round_ is None else round_
    if round_ is None or rt.kind != "numeric":
        return {}
    params = {"runs": [run_id], "rounds": [round_], "path": _json_path(by)}
    rows = _run(con, f"{_grouped_base(rt, 'o.' + q(rt.measure))} ORDER BY o.agent_id", params).fetchall()
    texts = {attr for _, attr, _ in rows if attr is not None and attr != "null"}
    parsed = {t: _parse_attr(t) for t in texts}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    out: dict[str, list[float]] = {label: [] for label in order}
    for _, attr, value in rows:
        label = mapping[hashable[attr]] if attr in hashable else NONE_GROUP
        out.setdefault(label, []).append(float(value))
    return {label: values for label, values in out.items() if values}


def group_table(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str], by: str,
                round: int | None = None, level: float = LEVEL) -> list[dict]:
    """The measure per group of attribute ``by`` (looked up in each agent's profile, then its
    persona), over the valid answers of one round of each run (``round=None``: each run's last
    round). Groups come in a sensible order (education levels by rank, ages by bin, others
    alphabetically; "(none)" — agents without the attribute — last).

    Numeric measure: one dict per group::

        group        label, e.g. "Ph.D." or "30-39"
        n            agents with a valid answer, pooled over the runs
        mean, median, std        over those agents (std: sample)
        ci_low, ci_high          95% Student-t CI of the mean across agents (None for n < 2)
        n_runs       runs in which the group has at least one valid answer
        run_means    {run_id: the group's mean in that run}        (None for a single run)
        seed_mean    mean of run_means                              (None for a single run)
        seed_ci_low, seed_ci_high  95% Student-t CI across runs (seeds)  (None for a single run
                     or a group seen in fewer than 2 runs)

    Categorical measure: one dict per group and option (every option for every group, zeros
    included)::

        group, option
        n            the group's valid answers, pooled over the runs
        count        of them, this option
        share, ci_low, ci_high   count / n with its 95% Wilson score interval
        n_runs, run_shares, seed_mean, seed_ci_low, seed_ci_high
                     as above, for the option's share in each run (Student-t across runs,
                     cut to [0, 1])

    Raises AnalysisError for an unknown run, an attribute no agent has, a round a run does not
    have, or runs that record different measures."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    rts = [run_tables(con, rid) for rid in run_ids]
    rt = _same_tables(rts)
    _need_measure(rt)
    available = group_attributes(con, run_ids)
    if by not in available:
        raise AnalysisError(
            f"attribute {by!r} is not in the profiles of run(s) {', '.join(run_ids)}; "
            f"available: {', '.join(available) if available else '(none: these runs have no population)'}")
    picks = _picks(con, rts, round)
    if not picks:
        return []
    params = {"runs": [p[0] for p in picks], "rounds": [p[1] for p in picks], "path": _json_path(by)}
    # 1. the attribute's distinct values (few), labelled in Python (bins, ranks) …
    if rt.kind == "categorical":
        # options in the order of the runs' round tables (frequency over every round), so colours
        # and columns stay the same from table to table
        options = _options(con, f"SELECT {_measure_expr(rt, 'o')} AS v FROM {q(rt.spec.outcomes)} o "
                                f"WHERE list_contains($runs, o.run_id) AND o.valid AND o.{q(rt.measure)} IS NOT NULL",
                           params, rt.spec.measure_options)
        params["opts"] = options
        value = _option_expr(rt, options)
    else:
        options = []
        value = f"o.{q(rt.measure)}"
    base = _grouped_base(rt, value)
    distinct = [r[0] for r in _run(con, f"WITH b AS ({base}) SELECT DISTINCT attr FROM b", params).fetchall()]
    present = [a for a in distinct if a is not None and a != "null"]  # JSON null: no attribute
    parsed = {t: _parse_attr(t) for t in present}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    # 2. … and the labels handed back to DuckDB, which aggregates per label (and run)
    params["attrs"] = present
    params["labels"] = [mapping[hashable[t]] for t in present]
    labelled = f"""
        WITH b AS ({base}),
             lab AS (SELECT unnest($attrs) AS attr, unnest($labels) AS label),
             x AS (SELECT b.run_id, coalesce(lab.label, '{NONE_GROUP}') AS label, b.v
                   FROM b LEFT JOIN lab ON b.attr = lab.attr)"""
    multi = len(run_ids) > 1
    if rt.kind == "numeric":
        return _numeric_groups(con, labelled, params, order, run_ids, multi, level)
    return _categorical_groups(con, labelled, params, order, options, run_ids, multi, level)


def _numeric_groups(con, labelled: str, params: dict, order: list[str], run_ids: list[str], multi: bool,
                    level: float) -> list[dict]:
    rows = _run(con,
        f"""{labelled}
        SELECT label, run_id, grouping(run_id) AS pooled, count(v) AS n, avg(v) AS mean,
               quantile_cont(v, 0.5) AS median, stddev_samp(v) AS std
        FROM x GROUP BY GROUPING SETS ((label), (label, run_id))""", params).fetchall()
    pooled = {r[0]: r for r in rows if r[2]}
    per_run: dict[str, dict[str, float]] = {}
    for label, rid, is_pooled, n, mean, _, _ in rows:
        if not is_pooled and n:
            per_run.setdefault(label, {})[rid] = float(mean)
    out = []
    for lab in order:
        if lab not in pooled:
            continue
        _, _, _, n, mean, median, std = pooled[lab]
        n, mean, median, std = int(n), _num(mean), _num(median), _num(std)
        low, high = t_interval(mean, std, n, level)
        row = {"group": lab, "n": n, "mean": mean, "ci_low": low, "ci_high": high, "median": median, "std": std,
               "n_runs": len(per_run.get(lab, {})),
               "run_means": None, "seed_mean": None, "seed_ci_low": None, "seed_ci_high": None}
        if multi:
            rm = {rid: per_run[lab][rid] for rid in run_ids if rid in per_run.get(lab, {})}
            sci = mean_ci(list(rm.values()), level)
            row.update(run_means=rm, seed_mean=sci["mean"], seed_ci_low=sci["low"], seed_ci_high=sci["high"])
        out.append(row)
    return out


def _categorical_groups(con, labelled: str, params: dict, order: list[str], options: list[str],
                        run_ids: list[str], multi: bool, level: float) -> list[dict]:
    rows = _run(con,
        f"""{labelled}
        SELECT label, run_id, v, grouping(run_id) AS pooled, count(*) AS c
        FROM x GROUP BY GROUPING SETS ((label, v), (label, run_id, v))""", params).fetchall()
    pooled: dict[str, dict[str, int]] = {}
    per_run: dict[str, dict[str, dict[str, int]]] = {}
    for label, rid, opt, is_pooled, c in rows:
        if is_pooled:
            pooled.setdefault(label, {})[opt] = int(c)
        else:
            per_run.setdefault(label, {}).setdefault(rid, {})[opt] = int(c)
    out = []
    for lab in order:
        if lab not in pooled:
            continue
        n = sum(pooled[lab].values())
        runs = per_run.get(lab, {})
        for opt in options:
            k = pooled[lab].get(opt, 0)
            ci = share_ci(k, n, level)
            row = {"group": lab, "option": opt, "n": n, "count": k, "share": ci["share"],
                   "ci_low": ci["low"], "ci_high": ci["high"], "n_runs": len(runs),
                   "run_shares": None, "seed_mean": None, "seed_ci_low": None, "seed_ci_high": None}
            if multi:
                # each run (seed) is one replicate: the share's mean across runs and its t interval
                rs = {rid: runs[rid].get(opt, 0) / sum(runs[rid].values()) for rid in run_ids if rid in runs}
                sci = mean_ci(list(rs.values()), level)
                # with few runs the t interval easily passes 0 or 1 (2 runs: t = 12.7); a share cannot,
                # so the interval is cut to [0, 1]
                low = None if sci["low"] is None else max(0.0, sci["low"])
                high = None if sci["high"] is None else min(1.0, sci["high"])
                row.update(run_shares=rs, seed_mean=sci["mean"], seed_ci_low=low, seed_ci_high=high)
            out.append(row)
    return out


# --- convergence ----------------------------------------------------------------------
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


# --- a fork beside its parent -------------------------------------------------------------
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


# --- groups of a grouped simulation -----------------------------------------------------
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


__all__ = [
    "AGE_EDGES", "MAX_OPTIONS", "NONE_GROUP", "OTHER", "attributes", "convergence_table", "group_attributes",
    "group_spread", "group_table", "guesses", "histogram", "invalid_answers", "known_runs", "last_round",
    "measure_values", "round_table", "run_info", "tables_of",
]
