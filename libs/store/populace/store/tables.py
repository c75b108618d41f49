"""Where a run's results are and how to read them: its declared tables (``runs.tables_json``,
a ``SimulationTables``) as the store recorded them. What its simulation class adds for reports
(summary field titles, reference columns, equilibrium) is the analysis library's
(``populace.analysis.tables.run_tables``): the store loads no simulation.

A database written before simulations were pluggable has no ``tables_json``: its runs are
the ratio game's, in the historic tables ``guesses`` and ``rounds``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

import duckdb
from pydantic import ValidationError

from populace.core.contracts import Column, RunConfig, SimulationTables


class QueryError(ValueError):
    """A read the store cannot answer (unknown run, attribute or round, bad argument). The
    message says what was asked and what is available. (The analysis library's AnalysisError
    is this class.)"""


RATIO_GAME = "ratio-game"

# The ratio game's tables as every release has written them; runs without tables_json are these.
LEGACY_TABLES = SimulationTables(
    simulation=RATIO_GAME, outcomes="guesses", outcome_columns=[Column(name="value", type="DOUBLE")],
    rounds="rounds",
    summary_columns=[Column(name="mean", type="DOUBLE"), Column(name="target", type="DOUBLE"),
                     Column(name="winner_agent_id", type="BIGINT"), Column(name="winner_value", type="DOUBLE"),
                     Column(name="n_winners", type="BIGINT")],
    measure="value", measure_kind="numeric")

NUMERIC_TYPES = ("DOUBLE", "BIGINT", "INTEGER")


def q(name: str) -> str:
    """A quoted identifier. Table and column names come from a validated SimulationTables
    ([a-z_][a-z0-9_]*), so quoting is enough."""
    return '"' + name.replace('"', '""') + '"'


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND database_name = current_database()",
        [name]).fetchone()[0])


def table_columns(con: duckdb.DuckDBPyConnection, name: str) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND database_name = current_database() "
        "ORDER BY column_index", [name]).fetchall()]


def loads(text) -> dict | None:
    if text is None:
        return None
    if isinstance(text, dict):
        return text
    try:
        out = json.loads(text)
    except (TypeError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def plural(noun: str) -> str:
    """An English plural, good enough for titles: guess → guesses, choice → choices."""
    if re.search(r"(s|x|z|ch|sh)$", noun):
        return noun + "es"
    if re.search(r"[^aeiou]y$", noun):
        return noun[:-1] + "ies"
    return noun + "s"


def words(class_name: str) -> str:
    """'VoteChoice' -> 'vote choice'."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", class_name).lower()


@dataclass(frozen=True)
class RunTables:
    """A run's tables and how to present them."""

    run_id: str
    spec: SimulationTables
    simulation: str  # as the scenario named it (entry point or import path)
    config: dict  # the run's RunConfig as recorded (JSON)
    measure: str | None  # the outcome column summarised first (None: the simulation declares none)
    kind: Literal["numeric", "categorical"] | None
    measure_type: str | None  # its column type (DOUBLE, BIGINT, VARCHAR …)
    noun: str  # what one answer is called in titles: "guess", "contribution", "choice"
    labels: dict[str, str]  # summary column -> its title (the Summary field's, else the name)
    reference: tuple[str, ...]  # numeric summary columns drawn on the measure's axis
    trend: tuple[str, ...]  # summary columns drawn over rounds (reference + the simulation's trend columns)
    equilibrium: float | None
    measure_range: tuple[float, float] | None
    loaded: bool  # the simulation's class was loaded here
    legacy: bool  # a run from before tables_json: the ratio game's historic tables
    note: str | None = None  # why some hints are missing
    description: str | None = None  # one line saying what was played (the simulation's own words)
    params: dict = field(default_factory=dict)  # the simulation's own config sections
    # a simulation on a grid (its `grid(params)` and `grid_columns`): a populace.sdk.space.Grid, and
    # the outcome columns of each agent's cell and of the colour its picture takes
    grid: object | None = None
    grid_columns: tuple[str, str] | None = None

    @property
    def grouped(self) -> bool:
        return self.spec.grouped

    @property
    def nouns(self) -> str:
        return plural(self.noun)

    @property
    def summary_types(self) -> dict[str, str]:
        return {c.name: c.type for c in self.spec.summary_columns}


def _run_row(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    if not has_table(con, "runs"):
        return {}
    cols = table_columns(con, "runs")
    wanted = [c for c in ("config_json", "simulation", "tables_json") if c in cols]
    row = con.execute(f"SELECT {', '.join(wanted)} FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return dict(zip(wanted, row)) if row else {}


def table_base(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[dict, SimulationTables, dict]:
    """The run's declared tables, checked against the database, as RunTables' first fields
    (`base`), its SimulationTables and its config (the caller has checked the run exists). Raises
    QueryError naming the run when its declared tables are unreadable or absent from the database."""
    row = _run_row(con, run_id)
    config = loads(row.get("config_json")) or {}
    legacy = not row.get("tables_json")
    if legacy:
        spec = LEGACY_TABLES
    else:
        try:
            spec = SimulationTables.model_validate_json(row["tables_json"])
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(root)"
            raise QueryError(f"run {run_id!r}: runs.tables_json is not a valid SimulationTables "
                             f"({where}: {first['msg']})") from None
    for table in (spec.outcomes, spec.rounds):
        if not has_table(con, table):
            raise QueryError(f"run {run_id!r}: its simulation {spec.simulation!r} records to table "
                             f"{table!r}, which is not in the database")
    types = {c.name: c.type for c in spec.outcome_columns}
    measure = spec.measure
    if measure is not None and measure not in types:
        raise QueryError(f"run {run_id!r}: measure {measure!r} is not one of its outcome columns "
                         f"({', '.join(types) or 'none'})")
    kind = spec.measure_kind
    if measure is not None and kind is None:
        kind = "numeric" if types[measure] in NUMERIC_TYPES else "categorical"
    simulation = row.get("simulation") or config.get("simulation") or spec.simulation
    base = {"run_id": run_id, "spec": spec, "simulation": simulation, "config": config, "measure": measure,
            "kind": kind, "measure_type": types.get(measure) if measure else None, "legacy": legacy}
    return base, spec, config


def recorded_tables(con: duckdb.DuckDBPyConnection, run_id: str) -> RunTables:
    """The run's tables alone, its simulation not loaded: titles are the column names, no
    reference lines, the declared measure range (what the recorder answers a read with)."""
    base, spec, config = table_base(con, run_id)
    numeric = base["kind"] == "numeric"
    return RunTables(**base, noun=(base["measure"] or "answer").replace("_", " "),
                     labels={c.name: c.name.replace("_", " ") for c in spec.summary_columns},
                     reference=(), trend=(), equilibrium=None,
                     measure_range=tuple(spec.measure_range) if numeric and spec.measure_range else None,
                     loaded=False, params=params_of(config))


def params_of(config: dict) -> dict:
    try:
        return RunConfig.model_validate(config).params
    except ValidationError:
        return {}
