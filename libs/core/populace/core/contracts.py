"""Wire contracts: every message on the bus is one of these versioned pydantic models.

These are *envelopes*: they know runs, rounds, hosts and agents, never a simulation. What a
simulation says (its parameters, outcome columns, partials, round summary, observation) rides
inside them as JSON payloads that the simulation's own models validate (populace.sdk).

Control-plane models reject unknown fields. Hot-path batches are columnar (parallel lists)
so one message carries ~1,000 agents and validates in pydantic-core, not per agent in Python.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import unicodedata
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from populace.core import metrics
from populace.core.subjects import valid_token

SCHEMA_VERSION = 1


class Strict(BaseModel):
    """Control-plane model: unknown keys are an error, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Wire(BaseModel):
    """Data-plane model: versioned; unknown keys are an error too (a typo is a bug); no
    float is NaN or infinite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    v: Literal[1] = SCHEMA_VERSION


def _not_bool(v: object) -> object:
    # YAML `yes`/`true` must not silently become 1 agent or 1.0 seconds.
    if isinstance(v, bool):
        raise ValueError("must be a number, not true/false")
    return v


FiniteFloat = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
Count = Annotated[int, BeforeValidator(_not_bool)]


# --- scenario / run configuration ----------------------------------------------------
class ModelConfig(Strict):
    """Which model answers. `dummy` is the paper's dummy benchmark (a seeded answer that
    satisfies the request's JSON schema, after `latency_s`); `local` is SmolLM2 on llama.cpp
    replicas on this machine; `sim` is simulated vLLM replicas; `openai` is any registered
    OpenAI-compatible replica (vLLM)."""

    backend: Literal["dummy", "local", "sim", "openai"] = "dummy"
    latency_s: FiniteFloat = Field(0.05, ge=0, le=3600)  # dummy only
    seed: Count = 0
    name: str | None = None  # model name sent to replicas; default: the replica's own
    max_tokens: Count = Field(48, ge=1, le=8192)
    temperature: FiniteFloat = Field(0.7, ge=0, le=2)


class PlacementConfig(Strict):
    # 0 = many agents per process (time-share a core while they wait on the LLM);
    # 1 = one agent per OS process (compute-heavy agents, no GIL contention).
    agents_per_process: Literal[0, 1] = 0


SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


# The JSON-schema mark of a field that names a file the client reads before the run (the
# personas, a population YAML, an edge list): a reader confined to one folder (the manager's
# start form) finds every such field by it, a future one included.
SCENARIO_FILE: dict[str, Any] = {"format": "scenario-file"}


class PopulationRef(Strict):
    """Who the agents are. Exactly one source: `personas`, a JSONL file written by
    `populace personas generate` (one agent per line, in order), or `config`, a population
    YAML from which template personas are built for this run (seeded by the run's seed).
    Paths are relative to the scenario file. The client uploads the personas to the bus's
    object store before the run and sets `digest`; hosts and the recorder read them from there."""

    personas: str | None = Field(None, min_length=1, json_schema_extra=SCENARIO_FILE,
                                 description="a personas JSONL (`populace personas generate`), one agent a line")
    config: str | None = Field(None, min_length=1, json_schema_extra=SCENARIO_FILE,
                               description="a population YAML: template personas built for this run")
    digest: SHA256 | None = None  # sha256 of the uploaded personas JSONL (set by the client)

    @model_validator(mode="after")
    def _one_source(self) -> PopulationRef:
        if (self.personas is None) == (self.config is None):
            raise ValueError("population: give exactly one of `personas` (a JSONL file) or "
                             "`config` (a population YAML)")
        return self


# A simulation is named by its entry point (`ratio-game`) or an import path (`pkg.mod:Class`).
SimulationName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")]
DEFAULT_SIMULATION = "ratio-game"


class GraphRef(BaseModel):
    """Who hears whom: the scenario's `graph:` section. Its generator's keys are validated by
    `populace.graph.parse_graph` (errors name the field); the client builds the graph before
    the run, uploads it to the `graphs` object store and sets `digest` (and `order`, the
    relabelling `placement: partition` chose). Hosts read it from there."""

    model_config = ConfigDict(extra="allow", frozen=True)

    # partition: number agents so that each host's contiguous range is a part of the graph
    # (most edges stay on one host); ids: keep the generator's or edge list's ids as agent ids
    placement: Literal["partition", "ids"] = "partition"
    digest: SHA256 | None = None  # sha256 of the stored graph (set by the client)
    order: SHA256 | None = None  # sha256 of the agent → graph-node order, when relabelled

    @property
    def spec(self) -> dict:
        """The generator's own keys, as written."""
        return dict(self.model_extra or {})


class Broadcast(Strict):
    """A message the platform puts in chosen agents' inboxes at the start of `round` (a
    campaign, a rumour): every agent, the `count` agents heard by the most others (the graph's
    top out-degree), or the listed agent ids. Agents read it as a message from author -1."""

    round: Count = Field(ge=1, le=10_000)
    text: str = Field(min_length=1, max_length=10_000)
    fields: dict[str, Any] = {}  # the simulation's post fields, e.g. {stance: 1.0}
    to: Literal["all", "top-degree", "agents"] = "all"
    count: Count | None = Field(None, ge=1)  # top-degree: how many
    agents: list[Count] | None = None  # to: agents

    @model_validator(mode="after")
    def _target(self) -> Broadcast:
        if self.to == "top-degree" and self.count is None:
            raise ValueError("count: `to: top-degree` needs how many agents (count: N)")
        if self.to == "agents" and not self.agents:
            raise ValueError("agents: `to: agents` needs the list of agent ids")
        if self.to != "agents" and self.agents is not None:
            raise ValueError("agents: only with `to: agents`")
        _finite_json(self.fields)
        return self


# --- interviews: questions agents answer from a copy of their state (populace.sdk.interview) ---
# A survey's or a question's id: a column value and a part of message ids (no dots or spaces).
InterviewId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
MAX_QUESTION_CHARS = 4000
MAX_CHOICES = 26  # more than a ballot paper: a question with that many answers is free text
MAX_LIKERT_POINTS = 11
MAX_ANSWER_CHARS = 10_000


def choice_key(text: str) -> str:
    """How two spellings of one option compare (and an answer is matched to an option): NFKC,
    whitespace collapsed, case folded."""
    return " ".join(unicodedata.normalize("NFKC", text).split()).casefold()


def _one_line(value: str, what: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError(f"{what} must not be empty")
    if any(ch in text for ch in "\r\n\t"):
        raise ValueError(f"{what} {text!r} must be on one line (they are listed in the prompt)")
    if len(text) > 200:
        raise ValueError(f"{what} must be at most 200 characters, not {len(text)}")
    return text


class Question(Strict):
    """One question an agent answers, in one structured call (`populace.sdk.interview`). Its
    kind says what a valid answer is: one of `options`; a point 1..`points` of a Likert scale
    (`labels`: one per point, or none); a `number` in [min, max] (whole with `integer`); free
    `text` of at most `max_chars`. `kind` may be left out when the other keys say it."""

    id: InterviewId
    text: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    kind: Literal["options", "likert", "number", "text"]
    options: list[str] | None = None
    points: Annotated[int, BeforeValidator(_not_bool)] | None = None
    labels: list[str] | None = None
    min: FiniteFloat | None = None
    max: FiniteFloat | None = None
    integer: bool = False
    max_chars: Annotated[int, BeforeValidator(_not_bool)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _kind_from_keys(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("kind") is None:
            keys = {k for k, v in data.items() if v is not None}
            kind = ("options" if "options" in keys else "likert" if keys & {"points", "labels"}
                    else "number" if keys & {"min", "max", "integer"} else "text")
            data = {**data, "kind": kind}
        return data

    @field_validator("text")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a question needs its text")
        return value.strip()

    @model_validator(mode="after")
    def _fits_kind(self) -> Question:
        kind = self.kind
        own = {"options": ("options",), "likert": ("points", "labels"), "number": ("min", "max"),
               "text": ("max_chars",)}
        for field, value in (("options", self.options), ("points", self.points), ("labels", self.labels),
                             ("min", self.min), ("max", self.max), ("max_chars", self.max_chars)):
            if value is not None and field not in own[kind]:
                raise ValueError(f"{field}: not a key of a {kind} question")
        if self.integer and kind != "number":
            raise ValueError(f"integer: not a key of a {kind} question")
        if kind == "options":
            options = [_one_line(o, "an option") for o in self.options or ()]
            if not 2 <= len(options) <= MAX_CHOICES:
                raise ValueError(f"options: a question with options needs 2 to {MAX_CHOICES}, not {len(options)}")
            seen: dict[str, int] = {}
            for i, option in enumerate(options):
                first = seen.setdefault(choice_key(option), i)
                if first != i:
                    raise ValueError(f"options: option {i} ({option!r}) repeats option {first} "
                                     f"({options[first]!r}); options are compared ignoring case and spacing")
            object.__setattr__(self, "options", options)
        elif kind == "likert":
            labels = [_one_line(label, "a label") for label in self.labels] if self.labels is not None else None
            points = self.points if self.points is not None else (len(labels) if labels else 5)
            if not 2 <= points <= MAX_LIKERT_POINTS:
                raise ValueError(f"points: a Likert scale needs 2 to {MAX_LIKERT_POINTS} points, not {points}")
            if labels is not None and len(labels) != points:
                raise ValueError(f"labels: {len(labels)} labels for {points} points (one label per point)")
            if labels is not None and len({choice_key(label) for label in labels}) < len(labels):
                raise ValueError("labels: two labels are the same (compared ignoring case and spacing)")
            object.__setattr__(self, "points", points)
            object.__setattr__(self, "labels", labels)
        elif kind == "number":
            if self.min is None or self.max is None:
                raise ValueError("min, max: a number question needs its range (both min and max)")
            if self.min >= self.max:
                raise ValueError(f"min: {self.min:g} must be below max ({self.max:g})")
            if self.integer and math.floor(self.max) < math.ceil(self.min):
                raise ValueError(f"min, max: no whole number lies in [{self.min:g}, {self.max:g}]")
        else:
            chars = self.max_chars if self.max_chars is not None else 500
            if not 1 <= chars <= MAX_ANSWER_CHARS:
                raise ValueError(f"max_chars: 1 to {MAX_ANSWER_CHARS}, not {chars}")
            object.__setattr__(self, "max_chars", chars)
        return self


class Survey(Strict):
    """Questions asked together of the same agents. `mode`: `each` (the default) asks every
    question in a structured call of its own; `together` asks them all in one call."""

    id: InterviewId
    questions: list[Question] = Field(min_length=1, max_length=50)
    mode: Literal["each", "together"] = "each"

    @field_validator("questions")
    @classmethod
    def _distinct_ids(cls, questions: list[Question]) -> list[Question]:
        seen: set[str] = set()
        for i, q in enumerate(questions):
            if q.id in seen:
                raise ValueError(f"question {i}'s id {q.id!r} is used twice in the survey")
            seen.add(q.id)
        return questions

    def question(self, qid: str) -> Question:
        return next(q for q in self.questions if q.id == qid)


class PlannedInterview(Survey):
    """A survey the scenario asks after given rounds (`after: [2, 4]`), or after every round
    (`after: every`: a panel, the same agents each round), of every agent, a seeded `sample`
    share of them, or the listed `agents`."""

    after: list[Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=10_000)]] | Literal["every"]
    sample: FiniteFloat | None = Field(None, gt=0, le=1)
    agents: list[Annotated[int, BeforeValidator(_not_bool), Field(ge=0)]] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _who(self) -> PlannedInterview:
        if self.sample is not None and self.agents is not None:
            raise ValueError("sample, agents: give one of them (or neither: every agent)")
        if isinstance(self.after, list) and not self.after:
            raise ValueError("after: the rounds after which to ask (or `every`)")
        return self

    @property
    def survey(self) -> Survey:
        return Survey(id=self.id, questions=self.questions, mode=self.mode)

    def rounds(self, last: int) -> list[int]:
        """The rounds (up to `last`) after which it is asked."""
        return list(range(1, last + 1)) if self.after == "every" else sorted(r for r in set(self.after) if r <= last)


class Budget(Strict):
    """What a run may spend on LLM work. Before a round that would go past it, the run pauses
    with a reason; `populace resume RUN --budget-tokens N` raises it and continues."""

    tokens: Count | None = Field(None, ge=1)  # prompt + completion tokens
    llm_calls: Count | None = Field(None, ge=1)  # answered calls (an agent's `ask`)


class Usage(Strict):
    """LLM work done: in a share's round, a round, or a whole run (they add up)."""

    # recorded in every round table, next to the simulation's summary
    RECORDED: ClassVar[tuple[str, ...]] = ("llm_calls", "prompt_tokens", "completion_tokens", "infra_retries")

    llm_calls: int = Field(0, ge=0)  # answered calls
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    # sum over answered calls of (prompt + completion tokens)²: the spread, for estimates
    tokens_sq: float = Field(0.0, ge=0, allow_inf_nan=False)
    # prompts asked again because no model answered them: infrastructure, never an answer
    infra_retries: int = Field(0, ge=0)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(llm_calls=self.llm_calls + other.llm_calls,
                     prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                     completion_tokens=self.completion_tokens + other.completion_tokens,
                     tokens_sq=self.tokens_sq + other.tokens_sq,
                     infra_retries=self.infra_retries + other.infra_retries)


class RunConfig(BaseModel):
    """A scenario file, validated. The platform owns the keys declared here; every other
    top-level key (e.g. the ratio game's `game:` and `prompt:`) belongs to the simulation
    and is validated by its parameters model (`populace.sdk`), which names the field on error.
    Those keys are kept as they were written, flat, so a scenario and its config read alike."""

    model_config = ConfigDict(extra="allow", frozen=True)

    simulation: SimulationName = DEFAULT_SIMULATION
    name: str = Field("", max_length=200)  # default: the simulation's name
    agents: Count = Field(1000, ge=1, le=100_000_000)
    rounds: Count = Field(3, ge=1, le=10_000)
    seed: Count = 0
    model: ModelConfig = ModelConfig()
    placement: PlacementConfig = PlacementConfig()
    population: PopulationRef | None = None
    budget: Budget | None = None
    graph: GraphRef | None = None  # agents hear their in-neighbours' posts of the round before
    broadcasts: list[Broadcast] = []  # messages the platform puts in inboxes (needs a graph)
    interviews: list[PlannedInterview] = []  # surveys asked after rounds (populace.sdk.interview)

    @model_validator(mode="before")
    @classmethod
    def _counted(cls, data: Any) -> Any:
        # every validation of a run's config passes here, nested ones too (inside a message or
        # a run state): counted, so a path that validates a config it already has shows up. An
        # instance taken as it is (pydantic does not validate it again) is not counted.
        if not isinstance(data, RunConfig):
            metrics.RUN_CONFIGS_VALIDATED.inc()
        return data

    @model_validator(mode="after")
    def _named(self) -> RunConfig:
        if not self.name:
            object.__setattr__(self, "name", self.simulation)  # frozen: once, during validation
        return self

    @model_validator(mode="after")
    def _one_per_process_is_bounded(self) -> RunConfig:
        if self.placement.agents_per_process == 1 and self.agents > 10_000:
            raise ValueError(
                "placement.agents_per_process: 1 starts one OS process per agent; "
                f"{self.agents} agents is too many (max 10000)"
            )
        return self

    @model_validator(mode="after")
    def _broadcasts_fit(self) -> RunConfig:
        for i, b in enumerate(self.broadcasts):
            where = f"broadcasts.{i}"
            if self.graph is None:
                raise ValueError(f"{where}: broadcasts go to inboxes, which need a `graph:`")
            if b.round > self.rounds:
                raise ValueError(f"{where}.round: {b.round} is after the run's last round ({self.rounds})")
            if b.count is not None and b.count > self.agents:
                raise ValueError(f"{where}.count: {b.count} is more than the run's {self.agents} agents")
            bad = [a for a in b.agents or () if a >= self.agents]
            if bad:
                raise ValueError(f"{where}.agents: agent {bad[0]} does not exist (ids are 0..{self.agents - 1})")
        return self

    @model_validator(mode="after")
    def _interviews_fit(self) -> RunConfig:
        seen: set[str] = set()
        for i, plan in enumerate(self.interviews):
            where = f"interviews.{i}"
            if plan.id in seen:
                raise ValueError(f"{where}.id: survey {plan.id!r} is planned twice (one entry per survey)")
            seen.add(plan.id)
            late = [r for r in plan.after if r > self.rounds] if plan.after != "every" else []
            if late:
                raise ValueError(f"{where}.after: round {late[0]} is after the run's last round ({self.rounds})")
            bad = [a for a in plan.agents or () if a >= self.agents]
            if bad:
                raise ValueError(f"{where}.agents: agent {bad[0]} does not exist (ids are 0..{self.agents - 1})")
        return self

    @property
    def params(self) -> dict:
        """The simulation's own sections, as written (validated by the simulation)."""
        return dict(self.model_extra or {})


def config_json(config: RunConfig) -> bytes:
    """A run config's canonical bytes (sorted keys, compact): what its digest is taken over and
    what the object store holds, the same after any number of JSON round trips."""
    return json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode()


class ConfigRef(BaseModel):
    """A run's config by reference: the sha256 of its canonical bytes (`config_json`) and the
    first round it applies to (a resume with a new budget changes it from its next round). Round
    opens carry this, never the config: a receiver fetches the config (populace.core.runconfigs)
    only when the digest is new to it, and uses it only if its bytes have that digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: SHA256
    from_round: int = Field(1, ge=1, le=10_000)

    @classmethod
    def of(cls, config: RunConfig, from_round: int = 1) -> ConfigRef:
        return cls(digest=hashlib.sha256(config_json(config)).hexdigest(), from_round=from_round)


def _check_token(v: str) -> str:
    if not valid_token(v):
        raise ValueError(f"{v!r} must be one NATS subject token (no '.', ' ', '*', '>')")
    return v


RunId = Annotated[str, Field(min_length=1, max_length=64)]


def _finite_json(v: object) -> object:
    """A JSON document (a simulation's payload, summary, state) holds no NaN or infinity: a
    NaN in a partial made the environment raise in a loop, and DuckDB refuses it as JSON."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            raise ValueError("numbers must be finite (no NaN or infinity)")
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return v


# Bounded wire types: what a forged or corrupted message carries is refused at the edge (a
# dead letter), never stored and never a stalled round. Bounds follow RunConfig's.
Token = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_check_token)]
AgentId = Annotated[int, Field(ge=0, lt=100_000_000)]
RoundNo = Annotated[int, Field(ge=1, le=10_000)]
Epoch = Annotated[int, Field(ge=0, le=1_000_000)]
Amount = Annotated[int, Field(ge=0, lt=2**63)]
Millis = Annotated[float, Field(ge=0, allow_inf_nan=False)]
JsonDoc = Annotated[dict, AfterValidator(_finite_json)]
CheckpointName = Annotated[str, Field(min_length=1, max_length=200)]  # subjects.checkpoint_agents / _env


# --- what a simulation records: declared by the simulation, carried by RunStarted --------
# The platform's columns of every round table; a simulation's summary takes other names.
PLATFORM_SUMMARY_COLUMNS = ("run_id", "round", "n", "n_valid", *Usage.RECORDED, "closed_at")
# A DuckDB identifier we create tables and columns with (quoted, but kept plain on purpose).
Identifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]{0,62}$")]
ColumnType = Literal["DOUBLE", "BIGINT", "VARCHAR", "BOOLEAN", "JSON"]


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


