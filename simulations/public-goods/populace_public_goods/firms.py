"""Public goods in teams within firms: nested groups (the paper's multi-level environments).
Teams of k play the public-goods game as before; each firm (a whole number of consecutive teams,
placed whole on one host) then matches its members' contributions: it pays out `match` × its
teams' total pot, shared equally by its members. The team settles first (its pot, multiplied and
shared), then the firm (the match) — both on the host that holds the firm — and each member
hears both. Outcome rows carry the team (`group_id`) and the firm (`firm_id`).

    simulation: public-goods-firms
    game: {group_size: 5, endowment: 20, multiplier: 1.6}
    firm: {size: 20, match: 0.5}      # 4 teams per firm; the firm adds half the pot it holds
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from populace.sdk import FiniteFloat, GroupEnv, RunConfig, State
from populace_public_goods import rules
from populace_public_goods.params import PublicGoodsParams
from populace_public_goods.rules import GoodsPartial, RoundSummary
from populace_public_goods.simulation import Contribution, Contributor, Group, PublicGoods, PublicGoodsEnv, counted


class FirmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(20, ge=2, le=1_000_000)  # agents per firm: a whole number of teams (game.group_size)
    match: FiniteFloat = Field(0.5, ge=0, le=1_000)  # the firm pays this × its teams' total pot

    @property
    def match_fraction(self) -> Fraction:
        return Fraction(repr(self.match))  # the decimal as written: payoffs stay exact


class FirmsParams(PublicGoodsParams):
    firm: FirmConfig = FirmConfig()


@dataclass(frozen=True, slots=True)
class FirmNews:
    round: int
    total: int  # the firm's teams' pots, summed
    size: int  # its members
    bonus: float  # what the firm paid each member


class Firm(GroupEnv):
    """The outer level: settles once every team of the firm did (their payoffs filled in)."""

    level = "firm"

    def __init__(self, sim: PublicGoodsFirms) -> None:
        super().__init__(sim)
        self.match = sim.params.firm.match_fraction

    def settle(self, round: int, group: int, agent_ids: Sequence[int],
               outcomes: Sequence[Contribution]) -> FirmNews:
        total = sum(c for c in map(counted, outcomes) if c is not None)
        bonus = self.match * total / len(outcomes)
        for o in outcomes:
            o.payoff = float(Fraction(o.payoff) + bonus) if o.payoff is not None else None
        return FirmNews(round, total, len(outcomes), float(bonus))


class Team(Group):
    Parent = Firm


class FirmMember(Contributor):
    """Hears its team (remembered as a Contributor does), then its firm: the round it remembers
    gets the payoff with the firm's match."""

    __slots__ = ()

    def settled(self, outcome: Contribution, news: object) -> None:
        if isinstance(news, FirmNews):
            if self.memory and self.memory[-1][0] == news.round:
                r, c, _, average = self.memory[-1]
                self.memory = (*self.memory[:-1], (r, c, outcome.payoff, average))
            return
        super().settled(outcome, news)


class FirmsEnv(PublicGoodsEnv):
    def __init__(self, sim: PublicGoodsFirms) -> None:
        super().__init__(sim)
        self.match = sim.params.firm.match_fraction

    def decide(self, state: State, round: int, total: GoodsPartial) -> tuple[State, RoundSummary]:
        _, summary = super().decide(state, round, total)
        if total.n:  # every firm paid match × its pot: Σ payoff grows by match × Σ pots, exactly
            mean = rules.mean_payoff(total.n, total.total, self.endowment, self.multiplier) \
                + self.match * total.total / total.n
            summary = summary.model_copy(update={"mean_payoff": float(mean)})
        return state, summary


class PublicGoodsFirms(PublicGoods):
    name = "public-goods-firms"
    Params = FirmsParams
    Agent = FirmMember
    Env = FirmsEnv
    GroupEnv = Team
    outcome_table = "public_goods_firms_outcomes"
    summary_table = "public_goods_firms_rounds"

    def group_sizes(self) -> tuple[int, int]:
        return self.params.game.group_size, self.params.firm.size

    @classmethod
    def check_run(cls, params: FirmsParams, config: RunConfig) -> None:
        super().check_run(params, config)
        k, size = params.game.group_size, params.firm.size
        if size % k:
            raise ValueError(f"firm.size: {size} is not a whole number of teams of game.group_size {k}")
