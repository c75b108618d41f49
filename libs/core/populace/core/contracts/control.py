"""The control plane: commands (start, cancel, resume a run, interview it after the fact), the
registry entries of hosts and services, and a run's state in KV `runs` with its placement
(shares). Unknown fields are an error."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from populace.core.contracts.questions import InterviewId, Survey
from populace.core.contracts.run_config import Budget, ConfigRef, RunConfig, Usage
from populace.core.contracts.wire_base import (
    SCHEMA_VERSION,
    SHA256,
    FiniteFloat,
    RunId,
    Strict,
    _check_token,
    _not_bool,
)


class WorldRef(Strict):
    """Where a simulation's world is (a checkpoint object, Arrow IPC) and the sha256 it must have:
    a reader uses it only if its bytes still have it."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    digest: SHA256


class StateRef(Strict):
    """Where the environment's state after a round is: its checkpoint object of that round
    (`populace.core.subjects.checkpoint_env`, JSON) and the sha256 recorded when the round
    closed. Round opens, KV `runs` and the hosts' checks carry this, never the state: the
    environment keeps the state it decided and reads the object only after a restart, a resume
    on another process or a fork (and uses it only if its bytes still have the digest)."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    digest: SHA256


class LivingRef(Strict):
    """Who is alive after a round, in a run whose population changed (populace.sdk.population):
    a checkpoint object (its sha256: a reader uses it only if its bytes still have it) holding
    the living, every id given so far and the changes of `round`, the last round that changed
    anything. `first`: the first id born in `round` (= `size` when none was); `living`: how many
    are alive."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    digest: SHA256
    round: int = Field(ge=1, le=10_000)
    size: int = Field(ge=1, le=100_000_000)
    first: int = Field(ge=1, le=100_000_000)
    living: int = Field(ge=0, le=100_000_000)

    def size_in(self, round_: int) -> int:
        """The ids given before the newcomers of round `round_` (this population's round, or a
        later one): the agents that round was played with, and checkpointed."""
        return self.first if round_ == self.round else self.size


class StoredObject(Strict):
    """One object of the `checkpoints` bucket as its writer describes it (populace.core.owned_objects),
    on the metadata subject only that writer may publish: its chunks are the `chunks` messages
    on the writer's chunk subject of the run (subjects.checkpoint_chunks) from stream sequence
    `first_seq` to `last_seq`; `needs`: the objects a delta builds on (pruning keeps them)."""

    v: Literal[1] = SCHEMA_VERSION
    name: Annotated[str, Field(min_length=1, max_length=200)]
    writer: Annotated[str, Field(min_length=1, max_length=64)]
    size: int = Field(ge=0)
    sha256: SHA256
    chunks: int = Field(ge=0)
    first_seq: int = Field(0, ge=0)
    last_seq: int = Field(0, ge=0)
    needs: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field([], max_length=10_000)

    _tok = field_validator("writer")(_check_token)

    @model_validator(mode="after")
    def _chunks_span(self) -> StoredObject:
        if self.chunks and not (0 < self.first_seq <= self.last_seq
                                and self.last_seq - self.first_seq + 1 >= self.chunks):
            raise ValueError(f"{self.chunks} chunks cannot lie between sequences {self.first_seq} and "
                             f"{self.last_seq}")
        return self


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
    # who is alive after `round` (a run whose population changed): the departed are not made
    # again, and the agents born at its end take the state they were born with
    population: LivingRef | None = None
    # agents' checkpoint object name -> the host that wrote it (the share that played its range
    # that round, from the run's layouts): a reader takes an object only from its writer
    writers: dict[str, Annotated[str, Field(min_length=1, max_length=64)]] = {}

    _tok = field_validator("run_id")(_check_token)

    @field_validator("writers")
    @classmethod
    def _writer_tokens(cls, value: dict[str, str]) -> dict[str, str]:
        for writer in value.values():
            _check_token(writer)
        return value


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
    # how long the host's event loop had not turned at this heartbeat (beaten from a thread of its
    # own: a simulation's code holding the loop keeps the host registered, and says so here)
    loop_busy_s: float = Field(0.0, ge=0, allow_inf_nan=False)

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


