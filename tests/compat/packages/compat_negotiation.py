"""A negotiation written against last month's SDK (issue 37): turns, with tuples everywhere a
Python author keeps them. Each agent asks for a share of a pie of 100 and keeps its offers as a
tuple of (round, amount) pairs, its best deal as a tuple, and concatenates tuples in its turn;
it overrides `restore` the way authors did when a checkpoint gave lists back. The environment's
State keeps loose fields (`Any`, a bare `list`) holding tuples, and its Partial a bare `list` of
(agent, amount) pairs that `decide` puts in a set. With a tuple back as a list, the agent's
`offers + ((round, amount),)` raises after round 1, and `set(pairs)` fails on the fleet only."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from populace.sdk import LLM, Agent, Env, Observation, Outcome, Partial, Simulation, State, Summary, answer_field


class Ask(Outcome):
    measure = "amount"
    amount: int | None = None
    streak: int = 0


class Seen(Observation):
    last: tuple[int, float] | None = None  # (round, mean ask) of the round before


class Asks(Partial):
    pairs: list = []  # (agent, amount): a bare list, as the SDK once let a partial be


class Book(State):
    last: Any = None  # (round, mean ask): loose, as the older SDK allowed
    history: list = Field(default_factory=list)  # (round, n asks, distinct amounts)


class Deal(Summary):
    mean_ask: float | None = None
    distinct: int = 0


class Negotiator(Agent):
    __slots__ = ("best", "offers")
    state_fields = ("memory", "offers", "best")  # the older style: listing memory too

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.offers: tuple = ()
        self.best: tuple[int, int] = (0, 0)  # (round, amount)

    def restore(self, state) -> None:
        # written when a checkpoint gave lists back: rebuild the tuples by hand
        super().restore(state)
        self.offers = tuple(tuple(o) for o in state.get("offers", ()))
        self.best = tuple(state.get("best", (0, 0)))

    async def turn(self, obs: Seen, llm: LLM) -> Ask:
        prompt = f"offers {self.offers!r}, best {self.best!r}, market {obs.last!r}: how much do you ask?"
        raw = await llm.ask(prompt, key=self.id)
        amount = answer_field(raw, "amount")
        if not isinstance(amount, int):
            return Ask(raw=raw, valid=False)
        self.offers = (self.offers + ((obs.round, amount),))[-3:]  # TypeError if offers came back a list
        if amount > self.best[1]:
            self.best = (obs.round, amount)
        streak = sum(1 for _, a in self.offers if a >= amount)
        self.remember((obs.round, amount))
        return Ask(amount=amount, streak=streak, raw=raw)


class Market(Env[Book, Asks]):
    State = Book
    Partial = Asks

    def observe(self, state: Book, round: int) -> Seen:
        return Seen(round=round, last=state.last)

    def reduce(self, agent_ids, outcomes) -> Asks:
        return Asks(pairs=[(a, o.amount) for a, o in zip(agent_ids, outcomes) if o.valid])

    def merge(self, partials) -> Asks:
        return Asks(pairs=sorted(p for x in partials for p in x.pairs))

    def decide(self, state: Book, round: int, total: Asks):
        pairs = set(total.pairs)  # unhashable if a pair came back a list
        amounts = [a for _, a in sorted(pairs)]
        mean = sum(amounts) / len(amounts) if amounts else None
        last = (round, mean) if mean is not None else state.last
        history = [*state.history, (round, len(amounts), len(set(amounts)))]
        return Book(last=last, history=history), Deal(mean_ask=mean, distinct=len(set(amounts)))


class Negotiation(Simulation):
    name = "compat-negotiation"
    Agent = Negotiator
    Env = Market
    Outcome = Ask
    Observation = Seen
    Summary = Deal

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"amount": {"type": "integer", "minimum": 0, "maximum": 100}},
                "required": ["amount"]}
