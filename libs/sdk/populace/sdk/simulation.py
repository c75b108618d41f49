"""A simulation: the one thing a user writes to run their own agents on the fleet.

    class PublicGoods(Simulation):
        name = "public-goods"          # how scenarios name it (also its entry point)
        Params = GameParams            # the scenario's own sections, validated
        Agent = Contributor            # an Agent subclass: turn(self, obs: Seen, llm) -> Contribution
        Env = PublicGoodsEnv           # an Env[State, Partial] subclass (reduce, decide; merge)
        GroupEnv = Group               # optional: settles each group on its host

        def system_prompt(self) -> str: ...
        def answer_schema(self) -> dict | None: ...
        def group_size(self) -> int | None: ...

`Outcome`, `Observation`, `Summary` (and `Act`) are read from the agent's and the environment's
annotations where the class does not set them (`_infer_types`); chain of thought is the
scenario's `model.answer`, which the platform applies (`request_system_prompt`, `request_schema`).

The class declares; an instance is one run of it (its validated params, agent count, seed
and cast), shared by reference by every agent of the run on a process (`agent.sim`).
"""

from __future__ import annotations

import inspect
import re
import typing
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, PrivateAttr

from populace.core.contracts import PLATFORM_SUMMARY_COLUMNS, Column, RunConfig, SimulationTables
from populace.sdk.agent import Agent
from populace.sdk.answers import reasons_itself, schema_options, with_cot_instruction, with_reasoning
from populace.sdk.edges import EdgeBook
from populace.sdk.env import Env, GroupEnv
from populace.sdk.groups import GroupError, GroupLayout
from populace.sdk.outcome import (
    PLATFORM_OUTCOME_COLUMNS,
    Outcome,
    OutcomeError,
    column_type,
    literal_values,
    outcome_fields,
)
from populace.sdk.post import Message, Post
from populace.sdk.rng import seeded

if TYPE_CHECKING:
    from populace.population.cast import Cast
    from populace.sdk.space import Grid

# Tables the platform owns; a simulation's tables take other names.
RESERVED_TABLES = ("runs", "agents", "llm_calls", "agent_profiles", "posts", "transcripts", "shown", "_ingested")
_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class Params(BaseModel):
    """A simulation's parameters: the scenario's top-level keys that are not the platform's
    (`agents`, `rounds`, `model` …). Unknown keys are errors, so a typo names itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Observation(BaseModel):
    """What every agent sees in a round (parsed once per host per round, shared by all its
    agents). `functools.cached_property` works for values derived once per round."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round: int = 0
    # the posts agents hear this round (a run with a `graph:`), set by the platform
    _mailbox: Any = PrivateAttr(default=None)

    def inbox(self, agent_id: int) -> tuple[Message, ...]:
        """What agent `agent_id` hears this round: its in-neighbours' posts of the round
        before, as (author, post), by author id. Empty in round 1 and in a run without a graph."""
        box = self.__pydantic_private__["_mailbox"]  # not self._mailbox: pydantic's __getattr__ is slow
        return box.inbox(agent_id) if box is not None else ()

    def in_degree(self, agent_id: int) -> int:
        """How many agents agent `agent_id` hears on the run's graph (its in-neighbours, whether
        or not they posted; with edge edits, those it follows as of the round before): the same
        in one process and on the fleet, in every round. 0 in a run without a graph."""
        box = self.__pydantic_private__["_mailbox"]
        if box is None:
            return 0
        if box.edges is not None and agent_id in box.edges.edits:
            return len(box.sources(agent_id))
        offsets = box.graph.offsets
        return int(offsets[agent_id + 1] - offsets[agent_id])


class Summary(BaseModel):
    """A round's summary: the columns recorded once per round (besides n and n_valid)."""

    model_config = ConfigDict(extra="forbid")


class SimulationError(ValueError):
    """A simulation that cannot be loaded or is declared wrongly; the message says which and why."""


