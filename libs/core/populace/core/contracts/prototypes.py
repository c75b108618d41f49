"""Prototypes (issue 39): a scenario's `prototypes:` section — some agents call the model, the
others copy an answer of their prototype's representatives, and seeded audits measure the error
inside the run — and what a round says of it (`PrototypeRound`, in its result)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from populace.core.contracts.wire_base import Count, FiniteFloat, Strict

# A round's result carries one line per prototype; a run with more would not fit its messages.
MAX_PROTOTYPES = 1000
# Columns a prototype run's outcome table has besides the simulation's: whose answer a row is
# (`llm`: the agent's own call; `prototype`: copied), its prototype, and the agent it copies.
PROTOTYPE_COLUMNS = (("source", "VARCHAR"), ("prototype", "VARCHAR"), ("drawn_from", "BIGINT"))

Attribute = Annotated[str, Field(min_length=1, max_length=100)]


class PrototypesConfig(Strict):
    """The approximation tier: in each prototype (agents alike in the persona attributes `by`
    names), a `share` of its agents (at least `min_representatives`) call the model each round;
    every other agent records an answer drawn from its prototype's representatives of that round.
    `audits` other agents per prototype also call the model, on a copy of their state: their
    answers (table `audits`) measure the draws' error and never change the run. With a
    `tolerance`, a prototype whose divergence's confidence interval lies wholly above it gets
    `raise_by` times its share from the next round (`on_breach: raise`), or the run pauses
    (`on_breach: pause`)."""

    share: FiniteFloat = Field(gt=0, le=1)
    by: list[Attribute] = Field([], max_length=8)
    min_representatives: Count = Field(2, ge=1, le=1_000_000)
    seed: Count | None = None  # default: the run's seed
    # keep: the same representatives every round (they carry their memory forward); every-round:
    # drawn again each round
    redraw: Literal["keep", "every-round"] = "keep"
    audits: Count = Field(20, ge=0, le=100_000)
    tolerance: FiniteFloat | None = Field(None, ge=0)
    on_breach: Literal["raise", "pause"] = "raise"
    raise_by: FiniteFloat = Field(2.0, gt=1, le=1000)
    bootstrap: Count = Field(200, ge=20, le=10_000)  # resamples of each divergence's 95% interval


class PrototypeStat(Strict):
    """One prototype in one round: who answered how, and how far the draws were from the audits."""

    label: str
    agents: int = Field(ge=0)
    share: float = Field(gt=0, le=1)  # of its agents calling the model this round
    representatives: int = Field(ge=0)
    valid: int = Field(ge=0)  # representatives whose answer is valid (the ones copied)
    drawn: int = Field(ge=0)  # agents that copied an answer
    unanswered: int = Field(0, ge=0)  # agents with no valid representative to copy: invalid rows
    audited: int = Field(0, ge=0)
    audited_valid: int = Field(0, ge=0)
    metric: Literal["w1", "js"] | None = None  # numeric measures: Wasserstein-1; categorical: Jensen-Shannon
    divergence: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    tv: float | None = None  # categorical: total variation
    breach: bool = False  # the interval lies wholly above the tolerance
    next_share: float = Field(gt=0, le=1)


class PrototypeRound(Strict):
    """What a prototype run's round says of its prototypes (in the round's result)."""

    stats: list[PrototypeStat] = Field([], max_length=MAX_PROTOTYPES)
    # the shares raised so far (label -> share), from the next round on: the next round open carries them
    shares: dict[str, float] = {}
    representatives: int = Field(0, ge=0)
    audited: int = Field(0, ge=0)
    pause: str | None = None  # the guard's reason to pause the run before the next round (on_breach: pause)


AgentIds = list[Annotated[int, Field(ge=0, lt=100_000_000)]]


def _same_lengths(n: int, lengths: list[int]) -> None:
    if any(k != n for k in lengths):
        raise ValueError("every column must have one value per agent id")


class RepresentativeRows(Strict):
    """A share's representatives this round: their prototype and outcome columns (the
    simulation's), valid or not."""

    agent_id: AgentIds
    prototype: list[str]
    valid: list[bool]
    columns: dict[str, list]

    @model_validator(mode="after")
    def _same_length(self) -> RepresentativeRows:
        _same_lengths(len(self.agent_id), [len(self.prototype), len(self.valid),
                                           *(len(v) for v in self.columns.values())])
        return self


class AuditValues(Strict):
    """A share's audited agents this round: their prototype and real answer's measure (None: invalid)."""

    agent_id: AgentIds
    prototype: list[str]
    valid: list[bool]
    value: list[FiniteFloat | str | bool | None]

    @model_validator(mode="after")
    def _same_length(self) -> AuditValues:
        _same_lengths(len(self.agent_id), [len(self.prototype), len(self.valid), len(self.value)])
        return self


class DrawTally(Strict):
    """What a share's other agents drew: per pool position (an index into the run's
    representatives ordered by prototype, then id), how many drew it and the smallest id that did."""

    position: list[Annotated[int, Field(ge=0)]]
    count: list[Annotated[int, Field(ge=1)]]
    first: list[Annotated[int, Field(ge=0, lt=100_000_000)]]

    @model_validator(mode="after")
    def _same_length(self) -> DrawTally:
        if not len(self.position) == len(self.count) == len(self.first):
            raise ValueError("position, count and first must have one value each per position")
        return self


class PrototypeEvidence(Strict):
    """A share's part of a prototype round, beside its partial (the environment folds the draws
    and measures them against the audits): its agents per prototype, its representatives' rows,
    its other agents' draws, its audits."""

    agents: dict[str, Annotated[int, Field(ge=0)]]
    reps: RepresentativeRows
    drawn: DrawTally
    audits: AuditValues
