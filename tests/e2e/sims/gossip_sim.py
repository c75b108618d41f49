"""A rumour on a graph, for the message tests: each agent's level is one more than the highest it
heard (broadcasts included), and it posts it. Every inbox changes the answer, so a lost or
doubled post shows in the recorded levels as well as in the inbox digests."""

from __future__ import annotations

from populace.sdk import Agent, Env, Outcome, Partial, Post, Simulation, Summary


class Rumour(Post):
    level: int = 0


class Said(Outcome):
    level: int | None = None
    heard: int = 0
    in_degree: int | None = None  # how many agents it hears on the graph (obs.in_degree)


class Tot(Partial):
    n: int = 0
    s: int = 0


class Sum(Summary):
    total: int = 0


class Gossiper(Agent):
    __slots__ = ()

    async def turn(self, obs, llm):
        inbox = obs.inbox(self.id)
        lvl = max([m.post.level for m in inbox], default=0) + 1
        await llm.ask(f"agent {self.id} heard {len(inbox)}", key=self.id)
        return Said(level=lvl, heard=len(inbox), in_degree=obs.in_degree(self.id),
                    post=Rumour(text=f"{self.id} says {lvl}", level=lvl))


class GEnv(Env):
    Partial = Tot

    def reduce(self, ids, outs):
        return Tot(n=len(ids), s=sum(o.level or 0 for o in outs))

    def merge(self, ps):
        return Tot(n=sum(p.n for p in ps), s=sum(p.s for p in ps))

    def decide(self, state, r, t):
        return state, Sum(total=t.s)


class Gossip(Simulation):
    name = "gossip"
    Agent = Gossiper
    Env = GEnv
    Outcome = Said
    Summary = Sum
    Post = Rumour