class Simulation:
    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    Agent: ClassVar[type[Agent]] = Agent
    Env: ClassVar[type[Env]] = Env
    GroupEnv: ClassVar[type[GroupEnv] | None] = None
    Outcome: ClassVar[type[Outcome]] = Outcome
    Observation: ClassVar[type[Observation]] = Observation
    Summary: ClassVar[type[Summary]] = Summary
    Post: ClassVar[type[Post]] = Post  # what `outcome.post` holds in a run with a `graph:`
    Act: ClassVar[type[Outcome] | None] = None  # scenes: what an agent's act returns (the acts table's columns)
    # graphs that change: the edge kinds an outcome's `edits` may name; the first is the run's
    # graph's (posts are heard along it)
    edge_kinds: ClassVar[tuple[str, ...]] = ()
    outcome_table: ClassVar[str] = ""  # default: "<name>_outcomes"
    summary_table: ClassVar[str] = ""  # default: "<name>_rounds"
    acts_table: ClassVar[str] = ""  # default: "<name>_acts" (a simulation with scenes)
    prompt_version: ClassVar[str] = ""  # bump when a prompt text changes; recorded in the manifest
    # For reports: summary columns on the measure's scale, drawn as lines on its histograms and
    # over rounds; `trend_columns` are drawn over rounds only.
    reference_columns: ClassVar[tuple[str, ...]] = ()
    trend_columns: ClassVar[tuple[str, ...]] = ()
    # Human reference data the simulation ships (populace.analysis.reference): files beside its
    # module, each with its citation; a report compares a run with the rows about its parameters.
    references: ClassVar[tuple[str, ...]] = ()
    # Spaces, for reports: (the outcome column holding each agent's cell on `grid(params)`, the
    # outcome column its picture is coloured by); reports draw the grid per round from them.
    grid_columns: ClassVar[tuple[str, str] | None] = None
    # Prototypes (a scenario's `prototypes:`, docs/prototypes.md): False when this simulation's
    # agents' answers must never be drawn from others' (the platform refuses it for groups, graphs,
    # worlds and activation itself)
    prototypes_allowed: ClassVar[bool] = True
    # how the run's agents answer (a scenario's `model.answer`): "direct", or "cot" (chain of
    # thought: the platform asks for a "reasoning" field first). Set by the platform before
    # __init__ runs, so a simulation's own __init__ may read it; "direct" for an instance built by hand.
    answer_mode: str = "direct"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _infer_types(cls)

    def __init__(self, params: Params, *, agents: int, rounds: int = 1, seed: int = 0,
                 run_id: str = "", cast: Cast | None = None) -> None:
        self.params = params
        self.agents = agents
        self.rounds = rounds
        self.seed = seed
        self.run_id = run_id
        self.cast = cast  # who the agents are (None: no population)
        self.edges: EdgeBook | None = None  # on a host: its agents' in-edges (a simulation with edge_kinds)

    # -- what a simulation may override ------------------------------------------------
    def system_prompt(self) -> str:
        """The system prompt every agent's request shares (replicas cache it)."""
        return ""

    def answer_schema(self) -> dict | None:
        """The JSON schema every answer must satisfy (one structured call per decision)."""
        return None

    def group_size(self) -> int | None:
        """Agents per group for the GroupEnv (groups are consecutive agent ids; the last may be
        smaller). None: no groups."""
        return None

    def group_sizes(self) -> tuple[int, ...] | None:
        """Nested groups: agents per group at each level, innermost first, each a multiple of the
        one before (e.g. (5, 20): teams of 5 in firms of 20). Default: (group_size(),)."""
        size = self.group_size()
        return None if size is None else (size,)

    def group_block(self) -> int | None:
        """Groups drawn again every round (stranger matching): a block of this many agents (a
        multiple of the group size) is shuffled, seeded by (run seed, round, block), and cut into
        groups. Blocks are placed whole. None: fixed groups of consecutive ids."""
        return None

    def following(self, agent_id: int, kind: str | None = None) -> tuple[int, ...]:
        """Whom agent `agent_id` follows now (on its host: in its turn, or the environment's view
        of it): the run's graph plus its edits of the rounds before. Kind: the first declared."""
        if self.edges is None:
            raise SimulationError(f"simulation {type(self).name!r}: following() needs `edge_kinds` and runs "
                                  "on the agent's host (a turn, a view; with one agent per process, in the "
                                  "environment's view only)")
        return self.edges.following(agent_id, kind)

    def rng(self, *salt: object):
        """A random.Random seeded by (run seed, *salt): the same in every process (Python's
        `hash(str)` is not). E.g. `self.sim.rng(round, self.id)` inside a turn."""
        return seeded(self.seed, *salt)

    # -- groups, as the platform lays them out -----------------------------------------------
    @classmethod
    def group_levels(cls) -> list[type[GroupEnv]]:
        """The GroupEnv classes, innermost first (its Parent, then that one's …)."""
        levels: list[type[GroupEnv]] = []
        level = cls.GroupEnv
        while level is not None:
            if level in levels:
                raise SimulationError(f"simulation {cls.name!r}: GroupEnv {level.__name__} is its own Parent")
            levels.append(level)
            level = level.Parent
        return levels

    def group_layout(self) -> GroupLayout | None:
        """Who is in which group each round (None: no groups)."""
        if type(self).GroupEnv is None:
            return None
        sizes = self.group_sizes()
        if sizes is None:
            return None
        levels = type(self).group_levels()
        if len(sizes) != len(levels):
            raise SimulationError(f"simulation {type(self).name!r}: group_sizes() gives {len(sizes)} level(s) but "
                                  f"the GroupEnv chain ({', '.join(g.__name__ for g in levels)}) has {len(levels)}")
        try:
            return GroupLayout(tuple(sizes), self.agents, self.seed, self.group_block())
        except GroupError as err:
            raise SimulationError(f"simulation {type(self).name!r}: {err}") from None

    def placement_unit(self) -> int:
        """Agents that must stay on one host (a group, a block, an outermost group)."""
        layout = self.group_layout()
        return layout.unit if layout is not None else 1

    def user_example(self) -> str | None:
        """A user prompt as agent 0 would send it in round 1, for the run's manifest."""
        return None

    @classmethod
    def model_defaults(cls, params: Params) -> dict[str, Any]:
        """`model.*` defaults these params want when the scenario does not set them, e.g.
        {"max_tokens": 256} for chain of thought."""
        return {}

    def world_sizes(self) -> dict[str, int] | None:
        """The length of each size its World's columns name, for this run, before it starts (e.g.
        {"agents": n, "cells": w * h}): what the memory check counts. None: not declared (a World
        whose columns are all per agent needs none: the default counts the agents)."""
        world = type(self).Env.World
        if world is None or any(c.size != "agents" for c in world.columns.values()):
            return None
        return {"agents": self.agents}

    @classmethod
    def check_run(cls, params: Params, config: RunConfig) -> None:
        """Raise ValueError (its message starting with the field) when these params cannot run
        with the rest of the scenario (its agent count, population …)."""

    @classmethod
    def equilibrium(cls, params: Params) -> float | None:
        """The theory's prediction for the measure, drawn in reports (None: no line)."""
        return None

    @classmethod
    def describe(cls, params: Params) -> str | None:
        """One line saying what was played, for reports (None: the parameters are listed)."""
        return None

    @classmethod
    def measure_range(cls, params: Params) -> tuple[float, float] | None:
        """The measure's possible range (None: any): plot axes use it, and a valid value
        outside it is recorded as invalid (the recorder refuses a batch that carries one)."""
        return None

    @classmethod
    def grid(cls, params: Params) -> Grid | None:
        """The grid the run's agents live on (a populace.sdk.space.Grid), for reports: with
        `grid_columns` they draw each round's grid from the outcomes (where each agent was, coloured
        by the second column) and its like-neighbour share. None: no grid."""
        return None

    @classmethod
    def measure_options(cls, params: Params) -> tuple[str, ...] | None:
        """A categorical measure's possible answers, in the order results and reports list them
        (None: any text). Default: the values of a `Literal["go", "stay"]` measure column; else
        (for a run) the `enum` of the answer schema's property named as the measure. A valid
        answer outside them is recorded as the model's invalid answer with the error named (the
        recorder refuses a batch that carries one), as a numeric measure outside `measure_range` is."""
        fields = dict(outcome_fields(cls.Outcome))
        measure = cls.Outcome.measure or next(iter(fields), None)
        values = literal_values(fields[measure]) if measure in fields else None
        return tuple(values) if values and all(isinstance(v, str) for v in values) else None

    # -- derived, for the platform -------------------------------------------------------
    def request_system_prompt(self) -> str:
        """The system prompt the run's requests carry: `system_prompt()`, with the platform's
        chain-of-thought instruction after it in a `model.answer: cot` run (unless the
        simulation's schema asks for its own "reasoning": then it wrote its own instruction)."""
        system = self.system_prompt()
        if self.answer_mode != "cot" or reasons_itself(self.answer_schema()):
            return system
        return with_cot_instruction(system)

    def request_schema(self) -> dict | None:
        """The answer schema the run's requests carry: `answer_schema()`, with a "reasoning"
        property first in a `model.answer: cot` run (ValueError naming `model.answer` when the
        schema is not a JSON object: `resolve` refuses such a run before it starts)."""
        schema = self.answer_schema()
        return with_reasoning(schema) if self.answer_mode == "cot" else schema

    @classmethod
    def slug(cls) -> str:
        return re.sub(r"[^a-z0-9_]", "_", cls.name.lower())

    @classmethod
    def tables(cls) -> SimulationTables:
        fields = outcome_fields(cls.Outcome)
        measure = cls.Outcome.measure or (fields[0][0] if fields else None)
        if measure is not None and measure not in dict(fields):
            raise OutcomeError(f"{cls.Outcome.__name__}.measure: {measure!r} is not one of its columns")
        columns = _columns(cls.Outcome, fields)
        kind = None
        if measure is not None:
            kind = "numeric" if {c.name: c.type for c in columns}[measure] in ("DOUBLE", "BIGINT") else "categorical"
        levels = [g.level for g in cls.group_levels()[1:]] if cls.GroupEnv is not None else []
        scenes = cls.GroupEnv is not None and cls.GroupEnv.plays_scenes() and cls.Act is not None
        return SimulationTables(
            simulation=cls.name,
            outcomes=cls.outcome_table or f"{cls.slug()}_outcomes",
            outcome_columns=columns,
            rounds=cls.summary_table or f"{cls.slug()}_rounds",
            summary_columns=_columns(cls.Summary, summary_fields(cls.Summary)),
            grouped=cls.GroupEnv is not None,
            measure=measure,
            measure_kind=kind,
            levels=levels,
            edge_kinds=list(cls.edge_kinds),
            acts=(cls.acts_table or f"{cls.slug()}_acts") if scenes else None,
            act_columns=_columns(cls.Act, outcome_fields(cls.Act)) if scenes else [],
            shown_items=cls.Env.shown_items,
        )

    @classmethod
    def tables_for(cls, params: Params, answer_schema: dict | None = None) -> SimulationTables:
        """The tables of a run with these parameters: with its numeric measure's declared range,
        or its categorical measure's declared options (`measure_options`, else the `enum` the
        run's `answer_schema` gives the measure's property: options that live only in the schema
        are options too)."""
        tables = cls.tables()
        if tables.measure_kind == "numeric":
            return tables.model_copy(update={"measure_range": cls.measure_range(params)})
        if tables.measure_kind != "categorical":
            return tables
        options = cls.measure_options(params)
        if options is None:
            found = schema_options(answer_schema)
            enum = found.get(tables.measure or "") or found.get("")
            options = enum if enum and all(isinstance(o, str) for o in enum) else None
        if options is None:
            return tables
        if not (isinstance(options, (tuple, list)) and options and all(isinstance(o, str) for o in options)
                and len(set(options)) == len(options)):
            raise SimulationError(f"simulation {cls.name!r}: measure_options() must return distinct texts "
                                  f"(or None), not {options!r}")
        return tables.model_copy(update={"measure_options": list(options)})

    @classmethod
    def check(cls) -> None:
        """Raise SimulationError listing what is wrong with this declaration."""
        problems: list[str] = []
        where = f"simulation {cls.name or cls.__qualname__!r}"
        if not cls.name or not re.fullmatch(r"[A-Za-z0-9_.:-]+", cls.name):
            problems.append("`name` must be set (letters, digits, '-', '_', '.')")
        for attr, base in (("Params", Params), ("Agent", Agent), ("Env", Env), ("Outcome", Outcome),
                           ("Observation", Observation), ("Summary", Summary), ("Post", Post)):
            value = getattr(cls, attr, None)
            if not (isinstance(value, type) and issubclass(value, base)):
                problems.append(f"`{attr}` must be a subclass of {base.__module__}.{base.__qualname__}")
        scenes = (isinstance(cls.GroupEnv, type) and issubclass(cls.GroupEnv, GroupEnv)
                  and cls.GroupEnv.plays_scenes())
        if scenes:
            if cls.Agent is Agent or cls.Agent.act is Agent.act:
                problems.append("`Agent` must be your Agent subclass with an `async def act(self, phase, view, llm)` "
                                "(its GroupEnv plays scenes)")
            if not (isinstance(cls.Act, type) and issubclass(cls.Act, Outcome)):
                problems.append("`Act` must be your Outcome subclass: what an act returns (its GroupEnv plays "
                                "scenes; the acts table's columns)")
        elif cls.Agent is Agent or cls.Agent.turn is Agent.turn:
            problems.append("`Agent` must be your Agent subclass with an `async def turn(self, obs, llm)`")
        if isinstance(cls.Agent, type) and issubclass(cls.Agent, Agent):
            for attr in ("state_fields", "transient_fields"):
                names = getattr(cls.Agent, attr)
                if not (isinstance(names, (tuple, list)) and all(isinstance(n, str) and n.isidentifier()
                                                                 for n in names)):
                    problems.append(f"`Agent.{attr}` must be a tuple of attribute names, e.g. (\"score\",) "
                                    f"(note the comma: (\"score\") is a string), not {names!r}")
            problems += _state_problems(cls.Agent)
        if cls.Env is Env or cls.Env.reduce is Env.reduce:
            problems.append("`Env` must be your Env subclass with reduce, merge and decide")
        if cls.GroupEnv is not None and not (isinstance(cls.GroupEnv, type) and issubclass(cls.GroupEnv, GroupEnv)):
            problems.append("`GroupEnv` must be a subclass of populace.sdk.GroupEnv (or None)")
        elif cls.GroupEnv is not None:
            try:
                levels = cls.group_levels()
            except SimulationError as err:
                levels = []
                problems.append(str(err))
            for level in levels[1:]:
                if not (isinstance(level, type) and issubclass(level, GroupEnv)):
                    problems.append(f"`{level!r}` (a Parent) must be a subclass of populace.sdk.GroupEnv")
                elif level.plays_scenes():
                    problems.append(f"`{level.__name__}`: only the innermost GroupEnv may play scenes")
                elif not _IDENT.match(f"{level.level}_id") or f"{level.level}_id" in PLATFORM_OUTCOME_COLUMNS:
                    problems.append(f"`{level.__name__}.level` {level.level!r} must be a lower-case identifier "
                                    "(its column is `<level>_id`)")
        if not problems:
            outcomes = cls.outcome_table or f"{cls.slug()}_outcomes"
            rounds = cls.summary_table or f"{cls.slug()}_rounds"
            acts = cls.acts_table or f"{cls.slug()}_acts"
            named = [("outcome_table", outcomes), ("summary_table", rounds)]
            if cls.Act is not None:
                named.append(("acts_table", acts))
            for label, table in named:
                if not _IDENT.match(table) or table in RESERVED_TABLES:
                    problems.append(f"`{label}` {table!r} must be a lower-case identifier and not one of "
                                    f"{', '.join(RESERVED_TABLES)}")
            if len({t for _, t in named}) < len(named):
                problems.append("`outcome_table`, `summary_table` (and `acts_table`) must differ")
        if not problems and cls.grid_columns is not None:
            problems += _grid_problems(cls)
        if not problems and cls.Env.shown_items is not None:
            problems += _shown_problems(cls.Env)
        if not problems:
            try:
                cls.tables()
            except (OutcomeError, ValueError) as err:
                problems.append(str(err))
        if problems:
            raise SimulationError(f"{where} ({cls.__module__}.{cls.__qualname__}) is not valid:\n  - "
                                  + "\n  - ".join(problems))


