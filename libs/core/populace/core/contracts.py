"""Wire contracts: every message on the bus is one of these versioned pydantic models.

Control-plane models reject unknown fields. Hot-path batches are columnar (parallel lists)
so one message carries ~1,000 agents and validates in pydantic-core, not per agent in Python.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from populace.core.subjects import valid_token

SCHEMA_VERSION = 1


class Strict(BaseModel):
    """Control-plane model: unknown keys are an error, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Wire(BaseModel):
    """Data-plane model: versioned; unknown keys are an error too (a typo is a bug)."""

    model_config = ConfigDict(extra="forbid")
    v: Literal[1] = SCHEMA_VERSION


def parse_ratio(value: object) -> Fraction:
    """'2/3', '0.5', 0.5 or 2 → Fraction; raises ValueError with a readable reason."""
    if isinstance(value, bool):
        raise ValueError("must be a number or a fraction string like '2/3'")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("must be finite")
        frac = Fraction(value)  # exact: a tiny positive float stays positive
    elif isinstance(value, str):
        try:
            frac = Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{value!r} is not a number or a fraction like '2/3'") from None
    else:
        raise ValueError("must be a number or a fraction string like '2/3'")
    if frac <= 0:
        raise ValueError("must be > 0")
    return frac


def _not_bool(v: object) -> object:
    # YAML `yes`/`true` must not silently become 1 agent or 1.0 seconds.
    if isinstance(v, bool):
        raise ValueError("must be a number, not true/false")
    return v


FiniteFloat = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
Count = Annotated[int, BeforeValidator(_not_bool)]


# --- scenario / run configuration ----------------------------------------------------
class GameConfig(Strict):
    """The guess-the-ratio game: target = ratio · mean + offset; closest guess wins."""

    ratio: str = "2/3"
    offset: FiniteFloat = 0.0
    max_value: FiniteFloat = Field(100.0, gt=0)
    history_window: Count = Field(5, ge=0, le=100)

    @field_validator("ratio", mode="before")
    @classmethod
    def _ratio(cls, v: object) -> str:
        parse_ratio(v)
        return str(v).strip()

    @property
    def ratio_fraction(self) -> Fraction:
        return parse_ratio(self.ratio)

    @property
    def ratio_value(self) -> float:
        return float(self.ratio_fraction)


class ModelConfig(Strict):
    """Which model answers. `dummy` is the paper's dummy benchmark (a seeded random number
    after `latency_s`); `local` is SmolLM2 on llama.cpp replicas on this machine; `sim` is
    simulated vLLM replicas; `openai` is any registered OpenAI-compatible replica (vLLM)."""

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


class PromptConfig(Strict):
    """Which of the paper's prompt variants the agents get. The system prompt (shared by every
    agent, so replicas cache it) is the game's rules plus the `system` family's sentence plus
    an optional note on the population's make-up; the user prompt carries the agent's persona
    background, its memory of past rounds and the `answer` instruction."""

    # basic: the rules only; rational: "all players are rational"; strategies: "think about
    # what the others will guess"; variant: "this is a variant of the guess-2/3 game".
    system: Literal["basic", "rational", "strategies", "variant"] = "basic"
    # direct: report the number at once; cot: think step by step first (chain of thought),
    # still one structured call: {"reasoning": ..., "guess": ...}.
    answer: Literal["direct", "cot"] = "direct"
    persona: bool = True  # put the agent's persona background in its prompt (needs a population)
    population_note: bool = False  # tell every agent the population's make-up (needs a population)


SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class PopulationRef(Strict):
    """Who the agents are. Exactly one source: `personas`, a JSONL file written by
    `populace personas generate` (one agent per line, in order), or `config`, a population
    YAML from which template personas are built for this run (seeded by the run's seed).
    Paths are relative to the scenario file. The client uploads the personas to the bus's
    object store before the run and sets `digest`; hosts and the recorder read them from there."""

    personas: str | None = Field(None, min_length=1)
    config: str | None = Field(None, min_length=1)
    digest: SHA256 | None = None  # sha256 of the uploaded personas JSONL (set by the client)

    @model_validator(mode="after")
    def _one_source(self) -> PopulationRef:
        if (self.personas is None) == (self.config is None):
            raise ValueError("population: give exactly one of `personas` (a JSONL file) or "
                             "`config` (a population YAML)")
        return self


# Chain of thought needs room to think: the default answer budget when `model.max_tokens`
# is not set in the scenario.
COT_MAX_TOKENS = 256


class RunConfig(Strict):
    """A scenario file, validated."""

    name: str = Field("guess-two-thirds", min_length=1, max_length=200)
    agents: Count = Field(1000, ge=1, le=100_000_000)
    rounds: Count = Field(3, ge=1, le=10_000)
    seed: Count = 0
    game: GameConfig = GameConfig()
    model: ModelConfig = ModelConfig()
    placement: PlacementConfig = PlacementConfig()
    prompt: PromptConfig = PromptConfig()
    population: PopulationRef | None = None

    @model_validator(mode="after")
    def _cot_budget(self) -> RunConfig:
        if self.prompt.answer == "cot" and "max_tokens" not in self.model.model_fields_set:
            # frozen model: bypass __setattr__ once, during validation
            object.__setattr__(self, "model", self.model.model_copy(update={"max_tokens": COT_MAX_TOKENS}))
        return self

    @model_validator(mode="after")
    def _one_per_process_is_bounded(self) -> RunConfig:
        if self.placement.agents_per_process == 1 and self.agents > 10_000:
            raise ValueError(
                "placement.agents_per_process: 1 starts one OS process per agent; "
                f"{self.agents} agents is too many (max 10000)"
            )
        return self


