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

from __future__ import annotations

from importlib import import_module

# Each name from the module that defines it, imported on first use (PEP 562): a process that
# needs one light part (the recorder: the interviews' table schema) does not load scipy and
# plotly with the rest, which took seconds at every service start.
_HOMES = {
    "populace.analysis.calls": ("call_stats", "model_of", "model_stats", "total_calls"),
    "populace.analysis.export": ("PLATFORM_TABLES", "TABLES", "export_parquet"),
    "populace.analysis.profile": ("profile_totals", "round_profile"),
    "populace.analysis.prototypes": ("has_prototypes", "prototype_summary", "prototype_table"),
    "populace.analysis.queries": (
        "NONE_GROUP", "OTHER", "attributes", "convergence_table", "fork_of", "fork_table", "group_attributes",
        "group_spread", "group_table", "guesses", "histogram", "invalid_answers", "known_runs", "last_round",
        "measure_values", "round_table", "run_info", "run_usage", "tables_of",
    ),
    "populace.analysis.report": ("describe", "render_report", "write_report"),
    "populace.analysis.stats": ("AnalysisError", "mean_ci", "share_ci", "summary", "t_interval", "wilson_interval"),
    "populace.analysis.tables": ("LEGACY_TABLES", "RunTables"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_HOME_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
    "has_prototypes",
    "histogram",
    "invalid_answers",
    "known_runs",
    "last_round",
    "mean_ci",
    "measure_values",
    "model_of",
    "model_stats",
    "profile_totals",
    "prototype_summary",
    "prototype_table",
    "render_report",
    "round_profile",
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