def _columns(owner: type, fields: list[tuple[str, Any]]) -> list[Column]:
    """The recorded columns of an outcome class's fields; OutcomeError naming the field whose type
    is not a column type (a tuple, a set, a class of the simulation's …)."""
    out = []
    for name, annotation in fields:
        try:
            out.append(Column(name=name, type=column_type(annotation)))
        except OutcomeError as err:
            raise OutcomeError(f"{owner.__name__}.{name}: {err}") from None
    return out


def _state_problems(agent: type[Agent]) -> list[str]:
    """A declared state field whose annotation names a type a checkpoint cannot keep (a
    random.Random, a numpy array, an Enum …): named now, not when a resume loses it."""
    from populace.sdk.statejson import unkept

    try:
        hints = typing.get_type_hints(agent)
    except Exception:  # an annotation only a type checker can resolve: its values are checked when kept
        return []
    names = agent.state_fields if isinstance(agent.state_fields, (tuple, list)) else ()
    out = []
    for name in names:
        bad = unkept(hints[name]) if isinstance(name, str) and name in hints else None
        if bad is not None:
            out.append(f"`{agent.__name__}.{name}` is declared {_type_name(hints[name])}, and a checkpoint cannot keep "
                       f"a {_type_name(bad)}: a state field holds numbers, text, booleans, None, and lists, tuples, "
                       "dicts, sets, frozensets, deques and Fractions of them (keep a seed, not a random.Random; "
                       "a list, not a numpy array)")
    return out


