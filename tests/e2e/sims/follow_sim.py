"""A rumour on a graph that changes, for the edge-edit mail tests: as gossip_sim, but each round
an agent follows one agent it does not hear yet (drawn from its seeded rng) and unfollows the
lowest it hears every third round. Its level and what it heard depend on whom it follows, so a
post lost or kept from an unfollowed author shows in the recorded levels and inbox digests."""

from __future__ import annotations

from populace.sdk import Agent, Env, Outcome, Partial, Post, Simulation, Summary
from populace.sdk.edges import follow, unfollow


class Rumour(Post):
    level: int = 0


class Said(Outcome):
    level: int | None = None
    heard: int = 0
    hears: int = 0  # obs.in_degree: whom it follows now
    authors: str = ""  # the authors of what it heard, as they came


class Tot(Partial):
    n: int = 0
    s: int = 0


class Sum(Summary):
    total: int = 0


class Follower(Agent):
    __slots__ = ()

    async def turn(self, obs, llm):
        inbox = obs.inbox(self.id)
        lvl = max([m.post.level for m in inbox], default=0) + 1
        await llm.ask(f"agent {self.id} heard {len(inbox)}", key=self.id)
        n = 60  # the tests run 60 agents
        now = set(self.sim.following(self.id))
        pick = (self.id * 7 + obs.round * 13) % n
        edits = []
        if pick != self.id and pick not in now:
            edits.append(follow(pick))
        if obs.round % 3 == 0 and now:
            edits.append(unfollow(min(now)))
        return Said(level=lvl, heard=len(inbox), hears=obs.in_degree(self.id),
                    authors=",".join(str(m.author) for m in inbox),
                    post=Rumour(text=f"{self.id} says {lvl}", level=lvl), edits=edits)


class FEnv(Env):
    Partial = Tot

    def reduce(self, ids, outs):
        return Tot(n=len(ids), s=sum(o.level or 0 for o in outs))

    def merge(self, ps):
        return Tot(n=sum(p.n for p in ps), s=sum(p.s for p in ps))

    def decide(self, state, r, t):
        return state, Sum(total=t.s)


class Follow(Simulation):
    name = "follow"
    Agent = Follower
    Env = FEnv
    Outcome = Said
    Summary = Sum
    Post = Rumour
    edge_kinds = ("follow",)
