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

One module per family, every public name re-exported here (import from
``populace.analysis.queries``): ``lookup`` (runs and their tables), ``sql_parts`` (what the
tables share), ``run_header``, ``rounds``, ``attribute_groups``, ``convergence``, ``forks`` and
``group_spread``."""

from __future__ import annotations

from populace.analysis.queries.attribute_groups import (
    AGE_EDGES,
    EDUCATION_LADDER,
    LEVEL,
    MAX_EXACT_NUMERIC,
    NONE_GROUP,
    NUMERIC_BINS,
    attributes,
    group_attributes,
    group_points,
    group_table,
)
from populace.analysis.queries.convergence import (
    convergence_table,
)
from populace.analysis.queries.forks import (
    fork_of,
    fork_table,
)
from populace.analysis.queries.group_spread import (
    MAX_GROUP_LINES,
    SPREAD_QUANTILES,
    group_spread,
)
from populace.analysis.queries.lookup import (
    known_runs,
    last_round,
    tables_of,
)
from populace.analysis.queries.rounds import (
    guesses,
    histogram,
    histogram_of,
    invalid_answers,
    measure_values,
    round_shares,
    round_table,
)
from populace.analysis.queries.run_header import (
    PLATFORM_KEYS,
    graph_info,
    run_info,
    run_usage,
)
from populace.analysis.queries.sql_parts import (
    MAX_OPTIONS,
    OTHER,
)

__all__ = [
    "AGE_EDGES",
    "EDUCATION_LADDER",
    "LEVEL",
    "MAX_EXACT_NUMERIC",
    "MAX_GROUP_LINES",
    "MAX_OPTIONS",
    "NONE_GROUP",
    "NUMERIC_BINS",
    "OTHER",
    "PLATFORM_KEYS",
    "SPREAD_QUANTILES",
    "attributes",
    "convergence_table",
    "fork_of",
    "fork_table",
    "graph_info",
    "group_attributes",
    "group_points",
    "group_spread",
    "group_table",
    "guesses",
    "histogram",
    "histogram_of",
    "invalid_answers",
    "known_runs",
    "last_round",
    "measure_values",
    "round_shares",
    "round_table",
    "run_info",
    "run_usage",
    "tables_of",
]