def _type_name(annotation: object) -> str:
    return annotation.__qualname__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _grid_problems(cls: type[Simulation]) -> list[str]:
    names = cls.grid_columns
    if not (isinstance(names, tuple) and len(names) == 2 and all(isinstance(n, str) for n in names)):
        return [f"`grid_columns` must be (cell column, colour column), e.g. (\"cell\", \"kind\"), not {names!r}"]
    try:
        fields = dict(outcome_fields(cls.Outcome))
    except OutcomeError as err:
        return [str(err)]
    cell = names[0]
    problems = [f"`grid_columns` names {n!r}, which is not a column of {cls.Outcome.__name__}"
                for n in names if n not in fields]
    if cell in fields and column_type(fields[cell]) != "BIGINT":
        problems.append(f"`grid_columns`: the cell column {cell!r} must be a whole number (int), not "
                        f"{column_type(fields[cell])}")
    return problems


def _shown_problems(env: type[Env]) -> list[str]:
    """What is wrong with an environment's `shown_items` (who saw what: populace.sdk.shown)."""
    name = env.shown_items
    where = f"`{env.__name__}.shown_items`"
    if not isinstance(name, str) or not _IDENT.match(name):
        return [f"{where} must name a column of its World (a lower-case identifier), not {name!r}"]
    if env.World is None:
        return [f"{where}: the environment declares no World (what a view shows are values of a world column)"]
    col = env.World.columns.get(name)
    if col is None:
        return [f"{where}: {name!r} is not a column of {env.World.__name__} "
                f"({', '.join(env.World.columns) or 'none'})"]
    if not (col.dtype.startswith("int") or col.dtype.startswith("uint")):
        return [f"{where}: {env.World.__name__}.{name} is {col.dtype}; the items a view shows are ids (an integer "
                "column)"]
    if env.view is Env.view:
        return [f"{where}: the environment has no `view` (what an agent is shown is recorded from its view)"]
    return []


