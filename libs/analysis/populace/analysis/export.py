"""Parquet export of runs for pandas / polars / DuckDB users.

``export_parquet(con, ["run-1", "run-2"], "out/")`` writes one file per table, filtered to
the given runs: the platform's tables (those absent from an older database file are skipped)
and each run's own tables, named as its simulation declared them::

    out/runs.parquet            run_id, started_at, finished_at, config_json, status, reason,
                                hosts, manifest_json, simulation, tables_json (JSON as text)
    out/agents.parquet          run_id, agent_id, host_id, persona_json
    out/agent_profiles.parquet  run_id, agent_id, persona_index, one column per profile
                                attribute (e.g. education; numbers stay numbers), profile and
                                persona (JSON text, the whole record)
    out/llm_calls.parquet       run_id, round, agent_id, replica, prompt_tokens,
                                completion_tokens, latency_ms, attempts, valid, batch_id
    out/<outcomes>.parquet      run_id, round, agent_id, [group_id], the simulation's outcome
                                columns, valid, raw, latency_ms, error
                                (the ratio game: guesses.parquet, its measure `value`)
    out/<rounds>.parquet        run_id, round, n, n_valid, the simulation's summary columns,
                                closed_at  (the ratio game: rounds.parquet)
    out/shown.parquet           run_id, round, agent_id, items, ranks: who saw what (runs whose
                                simulation declares shown_items; items and ranks are lists)

``runs.tables_json`` says which file holds which run's outcomes and which column is its measure.

Reading them back::

    import pandas as pd
    guesses = pd.read_parquet("out/guesses.parquet")
    profiles = pd.read_parquet("out/agent_profiles.parquet")
    last = guesses[guesses["round"] == guesses["round"].max()].merge(profiles, on=["run_id", "agent_id"])
    last.groupby("education")["value"].agg(["count", "mean", "std"])

    import polars as pl
    g = pl.read_parquet("out/public_goods_outcomes.parquet")
    p = pl.read_parquet("out/agent_profiles.parquet")
    g.filter(pl.col("valid")).join(p, on=["run_id", "agent_id"]).group_by("round", "education").agg(
        pl.col("contribution").mean())

    import duckdb
    duckdb.sql("SELECT round, choice, count(*) FROM 'out/votes.parquet' WHERE valid GROUP BY ALL ORDER BY ALL")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb

from populace.analysis.queries.lookup import _check_runs
from populace.analysis.tables import has_table, q, run_tables

PLATFORM_TABLES = ("runs", "agents", "agent_profiles", "llm_calls")
TABLES = PLATFORM_TABLES  # the tables every export has (each simulation adds its own two)
# a stable row order makes the files diffable and reproducible
ORDER = {
    "runs": "run_id",
    "agents": "run_id, agent_id",
    "agent_profiles": "run_id, agent_id",
    "llm_calls": "run_id, round, agent_id",
}
OUTCOME_ORDER = "run_id, round, agent_id"
SUMMARY_ORDER = "run_id, round"


def _lit(s: str) -> str:
    """A SQL string literal (COPY takes no prepared parameters)."""
    return "'" + str(s).replace("'", "''") + "'"


# JSON value types that become typed columns (anything else, or a mix, is exported as text)
PROFILE_TYPES = {"BIGINT": "BIGINT", "UBIGINT": "BIGINT", "DOUBLE": "DOUBLE", "BOOLEAN": "BOOLEAN"}


def profile_columns(con: duckdb.DuckDBPyConnection, ids: str) -> str:
    """The select list of agent_profiles with each profile attribute as its own typed column
    (a number column where every agent's value is a number, else text), named as the attribute
    (`profile_<name>` where that would clash with a column the table has)."""
    keys = [k for (k,) in con.execute(
        f"SELECT DISTINCT unnest(json_keys(profile)) AS k FROM agent_profiles WHERE run_id IN ({ids}) ORDER BY k"
    ).fetchall()]
    own = {"run_id", "agent_id", "persona_index", "profile", "persona"}
    cols = ["run_id", "agent_id", "persona_index"]
    for key in keys:
        path = _lit("$." + _json_key(key))
        types = {PROFILE_TYPES.get(t) for (t,) in con.execute(
            f"SELECT DISTINCT json_type(profile, {path}) FROM agent_profiles WHERE run_id IN ({ids}) "
            f"AND json_type(profile, {path}) <> 'NULL'").fetchall()}
        kind = "DOUBLE" if types == {"BIGINT", "DOUBLE"} else types.pop() if len(types) == 1 else None
        value = (f"CAST(json_extract(profile, {path}) AS {kind})" if kind
                 else f"json_extract_string(profile, {path})")
        name = f"profile_{key}" if key in own else key
        cols.append(f"{value} AS {q(name)}")
    return ", ".join([*cols, "profile", "persona"])


def _json_key(key: str) -> str:
    """A JSONPath member for any attribute name (quoted: names may hold spaces or dots)."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def export_tables(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> dict[str, str]:
    """{table: ORDER BY columns} of what an export of ``run_ids`` writes (checked runs)."""
    out = {t: ORDER[t] for t in PLATFORM_TABLES if has_table(con, t)}
    for rid in run_ids:
        spec = run_tables(con, rid).spec
        out.setdefault(spec.outcomes, OUTCOME_ORDER)
        out.setdefault(spec.rounds, SUMMARY_ORDER)
        if spec.shown_items is not None and has_table(con, "shown"):
            out.setdefault("shown", OUTCOME_ORDER)
    return out


def export_parquet(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str],
                   out_dir: str | Path) -> list[Path]:
    """Write ``<out_dir>/<table>.parquet`` for the platform's tables (runs, agents,
    agent_profiles, llm_calls) and each run's outcome and summary tables, holding only the rows
    of ``run_ids``. Creates ``out_dir``; overwrites existing files; returns the paths written.
    Raises AnalysisError for an unknown run or a run whose declared tables are missing."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    tables = export_tables(con, run_ids)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = ", ".join(_lit(r) for r in run_ids)
    written = []
    for table, order in tables.items():
        path = out / f"{table}.parquet"
        select = profile_columns(con, ids) if table == "agent_profiles" else "*"
        con.execute(
            f"COPY (SELECT {select} FROM {q(table)} WHERE run_id IN ({ids}) ORDER BY {order}) "
            f"TO {_lit(path)} (FORMAT parquet)")
        written.append(path)
    return written