# --- control plane -------------------------------------------------------------------
class WorldRef(Strict):
    """Where a simulation's world is (a checkpoint object, Arrow IPC) and the sha256 it must have:
    a reader uses it only if its bytes still have it."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    digest: SHA256


class Restore(Strict):
    """Where a run's agents and environment start from: the checkpoint of `run_id` taken
    after `round` (its own, on resume; its parent's, for a fork). `ranges` are the agent id
    ranges the checkpoint was written in (one object per range), filled by the orchestrator."""

    run_id: RunId
    round: int = Field(ge=1)
    ranges: list[tuple[int, int]] = []
    # checkpoint object name -> the sha256 of its bytes, as its writer reported when the round
    # closed (filled by the orchestrator from KV `runs`): a reader uses only what matches
    digests: dict[str, SHA256] = {}

    _tok = field_validator("run_id")(_check_token)


class Layout(Strict):
    """The agent id ranges a run's hosts played (and checkpointed) from `from_round` on."""

    from_round: int = Field(ge=1)
    ranges: list[tuple[int, int]]
    shares: list[str] = []  # the key of the share that played each range (parallel to `ranges`)


class RunStart(Strict):
    v: Literal[1] = SCHEMA_VERSION
    run_id: RunId
    config: RunConfig
    requested_at: float = Field(default_factory=time.time)
    manifest: dict | None = None  # reproducibility manifest, stored with the run
    fork: Restore | None = None  # start from another run's state after one of its rounds

    _tok = field_validator("run_id")(_check_token)


class RunCancel(Strict):
    """Stop a run at once; what was recorded stays, and it can be resumed."""

    v: Literal[1] = SCHEMA_VERSION
    run_id: RunId
    reason: str = Field("cancelled by the user", max_length=1000)
    requested_at: float = Field(default_factory=time.time)

    _tok = field_validator("run_id")(_check_token)


class RunResume(Strict):
    """Continue a failed, cancelled or paused run from its last completed round."""

    v: Literal[1] = SCHEMA_VERSION
    run_id: RunId
    budget: Budget | None = None  # replaces the run's budget (e.g. to continue after it paused on it)
    requested_at: float = Field(default_factory=time.time)

    _tok = field_validator("run_id")(_check_token)


class InterviewRequest(Strict):
    """Ask a survey after the fact, of a run's agents as they were after `after_round`: every
    agent, a seeded `sample` share of them, or `agents` (`populace interview`). It plays no
    round and writes no checkpoint: agent-hosts answer from the round's verified checkpoint,
    each agent on a copy. `request` names it (its answers' `request` column)."""

    v: Literal[1] = SCHEMA_VERSION
    run_id: RunId
    request: InterviewId
    after_round: int = Field(ge=1, le=10_000)
    survey: Survey
    sample: FiniteFloat | None = Field(None, gt=0, le=1)
    agents: list[Annotated[int, BeforeValidator(_not_bool), Field(ge=0, lt=100_000_000)]] | None = Field(
        None, min_length=1, max_length=1_000_000)
    requested_at: float = Field(default_factory=time.time)

    _tok = field_validator("run_id")(_check_token)

    @model_validator(mode="after")
    def _who(self) -> InterviewRequest:
        if self.sample is not None and self.agents is not None:
            raise ValueError("sample, agents: give one of them (or neither: every agent)")
        return self


class HostInfo(Strict):
    """An agent-host's registry entry (KV `hosts`), refreshed by heartbeats."""

    v: Literal[1] = SCHEMA_VERSION
    host_id: str
    capacity: int = Field(ge=1)
    agents: int = Field(0, ge=0)  # a negative count would claim more room than `capacity`
    pid: int
    started_at: float
    heartbeat_at: float

    _tok = field_validator("host_id")(_check_token)


class ServiceInfo(Strict):
    v: Literal[1] = SCHEMA_VERSION
    service: str
    instance: str
    pid: int
    heartbeat_at: float


def share_key(host_id: str, epoch: int) -> str:
    """A share's name: the host that plays it and the epoch it was placed in."""
    return f"{host_id}@{epoch}"


class Share(Strict):
    """Agents one host plays for a run, placed in one epoch: the unit of placement, recovery
    and integrity. Its key `host@epoch` is what its outcome batches and partial carry (host_id
    and epoch); once a re-placement or a resume replaces it, nothing of it counts from
    `from_round` of its replacement on."""

    host_id: str
    epoch: int = Field(0, ge=0)
    ranges: list[tuple[int, int]]  # (first_agent_id, count)
    from_round: int = Field(1, ge=1)  # the first round it plays (a replacement replays the one in play)
    incarnation: float | None = None  # the host process's start time when placed: a restart loses the share

    _tok = field_validator("host_id")(_check_token)

    @property
    def key(self) -> str:
        return share_key(self.host_id, self.epoch)

    @property
    def count(self) -> int:
        return sum(c for _, c in self.ranges)


# A run's status groups, shared by the orchestrator's decisions and the CLI's checks.
ACTIVE_STATUSES = ("spawning", "running")
RESUMABLE_STATUSES = ("failed", "cancelled", "paused")  # `populace resume` continues these


class RunState(Strict):
    """Run state in KV `runs`, advanced only by compare-and-swap. The environment's state and
    the next round's observation are the simulation's (opaque here): they travel with each
    round open, so the environment keeps no state between rounds that a restart could lose."""

    v: Literal[1] = SCHEMA_VERSION
    run_id: str
    status: Literal["spawning", "running", "done", "failed", "cancelled", "paused"]
    config: RunConfig
    # `config` by digest, as round opens name it (default: `config` from round 1); the
    # orchestrator sets it with every change of `config`
    config_ref: ConfigRef | None = None
    shares: list[Share]  # the placement: which host plays which agent ids, since which epoch
    spawned: list[str] = []  # keys of the shares whose agents exist
    # While running: the round being played; otherwise the last completed one (0: none yet).
    round: int = 0
    # Bumped by every placement after the first (a resume, a re-placement): the newest epoch.
    epoch: int = 0
    restore: Restore | None = None  # where the agents' state comes from when they spawn
    layouts: list[Layout] = []  # the ranges of each placement, to find a round's checkpoints
    env_state: dict | None = None  # after the last closed round; None before round 1
    observation: dict | None = None  # what the agents see in the next round
    selection: dict | None = None  # who acts in the next round (None: everyone)
    world: WorldRef | None = None  # the world the next round plays in (a simulation with a World)
    reason: str | None = None
    phase_at: float = Field(default_factory=time.time)  # when spawning began or the round in play opened
    nudged: int = 0  # times the round in play (or the spawn) was announced again for its deadline
    used: Usage = Usage()  # LLM work of the completed rounds
    last_round: Usage = Usage()  # the last completed round's: what the next one likely needs
    interviews: Usage = Usage()  # LLM work of the planned interviews, as the hosts reported it (apart from `used`)
    # The last completed round's checkpoint objects -> the sha256 of their bytes, as their
    # writers reported them (each share its own ranges', the environment its own): a restore
    # uses an object only if it still matches. Only the orchestrator writes KV `runs`.
    checkpoints: dict[str, SHA256] = {}
    updated_at: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _config_referenced(self) -> RunState:
        if self.config_ref is None:
            object.__setattr__(self, "config_ref", ConfigRef.of(self.config))  # frozen: once, during validation
        return self

    @property
    def placement(self) -> dict[str, list[tuple[int, int]]]:
        """host_id -> its ranges (every share of the host)."""
        out: dict[str, list[tuple[int, int]]] = {}
        for sh in self.shares:
            out.setdefault(sh.host_id, []).extend(sh.ranges)
        return out

    def share(self, key: str) -> Share | None:
        return next((sh for sh in self.shares if sh.key == key), None)


class RunHead(BaseModel):
    """What a round open is checked against in a run state (KV `runs`), read without its
    config: a receiver validates a run's config once (populace.core.runconfigs), not per round."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: str
    status: Literal["spawning", "running", "done", "failed", "cancelled", "paused"]
    config_ref: ConfigRef | None = None
    shares: list[Share]
    round: int = 0
    epoch: int = 0
    env_state: dict | None = None
    observation: dict | None = None


# --- run events ----------------------------------------------------------------------
class RunStarted(Wire):
    run_id: Token
    config: RunConfig
    started_at: float
    hosts: list[Token]
    tables: SimulationTables
    manifest: dict | None = None


class SpawnBatch(Wire):
    """Agents for one host, as id ranges: personas and the run's config by reference, never copied."""

    run_id: Token
    host_id: Token
    ranges: list[tuple[AgentId, Amount]]  # (first_agent_id, count)
    config_ref: ConfigRef  # the run's config by digest, as round opens name it (populace.core.runconfigs)
    epoch: Epoch = 0  # the share's epoch: with host_id, its key
    restore: Restore | None = None  # restore the agents' declared state from this checkpoint
    from_round: int = Field(1, ge=1)  # the first round this share plays (a replacement: the one in play)
    live: list[str] = []  # every live share's key after this placement: the host drops its others

    @property
    def count(self) -> int:
        return sum(c for _, c in self.ranges)


class HostSpawned(Wire):
    run_id: Token
    host_id: Token
    agents: Amount
    seconds: float = Field(ge=0)
    epoch: Epoch = 0


class RoundOpen(Wire):
    """Once per round (not per agent). `observation` is what every agent sees this round and
    `env_state` what the environment decided so far; both None in round 1 (the simulation's
    environment starts them)."""

    run_id: Token
    round: RoundNo
    expected: int = Field(ge=1)  # agents that must answer before the round closes
    config_ref: ConfigRef  # the run's config by digest: it does not travel with every round
    observation: JsonDoc | None = None
    env_state: JsonDoc | None = None
    opened_at: float
    epoch: Epoch = 0  # the placement's: announced again (same round, newer epoch) after a re-placement
    shares: dict[str, Amount] = {}  # live share key -> its agents: only their partials count
    nudge: int = 0  # >0: announced again because the round missed its deadline
    # live share key -> its agent id ranges: where posts go (runs with a graph)
    ranges: dict[str, list[tuple[AgentId, Amount]]] = {}
    # who acts this round (populace.sdk.select, as the environment decided it); None: everyone,
    # or in a run's first round what the simulation's environment starts with
    selection: JsonDoc | None = None
    world: WorldRef | None = None  # the simulation's world this round (None: round 1's, or none)


class PostColumns(Wire):
    """The posts of an outcome batch's agents (a run with a graph), one per agent id, and what
    each agent heard this round: how many posts, and the sum of their digests mod 2**63
    (`populace.sdk.post.post_hash`), so the inbox can be checked against the graph."""

    texts: list[str | None]  # None: the agent did not post
    fields: list[JsonDoc | None]
    heard: list[Amount]
    heard_digest: list[Amount]


class ActColumns(Wire):
    """The acts of the scenes whose members' outcomes are in the batch (a simulation with scenes):
    one row per act, in each group's order (`seq`, shared with its lines), with the simulation's
    Act columns, its validity, raw text, latency and error, as outcomes have them."""

    group_id: list[Amount]
    seq: list[Amount]
    agent_id: list[AgentId]
    phase: list[Annotated[str, Field(max_length=200)]]
    columns: dict[str, list]
    valid: list[bool]
    raw: list[str]
    latency_ms: list[Millis]
    error: list[str | None]

    @model_validator(mode="after")
    def _same_length(self) -> ActColumns:
        n = len(self.agent_id)
        lengths = [len(self.group_id), len(self.seq), len(self.phase), len(self.valid), len(self.raw),
                   len(self.latency_ms), len(self.error), *(len(c) for c in self.columns.values())]
        if any(k != n for k in lengths):
            raise ValueError("every column of a batch's acts must have one value per act")
        return self


class LineColumns(Wire):
    """What the batch's scenes' members said (`scene.say`): one row per line of a transcript."""

    group_id: list[Amount]
    seq: list[Amount]
    speaker: list[Annotated[int, Field(ge=-1, lt=100_000_000)]]  # -1: the scene itself (a game master)
    text: list[Annotated[str, Field(max_length=10_000)]]
    fields: list[str | None]  # compact JSON

    @model_validator(mode="after")
    def _same_length(self) -> LineColumns:
        n = len(self.seq)
        if any(len(c) != n for c in (self.group_id, self.speaker, self.text, self.fields)):
            raise ValueError("every column of a batch's lines must have one value per line")
        return self


class EdgeColumns(Wire):
    """The edge edits of a batch's agents (a simulation with edge kinds), in the order they apply."""

    follower: list[AgentId]
    author: list[AgentId]
    kind: list[Identifier]
    op: list[Literal["add", "remove"]]

    @model_validator(mode="after")
    def _same_length(self) -> EdgeColumns:
        n = len(self.follower)
        if any(len(c) != n for c in (self.author, self.kind, self.op)):
            raise ValueError("every column of a batch's edits must have one value per edit")
        return self


class OutcomeBatch(Wire):
    """~1,000 agents' outcomes of one round from one host, columnar. `columns` holds the
    simulation's outcome columns (name -> values); the rest is the platform's: whether the
    answer was valid, the model's raw text (always kept), the turn's latency, and an error
    when the turn failed (the agent raised, or no model answered)."""

    run_id: Token
    round: RoundNo
    host_id: Token
    seq: Amount
    agent_ids: list[AgentId]
    columns: dict[str, list]
    valid: list[bool]
    raws: list[str]
    latency_ms: list[Millis]
    errors: list[str | None]
    group_ids: list[Amount] | None = None
    epoch: Epoch = 0
    posts: PostColumns | None = None  # a run with a graph: each agent's post and what it heard
    levels: dict[Identifier, list[Amount]] | None = None  # nested groups: each outer level's group ids
    acts: ActColumns | None = None  # scenes: the acts of these agents' groups
    lines: LineColumns | None = None  # scenes: what these agents' groups said
    edits: EdgeColumns | None = None  # graphs that change: these agents' edge edits

    @model_validator(mode="after")
    def _same_length(self) -> OutcomeBatch:
        n = len(self.agent_ids)
        lengths = [len(self.valid), len(self.raws), len(self.latency_ms), len(self.errors),
                   *(len(c) for c in self.columns.values()), *(len(c) for c in (self.levels or {}).values())]
        if self.posts is not None:
            p = self.posts
            lengths += [len(p.texts), len(p.fields), len(p.heard), len(p.heard_digest)]
        if self.group_ids is not None:
            lengths.append(len(self.group_ids))
        if any(k != n for k in lengths):
            raise ValueError("every column of an outcome batch must have one value per agent id")
        return self


class InterviewBatch(Wire):
    """~1,000 answers to one survey asked after one round: one row per (agent, question), each
    the answer (as text: the option, the point, the number, the text), its number (Likert and
    number questions), the model's raw text (always kept), validity, error and latency. From a
    share that played the round (planned in the scenario) or a host a post-hoc `request` was
    placed on. `usage`: these answers' LLM work."""

    run_id: Token
    after_round: RoundNo
    host_id: Token
    epoch: Epoch = 0
    seq: Amount
    survey: Survey
    request: InterviewId | None = None  # a post-hoc interview's id; None: planned in the scenario
    agent_ids: list[AgentId]
    questions: list[InterviewId]
    answers: list[Annotated[str, Field(max_length=MAX_ANSWER_CHARS)] | None]
    values: list[FiniteFloat | None]
    raws: list[str]
    valid: list[bool]
    errors: list[str | None]
    latency_ms: list[Millis]
    usage: Usage = Usage()

    @model_validator(mode="after")
    def _rows(self) -> InterviewBatch:
        n = len(self.agent_ids)
        if any(len(c) != n for c in (self.questions, self.answers, self.values, self.raws, self.valid, self.errors,
                                     self.latency_ms)):
            raise ValueError("every column of an interview batch must have one value per row")
        asked = {q.id for q in self.survey.questions}
        strange = set(self.questions) - asked
        if strange:
            raise ValueError(f"questions: {min(strange)!r} is not a question of survey {self.survey.id!r}")
        return self


class InterviewOrder(Wire):
    """The orchestrator's order to one agent-host: its agents of `ranges` (those the request
    chooses) answer `request`'s survey from the checkpoint `restore` names (verified against
    its digests), with the run's config (its simulation, model, personas)."""

    run_id: Token
    host_id: Token
    request: InterviewId
    after_round: RoundNo
    survey: Survey
    sample: FiniteFloat | None = None
    agents: list[AgentId] | None = None
    ranges: list[tuple[AgentId, Amount]]
    restore: Restore
    config: RunConfig


class InterviewPlaced(Wire):
    """A post-hoc interview placed (`hosts`: host id -> its ranges; `expected`: answers the
    request will have), or refused with `error` (nothing is asked)."""

    run_id: Token
    request: InterviewId
    after_round: int = Field(ge=0)
    survey: Survey | None = None
    hosts: dict[str, list[tuple[AgentId, Amount]]] = {}
    expected: Amount = 0
    error: str | None = Field(None, max_length=4000)
    placed_at: float


class InterviewsRecorded(Wire):
    """Every answer of a post-hoc interview is in DuckDB (`populace interview` reads them)."""

    run_id: Token
    request: InterviewId
    answers: Amount
    db_path: str


class MailBatch(Wire):
    """Posts one share sends another: its authors' posts of `round` that the destination's
    agents hear. One message per (round, source share, destination share), or `shards` of
    them under the payload limit; every destination gets at least one (maybe empty), so it
    knows when its mail is all in. Message ids make a retry or a redelivery count once."""

    run_id: Token
    round: RoundNo
    host_id: Token  # the source share: host and epoch
    epoch: Epoch = 0
    to: Token  # the destination share's key (host@epoch)
    shard: int = Field(ge=0, lt=100_000)
    shards: int = Field(ge=1, le=100_000)
    authors: list[AgentId]
    texts: list[str]
    fields: list[JsonDoc | None]

    @model_validator(mode="after")
    def _same_length(self) -> MailBatch:
        if not (len(self.authors) == len(self.texts) == len(self.fields)):
            raise ValueError("authors, texts and fields must have one value per post")
        if self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} of {self.shards}")
        return self