def summary_fields(cls: type[Summary]) -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for name in cls.model_fields:
        if name in PLATFORM_SUMMARY_COLUMNS:
            raise OutcomeError(f"{cls.__name__}.{name}: the platform records that summary column itself")
        out.append((name, hints[name]))
    return out


# -- types declared once --------------------------------------------------------------------------
_UNSET = object()


def _infer_types(cls: type[Simulation]) -> None:
    """Fill in what the class does not say from what its parts say already: `Outcome` from its
    Agent's `turn` return annotation, `Observation` from what the environment's `observe`
    returns (else, in a simulation without views, the type of turn's observation), `Act` from
    `act`'s return annotation, `Summary` from the environment's `decide` (the Summary in the
    tuple it returns). Only where the class left the SDK's default or a parent's value that was
    itself read (a subclass with another Agent reads its own), so an attribute set by hand always
    wins; a type that cannot be read (an annotation only a type checker resolves) leaves what
    was there, as before."""
    parent_read = frozenset(getattr(cls, "_types_read", ()))
    cls._types_read = frozenset()
    agent = getattr(cls, "Agent", None)
    env = getattr(cls, "Env", None)
    has_env = isinstance(env, type) and issubclass(env, Env)
    if has_env and env.observe is not Env.observe:
        # what the environment's observe returns is what every host parses the round's with
        _fill(cls, "Observation", Observation, _annotation(env.observe, "return"), parent_read)
    if isinstance(agent, type) and issubclass(agent, Agent):
        if agent.turn is not Agent.turn:
            _fill(cls, "Outcome", Outcome, _annotation(agent.turn, "return"), parent_read)
            if not (has_env and env.view is not Env.view):  # with views, a turn is given its own view
                _fill(cls, "Observation", Observation, _annotation(agent.turn, 1), parent_read)
        if agent.act is not Agent.act:
            _fill(cls, "Act", Outcome, _annotation(agent.act, "return"), parent_read, default=None)
    if has_env and env.decide is not Env.decide:
        decided = _annotation(env.decide, "return")
        for part in typing.get_args(decided) if typing.get_origin(decided) is tuple else (decided,):
            if isinstance(part, type) and issubclass(part, Summary) and part is not Summary:
                _fill(cls, "Summary", Summary, part, parent_read)
                break


