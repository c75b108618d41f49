"""Process settings from environment variables (POPULACE_*). Scenario files configure runs;
these configure the processes that play them."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from populace.core import replica_hosts

# What one hosted agent costs its host, assumed to size a host from its memory: its object, memory
# and outcome (780 B measured at 10M agents on the dummy model, docs/benchmarks.md), rounded up.
AGENT_BYTES = 1024


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POPULACE_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"  # several servers of a cluster: comma-separated
    nats_user: str | None = None  # per-service users and permissions: deploy/nats/
    nats_password: str | None = None
    log_level: str = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"
    metrics_port: int = Field(0, ge=0, le=65535)  # Prometheus /metrics; 0 = off
    parent_pid: int | None = None  # set by `populace demo/up/bench`: exit when that process dies
    # A file touched after every heartbeat NATS took: a container's healthcheck reads its age
    # (deploy/Dockerfile sets it). Unset: no file.
    health_file: str | None = None

    # agent-host
    host_id: str = Field(default_factory=lambda: f"{socket.gethostname().split('.')[0]}-{os.getpid()}")
    # The most agents this host takes; 0: as many as its memory holds at AGENT_BYTES each
    # (host_memory_bytes, or this machine's memory: 24.5M agents on 24 GiB).
    host_capacity: int = Field(0, ge=0)
    # An agent-host's memory, for the check before a run that its world and agents fit (each host
    # holds the whole world); 0: this machine's physical memory.
    host_memory_bytes: int = Field(0, ge=0)
    max_in_flight: int = Field(1_000_000, ge=1)  # concurrent agent turns per host
    # The most the simulation's code (its views, turns, scenes) holds a host's event loop before
    # heartbeats, control messages and model answers go first (populace.sdk.slicing).
    loop_slice_ms: float = Field(50.0, gt=0, le=10_000)
    # The largest view (or shared observation) an agent should see, as JSON: one larger is said
    # once per run, naming the hook, the agent and its size (table round_profile, column note).
    view_budget_bytes: int = Field(65_536, ge=1)
    # Concurrent interview answers per host (each also bounded by max_in_flight). Answers are
    # asked beside a round (a panel) or alone (post hoc): a burst of every agent's copy at once
    # would hold a second population in memory for no gain once calls are CPU-bound. 25,000: a
    # host answers ~21,000 a second post hoc on the dummy model (1 s latency), and what is out
    # is held by the host, the gateway and nats-server alike (50,000 kept the gateway above the
    # run's own peak during a post-hoc interview of 1M agents).
    interview_in_flight: int = Field(25_000, ge=1)
    # Planned interviews (a panel) start no new answers while one of the host's rounds is in
    # play, so the round has the CPU; unless the round-end states they wait to answer from pass
    # this many MB (JSON), which bounds what a long run's panel may hold back (and so how long
    # after the last round its answers keep the run from counting as recorded: interview_wait_s).
    interview_backlog_mb: int = Field(64, ge=0)
    # a scene waiting this long on neither an act nor a model call is stuck: the run pauses, naming it
    scene_idle_s: float = Field(60.0, gt=0, le=86_400)
    one_agent_per_process: bool = False  # host flag: run every agent in its own OS process
    outcome_batch_size: int = Field(1000, ge=1, le=20_000)
    # Save the agents' declared state after every round (what resume, fork and a host's
    # replacement start from). Off only to measure what it costs.
    checkpoints: bool = True
    # A range's checkpoint holds only the agents that acted since its previous one (a delta on
    # it), so idle agents cost nothing; a full one again once the chain has this many links
    # (1: every checkpoint full) or its deltas' bytes exceed this share of the full one's: a
    # restore reads at most that many objects, about (1 + ratio) × one full checkpoint.
    checkpoint_full_every: int = Field(32, ge=1, le=10_000)
    checkpoint_delta_ratio: float = Field(0.5, gt=0, le=100)
    # A run with a graph: how long a host waits for the other shares' posts of the last round
    # (read again from the stream every second after the first) before the run pauses.
    mail_wait_s: float = Field(120.0, gt=0)
    # Fault tests only: ignore the first N mail messages this host receives, as if lost on the
    # way; the host must read them back from the stream.
    fault_drop_mail: int = Field(0, ge=0)
    infer_batch_size: int = Field(1000, ge=1, le=20_000)
    infer_flush_ms: float = Field(5.0, ge=0)
    infer_timeout_s: float = Field(60.0, gt=0)
    infer_attempts: int = Field(3, ge=1)
    # A batch no gateway acknowledges this fast (or whose gateway stops saying it is working on
    # it for this long) is sent again: a gateway that died is noticed in seconds, not after the
    # batch's timeout.
    infer_silence_s: float = Field(5.0, gt=0)
    # No model answering for this long (no gateway, no replica, every attempt failing) pauses
    # the run with a reason: an infrastructure failure is retried, never recorded as an answer.
    infer_down_s: float = Field(120.0, gt=0)
    heartbeat_s: float = Field(2.0, gt=0)
    registry_ttl_s: float = Field(10.0, gt=0)
    # How often a service looks its durable consumers up (re-created, and reported, when one is
    # gone or was changed: populace.core.durables).
    durable_check_s: float = Field(5.0, gt=0)
    # A host silent this long is lost: the orchestrator places its agents on the hosts up
    # (a host busy spawning a million agents can miss a few heartbeats; 30 s is the KV TTL).
    # A host that restarts is noticed at once (a new process start time), whatever this says.
    host_lost_s: float = Field(30.0, gt=0)
    # A round (or a spawn) with no progress this long is announced again once, then the run
    # pauses with a reason. Default: derived from the model (one inference batch's worst case).
    round_stall_s: float | None = Field(None, gt=0)
    # How the orchestrator splits a run over the hosts with room: evenly (a host's capacity is
    # what it says of itself, so it only bounds its share), or in proportion to free capacity.
    placement_policy: Literal["spread", "capacity"] = "spread"
    # The most agents the orchestrator believes any one host's capacity claim to be (0: no bound).
    host_capacity_max: int = Field(0, ge=0)

    # gateway
    gateway_max_workers: int = Field(4096, ge=1)  # inference batches handled concurrently
    gateway_id: str = Field(default_factory=lambda: f"gw-{os.getpid()}")
    gateway_router: Literal["prefix-affinity", "least-loaded", "round-robin"] = "prefix-affinity"
    gateway_max_queue: int = Field(100_000, ge=1)  # prompts admitted at once; beyond: explicit error
    # One requester (an agent-host's NATS user, or the shared one) holds at most this share of
    # the batches and replica-bound prompts in service; beyond it, its batches wait in its own
    # line, served round-robin with the others' (populace.gateway.fairshare).
    gateway_requester_share: float = Field(0.5, gt=0, le=1)
    # The bytes of requests one requester may have waiting; a request beyond it is refused at once.
    gateway_requester_waiting_bytes: int = Field(64 * 2**20, ge=1024)
    # Caps on what a request may ask of this gateway (a request above them gets an explicit
    # error): the dummy model's latency, and the tokens one answer may take.
    gateway_max_latency_s: float = Field(60.0, ge=0, le=3600)
    gateway_max_tokens: int = Field(4096, ge=1, le=8192)
    gateway_attempts: int = Field(3, ge=1, le=10)  # tries per call, each on another replica
    gateway_retry_budget: float = Field(0.2, ge=0, le=1)  # retries allowed as a share of calls
    gateway_reasks: int = Field(1, ge=0, le=3)  # re-asks after an invalid answer
    gateway_request_timeout_s: float = Field(120.0, gt=0)
    gateway_keepalive_s: float = Field(1.0, gt=0)  # "still working on your batch", to the asking host
    gateway_poll_s: float = Field(1.0, gt=0)  # replica registry, health and /metrics polling
    # HTTP connections to all replicas together. Calls beyond it wait for a connection (not
    # counted as replica failure). With aiohttp the count costs little: through NATS and the
    # gateway to one simulated replica, 32 / 128 / 512 gave 5.1k / 4.4k / 4.4k requests/s.
    gateway_http_connections: int = Field(128, ge=1)
    # The chat calls' HTTP client: aiohttp (populace.gateway.openai_api.ChatClient), or httpx,
    # the one before it, 10x the CPU per call, kept to compare in `populace bench gateway`.
    gateway_http_client: Literal["aiohttp", "httpx"] = "aiohttp"
    replicas: str = ""  # static replicas: "id=http://host:port,…" (backend openai)
    # A run's `models:` name where a model's key comes from (api_key_env, api_key_file), never the
    # key: this gateway reads it, and sends it only to the hosts its source is bound to here,
    # "env:NAME@host[:port],file:PATH@host[:port],…" (populace.gateway.keys): a run or a forged
    # request cannot have it sent anywhere else. `populace demo/run` bind their scenario's own.
    gateway_keys: str = ""
    # The hosts a run model's base_url may name ("*": any); the hosts of gateway_keys are allowed too.
    gateway_model_hosts: str = "127.0.0.1,localhost,[::1]"
    # Where a replica registered in KV `replicas` may be: "[writer@]host[:port]" or
    # "[writer@]network/prefix", comma-separated ("*": anywhere; populace.core.replica_hosts).
    # The gateway calls no replica elsewhere (it logs it once), the manager probes none, and
    # `populace node` starts none that would advertise an address elsewhere. Default: loopback.
    replica_hosts: str = "127.0.0.0/8,::1,localhost"
    # The folders under which `populace node` serves a vLLM replica's model given as a local path
    # (`model: /models/x`), comma-separated; none: only model ids (`org/name`) are served.
    node_model_roots: str = ""

    # A population's personas: the most bytes one record (one line of the personas JSONL) may
    # take. Its text goes into every prompt of its agent; a larger one is refused by `validate`,
    # `run`, the manager and the Python API, naming the line, before anything is uploaded. At
    # most 256 KiB: a prompt must fit one inference batch message (512 KiB, under NATS' 1 MB).
    persona_max_bytes: int = Field(65_536, ge=256, le=262_144)

    # How long JetStream waits for a service to acknowledge a message of one of its durable
    # consumers (the orchestrator's control events, the environment's round opens and partials)
    # before it hands the message out again: what a killed orchestrator or environment had in hand
    # reaches its successor after this long (NATS's own default, 30 s, stalled a run that long). A
    # handler that takes longer says "in progress" every third of it meanwhile.
    ack_wait_s: float = Field(10.0, ge=1, le=600)

    # recorder
    db: str = "populace.duckdb"
    recorder_fetch: int = Field(256, ge=1)
    # How long JetStream waits for the recorder to acknowledge a fetched event before it gives
    # the event to a recorder again: what a killed recorder had fetched reaches its successor
    # after this long (a long ingest says "in progress" every third of it meanwhile).
    recorder_ack_wait_s: float = Field(15.0, ge=1, le=600)
    # A completed run counts as recorded once its planned interviews' answers are in too, or
    # after this long without them (a host lost after its last round took them with it: said so)
    interview_wait_s: float = Field(600.0, gt=0)
    # A finished run short of outcomes its rounds counted, neither recorded nor refused (a batch
    # dead-lettered, lost), is announced recorded, `incomplete` with the count, once none of its
    # outcomes came for this long: past the redelivery of a batch whose ingest failed (its retries
    # take about two minutes) and a killed recorder's successor's ack wait.
    recorder_missing_wait_s: float = Field(180.0, gt=0)
    # Once a run is recorded, its outcome batches and LLM call records leave stream RUN (the
    # small control events stay: restart, fork and follow read them). Off: kept until max age.
    purge_recorded: bool = True
    # Checkpoints of a completed run, once recorded: all (fork from any round), last (only the
    # last round's: fork from it), none. Failed, cancelled and paused runs keep theirs: resume.
    checkpoints_keep: Literal["all", "last", "none"] = "all"
    # How often the recorder purges what belongs to no run from the object store `checkpoints`
    # (objects of a run KV `runs` does not know, or written by a user that is none of the run's
    # writers: a host never placed in it); 0: never.
    checkpoints_sweep_s: float = Field(300.0, ge=0)

    # JetStream
    storage: Literal["file", "memory"] = "file"
    stream_replicas: int = Field(1, ge=1, le=5)  # 3 on a 3-node cluster
    # Age limit of stream RUN's events, set when the stream is created; 0 = none. An event
    # older than this is gone even if the recorder (down that long) never had it.
    run_max_age_s: float = Field(30 * 86400.0, ge=0)
    # Byte limit of stream RUN, set when it is created (default: 16 GiB on file storage, 2 GiB in
    # memory, halved while the server cannot reserve it); once full, new events are refused (a
    # publish fails, loudly), never old ones dropped.
    run_max_bytes: int | None = Field(None, ge=1024 * 1024)
    # Limits of stream DLQ (dead letters: each a refused message's reference and an excerpt); the
    # oldest go first. Default bytes: 256 MiB, halved while the server cannot reserve it.
    dlq_max_age_s: float = Field(7 * 86400.0, gt=0)
    dlq_max_bytes: int | None = Field(None, ge=1024 * 1024)
    # Byte limit of the object store `checkpoints`, set when it is created (default: 8 GiB on file
    # storage, 1 GiB in memory, halved while the server cannot reserve it): the checkpoints of the
    # runs kept (docs/limits.md says how to size it). Once full, a write is refused and the runs
    # that write pause, naming it; starting a run is never blocked (every stream's room is reserved).
    checkpoints_max_bytes: int | None = Field(None, ge=1024 * 1024)
    # What one writer (a host, the environment, the orchestrator) may store for one run in it,
    # enforced by the server, counted in messages of up to 128 KiB (an object takes its size over
    # 128 KiB, rounded up, at least one). Default: a quarter of the store's limit, and never fewer
    # than 32,768 messages (what a 10,000-round run's writer writes, with room).
    checkpoints_writer_run_max_bytes: int | None = Field(None, ge=128 * 1024)
    # Byte limit of each of the object stores `personas` and `graphs` (default: 4 GiB on file
    # storage, 1 GiB in memory, halved while the server cannot reserve it).
    blobs_max_bytes: int | None = Field(None, ge=1024 * 1024)
    publish_async_max_pending: int = Field(4000, ge=1)

    @field_validator("replica_hosts")
    @classmethod
    def _replica_hosts_parse(cls, value: str) -> str:
        replica_hosts.parse(value)  # ValueError naming the item
        return value

    @field_validator("node_model_roots")
    @classmethod
    def _model_roots_absolute(cls, value: str) -> str:
        for root in (r.strip() for r in value.split(",") if r.strip()):
            if not os.path.isabs(root):
                raise ValueError(f"{root!r} is not an absolute path")
        return value

    @field_validator("health_file")
    @classmethod
    def _health_file_directory_exists(cls, value: str | None) -> str | None:
        if value and not os.path.isdir(os.path.dirname(os.path.abspath(value))):
            raise ValueError(f"{value}: its directory does not exist")
        return value

    @model_validator(mode="after")
    def _capacity_from_memory(self) -> Settings:
        if self.host_capacity == 0:
            self.host_capacity = max(1, (self.host_memory_bytes or machine_memory()) // AGENT_BYTES)
        return self
