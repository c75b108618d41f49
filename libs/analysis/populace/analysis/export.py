"""Parquet export of a run's tables for pandas / polars / DuckDB users.

``export_parquet(con, ["run-1", "run-2"], "out/")`` writes one file per table, filtered to
the given runs (tables absent from an older database file are skipped)::

    out/runs.parquet            run_id, started_at, finished_at, config_json, status, reason,
                                hosts, manifest_json   (config/manifest: JSON text)
    out/agents.parquet          run_id, agent_id, host_id, persona_json
    out/agent_profiles.parquet  run_id, agent_id, persona_index, profile, persona (JSON text)
    out/guesses.parquet         run_id, round, agent_id, value (null when invalid), valid, raw,
                                latency_ms
    out/rounds.parquet          run_id, round, n_valid, mean, target, winner_agent_id,
                                winner_value, n, n_winners, closed_at
    out/llm_calls.parquet       run_id, round, agent_id, replica, prompt_tokens,
                                completion_tokens, latency_ms, attempts, valid, batch_id

Reading them back::

    import pandas as pd
    guesses = pd.read_parquet("out/guesses.parquet")
    profiles = pd.read_parquet("out/agent_profiles.parquet")
    profiles["education"] = profiles["profile"].map(lambda s: json.loads(s).get("education"))
    last = guesses[guesses["round"] == guesses["round"].max()].merge(profiles, on=["run_id", "agent_id"])
    last.groupby("education")["value"].agg(["count", "mean", "std"])

    import polars as pl
    g = pl.read_parquet("out/guesses.parquet")
    p = pl.read_parquet("out/agent_profiles.parquet").with_columns(
        pl.col("profile").str.json_path_match("$.education").alias("education"))
    g.filter(pl.col("valid")).join(p, on=["run_id", "agent_id"]).group_by("round", "education").agg(
        pl.col("value").mean())

    import duckdb
    duckdb.sql("SELECT round, avg(value) FROM 'out/guesses.parquet' GROUP BY round ORDER BY round")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb

from populace.analysis.queries import _check_runs, _has_table

TABLES = ("runs", "agents", "agent_profiles", "guesses", "rounds", "llm_calls")
# a stable row order makes the files diffable and reproducible
ORDER = {
    "runs": "run_id",
    "agents": "run_id, agent_id",
    "agent_profiles": "run_id, agent_id",
    "guesses": "run_id, round, agent_id",
    "rounds": "run_id, round",
    "llm_calls": "run_id, round, agent_id",
}


def _lit(s: str) -> str:
    """A SQL string literal (COPY takes no prepared parameters)."""
    return "'" + str(s).replace("'", "''") + "'"


def export_parquet(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str],
                   out_dir: str | Path) -> list[Path]:
    """Write ``<out_dir>/<table>.parquet`` for each of runs, agents, agent_profiles, guesses,
    rounds and llm_calls, holding only the rows of ``run_ids``. Creates ``out_dir``; overwrites
    existing files; returns the paths written. Raises AnalysisError for an unknown run."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = ", ".join(_lit(r) for r in run_ids)
    written = []
    for table in TABLES:
        if not _has_table(con, table):
            continue
        path = out / f"{table}.parquet"
        con.execute(
            f"COPY (SELECT * FROM {table} WHERE run_id IN ({ids}) ORDER BY {ORDER[table]}) "
            f"TO {_lit(path)} (FORMAT parquet)")
        written.append(path)
    return written
