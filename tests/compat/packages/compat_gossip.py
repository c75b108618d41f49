"""Gossip on a graph written against last month's SDK (issue 37): each agent reads its
in-neighbours' posts, keeps the authors it heard as a set and the levels it heard as a sorted
tuple, and posts one more than the highest. A set back as a list would hold an author twice."""

from __future__ import annotations

from populace.sdk import LLM, Agent, Env, Outcome, Partial, Post, Simulation, State, Summary


class Rumour(Post):
    level: int = 0


class Heard(Outcome):
    measure = "level"
    level: int | None = None
    authors: int = 0  # distinct authors heard so far


class Levels(Partial):
    total: int = 0


class Spread(Summary):
    total: int = 0


class Listener(Agent):
    __slots__ = ("authors", "levels")
    state_fields = ("authors", "levels")

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.authors: set[int] = set()
        self.levels: tuple[int, ...] = ()

    async def turn(self, obs, llm: LLM) -> Heard:
        inbox = obs.inbox(self.id)
        for m in inbox:
            self.authors.add(m.author)  # AttributeError if the set came back a list
        self.levels = tuple(sorted({*self.levels, *(m.post.level for m in inbox)}))[-4:]
        await llm.ask(f"heard {sorted(self.authors)!r}, levels {self.levels!r}", key=self.id)
        level = max(self.levels, default=0) + 1
        return Heard(level=level, authors=len(self.authors), post=Rumour(text=f"{self.id}: {level}", level=level))


class GossipEnv(Env[State, Levels]):
    Partial = Levels

    def reduce(self, agent_ids, outcomes) -> Levels:
        return Levels(total=sum(o.level or 0 for o in outcomes))

    def merge(self, partials) -> Levels:
        return Levels(total=sum(p.total for p in partials))

    def decide(self, state, round, total):
        return state, Spread(total=total.total)


class Gossip(Simulation):
    name = "compat-gossip"
    Agent = Listener
    Env = GossipEnv
    Outcome = Heard
    Summary = Spread
    Post = Rumour
