"""A run's header (``run_info``): its config, status, manifest, graph and how to read its results;
and its LLM work and what went wrong (``run_usage``)."""

from __future__ import annotations

import duckdb

from populace.analysis.queries.lookup import _check_runs, _has_table
from populace.analysis.tables import RunTables, loads, q, run_tables, table_columns
from populace.core.contracts import Usage
from populace.store.sql_parts import _rows

PLATFORM_KEYS = ("simulation", "name", "agents", "rounds", "seed", "model", "placement", "population", "budget",
                 "graph", "broadcasts")


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


def _usage_columns(con: duckdb.DuckDBPyConnection, rt: RunTables) -> tuple[str, ...]:
    """The round table's usage columns: all of them; in a file from before cached tokens and
    dollars were recorded, the others; none in a file from before usage was."""
    have = set(table_columns(con, rt.spec.rounds))
    return tuple(c for c in Usage.RECORDED if c in have) if have.issuperset(Usage.RECORDED_CORE) else ()


def usage_value(column: str, value: object) -> int | float:
    """A usage column's value as its type: dollars a float, the counts ints (NULL: 0, a row
    written before the column existed)."""
    return float(value or 0.0) if column == "dollars" else int(value or 0)


def _simulation_error(con: duckdb.DuckDBPyConnection, rt: RunTables) -> str:
    """SQL: the row's error is the simulation's own (its turn raised, or returned a value that
    does not fit its column, options or range: 'agent: …'), not the model's invalid answer."""
    return "coalesce(error LIKE 'agent:%', false)" if "error" in table_columns(con, rt.spec.outcomes) else "false"


def run_usage(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    """The run's LLM work over its closed rounds and what went wrong, in three classes:
    ``llm_calls, prompt_tokens, completion_tokens``, ``cached_tokens`` and ``dollars`` (at the
    models' prices; absent in a file from before they were recorded); ``infra_retries`` (prompts asked again
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
    out = {c: usage_value(c, v) for c, v in zip(usage, sums, strict=True)}
    ours = _simulation_error(con, rt)
    invalid, errors = con.execute(f"SELECT count(*) FILTER (WHERE NOT valid AND NOT {ours}), "
                                  f"count(*) FILTER (WHERE NOT valid AND {ours}) FROM {q(rt.spec.outcomes)} "
                                  "WHERE run_id = ?", [run_id]).fetchone()
    out["invalid_answers"], out["simulation_errors"] = int(invalid), int(errors)
    return out
