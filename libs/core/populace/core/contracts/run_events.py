"""Run events (stream RUN): a run's start and spawn, round opens, the hosts' outcome, interview and
mail batches, partials, the environment's results, and the run's end. Hot-path batches are
columnar (parallel lists), so one message carries ~1,000 agents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from populace.core.contracts.control import LivingRef, Restore, StateRef, WorldRef
from populace.core.contracts.prototypes import PrototypeRound
from populace.core.contracts.questions import MAX_ANSWER_CHARS, InterviewId, Survey
from populace.core.contracts.recorded_tables import Identifier, SimulationTables
from populace.core.contracts.run_config import ConfigRef, RunConfig, Usage
from populace.core.contracts.wire_base import (
    SHA256,
    AgentId,
    Amount,
    CheckpointName,
    Epoch,
    FiniteFloat,
    JsonDoc,
    Millis,
    RoundNo,
    Strict,
    Token,
    Wire,
)


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
    `env_state` where the state the environment decided so far is (a reference to its checkpoint
    object, never the state); both None in round 1 (the simulation's environment starts them)."""

    run_id: Token
    round: RoundNo
    expected: int = Field(ge=1)  # agents that must answer before the round closes
    config_ref: ConfigRef  # the run's config by digest: it does not travel with every round
    observation: JsonDoc | None = None
    env_state: StateRef | None = None
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
    # a prototype run: the shares its guard raised (prototype label -> share); None: the config's
    prototypes: dict[str, float] | None = None
    population: LivingRef | None = None  # who is alive this round (None: the run's first agents)


class PostColumns(Wire):
    """The posts of an outcome batch's agents (a run with a graph), one per agent id, and what
    each agent heard this round: how many posts, and the sum of their digests mod 2**63
    (`populace.sdk.post.post_hash`), so the inbox can be checked against the graph."""

    texts: list[str | None]  # None: the agent did not post
    fields: list[JsonDoc | None]
    heard: list[Amount]
    heard_digest: list[Amount]


# A scene's acts and lines per round, per member of its group: a group of k members acts at most
# MAX_ACTS_PER_MEMBER × k times and says at most MAX_LINES_PER_MEMBER × k lines (its members' and
# the scene's own, speaker -1) in a round. A scene that would do more stops (its round pauses
# naming it); the recorder refuses a group whose batch carries more.
MAX_ACTS_PER_MEMBER = 100
MAX_LINES_PER_MEMBER = 100


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


# The most items one shown record holds (populace.sdk.shown.MAX_SHOWN)
MAX_SHOWN = 1_000
_ShownList = Annotated[list[Annotated[int, Field(ge=-(2**63), lt=2**63)]], Field(max_length=MAX_SHOWN)]


