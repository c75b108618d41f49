"""The run configuration: a scenario file validated (`RunConfig`) with the platform's sections
(model, placement, population, graph, broadcasts, budget, planned interviews), the LLM work a
run spends (`Usage`), and a config by reference (`ConfigRef`)."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from populace.core.contracts.models import ModelAssign, ModelEndpoint, check_models
from populace.core.contracts.prototypes import PrototypesConfig
from populace.core.contracts.questions import PlannedInterview
from populace.core.contracts.wire_base import SHA256, Count, FiniteFloat, Strict, _finite_json
from populace.core.extras import is_fleet_library

# A run with a graph and one agent per process: refused alike by every path (the CLI, notebooks,
# the orchestrator, `run_local(one_per_process=True)`): a host delivers posts into its agents'
# observations in process, which a child process cannot read.
GRAPH_ONE_PER_PROCESS = ("graph: a run with a graph cannot place one agent per process (placement.agents_per_process: "
                         "1): its agents read their posts from their host's in-process inboxes; keep "
                         "agents_per_process: 0, or drop the graph (edge kinds without a graph work one per "
                         "process: read whom an agent follows in the environment's view)")


# The answer budget a chain-of-thought run asks for when neither the scenario's `model.max_tokens`
# nor the simulation's `model_defaults` sets one: room to think before the answer.
COT_MAX_TOKENS = 256


class ModelConfig(Strict):
    """Which model answers, and how it is asked. `dummy` is the paper's dummy benchmark (a seeded
    answer that satisfies the request's JSON schema, after `latency_s`); `local` is SmolLM2 on
    llama.cpp replicas on this machine; `sim` is simulated vLLM replicas; `openai` is any
    registered OpenAI-compatible replica (vLLM). A run with a `models:` section (several models,
    hosted APIs with keys, limits and prices: populace.core.contracts.models) takes its models from
    there, and only the generation settings here (max_tokens, temperature, seed)."""

    backend: Literal["dummy", "local", "sim", "openai"] = "dummy"
    latency_s: FiniteFloat = Field(0.05, ge=0, le=3600)  # dummy only
    seed: Count = 0
    name: str | None = None  # model name sent to replicas; default: the replica's own
    max_tokens: Count = Field(48, ge=1, le=8192)
    temperature: FiniteFloat = Field(0.7, ge=0, le=2)
    # direct: answer at once; cot: think step by step first (chain of thought), still one structured
    # call: the platform puts a "reasoning" property first in the run's answer schema, says so in
    # its system prompt, and asks for COT_MAX_TOKENS when neither `max_tokens` nor the simulation
    # sets a budget (populace.sdk.answers.with_reasoning)
    answer: Literal["direct", "cot"] = "direct"

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # the default answer mode is left out of the dump, so a config's canonical bytes (and its
        # digest) are what they were before the field existed: stored runs resume and fork as before
        data = handler(self)
        if data.get("answer") == "direct":
            del data["answer"]
        return data


class PlacementConfig(Strict):
    # 0 = many agents per process (time-share a core while they wait on the LLM);
    # 1 = one agent per OS process (compute-heavy agents, no GIL contention).
    agents_per_process: Literal[0, 1] = 0


# The JSON-schema mark of a field that names a file the client reads before the run (the
# personas, a population YAML, an edge list): a reader confined to one folder (the manager's
# start form) finds every such field by it, a future one included.
SCENARIO_FILE: dict[str, Any] = {"format": "scenario-file"}


class PopulationChange(Strict):
    """A change the scenario schedules (`population: changes:`), after the given rounds (`after:
    [3, 5]`) or every round (`after: every`), after the environment's own changes: a seeded
    share of the living dies or leaves (`died: 0.01`, `left: 0.05`), or a number of newcomers is
    born or arrives (`born: 10`, `arrived: 100`), each newcomer as its agent class starts one
    (and with the next newcomer's persona, in a run with a population: `population.newcomers`)."""

    after: list[Annotated[int, Field(ge=1, le=10_000)]] | Literal["every"]
    died: FiniteFloat | None = Field(None, gt=0, le=1)
    left: FiniteFloat | None = Field(None, gt=0, le=1)
    born: Count | None = Field(None, ge=1, le=10_000_000)
    arrived: Count | None = Field(None, ge=1, le=10_000_000)
    reason: str = Field("scheduled", max_length=200)

    @model_validator(mode="after")
    def _something(self) -> PopulationChange:
        if isinstance(self.after, list) and not self.after:
            raise ValueError("after: the rounds after which the change happens (or `every`)")
        if self.died is None and self.left is None and self.born is None and self.arrived is None:
            raise ValueError("give what changes: `died` or `left` (a share of the living, e.g. 0.01), "
                             "`born` or `arrived` (how many newcomers)")
        return self

    def rounds(self, last: int) -> list[int]:
        """The rounds (up to `last`) after which it happens."""
        return list(range(1, last + 1)) if self.after == "every" else sorted(r for r in set(self.after) if r <= last)

    def applies(self, round_: int) -> bool:
        return self.after == "every" or round_ in self.after

    @property
    def births(self) -> bool:
        return bool(self.born or self.arrived)


class PopulationRef(Strict):
    """Who the agents are, and how they change. At most one source of personas: `personas`, a
    JSONL file written by `populace personas generate` (one agent per line, in order), or
    `config`, a population YAML from which template personas are built for this run (seeded by
    the run's seed). Paths are relative to the scenario file. The client uploads the personas to
    the bus's object store before the run and sets `digest`; hosts and the recorder read them
    from there. `newcomers`: personas kept for agents born or arriving during the run (after the
    first `agents`: the personas file's next lines, or as many more drawn from the config with
    its quotas); `changes`: the scenario's scheduled changes (PopulationChange)."""

    personas: str | None = Field(None, min_length=1, json_schema_extra=SCENARIO_FILE,
                                 description="a personas JSONL (`populace personas generate`), one agent a line")
    config: str | None = Field(None, min_length=1, json_schema_extra=SCENARIO_FILE,
                               description="a population YAML: template personas built for this run")
    digest: SHA256 | None = None  # sha256 of the uploaded personas JSONL (set by the client)
    newcomers: Count = Field(0, ge=0, le=10_000_000)
    changes: list[PopulationChange] = Field([], max_length=1000)

    @model_validator(mode="after")
    def _one_source(self) -> PopulationRef:
        if self.personas is not None and self.config is not None:
            raise ValueError("population: give one of `personas` (a JSONL file) or `config` (a population YAML)")
        if not self.has_personas and not self.changes:
            raise ValueError("population: give one of `personas` (a JSONL file) or "
                             "`config` (a population YAML), or the scheduled `changes`")
        if self.newcomers and not self.has_personas:
            raise ValueError("population.newcomers: newcomers' personas come from the population's `personas` "
                             "or `config`; a run without personas has newcomers without them")
        return self

    @property
    def has_personas(self) -> bool:
        return self.personas is not None or self.config is not None

    @property
    def births(self) -> bool:
        """Whether the schedule brings newcomers."""
        return any(c.births for c in self.changes)


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


class Budget(Strict):
    """What a run may spend on LLM work, its interviews' included. Before a round that would go
    past it, the run pauses with a reason; `populace resume RUN --budget-tokens N` (or
    `--budget-calls`, `--budget-dollars`) raises it and continues."""

    tokens: Count | None = Field(None, ge=1)  # prompt + completion tokens
    llm_calls: Count | None = Field(None, ge=1)  # answered calls (an agent's `ask`)
    dollars: FiniteFloat | None = Field(None, gt=0, le=10_000_000)  # at the models' prices (`models:`)


class ModelUse(Strict):
    """One model's share of some LLM work (Usage.by_model)."""

    llm_calls: int = Field(0, ge=0)
    prompt_tokens: int = Field(0, ge=0)
    cached_tokens: int = Field(0, ge=0)  # of the prompt tokens, those the provider served from its cache
    completion_tokens: int = Field(0, ge=0)
    dollars: float = Field(0.0, ge=0, allow_inf_nan=False)

    def __add__(self, other: ModelUse) -> ModelUse:
        return ModelUse(llm_calls=self.llm_calls + other.llm_calls,
                        prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                        cached_tokens=self.cached_tokens + other.cached_tokens,
                        completion_tokens=self.completion_tokens + other.completion_tokens,
                        dollars=self.dollars + other.dollars)

    def __sub__(self, other: ModelUse) -> ModelUse:
        return ModelUse(llm_calls=self.llm_calls - other.llm_calls,
                        prompt_tokens=self.prompt_tokens - other.prompt_tokens,
                        cached_tokens=self.cached_tokens - other.cached_tokens,
                        completion_tokens=self.completion_tokens - other.completion_tokens,
                        dollars=max(0.0, self.dollars - other.dollars))


class Usage(Strict):
    """LLM work done: in a share's round, a round, or a whole run (they add up)."""

    # recorded in every round table, next to the simulation's summary (dollars as a DOUBLE, the rest
    # as BIGINT); a table written before models had prices lacks the last two (CORE: the rest)
    RECORDED: ClassVar[tuple[str, ...]] = ("llm_calls", "prompt_tokens", "completion_tokens", "infra_retries",
                                           "cached_tokens", "dollars")
    RECORDED_CORE: ClassVar[tuple[str, ...]] = RECORDED[:4]

    llm_calls: int = Field(0, ge=0)  # answered calls
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    # sum over answered calls of (prompt + completion tokens)²: the spread, for estimates
    tokens_sq: float = Field(0.0, ge=0, allow_inf_nan=False)
    # prompts asked again because no model answered them: infrastructure, never an answer
    infra_retries: int = Field(0, ge=0)
    cached_tokens: int = Field(0, ge=0)  # of the prompt tokens, those served from a provider's cache
    dollars: float = Field(0.0, ge=0, allow_inf_nan=False)  # at the run's models' prices (`models:`)
    by_model: dict[str, ModelUse] = {}  # a run with `models:`: the same, per model

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        by_model = dict(self.by_model)
        for name, use in other.by_model.items():
            by_model[name] = by_model[name] + use if name in by_model else use
        return Usage(llm_calls=self.llm_calls + other.llm_calls,
                     prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                     completion_tokens=self.completion_tokens + other.completion_tokens,
                     tokens_sq=self.tokens_sq + other.tokens_sq,
                     infra_retries=self.infra_retries + other.infra_retries,
                     cached_tokens=self.cached_tokens + other.cached_tokens,
                     dollars=self.dollars + other.dollars, by_model=by_model)

    def __sub__(self, other: Usage) -> Usage:
        """What was added to `other` to make this (a running total minus what was reported)."""
        by_model = {name: use - other.by_model[name] if name in other.by_model else use
                    for name, use in self.by_model.items()}
        return Usage(llm_calls=self.llm_calls - other.llm_calls,
                     prompt_tokens=self.prompt_tokens - other.prompt_tokens,
                     completion_tokens=self.completion_tokens - other.completion_tokens,
                     tokens_sq=max(0.0, self.tokens_sq - other.tokens_sq),
                     infra_retries=self.infra_retries - other.infra_retries,
                     cached_tokens=self.cached_tokens - other.cached_tokens,
                     dollars=max(0.0, self.dollars - other.dollars), by_model=by_model)


@functools.cache
def _validations_counter() -> Any:
    """This process's count of run-config validations (a Prometheus counter), or None without
    Prometheus: an author's `populace-sdk` alone has no fleet libraries and exports no metrics
    (populace.core.extras). Looked up once: validation is on hot paths."""
    try:
        # lazy import: the contracts (and an author's SDK) need no Prometheus
        from populace.core import metrics
    except ModuleNotFoundError as missing:
        if not is_fleet_library(missing):
            raise
        return None
    return metrics.RUN_CONFIGS_VALIDATED


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
    models: list[ModelEndpoint] = []  # the run's models (none: `model.backend` answers for everyone)
    assign: ModelAssign | None = None  # which agents each model answers for (none: by `share`)
    # some agents call the model, the rest copy their prototype's answers, audited (issue 39)
    prototypes: PrototypesConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _counted(cls, data: Any) -> Any:
        # every validation of a run's config passes here, nested ones too (inside a message or
        # a run state): counted, so a path that validates a config it already has shows up. An
        # instance taken as it is (pydantic does not validate it again) is not counted.
        if not isinstance(data, RunConfig):
            counter = _validations_counter()
            if counter is not None:
                counter.inc()
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
        if self.placement.agents_per_process == 1 and self.graph is not None:
            raise ValueError(GRAPH_ONE_PER_PROCESS)
        return self

    @model_validator(mode="after")
    def _models_fit(self) -> RunConfig:
        if not self.models:
            if self.assign is not None:
                raise ValueError("assign: needs a `models:` section to assign agents to")
            if self.budget is not None and self.budget.dollars is not None:
                raise ValueError("budget.dollars: needs `models:` with their prices (the dummy and the "
                                 "single `model:` backends have none)")
            return self
        # by value, not by what was written: a config read back from its JSON has every field set
        default = ModelConfig()
        set_here = [f for f in ("backend", "latency_s", "name") if getattr(self.model, f) != getattr(default, f)]
        if set_here:
            field = set_here[0]
            raise ValueError(f"model.{field}: with a `models:` section each model has its own "
                             "(kind, model, latency_s); `model:` keeps max_tokens, temperature and seed")
        check_models(self.models, self.assign, self.agents)
        if self.budget is not None and self.budget.dollars is not None and all(m.prices.free for m in self.models):
            raise ValueError("budget.dollars: no model has prices (models.N.prices: input, output dollars per "
                             "million tokens), so the run would never spend a dollar of it")
        if self.assign is not None and self.assign.attribute is not None and not self.has_personas:
            raise ValueError("assign.attribute: assigning models by a persona attribute needs a `population`")
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

    @model_validator(mode="after")
    def _prototypes_fit(self) -> RunConfig:
        p = self.prototypes
        if p is None:
            return self
        if self.graph is not None:
            raise ValueError("prototypes: a run with a graph cannot draw answers (each agent's post and inbox "
                             "are its own); drop `graph:` or `prototypes:`")
        if self.placement.agents_per_process == 1:
            raise ValueError("prototypes: not with one agent per process (placement.agents_per_process: 1)")
        if len(self.models) > 1:
            raise ValueError("prototypes: a run with several models would copy one model's answers for agents "
                             "of another; give one model, or drop `prototypes:`")
        if p.by and self.population is None:
            raise ValueError(f"prototypes.by: {p.by} names persona attributes, but the run has no `population`")
        if p.min_representatives > self.agents:
            raise ValueError(f"prototypes.min_representatives: {p.min_representatives} is more than the run's "
                             f"{self.agents} agents")
        return self

    @property
    def has_personas(self) -> bool:
        """Whether the agents have personas (a `population:` with `personas` or `config`)."""
        return self.population is not None and self.population.has_personas

    @model_validator(mode="after")
    def _changes_fit(self) -> RunConfig:
        for i, change in enumerate(self.population.changes if self.population is not None else ()):
            late = [r for r in change.after if r > self.rounds] if change.after != "every" else []
            if late:
                raise ValueError(f"population.changes.{i}.after: round {late[0]} is after the run's last round "
                                 f"({self.rounds})")
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