def _check_token(v: str) -> str:
    if not valid_token(v):
        raise ValueError(f"{v!r} must be one NATS subject token (no '.', ' ', '*', '>')")
    return v


RunId = Annotated[str, Field(min_length=1, max_length=64)]


# --- control plane -------------------------------------------------------------------
class RunStart(Strict):
    v: Literal[1] = SCHEMA_VERSION
    run_id: RunId
    config: RunConfig
    requested_at: float = Field(default_factory=time.time)
    manifest: dict | None = None  # reproducibility manifest, stored with the run

    _tok = field_validator("run_id")(_check_token)


class HostInfo(Strict):
    """An agent-host's registry entry (KV `hosts`), refreshed by heartbeats."""

    v: Literal[1] = SCHEMA_VERSION
    host_id: str
    capacity: int = Field(ge=1)
    agents: int = 0
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


class RunState(Strict):
    """Run state in KV `runs`, advanced only by compare-and-swap."""

    v: Literal[1] = SCHEMA_VERSION
    run_id: str
    status: Literal["spawning", "running", "done", "failed"]
    config: RunConfig
    placement: dict[str, list[tuple[int, int]]]  # host_id -> [(first_agent_id, count)]
    spawned: list[str] = []
    round: int = 0
    history: list[float] = []  # winning numbers so far
    reason: str | None = None
    updated_at: float = Field(default_factory=time.time)


# --- run events ----------------------------------------------------------------------
class RunStarted(Wire):
    run_id: str
    config: RunConfig
    started_at: float
    hosts: list[str]
    manifest: dict | None = None


class SpawnBatch(Wire):
    """Agents for one host, as id ranges: persona by reference, never copied per agent."""

    run_id: str
    host_id: str
    ranges: list[tuple[int, int]]  # (first_agent_id, count)
    config: RunConfig

    @property
    def count(self) -> int:
        return sum(c for _, c in self.ranges)


class HostSpawned(Wire):
    run_id: str
    host_id: str
    agents: int
    seconds: float


class RoundOpen(Wire):
    run_id: str
    round: int = Field(ge=1)
    expected: int = Field(ge=1)  # agents that must answer before the round closes
    game: GameConfig
    history: list[float] = []  # previous winning numbers, most recent last
    opened_at: float


class GuessBatch(Wire):
    """~1,000 guesses from one host, columnar. `values[i]` is None when the answer was invalid."""

    run_id: str
    round: int
    host_id: str
    seq: int
    agent_ids: list[int]
    values: list[float | None]
    raws: list[str]
    latency_ms: list[float]

    @model_validator(mode="after")
    def _same_length(self) -> GuessBatch:
        n = len(self.agent_ids)
        if not (len(self.values) == len(self.raws) == len(self.latency_ms) == n):
            raise ValueError("agent_ids, values, raws and latency_ms must have equal length")
        return self


class HostPartial(Wire):
    """One host's reduced round: enough for the environment to find target and winner exactly.

    `by_value` holds one entry per distinct guessed value: (value, count, smallest agent id).
    """

    run_id: str
    round: int
    host_id: str
    n: int  # agents that answered (valid or not)
    n_valid: int
    total: float  # sum of valid values
    by_value: list[tuple[float, int, int]]


class RoundResult(Wire):
    run_id: str
    round: int
    n: int
    n_valid: int
    mean: float | None
    target: float | None
    winner_agent_id: int | None
    winner_value: float | None
    n_winners: int
    closed_at: float


class RunDone(Wire):
    run_id: str
    status: Literal["completed", "failed"]
    rounds: int
    finished_at: float
    reason: str | None = None


class RunRecorded(Wire):
    run_id: str
    guesses: int
    db_path: str


class Progress(Wire):
    run_id: str
    round: int
    host_id: str
    answered: int


# --- inference -----------------------------------------------------------------------
class InferBatch(Wire):
    """Many prompts that share one system prompt (a shared prefix, sent once per batch) and
    one answer schema: each prompt is one structured call, validated by the gateway."""

    batch_id: str
    run_id: str
    round: int
    model: ModelConfig
    max_value: float
    system: str
    keys: list[int]  # request keys (agent ids): correlation and per-agent seeding
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
        return self


class InferReply(Wire):
    """Answers in request order. `texts[i]` is the model's raw text (kept even when invalid);
    the per-call columns are filled for real model backends."""

    batch_id: str
    texts: list[str] = []
    error: str | None = None
    valid: list[bool] = []
    attempts: list[int] = []


class LlmCallBatch(Wire):
    """What the gateway did for each decision of one inference batch (table `llm_calls`)."""

    run_id: str
    round: int
    batch_id: str
    agent_ids: list[int]
    replicas: list[str]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    latency_ms: list[float]
    attempts: list[int]
    valid: list[bool]


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