class RoundPartial(Wire):
    """One host's reduced round (its groups reduced first): the simulation's `payload`, plus
    how many agents it covers. The environment merges partials; it never sees an agent."""

    run_id: Token
    round: RoundNo
    host_id: Token
    n: int = Field(ge=0)  # agents that answered (valid or not)
    n_valid: int = Field(ge=0)
    payload: JsonDoc
    epoch: Epoch = 0
    usage: Usage = Usage()
    # interviews' LLM work the share finished since its last partial (planned ones run after a
    # round, beside the next): counted apart from the rounds', against the same budget
    interviews: Usage = Usage()
    # the share's checkpoint objects of this round -> the sha256 of the bytes it stored
    checkpoints: dict[CheckpointName, SHA256] = Field({}, max_length=100_000)
    # invalid rows whose cause is the simulation's own code (error 'agent: …'), not the model
    n_simulation_errors: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _valid_within_n(self) -> RoundPartial:
        if self.n_valid > self.n:
            raise ValueError(f"n_valid ({self.n_valid}) cannot exceed n ({self.n})")
        if self.n_valid + self.n_simulation_errors > self.n:
            raise ValueError(f"n_simulation_errors ({self.n_simulation_errors}) cannot exceed the invalid rows "
                             f"({self.n - self.n_valid})")
        return self