class AskedShare(Strict):
    """One host's part of a post-hoc interview in flight: the checkpoint ranges it answers, the
    host process's start time when it was ordered (a restart loses the order) and the placement
    that ordered it (0: the first; n: the n-th time a lost host's part was placed again)."""

    host_id: str
    ranges: list[tuple[int, int]]
    incarnation: float | None = None
    placement: int = Field(0, ge=0)

    _tok = field_validator("host_id")(_check_token)


class Asking(Strict):
    """A post-hoc interview placed and not yet recorded (RunState.asking): the orchestrator
    watches its hosts, orders a lost host's part from a living one, and says so when none is up
    (InterviewPlaced.error). Its orders all ask what the first one asks (survey, sample, agents,
    checkpoint): that order is read back from stream RUN by its sequence, since `agents` may be
    too long for a run state."""

    request: InterviewId
    after_round: int = Field(ge=1)
    expected: int = Field(ge=0)  # the answers it will have (InterviewPlaced.expected)
    order_seq: int = Field(ge=1)  # its first order's sequence in stream RUN
    shares: list[AskedShare]
    placements: int = Field(0, ge=0)  # times a lost host's part was placed again
    placed_at: float

    @property
    def hosts(self) -> dict[str, list[tuple[int, int]]]:
        out: dict[str, list[tuple[int, int]]] = {}
        for sh in self.shares:
            out.setdefault(sh.host_id, []).extend(sh.ranges)
        return {h: sorted(r) for h, r in out.items()}


# A run's status groups, shared by the orchestrator's decisions and the CLI's checks.
ACTIVE_STATUSES = ("spawning", "running")
RESUMABLE_STATUSES = ("failed", "cancelled", "paused")  # `populace resume` continues these


class RunState(Strict):
    """Run state in KV `runs`, advanced only by compare-and-swap. The next round's observation is
    the simulation's (opaque here) and travels with each round open; the environment's state
    stays with the environment and its checkpoint object, named here by reference (`env_state`),
    so a restarted environment reads it back and no message carries it."""

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
    env_state: StateRef | None = None  # the state after the last closed round, by reference; None before round 1
    observation: dict | None = None  # what the agents see in the next round
    selection: dict | None = None  # who acts in the next round (None: everyone)
    world: WorldRef | None = None  # the world the next round plays in (a simulation with a World)
    prototypes: dict[str, float] | None = None  # a prototype run: the shares its guard raised so far
    population: LivingRef | None = None  # who is alive in the next round (None: the first agents, as ever)
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
    # Post-hoc interviews placed and not yet recorded: their hosts are watched (a lost one's part
    # is placed again). Changed without touching `updated_at`: asking is not running.
    asking: list[Asking] = []
    # The newest control request (a cancel or a resume) that changed the run, by its message in
    # the CTL stream: sequence and the server's time. One no newer in both changes nothing: the
    # same request delivered again (its handler died between this write and its ack) or an older
    # one that reached the other request's consumer late.
    request_seq: int = Field(default=0, ge=0)
    request_at: float = 0.0
    # False from a stop's decision (done, failed, cancelled, paused) until its RunDone is published:
    # an orchestrator that died between the two (or whose publish failed) publishes it then.
    stop_announced: bool = True
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


class RunWriters(BaseModel):
    """Who may have written a run's checkpoint objects, from its state in KV `runs` (read without
    its config): its placements' hosts, and the environment and orchestrator."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: str
    shares: list[Share]
    layouts: list[Layout] = []

    def placed(self) -> set[str] | None:
        """The key of every share the run ever placed: the placement in force and the earlier
        layouts (None: a placement recorded before layouts named their shares, so not known)."""
        if any(lay.ranges and not lay.shares for lay in self.layouts):
            return None
        return {sh.key for sh in self.shares} | {key for lay in self.layouts for key in lay.shares}

    def writers(self, services: tuple[str, ...]) -> set[str] | None:
        """Every writer of the run's objects (None: its shares are not known, `placed`)."""
        keys = self.placed()
        return None if keys is None else {key.rpartition("@")[0] for key in keys} | set(services)


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
    env_state: StateRef | None = None
    observation: dict | None = None
    prototypes: dict[str, float] | None = None
    population: LivingRef | None = None
