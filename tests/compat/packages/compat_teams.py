"""Teams written against last month's SDK (issue 37): groups of 4 settled on their host. Each
agent keeps its share of its team's pot as a Fraction, its last payoffs in a deque(maxlen=3), and
remembers (round, (contribution, team total)) — a tuple inside a memory item, deeper than the
memory's one-level rule. A Fraction back as text, a deque back as a list (no maxlen) or an inner
tuple back as a list changes what the agent asks, and so its answers."""

from __future__ import annotations

from collections import deque
from fractions import Fraction

from populace.sdk import LLM, Agent, Env, GroupEnv, Outcome, Partial, Simulation, State, Summary, answer_field


class Put(Outcome):
    measure = "put"
    put: int | None = None
    payoff: float | None = None


class Pot(Partial):
    put: int = 0
    n: int = 0


class Round(Summary):
    mean_put: float | None = None


class Member(Agent):
    __slots__ = ("payoffs", "share")
    state_fields = ("share", "payoffs")

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.share = Fraction(0)
        self.payoffs: deque = deque(maxlen=3)

    async def turn(self, obs, llm: LLM) -> Put:
        prompt = f"share {self.share!r}, payoffs {self.payoffs!r}, memory {self.memory!r}: how much do you put in?"
        raw = await llm.ask(prompt, key=self.id)
        put = answer_field(raw, "put")
        return Put(put=put, raw=raw) if isinstance(put, int) else Put(raw=raw, valid=False)

    def settled(self, outcome: Put, news) -> None:
        if outcome.valid:
            self.share += Fraction(outcome.payoff or 0).limit_denominator(1000) / 10
            self.payoffs.append(outcome.payoff)
            self.remember((news["round"], (outcome.put, news["total"])))


class Team(GroupEnv):
    def settle(self, round, group, agent_ids, outcomes):
        puts = [o.put for o in outcomes if o.valid]
        total = sum(puts)
        for o in outcomes:
            o.payoff = (10 - (o.put or 0)) + 1.5 * total / len(outcomes) if o.valid else None
        return {"round": round, "total": total}


class TeamsEnv(Env[State, Pot]):
    Partial = Pot

    def reduce(self, agent_ids, outcomes) -> Pot:
        valid = [o.put for o in outcomes if o.valid]
        return Pot(put=sum(valid), n=len(valid))

    def merge(self, partials) -> Pot:
        return Pot(put=sum(p.put for p in partials), n=sum(p.n for p in partials))

    def decide(self, state, round, total):
        return state, Round(mean_put=total.put / total.n if total.n else None)


class Teams(Simulation):
    name = "compat-teams"
    Agent = Member
    Env = TeamsEnv
    GroupEnv = Team
    Outcome = Put
    Summary = Round

    def group_size(self) -> int:
        return 4

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"put": {"type": "integer", "minimum": 0, "maximum": 10}},
                "required": ["put"]}