class RoundResult(Wire):
    """The environment's decision: the simulation's per-round `summary` (recorded), the
    `observation` agents see next round and the environment's `state` after this round."""

    run_id: Token
    round: RoundNo
    n: Amount
    n_valid: Amount
    summary: JsonDoc
    observation: JsonDoc
    state: JsonDoc
    closed_at: float
    epoch: Epoch = 0
    shares: list[str] = []  # the share keys whose partials it folded: stale if one was replaced
    usage: Usage = Usage()  # the folded shares' LLM work
    interviews: Usage = Usage()  # the folded shares' interviews' LLM work, apart
    selection: JsonDoc | None = None  # who acts next round (populace.sdk.select); None: everyone
    world: WorldRef | None = None  # the simulation's world after the round (stored before this result)
    # share key -> the checkpoint digests its partial reported (the orchestrator keeps each
    # share's own ranges' only), and the sha256 of the environment's own checkpoint
    checkpoints: dict[str, dict[CheckpointName, SHA256]] = {}
    env_checkpoint: SHA256 | None = None
    # of the n - n_valid invalid rows, those the simulation's own code caused (error 'agent: …');
    # the rest are the model's invalid answers
    n_simulation_errors: Amount = 0


class RunResumed(Wire):
    """A run continues (resume) in a new epoch: rounds after `after_round` are played again,
    so what was recorded of them is dropped; outcomes of older epochs are stale."""

    run_id: Token
    epoch: int = Field(ge=1)
    after_round: int = Field(ge=0)  # the last completed round: play continues with the next
    hosts: list[str]
    resumed_at: float


