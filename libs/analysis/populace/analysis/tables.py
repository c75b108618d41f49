"""Where a run's results are and how to read them: its declared tables (``runs.tables_json``,
a ``SimulationTables``, read by the store: ``populace.store.tables``) and what its simulation
class adds for reports when it can be loaded here (summary field titles, reference columns,
equilibrium, the measure's range).

A database written before simulations were pluggable has no ``tables_json``: its runs are
the ratio game's, in the historic tables ``guesses`` and ``rounds``. A simulation that is not
installed where the analysis runs (or whose parameters no longer validate) is analysed from
its tables alone; ``RunTables.note`` says so, and the report shows the note.
"""

from __future__ import annotations

import math

import duckdb

from populace.core.contracts import RunConfig, SimulationTables
from populace.store.tables import (  # noqa: F401 (the names the analysis has always taken from here)
    LEGACY_TABLES,
    NUMERIC_TYPES,
    RATIO_GAME,
    RunTables,
    has_table,
    loads,
    plural,
    q,
    recorded_tables,
    table_base,
    table_columns,
)
from populace.store.tables import params_of as _params_of
from populace.store.tables import words as _words


def _finite(x) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _with_hints(base: dict, spec: SimulationTables, config: dict) -> RunTables:
    """Add what the simulation's class says; fall back to the tables when it cannot load."""
    summary_names = [c.name for c in spec.summary_columns]
    numeric_summary = {c.name for c in spec.summary_columns if c.type in NUMERIC_TYPES}
    labels = {n: n.replace("_", " ") for n in summary_names}
    measure = base["measure"]
    noun = (measure or "answer").replace("_", " ")
    reference: tuple[str, ...] = ()
    trend_extra: tuple[str, ...] = ()
    eq = rng = description = grid = None
    grid_columns = None
    loaded = False
    note = None
    name = base["simulation"]
    params = _params_of(config)
    try:
        from populace.sdk.registry import load_simulation, resolve

        sim = load_simulation(name)
    except Exception as err:
        sim = None
        note = f"simulation {name!r} is not loadable here ({err}); figures use its recorded tables only"
    if sim is not None:
        loaded = True
        for n, f in sim.Summary.model_fields.items():
            if n in labels and f.title:
                labels[n] = f.title
        reference = tuple(c for c in sim.reference_columns if c in numeric_summary)
        trend_extra = tuple(c for c in sim.trend_columns if c in numeric_summary and c not in reference)
        outcome_names = [c.name for c in spec.outcome_columns]
        if len(outcome_names) == 1 and outcome_names[0] == measure:
            # the outcome class holds only the measure, so its name names one answer (Guess)
            noun = _words(sim.Outcome.__name__)
        try:
            resolved = resolve(RunConfig.model_validate(config))
            eq = _finite(sim.equilibrium(resolved.params))
            description = sim.describe(resolved.params)
            r = sim.measure_range(resolved.params)
            rng = (float(r[0]), float(r[1])) if r is not None else None
            grid, grid_columns = _grid_of(sim, resolved.params, spec)
        except Exception as err:
            note = (f"the run's parameters do not validate with the installed {name!r} ({err}); "
                    "no equilibrium or range drawn")
    trend = reference + trend_extra
    if base["kind"] != "numeric":
        eq = rng = None
        reference = trend = ()
    return RunTables(**base, noun=noun, labels=labels, reference=reference, trend=trend, equilibrium=eq,
                     measure_range=rng, loaded=loaded, note=note, params=params, description=description,
                     grid=grid, grid_columns=grid_columns)


def run_tables(con: duckdb.DuckDBPyConnection, run_id: str, hints: bool = True) -> RunTables:
    """The run's tables (the caller has checked the run exists). Raises AnalysisError naming the
    run when its declared tables are unreadable or absent from the database. `hints` False: the
    recorded tables alone, the simulation not loaded (populace.store.tables.recorded_tables)."""
    if not hints:
        return recorded_tables(con, run_id)
    return _with_hints(*table_base(con, run_id))


def _grid_of(sim, params, spec: SimulationTables) -> tuple[object | None, tuple[str, str] | None]:
    """The run's grid and its (cell, colour) outcome columns, when the simulation declares both and
    the recorded table has them (an older run's table may not)."""
    from populace.sdk.space import Grid

    columns = getattr(sim, "grid_columns", None)
    grid = sim.grid(params) if columns else None
    recorded = {c.name for c in spec.outcome_columns}
    if not isinstance(grid, Grid) or not set(columns) <= recorded:
        return None, None
    return grid, (str(columns[0]), str(columns[1]))