class ShownColumns(Wire):
    """Who saw what: what each of a batch's agents was shown this round (a simulation that declares
    `shown_items`), at most one record per agent: the items in the order shown and each item's rank."""

    agent_id: list[AgentId]
    items: list[_ShownList]
    ranks: list[Annotated[list[Annotated[int, Field(ge=1, lt=2**31)]], Field(max_length=MAX_SHOWN)]]

    @model_validator(mode="after")
    def _same_length(self) -> ShownColumns:
        n = len(self.agent_id)
        if len(self.items) != n or len(self.ranks) != n:
            raise ValueError("every column of a batch's shown records must have one value per record")
        if any(len(i) != len(r) for i, r in zip(self.items, self.ranks)):
            raise ValueError("a shown record must have one rank per item")
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
    # a prototype run's audits: these agents' real answers on copies of their state (table
    # `audits`), never their outcomes; `prototypes` names each one's prototype
    audit: bool = False
    prototypes: list[str] | None = None
    shown: ShownColumns | None = None  # who saw what: these agents' records

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
        if self.prototypes is not None:
            lengths.append(len(self.prototypes))
        if any(k != n for k in lengths):
            raise ValueError("every column of an outcome batch must have one value per agent id")
        return self

    def take(self, rows: Sequence[int]) -> OutcomeBatch:
        """The batch of these rows only (indices, in order), with what rides with them: their
        posts and levels, their agents' edge edits and shown records, and the acts and lines of their groups (a
        group not among them loses its acts and lines too). Not validated again."""
        def pick(values: list) -> list:
            return [values[i] for i in rows]

        def keep(model, keys: tuple[str, ...], kept: list[int], **extra):
            if not kept:
                return None
            return model.model_construct(v=model.v, **{k: [getattr(model, k)[i] for i in kept] for k in keys}, **extra)

        ids = pick(self.agent_ids)
        groups = set(pick(self.group_ids)) if self.group_ids is not None else set()
        update: dict = {"agent_ids": ids, "columns": {k: pick(v) for k, v in self.columns.items()},
                        "valid": pick(self.valid), "raws": pick(self.raws), "latency_ms": pick(self.latency_ms),
                        "errors": pick(self.errors),
                        "group_ids": None if self.group_ids is None else pick(self.group_ids),
                        "levels": None if self.levels is None else {k: pick(v) for k, v in self.levels.items()},
                        "prototypes": None if self.prototypes is None else pick(self.prototypes)}
        if (p := self.posts) is not None:
            update["posts"] = PostColumns.model_construct(v=p.v, texts=pick(p.texts), fields=pick(p.fields),
                                                          heard=pick(p.heard), heard_digest=pick(p.heard_digest))
        if (e := self.edits) is not None:
            mine = set(ids)
            update["edits"] = keep(e, ("follower", "author", "kind", "op"),
                                   [i for i, f in enumerate(e.follower) if f in mine])
        if (x := self.shown) is not None:
            mine = set(ids)
            update["shown"] = keep(x, ("agent_id", "items", "ranks"),
                                   [i for i, a in enumerate(x.agent_id) if a in mine])
        if (a := self.acts) is not None:
            kept = [i for i, g in enumerate(a.group_id) if g in groups]
            update["acts"] = keep(a, ("group_id", "seq", "agent_id", "phase", "valid", "raw", "latency_ms", "error"),
                                  kept, columns={k: [v[i] for i in kept] for k, v in a.columns.items()})
        if (x := self.lines) is not None:
            update["lines"] = keep(x, ("group_id", "seq", "speaker", "text", "fields"),
                                   [i for i, g in enumerate(x.group_id) if g in groups])
        return self.model_copy(update=update)


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
    its digests), with the run's config (its simulation, model, personas) named by digest, as
    spawns and round opens name it (populace.core.runconfigs): it never travels with an order."""

    run_id: Token
    host_id: Token
    request: InterviewId
    after_round: RoundNo
    survey: Survey
    sample: FiniteFloat | None = None
    agents: list[AgentId] | None = None
    ranges: list[tuple[AgentId, Amount]]
    restore: Restore
    config_ref: ConfigRef
    # 0: the request's first placement; n: its n-th, of a lost host's ranges (its answers are new
    # messages, stored apart from another order's to the same host; the recorder keeps the first
    # answer of each agent and question)
    placement: int = Field(0, ge=0, le=10_000)


class InterviewPlaced(Wire):
    """A post-hoc interview placed (`hosts`: host id -> its ranges; `expected`: answers the
    request will have), or refused with `error` (nothing is asked). Said again when it changes:
    a lost host's part placed again on living hosts (`placement` n > 0, `reason` says why), or
    the interview failed (`error`: no host is up to answer a lost host's part, or a host could
    not answer; what was answered stays recorded)."""

    run_id: Token
    request: InterviewId
    after_round: int = Field(ge=0)
    survey: Survey | None = None
    hosts: dict[str, list[tuple[AgentId, Amount]]] = {}
    expected: Amount = 0
    error: str | None = Field(None, max_length=4000)
    placed_at: float
    placement: int = Field(0, ge=0, le=10_000)
    reason: str | None = Field(None, max_length=4000)


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


Seconds = Annotated[float, Field(ge=0, le=10_000_000, allow_inf_nan=False)]
ProfileNote = Annotated[str, Field(max_length=1000)]


class ShareProfile(Wire):
    """Where one share's round went (table `round_profile`, one row per round and share): seconds
    the simulation's code held this host's loop, in `Env.view` (exact), in its turns, acts and
    scenes (estimated from timed samples), in its group envs' settle and its env's reduce and
    merge; the seconds the share had a model call out; the bytes of its agents' views
    (estimated from sized samples) and of the round's shared observation. Accumulated per host
    and round, never per agent."""

    agents: Amount = 0  # agents that played
    wall_s: Seconds = 0.0  # the share's round, its first turn to its last outcome
    view_s: Seconds = 0.0
    turn_s: Seconds = 0.0
    merge_s: Seconds = 0.0
    model_wait_s: Seconds = 0.0
    view_bytes: Amount = 0  # all views together (sampled, scaled to the views made)
    view_max_bytes: Amount = 0  # the largest view sized
    observation_bytes: Amount = 0  # the round's shared observation, once
    held: Amount = 0  # turns that waited for the loop to turn (author code had filled a slice)
    note: ProfileNote | None = None  # a view or observation over its budget, said once per run


class DecideProfile(Wire):
    """Where the environment's part of a round went: the seconds its `merge` of the shares'
    partials and its `decide` (with the next round's observation and selection) took, and the
    bytes of the observation it announced."""

    merge_s: Seconds = 0.0
    decide_s: Seconds = 0.0
    observation_bytes: Amount = 0
    note: ProfileNote | None = None


# A partial larger than this (its columns: the agents that move …) travels as an object of the
# checkpoints store, which the message names (PartialRef): a message stays under 1 MB.
PARTIAL_INLINE_BYTES = 256 * 1024
# What a partial's object may hold: this much, plus PARTIAL_BYTES_PER_AGENT per agent of its share
# (room for a few int or float columns of every agent as JSON). The environment refuses a larger
# one before reading a byte of it; a host never stores one (the round pauses naming it).
PARTIAL_OBJECT_BASE_BYTES = 1 << 20
PARTIAL_BYTES_PER_AGENT = 256


def partial_object_limit(agents: int) -> int:
    """The most bytes a partial's object of a share of `agents` agents may hold."""
    return PARTIAL_OBJECT_BASE_BYTES + PARTIAL_BYTES_PER_AGENT * max(0, agents)


class PartialRef(Strict):
    """A partial's payload when it travels by reference: the object of its own share that holds
    it (subjects.checkpoint_partial), its sha256 and its size, which the object's metadata must
    say too. The environment reads it only once the sender's share is known to be placed."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    ref: CheckpointName = Field(alias="$ref")
    sha256: SHA256
    size: int = Field(ge=0, lt=2**63)

    @staticmethod
    def of(payload: object) -> bool:
        """Whether a partial's payload is a reference (a simulation's partial has no `$ref` field)."""
        return isinstance(payload, dict) and "$ref" in payload


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
    profile: ShareProfile | None = None  # where the share's round went (None: a host that measures none)

    @model_validator(mode="after")
    def _valid_within_n(self) -> RoundPartial:
        if self.n_valid > self.n:
            raise ValueError(f"n_valid ({self.n_valid}) cannot exceed n ({self.n})")
        if self.n_valid + self.n_simulation_errors > self.n:
            raise ValueError(f"n_simulation_errors ({self.n_simulation_errors}) cannot exceed the invalid rows "
                             f"({self.n - self.n_valid})")
        return self


class RoundResult(Wire):
    """The environment's decision: the simulation's per-round `summary` (recorded) and the
    `observation` agents see next round. The environment's state after this round is not here:
    it stays with the environment, stored (before this result) in its checkpoint object of the
    round, whose sha256 is `env_checkpoint`; the next round's open names it (StateRef)."""

    run_id: Token
    round: RoundNo
    n: Amount
    n_valid: Amount
    summary: JsonDoc
    observation: JsonDoc
    closed_at: float
    epoch: Epoch = 0
    shares: list[str] = []  # the share keys whose partials it folded: stale if one was replaced
    usage: Usage = Usage()  # the folded shares' LLM work
    interviews: Usage = Usage()  # the folded shares' interviews' LLM work, apart
    selection: JsonDoc | None = None  # who acts next round (populace.sdk.select); None: everyone
    world: WorldRef | None = None  # the simulation's world after the round (stored before this result)
    # who is alive after the round (stored before this result); None: the run's first agents, as ever
    population: LivingRef | None = None
    # share key -> the checkpoint digests its partial reported (the orchestrator keeps each
    # share's own ranges' only), and the sha256 of the environment's own checkpoint
    checkpoints: dict[str, dict[CheckpointName, SHA256]] = {}
    env_checkpoint: SHA256 | None = None
    # of the n - n_valid invalid rows, those the simulation's own code caused (error 'agent: …');
    # the rest are the model's invalid answers
    n_simulation_errors: Amount = 0
    profile: DecideProfile | None = None  # where the environment's part of the round went
    prototypes: PrototypeRound | None = None  # a prototype run: each prototype's draws, audits and guard


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
    `pause`: not the run's fault (no model answers): the run pauses instead, to be resumed.
    `request`: a host cannot answer a post-hoc interview's order: that interview fails, not the run."""

    run_id: Token
    source: str  # the service or host that reports it: the last token of its subject
    round: int | None = None
    reason: str
    pause: bool = False
    epoch: Epoch | None = None  # a host's: the epoch of its share that cannot go on
    request: InterviewId | None = None