class RunFault(Wire):
    """A service cannot go on with a run (a simulation that does not import, an environment
    that raised, personas missing): the orchestrator fails the run with this reason at once.
    `pause`: not the run's fault (no model answers): the run pauses instead, to be resumed."""

    run_id: Token
    source: str  # the service or host that reports it: the last token of its subject
    round: int | None = None
    reason: str
    pause: bool = False
    epoch: Epoch | None = None  # a host's: the epoch of its share that cannot go on


class RunDone(Wire):
    run_id: Token
    status: Literal["completed", "failed", "cancelled", "paused"]
    rounds: Amount
    finished_at: float
    reason: str | None = None
    epoch: Epoch = 0


class RunRecorded(Wire):
    run_id: Token
    outcomes: int  # agent-rounds recorded
    db_path: str
    answers: int = 0  # planned interviews' answers recorded
    answers_missing: int = 0  # planned answers that did not come within POPULACE_INTERVIEW_WAIT_S (a host lost)
    epoch: Epoch = 0  # the RunDone's it follows: a resumed run's earlier stop may be recorded after it


class Progress(Wire):
    run_id: Token
    round: RoundNo
    host_id: Token
    answered: int


# --- inference -----------------------------------------------------------------------
class InferBatch(Wire):
    """Many prompts that share one system prompt (a shared prefix, sent once per batch) and
    one answer schema: each prompt is one structured call, validated by the gateway."""

    batch_id: str
    run_id: Token
    round: RoundNo
    model: ModelConfig
    system: str
    keys: list[Amount]  # request keys (agent ids): correlation and per-agent seeding
    # per request, the how-many-th call of its key in this round (None: all first calls): seeds each call apart
    seqs: list[Amount] | None = None
    prompts: list[str]
    response_schema: dict | None = None  # JSON schema every answer must satisfy
    # Leading characters of each prompt that stay the same from round to round (the agent's
    # persona): the gateway routes on system prompt + this prefix, so an agent's persona
    # stays in one replica's prefix cache across rounds. None: route on the system prompt.
    prefix_chars: list[int] | None = None

    @model_validator(mode="after")
    def _same_length(self) -> InferBatch:
        if len(self.keys) != len(self.prompts):
            raise ValueError("keys and prompts must have equal length")
        if self.prefix_chars is not None and len(self.prefix_chars) != len(self.prompts):
            raise ValueError("prefix_chars and prompts must have equal length")
        if self.seqs is not None and len(self.seqs) != len(self.prompts):
            raise ValueError("seqs and prompts must have equal length")
        return self


