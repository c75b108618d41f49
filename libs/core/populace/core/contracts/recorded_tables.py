"""What a simulation records: its tables and columns, declared by the simulation and carried by
RunStarted, so the recorder stores any simulation without importing it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from populace.core.contracts.run_config import Usage
from populace.core.contracts.wire_base import FiniteFloat, Strict

# The platform's columns of every round table; a simulation's summary takes other names.
PLATFORM_SUMMARY_COLUMNS = ("run_id", "round", "n", "n_valid", *Usage.RECORDED, "closed_at")
# A DuckDB identifier we create tables and columns with (quoted, but kept plain on purpose).
Identifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]{0,62}$")]
# `<type>[]`: a DuckDB LIST of that type (an outcome's `list[int]` …)
ColumnType = Literal["DOUBLE", "BIGINT", "VARCHAR", "BOOLEAN", "JSON", "DOUBLE[]", "BIGINT[]", "VARCHAR[]",
                     "BOOLEAN[]"]


class Column(Strict):
    name: Identifier
    type: ColumnType


class SimulationTables(Strict):
    """Where and how a run's results are stored: one row per agent per round in `outcomes`
    (the platform's columns plus the simulation's), one row per round in `rounds` (the
    platform's counts plus the simulation's summary). The recorder needs nothing else, so it
    records any simulation without importing it."""

    simulation: str
    outcomes: Identifier
    outcome_columns: list[Column]
    rounds: Identifier
    summary_columns: list[Column]
    grouped: bool = False  # outcome rows carry the agent's group id (nested group envs)
    measure: str | None = None  # the outcome column analysis summarises first
    measure_kind: Literal["numeric", "categorical"] | None = None
    # A run's declared range of its numeric measure (the simulation's measure_range for the
    # run's parameters): a valid value outside it is impossible, so the recorder refuses it.
    measure_range: tuple[FiniteFloat, FiniteFloat] | None = None
    levels: list[Identifier] = []  # nested groups: the outer levels, each recorded as `<level>_id`
    acts: Identifier | None = None  # scenes: one row per act (the platform's columns plus the Act's)
    act_columns: list[Column] = []
    edge_kinds: list[Identifier] = []  # graphs that change: the kinds recorded in table `edges`
    # A run's declared answers of its categorical measure, in the order reports list them (the
    # simulation's measure_options): a valid value outside them is impossible, refused likewise.
    measure_options: list[Annotated[str, Field(max_length=1000)]] | None = Field(None, max_length=1000)
    # Who may be in which group (populace.sdk.groups.GroupLayout, for the run's parameters): agents
    # per group at each level, innermost first, and the block groups are drawn in again each round.
    # The recorder refuses a group an agent cannot be in (a host claiming another host's group to
    # write in its transcript). Empty: not declared (a run recorded before), nothing checked.
    group_sizes: list[Annotated[int, Field(ge=1)]] = Field([], max_length=16)
    group_block: int | None = Field(None, ge=1)
    # a prototype run (issue 39): its outcome rows say whose answer each is (populace.core.contracts.
    # PROTOTYPE_COLUMNS), and its audits are recorded apart (table `audits`)
    prototypes: bool = False
    # who saw what: the world column whose values a view's `show(...)` names; each acting agent's
    # shown items are recorded in table `shown` (None: the simulation records none)
    shown_items: Identifier | None = None