class RunDone(Wire):
    run_id: Token
    status: Literal["completed", "failed", "cancelled", "paused"]
    rounds: Amount
    finished_at: float
    reason: str | None = None
    epoch: Epoch = 0


class RunRecorded(Wire):
    """Everything of a finished run the recorder will ever have is in DuckDB. `status` is the
    run's as recorded: its RunDone's, except that a run that completed with an outcome, act or
    line missing (a group refused, a batch that never came) is `incomplete`, `reason` saying
    which rounds lack what and why (None: as its RunDone said, from a recorder before statuses)."""

    run_id: Token
    outcomes: int  # agent-rounds recorded
    db_path: str
    answers: int = 0  # planned interviews' answers recorded
    # planned answers owed (after the rounds the run played) that are not in: they did not come within
    # POPULACE_INTERVIEW_WAIT_S (a host lost), or nothing asks them again (cut short before a resume)
    answers_missing: int = 0
    epoch: Epoch = 0  # the RunDone's it follows: a resumed run's earlier stop may be recorded after it
    status: Literal["completed", "incomplete", "failed", "cancelled", "paused"] | None = None
    reason: str | None = None
    outcomes_missing: Amount = 0  # outcomes its round results counted that are not recorded
    acts_missing: Amount = 0  # acts of refused groups
    lines_missing: Amount = 0  # transcript lines of refused groups


class Progress(Wire):
    run_id: Token
    round: RoundNo
    host_id: Token
    answered: int