class InferReply(Wire):
    """Answers in request order. `texts[i]` is the model's raw text (kept even when invalid);
    the per-call columns are filled for real model backends."""

    batch_id: str
    texts: list[str] = []
    error: str | None = None
    valid: list[bool] = []
    attempts: list[int] = []
    # Per prompt: why no model answered it (no replica, every attempt failed), None when one
    # did. An infrastructure failure is never an answer: the agent-host asks again.
    failed: list[str | None] = []
    prompt_tokens: list[int] = []  # per prompt, for real model backends (empty: not counted)
    completion_tokens: list[int] = []


class LlmCallBatch(Wire):
    """What the gateway did for each decision of one inference batch (table `llm_calls`)."""

    run_id: Token
    round: RoundNo
    batch_id: str
    agent_ids: list[AgentId]
    replicas: list[str]
    prompt_tokens: list[Amount]
    completion_tokens: list[Amount]
    latency_ms: list[Millis]
    attempts: list[Amount]  # HTTP calls made for the decision: re-asks and retries on other replicas included
    valid: list[bool]
    reasks: list[Amount] = []  # of those, corrective re-asks after an invalid answer (empty: not counted)
    # Who asked: the NATS user its request subject named (llm.infer.<requester>), which only that
    # user may publish; "" from a gateway before requesters were named.
    requester: str = ""

    @model_validator(mode="after")
    def _same_length(self) -> LlmCallBatch:
        n = len(self.agent_ids)
        if any(len(c) != n for c in (self.replicas, self.prompt_tokens, self.completion_tokens, self.latency_ms,
                                     self.attempts, self.valid)) or len(self.reasks) not in (0, n):
            raise ValueError("every column of a call batch must have one value per agent id")
        return self


