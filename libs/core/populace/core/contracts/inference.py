"""Inference: prompts to the gateway (`InferBatch`, core NATS request/reply) and its answers, what
the gateway did for each decision (`LlmCallBatch`, table `llm_calls`), and an LLM replica's
registry entry."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from populace.core.contracts.models import ModelEndpoint
from populace.core.contracts.run_config import ModelConfig
from populace.core.contracts.wire_base import (
    SCHEMA_VERSION,
    AgentId,
    Amount,
    Millis,
    RoundNo,
    Strict,
    Token,
    Wire,
    _check_token,
)


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
    # Text that ends every prompt of the batch, sent once rather than in each (an interview's
    # question, the same for every agent asked it): prompt i is `prompts[i] + suffix`.
    suffix: str | None = None
    # The model of the run's `models:` that answers this batch (its agents' model); None: the
    # `model.backend` of a run without `models:`. Where its key comes from, never the key.
    endpoint: ModelEndpoint | None = None

    def prompt(self, i: int) -> str:
        """Prompt `i` as the model reads it (its shared suffix put back)."""
        return self.prompts[i] + self.suffix if self.suffix else self.prompts[i]

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
    cached_tokens: list[int] = []  # per prompt, of its prompt tokens those the provider had cached
    # The model will not answer this batch, and asking again will not help (its key refused):
    # the run pauses at once, naming the model and why, instead of retrying for minutes.
    refused: str | None = None


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
    model: str = ""  # the model's name in the run's `models:` ("": the run's one model.backend)
    cached_tokens: list[Amount] = []  # per call, of its prompt tokens those the provider had cached (empty: none)
    dollars: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = []  # per call, at the model's prices
    # Who asked: the NATS user its request subject named (llm.infer.<requester>), which only that
    # user may publish; "" from a gateway before requesters were named.
    requester: str = ""

    @model_validator(mode="after")
    def _same_length(self) -> LlmCallBatch:
        n = len(self.agent_ids)
        if any(len(c) != n for c in (self.replicas, self.prompt_tokens, self.completion_tokens, self.latency_ms,
                                     self.attempts, self.valid)) or any(
                len(c) not in (0, n) for c in (self.reasks, self.cached_tokens, self.dollars)):
            raise ValueError("every column of a call batch must have one value per agent id")
        return self


class ReplicaInfo(Strict):
    """An LLM replica's registry entry (KV `replicas`), refreshed by heartbeats, under the key
    `<writer>.<replica_id>` (subjects.replica_key): readers take it only if the key names this
    replica_id, and name it by the key from then on (populace.core.replica_hosts)."""

    v: Literal[1] = SCHEMA_VERSION
    replica_id: str
    url: str  # base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8100
    backend: Literal["local", "sim", "openai"]  # which ModelConfig.backend it serves
    kind: Literal["llamacpp", "vllm", "sim", "openai"]  # API dialect and metric names
    model: str
    max_concurrency: int = Field(4, ge=1)
    pid: int | None = None
    heartbeat_at: float
    # the name of the run model (a `models:` entry without base_url) this replica answers for;
    # None: it answers for its `backend` (a run without `models:`)
    serves: Token | None = None

    _tok = field_validator("replica_id")(_check_token)
