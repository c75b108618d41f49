"""A run's social graph as a scenario declares it: the `graph:` section, validated with errors
that name the field.

::

    graph:                       # who hears whom: an agent reads its in-neighbours' posts
      generator: small-world     # small-world | scale-free | homophily | edges
      degree: 10                 # small-world: each agent linked to degree/2 neighbours on each side
      rewire: 0.1                # small-world: probability that a lattice edge is rewired
      directed: false            # default false; true: edges are "source is heard by target"
      self_loops: false          # default false
      seed: 7                    # default: the run's seed

    graph: {generator: scale-free, m: 5}                    # Barabási–Albert: m edges per new agent
    graph: {generator: homophily, attribute: education, degree: 10, strength: 0.8}
    graph: {generator: edges, path: follows.parquet}        # columns source,target[,weight]

Checks that need the run (the agent count, the population's attributes, the edge list's rows)
take the agent count through :func:`parse_graph` and name the field all the same, e.g.
``graph.degree: must be ≥ 1 and < agents (1000) (got 1000)``.

This module needs only pydantic (no numpy), so the model can be referenced from a run's
config without pulling in the builders.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from populace.core.contracts import SCENARIO_FILE
from populace.core.scenario import ScenarioError, format_validation_error

__all__ = [
    "GENERATORS",
    "EdgeListGraph",
    "GraphConfig",
    "GraphError",
    "HomophilyGraph",
    "ScaleFreeGraph",
    "SmallWorldGraph",
    "parse_graph",
]

# The most edges a graph may hold (after undirected edges count twice): the CSR's offsets are
# int64 but a build holds several arrays of this length; 1M agents × degree 10 is 1e7.
MAX_EDGES = 1_000_000_000


class GraphError(ScenarioError):
    """A graph config, edge list or stored graph is invalid. The message starts with the
    dotted field (``graph.degree: …``), one line per problem; a CLI exits 2 on it like on any
    ScenarioError."""


def _not_bool(v: object) -> object:
    # YAML `yes`/`true` must not silently become degree 1 or probability 1.0.
    if isinstance(v, bool):
        raise ValueError("must be a number, not true/false")
    return v


Probability = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, le=1, allow_inf_nan=False)]
Int = Annotated[int, BeforeValidator(_not_bool)]


def _agents(info: ValidationInfo) -> int | None:
    return (info.context or {}).get("agents")


def _check_degree(v: int, info: ValidationInfo, what: str = "must be ≥ 1 and < agents") -> int:
    n = _agents(info)
    if v < 1 or (n is not None and v >= n):
        bound = f" ({n})" if n is not None else ""
        raise ValueError(f"{what}{bound}")
    if n is not None and v * n > MAX_EDGES:
        raise ValueError(f"{n} agents × {v} is more than {MAX_EDGES:,} edges")
    return v


class _Graph(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[str]

    directed: bool = False
    self_loops: bool = False
    seed: Int | None = Field(None, ge=0, lt=2**63)  # None: the run's seed


class SmallWorldGraph(_Graph):
    """Watts–Strogatz: a ring lattice where each agent is linked to its `degree`/2 nearest
    neighbours on each side, each lattice edge rewired to a uniform random agent with
    probability `rewire`. Directed: each agent hears `degree` agents (the lattice's, rewired)."""

    kind: ClassVar[str] = "small-world"
    generator: Literal["small-world"]
    degree: Int = 10
    rewire: Probability = 0.1

    @field_validator("degree")
    @classmethod
    def _degree(cls, v: int, info: ValidationInfo) -> int:
        _check_degree(v, info)
        if v % 2:
            raise ValueError("must be even (each agent is linked to degree/2 neighbours on each side)")
        return v


class ScaleFreeGraph(_Graph):
    """Barabási–Albert: agents arrive one by one and each links to `m` earlier agents chosen
    with probability proportional to their degree (mean degree ≈ 2m, a heavy tail).
    Directed: each new agent hears its `m` picks, so popular agents are heard by many."""

    kind: ClassVar[str] = "scale-free"
    generator: Literal["scale-free"]
    m: Int = 5

    @field_validator("m")
    @classmethod
    def _m(cls, v: int, info: ValidationInfo) -> int:
        return _check_degree(v, info)


class HomophilyGraph(_Graph):
    """Random links, more likely between agents that share a persona attribute: each edge's
    other end is drawn among agents with the same value of `attribute` with probability
    `strength`, else among all agents (0: no homophily; 1: only within groups)."""

    kind: ClassVar[str] = "homophily"
    generator: Literal["homophily"]
    attribute: str = Field(min_length=1, max_length=200)
    degree: Int = 10  # mean degree (undirected), or each agent's in-degree (directed)
    strength: Probability = 0.8

    @field_validator("degree")
    @classmethod
    def _degree(cls, v: int, info: ValidationInfo) -> int:
        return _check_degree(v, info)


class EdgeListGraph(_Graph):
    """An edge list file, CSV or Parquet (by its extension: .csv, .parquet, .pq) with columns
    `source,target[,weight]` of agent ids (0..agents-1). Relative paths are relative to the
    scenario file. Every row is checked before anything starts; a bad row is named."""

    kind: ClassVar[str] = "edges"
    generator: Literal["edges"]
    path: str = Field(min_length=1, max_length=4096, json_schema_extra=SCENARIO_FILE)

    @field_validator("path")
    @classmethod
    def _format(cls, v: str) -> str:
        if not v.lower().endswith((".csv", ".parquet", ".pq")):
            raise ValueError("must name a .csv or .parquet file")
        return v


GraphConfig = SmallWorldGraph | ScaleFreeGraph | HomophilyGraph | EdgeListGraph
GENERATORS: dict[str, type[_Graph]] = {
    m.kind: m for m in (SmallWorldGraph, ScaleFreeGraph, HomophilyGraph, EdgeListGraph)
}


class _Section(BaseModel):
    graph: Any  # validated by the generator's model, so errors read `graph.<field>`


def parse_graph(data: object, agents: int | None = None) -> GraphConfig:
    """The `graph:` section as its generator's model, or a GraphError naming each bad field.
    With `agents`, degrees are checked against the run's agent count too."""
    if not isinstance(data, dict):
        raise GraphError(f"graph: must be a mapping with a `generator` (got {data!r})")
    gen = data.get("generator")
    if gen not in GENERATORS:
        expected = ", ".join(GENERATORS)
        what = "is required" if gen is None else f"unknown generator {gen!r}"
        raise GraphError(f"graph.generator: {what} (expected one of: {expected})")
    model = GENERATORS[gen]
    try:
        return model.model_validate(data, context={"agents": agents})  # type: ignore[return-value]
    except ValidationError as err:
        text = format_validation_error(err)
        raise GraphError("\n".join(f"graph.{line}" if line else line for line in text.splitlines())) from None