class ReplicaInfo(Strict):
    """An LLM replica's registry entry (KV `replicas`), refreshed by heartbeats."""

    v: Literal[1] = SCHEMA_VERSION
    replica_id: str
    url: str  # base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8100
    backend: Literal["local", "sim", "openai"]  # which ModelConfig.backend it serves
    kind: Literal["llamacpp", "vllm", "sim", "openai"]  # API dialect and metric names
    model: str
    max_concurrency: int = Field(4, ge=1)
    pid: int | None = None
    heartbeat_at: float

    _tok = field_validator("replica_id")(_check_token)


# --- nodes: `populace node`, one daemon per machine ---------------------------------------
# Requests are core NATS request/reply on `node.<node_id>.<verb>` (subjects.node_request): a
# request to a node that is down fails at once (no responders) instead of waiting in a stream
# and starting processes whenever the node comes back. Each verb has its own request model;
# every request gets a NodeReply, a malformed one included (and is dead-lettered to dlq.node).
GONE_AFTER_BEATS = 3  # a node whose entry is older than this many heartbeats reads as gone


class RestartPolicy(Strict):
    """What a node does when a child exits by itself: `never` restart it, or restart it
    `on-failure` (a non-zero exit code or a signal) up to `max_restarts` times, after
    `backoff_s`, doubled at each restart up to MAX_BACKOFF_S. A child stopped on request is
    never restarted."""

    MAX_BACKOFF_S: ClassVar[float] = 60.0

    mode: Literal["never", "on-failure"] = "never"
    max_restarts: Count = Field(3, ge=0, le=100)
    backoff_s: FiniteFloat = Field(1.0, ge=0, le=60)


# A host name or address a server binds to or is reached at (no spaces, quotes or options).
HostName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9_.:\[\]-]+$")]


class AgentHostSpec(Strict):
    """An agent-host (`populace service agent-host`); its host id is `<node_id>-<proc_id>`."""

    kind: Literal["agent-host"] = "agent-host"
    max_in_flight: Count | None = Field(None, ge=1, le=10_000_000)  # POPULACE_MAX_IN_FLIGHT
    capacity: Count | None = Field(None, ge=1, le=100_000_000)  # POPULACE_HOST_CAPACITY
    one_agent_per_process: bool = False  # POPULACE_ONE_AGENT_PER_PROCESS


class GatewaySpec(Strict):
    """An inference gateway (`populace service gateway`)."""

    kind: Literal["gateway"] = "gateway"
    router: Literal["prefix-affinity", "least-loaded", "round-robin"] | None = None  # POPULACE_GATEWAY_ROUTER
    max_workers: Count | None = Field(None, ge=1, le=100_000)  # POPULACE_GATEWAY_MAX_WORKERS


class ReplicasSpec(Strict):
    """LLM replicas registered for the gateways: `populace replicas local|sim|vllm`, one
    process serving `servers` replicas (llama.cpp servers, simulated replicas, or one
    `vllm serve` per GPU in `gpus`)."""

    kind: Literal["replicas"] = "replicas"
    backend: Literal["local", "sim", "vllm"] = "sim"
    servers: Count = Field(1, ge=1, le=64)  # local and sim: --count (vllm: one per GPU)
    max_concurrency: Count | None = Field(None, ge=1, le=100_000)
    threads: Count | None = Field(None, ge=1, le=1024)  # local only
    ctx: Count | None = Field(None, ge=256, le=1_048_576)  # local only
    model: str | None = Field(None, min_length=1, max_length=500, pattern=r"^[A-Za-z0-9_./:@+-]+$")  # vllm only
    gpus: list[Annotated[int, Field(ge=0, le=1023)]] = Field([], max_length=64)  # vllm only
    base_port: Count | None = Field(None, ge=1024, le=65535)  # vllm only
    bind: HostName | None = None
    advertise: HostName | None = None

    @model_validator(mode="after")
    def _options_of_its_backend(self) -> ReplicasSpec:
        if self.backend == "vllm":
            if not self.model:
                raise ValueError("model: a vllm replica needs the model to serve")
            if self.threads is not None or self.ctx is not None:
                raise ValueError("threads and ctx are options of the local backend, not vllm")
        else:
            if self.model or self.gpus or self.base_port is not None:
                raise ValueError(f"model, gpus and base_port are options of the vllm backend, not {self.backend}")
            if self.backend == "sim" and (self.threads is not None or self.ctx is not None):
                raise ValueError("threads and ctx are options of the local backend, not sim")
        return self


class ServiceSpec(Strict):
    """Another Populace service by name (`populace service NAME`: orchestrator, environment,
    recorder …); the node refuses a name that is not an installed service."""

    kind: Literal["service"] = "service"
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z][a-z0-9-]*$")


ProcessSpec = Annotated[AgentHostSpec | GatewaySpec | ReplicasSpec | ServiceSpec, Field(discriminator="kind")]
ProcessState = Literal["running", "restarting", "exited", "stopped"]


class NodeRequest(Strict):
    """A request to one node; VERB is the last token of its subject."""

    VERB: ClassVar[str] = ""
    v: Literal[1] = SCHEMA_VERSION


# A client's name for one request (node_request sets a uuid): a node answers a request whose
# id it has seen with the reply it gave then, so a re-send after a timeout starts nothing twice.
RequestId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class StartProcess(NodeRequest):
    """Start `count` processes of `spec`, each with `restart` as its policy. A repeat of a
    `request_id` the node remembers gets the first reply and starts nothing."""

    VERB: ClassVar[str] = "start"
    spec: ProcessSpec
    count: Count = Field(1, ge=1, le=64)
    restart: RestartPolicy = RestartPolicy()
    request_id: RequestId | None = None


class StopProcess(NodeRequest):
    """Stop one process (SIGTERM, SIGKILL after `grace_s`) and forget it."""

    VERB: ClassVar[str] = "stop"
    proc_id: Token
    grace_s: FiniteFloat = Field(10.0, ge=0, le=300)


