"""Populace analysis: per-round statistics, per-group means with confidence intervals, convergence, and the HTML report.

A library: pure functions (``stats``) and reads from a DuckDB connection to the recorder's
file (``queries``, ``report``, ``export``). Open the file read-only::

    import duckdb
    from populace.analysis import group_table, round_table, write_report

    with duckdb.connect("populace.duckdb", read_only=True) as con:
        round_table(con, "run-1")                          # list of dicts, one per round
        group_table(con, ["run-1", "run-2"], "education")  # CIs across agents and across seeds
        write_report(con, "run-1", "report.html")

Errors a user can cause (unknown run, attribute, round) raise ``AnalysisError`` (a ValueError).
"""

from populace.analysis.export import TABLES, export_parquet
from populace.analysis.queries import (
    NONE_GROUP,
    attributes,
    convergence_table,
    group_attributes,
    group_table,
    guesses,
    invalid_answers,
    known_runs,
    last_round,
    round_table,
    run_info,
)
from populace.analysis.report import game_text, render_report, write_report
from populace.analysis.stats import AnalysisError, equilibrium, mean_ci, summary, t_interval

__all__ = [
    "NONE_GROUP",
    "TABLES",
    "AnalysisError",
    "attributes",
    "convergence_table",
    "equilibrium",
    "export_parquet",
    "game_text",
    "group_attributes",
    "group_table",
    "guesses",
    "invalid_answers",
    "known_runs",
    "last_round",
    "mean_ci",
    "render_report",
    "round_table",
    "run_info",
    "summary",
    "t_interval",
    "write_report",
]
