"""Hot posts: a small feed built with the recommender toolkit (docs/worlds.md#a-recommender-toolkit).

Every round each agent reads the `k` items a Ranker picks for it — the items' hot score plus the
similarity of their topic to its taste — which the view records as shown, and upvotes one. The
environment adds the round's upvotes to the items, so what was upvoted is hotter next round.

    PYTHONPATH=examples/simulations/hot_posts uv run populace run examples/simulations/hot_posts/scenario.yaml --local
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from populace.sdk import Agent, Env, Ids, Outcome, Params, Partial, Simulation, State, Summary, stable_seed
from populace.sdk.env import Ints
from populace.sdk.recommend import Mix, Ranker, interests
from populace.sdk.world import World, column

DIMS = 8  # the length of a taste (an agent's) and of a topic (an item's)


class Shelf(World):
    item_id = column("int64", "items")
    posted_in = column("int32", "items")
    upvotes = column("int64", "items")


@dataclass(frozen=True, slots=True)
class Page:  # what an agent reads this round: its items, best first
    round: int
    items: tuple[int, ...]


class Vote(Outcome):
    upvoted: int | None = None  # the item it upvoted (None: no valid answer)
    passed: Ids | None = None  # the items it read and did not upvote: an id-list column (BIGINT[])
    measure = "upvoted"


def _none() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


class Upvotes(Partial):
    items: Ints = Field(default_factory=_none)  # one entry per upvote


class Tally(Summary):
    upvotes: int = Field(0, title="upvotes")
    top_item: int | None = Field(None, title="most upvoted item so far")


class HotParams(Params):
    items: int = Field(200, ge=1, le=1_000_000)
    k: int = Field(5, ge=1, le=50)
    interest: float = Field(2.0, ge=0, le=100)  # the weight of taste against the hot score


class Reader(Agent):
    __slots__ = ()

    async def turn(self, page: Page, llm) -> Vote:
        sim: HotPosts = self.sim  # type: ignore[assignment]
        raw = await llm.ask(f"Your page: items {list(page.items)}. Which one (1 to {len(page.items)}) do you "
                            "upvote?", key=self.id, schema=sim.answer_schema())
        try:
            pick = json.loads(raw)["pick"]
        except (ValueError, TypeError, KeyError):
            pick = None
        if type(pick) is not int or not 1 <= pick <= len(page.items):
            return Vote(raw=raw, valid=False)
        chosen = page.items[pick - 1]
        return Vote(upvoted=chosen, passed=[i for i in page.items if i != chosen], raw=raw)


class ShelfEnv(Env[State, Upvotes]):
    Partial = Upvotes
    World = Shelf
    shown_items = "item_id"  # what a view shows are item ids: recorded in table `shown`

    def __init__(self, sim: HotPosts) -> None:
        super().__init__(sim)
        self._ranked: tuple[Shelf, Ranker] | None = None  # this host's ranker of the round's world

    def start_world(self, state: State) -> Shelf:
        n = self.params.items
        return Shelf({"items": n}, item_id=np.arange(n), posted_in=np.zeros(n, np.int32),
                     upvotes=np.zeros(n, np.int64))

    def view(self, world: Shelf, round: int, agent_id: int) -> Page:
        if self._ranked is None or self._ranked[0] is not world:  # once per world, on each host
            topics = interests(stable_seed(self.sim.seed, "topics"), world.item_id, DIMS)
            mix = Mix(hot=1.0, interest=self.params.interest)
            self._ranked = world, Ranker(world.item_id, round=round, mix=mix, likes=world.upvotes,
                                         posted_in=world.posted_in, vectors=topics)
        ranker = self._ranked[1]
        taste = interests(stable_seed(self.sim.seed, "tastes"), [agent_id], DIMS)[0]
        best = ranker.ids[ranker.top(agent_id, self.params.k, vector=taste)]
        self.show(agent_id, best)  # who saw what: one row of table `shown` (ranks 1, 2, …)
        return Page(round, tuple(best.tolist()))

    def reduce(self, agent_ids, outcomes) -> Upvotes:
        return Upvotes(items=np.asarray([o.upvoted for o in outcomes if o.valid], dtype=np.int64))

    def merge(self, partials) -> Upvotes:
        return Upvotes(items=np.concatenate([p.items for p in partials]) if partials else _none())

    def decide(self, state: State, round: int, total: Upvotes, world: Shelf) -> tuple[State, Tally, Shelf]:
        upvotes = world.upvotes + np.bincount(total.items, minlength=world.upvotes.size)  # item id = its index
        top = int(np.argmax(upvotes)) if upvotes.any() else None
        return state, Tally(upvotes=int(total.items.size), top_item=top), world.replace(upvotes=upvotes)


class HotPosts(Simulation):
    name = "hot-posts"
    Params = HotParams
    Agent = Reader
    Env = ShelfEnv
    Outcome = Vote
    Summary = Tally

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"pick": {"type": "integer", "minimum": 1, "maximum": self.params.k}},
                "required": ["pick"], "additionalProperties": False}

    def system_prompt(self) -> str:
        return 'You read a page of posts and upvote one. Answer with JSON only: {"pick": n}.'