class ListProcesses(NodeRequest):
    """The node's entry as it is now (resources and every process, with CPU and memory)."""

    VERB: ClassVar[str] = "list"


class TailLog(NodeRequest):
    """The last `lines` lines of a process's log, at most `max_bytes` of it."""

    VERB: ClassVar[str] = "logs"
    proc_id: Token
    lines: Count = Field(50, ge=1, le=10_000)
    max_bytes: Count = Field(64 * 1024, ge=1, le=512 * 1024)


class Cleanup(NodeRequest):
    """Stop every process the node started (SIGTERM, SIGKILL after `grace_s`) and forget them."""

    VERB: ClassVar[str] = "cleanup"
    grace_s: FiniteFloat = Field(10.0, ge=0, le=300)


NODE_REQUESTS: tuple[type[NodeRequest], ...] = (StartProcess, StopProcess, ListProcesses, TailLog, Cleanup)


class ProcessInfo(Strict):
    """One child of a node. `exit_code` is its last exit's (negative: killed by that signal);
    `cpu_percent` counts its own process tree (100 = one core)."""

    proc_id: Token
    spec: ProcessSpec
    restart: RestartPolicy
    state: ProcessState
    pid: int | None = None
    exit_code: int | None = None
    restarts: int = Field(0, ge=0)
    started_at: float
    cpu_percent: float = Field(0.0, ge=0, allow_inf_nan=False)
    rss_bytes: int = Field(0, ge=0)
    log_path: str


class GpuInfo(Strict):
    index: int = Field(ge=0)
    name: str
    memory_mb: int = Field(ge=0)


class NodeInfo(Strict):
    """A node's registry entry (KV `nodes`, key: its node id), refreshed every `heartbeat_s`."""

    v: Literal[1] = SCHEMA_VERSION
    node_id: Token
    hostname: str
    pid: int
    version: str
    cpus: int = Field(ge=1)
    memory_bytes: int = Field(ge=0)
    memory_available_bytes: int = Field(ge=0)
    gpus: list[GpuInfo] = []
    free_ports: list[int] = []  # a few ports free when the entry was written
    log_dir: str
    started_at: float
    heartbeat_at: float
    heartbeat_s: float = Field(gt=0)
    processes: list[ProcessInfo] = []

    def gone(self, now: float | None = None) -> bool:
        """Whether the node missed GONE_AFTER_BEATS heartbeats (stopped, killed, cut off)."""
        return (now if now is not None else time.time()) - self.heartbeat_at > GONE_AFTER_BEATS * self.heartbeat_s


class NodeReply(Strict):
    """Every node request's answer. `ok` False: `error` says why (nothing was done). `start`,
    `stop` and `cleanup` list the processes they started or stopped; `list` gives the node's
    entry as it is now (`node`); `logs` fills `log` (whole lines; `log_truncated` when older
    lines were left out)."""

    v: Literal[1] = SCHEMA_VERSION
    node_id: str
    ok: bool
    error: str | None = Field(None, max_length=4000)
    node: NodeInfo | None = None  # `list` only
    processes: list[ProcessInfo] = []
    log: str | None = None
    log_truncated: bool = False


# --- reading results while the recorder writes them (`recorder.read.<verb>`) ------------------
class ReadRequest(Strict):
    """A request to the recorder to read recorded results; VERB is the last token of its subject."""

    VERB: ClassVar[str] = ""
    v: Literal[1] = SCHEMA_VERSION


class SnapshotRequest(ReadRequest):
    """A consistent copy of what is recorded so far: the whole `runs` table, and the rows of
    `run_ids` in every other table (none: the runs table alone, to resolve 'last' or a sweep)."""

    VERB: ClassVar[str] = "snapshot"
    run_ids: list[RunId] = Field([], max_length=256)


class ReadReply(Strict):
    """Every read request's answer; `ok` False: `error` says why."""

    v: Literal[1] = SCHEMA_VERSION
    ok: bool
    error: str | None = Field(None, max_length=4000)


class SnapshotReply(ReadReply):
    """`snapshot`: the object (in the `snapshots` object store, kept for a few minutes) holding
    a DuckDB file with the rows, its size, and which of the requested runs it holds."""

    snapshot: str | None = None
    size: int = 0
    runs: list[str] = []


class AgentsRequest(ReadRequest):
    """A page of a run's agents: those matching `search` (an agent id, or words that must all
    appear in the agent's profile or persona, any case), by id, `limit` from `offset`."""

    VERB: ClassVar[str] = "agents"
    run_id: RunId
    search: str | None = Field(None, max_length=200)
    offset: int = Field(0, ge=0)
    limit: int = Field(50, ge=1, le=200)

    _tok = field_validator("run_id")(_check_token)


class AgentRound(Strict):
    """One agent's outcome in one round: the simulation's columns, and the platform's."""

    round: int
    values: dict[str, Any] = {}
    valid: bool | None = None
    raw: str | None = None  # the model's answer, cut short
    error: str | None = None


class AgentRow(Strict):
    agent_id: int
    profile: str | None = None  # 'education: master's · age: 38'
    persona: str | None = None  # its name and description, cut short
    rounds: list[AgentRound] = []


class AgentsReply(ReadReply):
    """`agents`: `total` agents match; the page's rows, each round in `rounds` (a long run's
    last ones), the outcome `columns` the run declared; `personas` False: only an id is
    searchable."""

    run_id: str | None = None
    search: str = ""
    offset: int = 0
    limit: int = 0
    total: int = 0
    columns: list[str] = []
    rounds: list[int] = []
    rounds_total: int = 0
    personas: bool = False
    agents: list[AgentRow] = []


class InterviewsRequest(ReadRequest):
    """A run's interviews (one post-hoc `request`'s, or all of them): each question's answers,
    overall and per group of attribute `by` (populace.analysis.interviews.interview_table)."""

    VERB: ClassVar[str] = "interviews"
    run_id: RunId
    request: InterviewId | None = None
    by: str | None = Field(None, min_length=1, max_length=100)

    _tok = field_validator("run_id")(_check_token)


class InterviewsReply(ReadReply):
    """`interviews`: what was asked (`questions`), the answers per question and group (`rows`),
    and what one can group by (`attributes`)."""

    run_id: str | None = None
    request: str | None = None
    by: str | None = None
    questions: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    attributes: list[str] = []


class DistributionRequest(ReadRequest):
    """The run's measure in one round (None: the last closed round), in `bins` bins when numeric."""

    VERB: ClassVar[str] = "distribution"
    run_id: RunId
    round: int | None = Field(None, ge=1)
    bins: int = Field(30, ge=1, le=100)

    _tok = field_validator("run_id")(_check_token)


class DistributionReply(ReadReply):
    """`distribution`: a numeric measure's histogram (`edges`, one more than `counts`) or a
    categorical one's `options` with their `counts` and `shares`; `round` None: none closed yet."""

    run_id: str | None = None
    round: int | None = None
    closed: int | None = None  # the run's last closed round
    measure: str | None = None
    kind: Literal["numeric", "categorical"] | None = None
    n: int = 0
    summary: dict[str, Any] = {}
    edges: list[float] = []
    counts: list[int] = []
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    options: list[str] = []
    shares: list[float | None] = []
    leader: str | None = None
    leader_share: float | None = None
