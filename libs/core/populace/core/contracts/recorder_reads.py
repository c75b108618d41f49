"""Reading results while the recorder writes them (`recorder.read.<verb>`): each verb's request
and reply."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from populace.core.contracts.questions import InterviewId
from populace.core.contracts.wire_base import SCHEMA_VERSION, RunId, Strict, _check_token


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


class ProfileRequest(ReadRequest):
    """Where a run's rounds went (table round_profile): the rows of its last `rounds` rounds, and
    the whole run's seconds per column."""

    VERB: ClassVar[str] = "profile"
    run_id: RunId
    rounds: int = Field(50, ge=1, le=200)

    _tok = field_validator("run_id")(_check_token)


class ProfileReply(ReadReply):
    """`profile`: the rows (populace.analysis.round_profile), the rounds recorded in all, the run's
    seconds per column (`seconds`), the largest (`top`: [column, seconds]) and the notes said."""

    run_id: str | None = None
    rows: list[dict[str, Any]] = []
    rounds_total: int = 0
    seconds: dict[str, float] = {}
    top: tuple[str, float] | None = None
    notes: list[str] = []


class GroupsRequest(ReadRequest):
    """The run's measure per group of `by` (a persona attribute, or `model` in a run with several
    models) in one round (None: the last), with 95% CIs (populace.analysis.group_table)."""

    VERB: ClassVar[str] = "groups"
    run_id: RunId
    by: str = Field(min_length=1, max_length=100)
    round: int | None = Field(None, ge=1)

    _tok = field_validator("run_id")(_check_token)


class GroupsReply(ReadReply):
    """`groups`: one row per group (numeric measure) or per group and option (categorical), and
    what one can group by (`attributes`)."""

    run_id: str | None = None
    by: str | None = None
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
