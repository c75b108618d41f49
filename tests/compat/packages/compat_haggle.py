"""Haggling written against last month's SDK (issue 37): a scene per pair, the seller asks and the
buyer answers, both inside the round. Each agent keeps a ledger keyed by (round, partner) — a dict
with tuple keys, which JSON cannot write at all — and its deals as a set of rounds."""

from __future__ import annotations

from typing import Literal

from populace.sdk import LLM, Agent, Env, GroupEnv, Outcome, Partial, Simulation, State, Summary, answer_field
from populace.sdk.scene import Scene


class Quote(Outcome):
    price: int | None = None
    take: bool | None = None


class Trade(Outcome):
    measure = "price"
    role: Literal["seller", "buyer", "alone"] = "alone"
    price: int | None = None
    deal: bool | None = None


class Deals(Partial):
    deals: int = 0
    pairs: int = 0


class Market(Summary):
    deal_rate: float | None = None


class Trader(Agent):
    __slots__ = ("deals", "ledger")
    state_fields = ("ledger", "deals")

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.ledger: dict[tuple[int, int], int] = {}
        self.deals: set[int] = set()

    def _known(self) -> str:
        return f"ledger {sorted(self.ledger.items())!r}, deals {sorted(self.deals)!r}"

    async def act(self, phase: str, view: dict, llm: LLM) -> Quote:
        if phase == "ask":
            raw = await llm.ask(f"{self._known()}: your price?", key=self.id,
                                schema={"type": "object", "properties": {"price": {"type": "integer", "minimum": 1,
                                                                                   "maximum": 20}}})
            price = answer_field(raw, "price")
            return Quote(price=price, raw=raw, valid=isinstance(price, int))
        raw = await llm.ask(f"{self._known()}: buy at {view['price']}?", key=self.id,
                            schema={"type": "object", "properties": {"take": {"type": "boolean"}}})
        take = answer_field(raw, "take")
        return Quote(take=take, raw=raw, valid=isinstance(take, bool))

    def settled(self, outcome: Trade, news) -> None:
        if outcome.role != "alone" and outcome.price is not None:
            self.ledger[(news["round"], news["partner"][self.id])] = outcome.price
            if outcome.deal:
                self.deals.add(news["round"])


class Pair(GroupEnv):
    async def scene(self, scene: Scene):
        if len(scene.members) < 2:
            scene.outcome(scene.members[0], Trade())
            return {"round": scene.round, "partner": {}}
        seller, buyer = scene.members
        quote = await seller.act("ask", {})
        price = quote.price if quote.valid else None
        deal = None
        if price is not None:
            reply = await buyer.act("answer", {"price": price})
            deal = reply.take if reply.valid else None
            scene.say(buyer, "deal" if deal else "no deal")
        scene.outcome(seller, Trade(role="seller", price=price, deal=deal, valid=price is not None))
        scene.outcome(buyer, Trade(role="buyer", price=price, deal=deal, valid=price is not None))
        return {"round": scene.round, "partner": {seller.id: buyer.id, buyer.id: seller.id}}


class HaggleEnv(Env[State, Deals]):
    Partial = Deals

    def reduce(self, agent_ids, outcomes) -> Deals:
        sellers = [o for o in outcomes if o.role == "seller"]
        return Deals(deals=sum(1 for o in sellers if o.deal), pairs=len(sellers))

    def merge(self, partials) -> Deals:
        return Deals(deals=sum(p.deals for p in partials), pairs=sum(p.pairs for p in partials))

    def decide(self, state, round, total):
        return state, Market(deal_rate=total.deals / total.pairs if total.pairs else None)


class Haggle(Simulation):
    name = "compat-haggle"
    Agent = Trader
    Env = HaggleEnv
    GroupEnv = Pair
    Outcome = Trade
    Act = Quote
    Summary = Market

    def group_size(self) -> int:
        return 2
