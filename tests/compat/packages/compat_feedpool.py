"""A feed pool written against last month's SDK (issue 37): a world of posts, a view per agent,
and agents that keep what they saw as a frozenset, what they liked as a dict keyed by post id (an
int), and a deque of their last feeds. With the frozenset back as a list, `seen | set(feed)`
raises; with the dict's keys back as text, `liked.get(post)` misses and the agent likes again."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from populace.sdk import LLM, Agent, Env, Outcome, Partial, Simulation, State, Summary, answer_field
from populace.sdk.env import Ints
from populace.sdk.world import World, column

POSTS = 12
FEED = 3


class Pool(World):
    author = column("int32", "posts")
    likes = column("int64", "posts")


@dataclass(frozen=True, slots=True)
class Feed:
    round: int
    posts: tuple[int, ...]  # post ids, most liked first


class Liked(Outcome):
    measure = "pick"
    pick: int | None = None  # the post liked (None: none)
    new: int = 0  # posts in the feed the agent had not seen


class Likes(Partial):
    liked: Ints = np.zeros(0, dtype=np.int64)


class Tally(Summary):
    likes: int = 0


class Reader(Agent):
    __slots__ = ("feeds", "liked", "seen")
    state_fields = ("seen", "liked", "feeds")

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.seen: frozenset[int] = frozenset()
        self.liked: dict[int, int] = {}  # post -> round
        self.feeds: deque = deque(maxlen=2)

    async def turn(self, feed: Feed, llm: LLM) -> Liked:
        new = len(set(feed.posts) - self.seen)
        self.seen = self.seen | frozenset(feed.posts)
        self.feeds.append(feed.posts)
        fresh = [p for p in feed.posts if self.liked.get(p) is None]
        prompt = f"feed {feed.posts!r}, liked {sorted(self.liked.items())!r}, last {list(self.feeds)!r}: like which?"
        raw = await llm.ask(prompt, key=self.id)
        pick = answer_field(raw, "pick")
        post = fresh[pick % len(fresh)] if isinstance(pick, int) and fresh else None
        if post is not None:
            self.liked[post] = feed.round
        return Liked(pick=post, new=new, raw=raw)


class PoolEnv(Env[State, Likes]):
    Partial = Likes
    World = Pool

    def start_world(self, state: State) -> Pool:
        ids = np.arange(POSTS)
        return Pool({"posts": POSTS}, author=(ids % max(1, self.sim.agents)).astype(np.int32),
                    likes=np.zeros(POSTS, dtype=np.int64))

    def view(self, world: Pool, round: int, agent_id: int) -> Feed:
        order = np.lexsort(((np.arange(POSTS) + agent_id + round) % POSTS, -world.likes))
        return Feed(round, tuple(int(p) for p in order[:FEED]))

    def reduce(self, agent_ids, outcomes) -> Likes:
        return Likes(liked=np.array([o.pick for o in outcomes if o.pick is not None], dtype=np.int64))

    def merge(self, partials) -> Likes:
        return Likes(liked=np.concatenate([p.liked for p in partials]) if partials else np.zeros(0, dtype=np.int64))

    def decide(self, state: State, round: int, total: Likes, world: Pool):
        likes = world.likes + np.bincount(total.liked, minlength=POSTS)
        return state, Tally(likes=int(total.liked.size)), world.replace(likes=likes)


class FeedPool(Simulation):
    name = "compat-feedpool"
    Agent = Reader
    Env = PoolEnv
    Outcome = Liked
    Summary = Tally

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"pick": {"type": "integer", "minimum": 0, "maximum": FEED - 1}},
                "required": ["pick"]}