def _fill(cls: Any, attr: str, base: type, found: object, parent_read: frozenset[str],
          default: object = _UNSET) -> None:
    """Set `attr` to `found` (a proper subclass of `base`) where the class may take it: not set
    by hand here, not already read here from a better source, and either the SDK's default or
    a value a parent read."""
    if attr in cls.__dict__ or not (isinstance(found, type) and issubclass(found, base) and found is not base):
        return
    current = getattr(cls, attr)
    if current is (base if default is _UNSET else default) or attr in parent_read:
        setattr(cls, attr, found)
        cls._types_read = cls._types_read | {attr}


def _annotation(fn: Any, which: int | str) -> object:
    """One annotation of a function, evaluated: its return's ("return") or its n-th parameter's
    (counting self as 0). None when there is none or it cannot be evaluated here."""
    fn = getattr(fn, "__func__", fn)
    raw = getattr(fn, "__annotations__", {})
    if which != "return":
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            return None
        which = names[which] if isinstance(which, int) and which < len(names) else ""
    value = raw.get(which)
    if isinstance(value, str):
        try:
            value = eval(value, getattr(fn, "__globals__", {}), {})  # as typing.get_type_hints does, one at a time
        except Exception:  # a name only a type checker sees (TYPE_CHECKING): not inferred
            return None
    return value
