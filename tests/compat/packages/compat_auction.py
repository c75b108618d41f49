"""A sealed-bid auction written against last month's SDK (issue 37): a scene per group of 3 whose
members bid at once (`asyncio.gather` of their acts, as the docs show), then the highest bid
wins. Each agent keeps the bids it saw as a tuple of (round, (bids …)) and its wins as a frozenset
of rounds. The acts' seq follow the order they were started in, whatever order they finish."""

from __future__ import annotations

import asyncio

from populace.sdk import LLM, Agent, Env, GroupEnv, Outcome, Partial, Simulation, State, Summary, answer_field
from populace.sdk.scene import Scene


class Bid(Outcome):
    bid: int | None = None


class Lot(Outcome):
    measure = "paid"
    paid: int | None = None
    won: bool = False


class Sales(Partial):
    sold: int = 0
    total: int = 0


class Market(Summary):
    mean_price: float | None = None


class Bidder(Agent):
    __slots__ = ("seen", "wins")
    state_fields = ("seen", "wins")

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.seen: tuple = ()
        self.wins: frozenset[int] = frozenset()

    async def act(self, phase: str, view, llm: LLM) -> Bid:
        raw = await llm.ask(f"seen {self.seen!r}, wins {sorted(self.wins)!r}: your bid?", key=self.id,
                            schema={"type": "object", "properties": {"bid": {"type": "integer", "minimum": 0,
                                                                              "maximum": 50}}})
        bid = answer_field(raw, "bid")
        return Bid(bid=bid, raw=raw, valid=isinstance(bid, int))

    def settled(self, outcome: Lot, news) -> None:
        self.seen = (*self.seen[-2:], (news["round"], tuple(news["bids"])))
        if outcome.won:
            self.wins = self.wins | {news["round"]}


class Room(GroupEnv):
    async def scene(self, scene: Scene):
        bids = await asyncio.gather(*(m.act("bid") for m in scene.members))  # at once
        amounts = [b.bid if b.valid else -1 for b in bids]
        best = max(range(len(bids)), key=lambda i: (amounts[i], -i))
        for i, m in enumerate(scene.members):
            won = i == best and amounts[i] >= 0
            scene.outcome(m, Lot(paid=amounts[i] if won else None, won=won, raw=bids[i].raw, valid=bids[i].valid))
        return {"round": scene.round, "bids": amounts}


class AuctionEnv(Env[State, Sales]):
    Partial = Sales

    def reduce(self, agent_ids, outcomes) -> Sales:
        paid = [o.paid for o in outcomes if o.won]
        return Sales(sold=len(paid), total=sum(paid))

    def merge(self, partials) -> Sales:
        return Sales(sold=sum(p.sold for p in partials), total=sum(p.total for p in partials))

    def decide(self, state, round, total):
        return state, Market(mean_price=total.total / total.sold if total.sold else None)


class Auction(Simulation):
    name = "compat-auction"
    Agent = Bidder
    Env = AuctionEnv
    GroupEnv = Room
    Outcome = Lot
    Act = Bid
    Summary = Market

    def group_size(self) -> int:
        return 3
