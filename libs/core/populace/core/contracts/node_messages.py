"""Nodes (`populace node`, one daemon per machine): the processes it may run, its requests and
replies, and its registry entry (KV `nodes`)."""

from __future__ import annotations

import re
import time
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from populace.core.contracts.wire_base import SCHEMA_VERSION, Count, FiniteFloat, Strict, Token

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
HostName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9_.:\[][A-Za-z0-9_.:\[\]-]*$")]
# What a node's vLLM replica serves: a model id (`name` or `org/name`, as the Hugging Face hub
# names them) or an absolute path, which the node serves only under its own
# POPULACE_NODE_MODEL_ROOTS. Never an option (`--help`, `--trust-remote-code`), never `..`.
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?|/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/?")


def _model_name(value: str) -> str:
    if value.startswith("-"):
        raise ValueError(f"{value[:80]!r} is an option, not a model")
    if ".." in value:
        raise ValueError(f"{value[:80]!r} climbs directories ('..')")
    if not _MODEL.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is neither a model id (name or org/name: letters, digits, '.', '_', '-') "
                         "nor an absolute path")
    return value


ModelName = Annotated[str, Field(min_length=1, max_length=500), AfterValidator(_model_name)]
# A replica set (`populace auth replicas SET`): its replicas register as the NATS user `replicas-<set>`
ReplicaSetName = Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$")]


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
    model: ModelName | None = None  # vllm only
    gpus: list[Annotated[int, Field(ge=0, le=1023)]] = Field([], max_length=64)  # vllm only
    base_port: Count | None = Field(None, ge=1024, le=65535)  # vllm only
    bind: HostName | None = None
    advertise: HostName | None = None  # must be in the node's POPULACE_REPLICA_HOSTS
    set: ReplicaSetName | None = None  # None: registered as the shared `replicas` user

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
