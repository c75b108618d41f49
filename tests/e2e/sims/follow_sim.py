"""A rumour on a graph that changes, for the edge-edit mail tests: as gossip_sim, but each round
an agent follows one agent it does not hear yet (picked from its id and the round) and unfollows the
lowest it hears every third round. Its level and what it heard depend on whom it follows, so a
post lost or kept from an unfollowed author shows in the recorded levels and inbox digests."""

from __future__ import annotations

from gossip_sim import GEnv, Rumour, Sum  # the same rumour, tally and summary, on a graph that changes

from populace.sdk import Agent, Outcome, Simulation
from populace.sdk.edges import follow, unfollow


class Said(Outcome):
    level: int | None = None
    heard: int = 0
    hears: int = 0  # obs.in_degree: whom it follows now
    authors: str = ""  # the authors of what it heard, as they came


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


class Follow(Simulation):
    name = "follow"
    Agent = Follower
    Env = GEnv
    Outcome = Said
    Summary = Sum
    Post = Rumour
    edge_kinds = ("follow",)
