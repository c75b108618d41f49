"""Populace analysis: per-round statistics, per-group means or shares with confidence intervals,
convergence, and the HTML report, for any simulation.

A library: pure functions (``stats``) and reads from a DuckDB connection to the recorder's
file (``queries``, ``report``, ``export``). Each run is read from the tables its simulation
declared (``runs.tables_json``; ``tables``): its measure is summarised as numbers (mean, median,
Student-t CIs) or as categories (shares, Wilson CIs). Open the file read-only::

    import duckdb
    from populace.analysis import group_table, round_table, write_report

    with duckdb.connect("populace.duckdb", read_only=True) as con:
        round_table(con, "run-1")                          # list of dicts, one per round
        group_table(con, ["run-1", "run-2"], "education")  # CIs across agents and across seeds
        write_report(con, "run-1", "report.html")

Errors a user can cause (unknown run, attribute, round) raise ``AnalysisError`` (a ValueError).
"""

from populace.analysis.calls import call_stats, model_of, total_calls
from populace.analysis.export import PLATFORM_TABLES, TABLES, export_parquet
from populace.analysis.queries import (
    NONE_GROUP,
    OTHER,
    attributes,
    convergence_table,
    fork_of,
    fork_table,
    group_attributes,
    group_spread,
    group_table,
    guesses,
    histogram,
    invalid_answers,
    known_runs,
    last_round,
    measure_values,
    round_table,
    run_info,
    run_usage,
    tables_of,
)
from populace.analysis.report import describe, render_report, write_report
from populace.analysis.stats import (
    AnalysisError,
    mean_ci,
    share_ci,
    summary,
    t_interval,
    wilson_interval,
)
from populace.analysis.tables import LEGACY_TABLES, RunTables

__all__ = [
    "LEGACY_TABLES",
    "NONE_GROUP",
    "OTHER",
    "PLATFORM_TABLES",
    "TABLES",
    "AnalysisError",
    "RunTables",
    "attributes",
    "call_stats",
    "convergence_table",
    "describe",
    "export_parquet",
    "fork_of",
    "fork_table",
    "group_attributes",
    "group_spread",
    "group_table",
    "guesses",
    "histogram",
    "invalid_answers",
    "known_runs",
    "last_round",
    "mean_ci",
    "measure_values",
    "model_of",
    "render_report",
    "round_table",
    "run_info",
    "run_usage",
    "share_ci",
    "summary",
    "t_interval",
    "tables_of",
    "total_calls",
    "wilson_interval",
    "write_report",
]
