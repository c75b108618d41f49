"""Graphs that change: an outcome may carry edge edits — follow, unfollow, or any edge kind the
simulation declares — and each agent's in-edges (who it follows) live with it, on its host.

    return Posted(..., edits=[follow(42), unfollow(7)])      # this agent follows 42, stops following 7
    self.sim.following(agent_id)                              # in a view or a turn: who it follows now

An edit made in round n takes effect after round n: from round n+1 on, `following` includes it
(a feed ranks that author's posts up). Edits are applied in a fixed order (by agent id, then in
the order the outcome lists them), so every placement builds the same graph, and every edit is
recorded (table `edges`: run, round, follower, author, kind, op) so `populace.analysis` can
rebuild the graph at any round. An agent's edits are saved in its checkpoint with its state.
Posts on the run's graph follow the edits of the first kind (populace.sdk.mailbox): from round
n+1 on, an agent hears whom it followed in round n.
An edit naming an agent that does not exist, or a kind the simulation does not declare, is the
simulation's bug: the run pauses naming it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from populace.graph.csr import Graph


class EdgeError(ValueError):
    """An edit the run cannot apply (its message names the agent, the edit and why)."""


@dataclass(frozen=True, slots=True)
class Edit:
    op: Literal["add", "remove"]
    author: int  # whom the agent follows (or stops following): the edge author -> agent
    kind: str = "follow"


def follow(author: int, kind: str = "follow") -> Edit:
    return Edit("add", int(author), kind)


def unfollow(author: int, kind: str = "follow") -> Edit:
    return Edit("remove", int(author), kind)


class EdgeBook:
    """One process's agents' in-edges: the run's graph (for the first declared kind) plus each own
    agent's edits, by the round each was made. Pure; the engine feeds it, views read it."""

    __slots__ = ("agents", "base", "base_kind", "edits", "kinds")

    def __init__(self, agents: int, kinds: Sequence[str], base: Graph | None = None) -> None:
        self.agents = agents
        self.kinds = tuple(kinds)
        self.base = base  # the run's graph: the first kind's edges before any edit
        self.base_kind = self.kinds[0] if self.kinds else None
        # follower -> [(round, kind, op, author)], in the order they were made
        self.edits: dict[int, list[tuple[int, str, str, int]]] = {}

    def check(self, follower: int, edits: object, sim_name: str, round_: int) -> list[Edit]:
        """The outcome's edits as a list, or EdgeError naming what is wrong."""
        if edits is None:
            return []
        where = f"simulation {sim_name!r}, round {round_}, agent {follower}: outcome.edits"
        if not isinstance(edits, (list, tuple)):
            raise EdgeError(f"{where} must be a list of populace.sdk.edges.follow/unfollow, not "
                            f"{type(edits).__name__}")
        out = []
        for i, e in enumerate(edits):
            if not isinstance(e, Edit):
                raise EdgeError(f"{where}[{i}] is a {type(e).__name__}, not an Edit "
                                "(follow(author) / unfollow(author))")
            if e.kind not in self.kinds:
                declared = ", ".join(self.kinds) or "none: set `edge_kinds` on the Simulation"
                raise EdgeError(f"{where}[{i}]: edge kind {e.kind!r} is not declared ({declared})")
            if not isinstance(e.author, (int, np.integer)) or isinstance(e.author, bool) \
                    or not 0 <= e.author < self.agents:
                raise EdgeError(f"{where}[{i}]: agent {e.author!r} does not exist (the run has {self.agents} agents)")
            if e.author == follower:
                raise EdgeError(f"{where}[{i}]: an agent cannot {'follow' if e.op == 'add' else 'unfollow'} itself")
            out.append(e)
        return out

    def apply(self, round_: int, follower: int, edits: Iterable[Edit]) -> None:
        mine = self.edits.setdefault(follower, [])
        mine.extend((round_, e.kind, e.op, e.author) for e in edits)
        if not mine:
            del self.edits[follower]

    def following(self, agent: int, kind: str | None = None, as_of: int | None = None) -> tuple[int, ...]:
        """Who `agent` follows (kind: the first declared by default), with the edits made up to
        round `as_of` (None: all of them), ascending."""
        kind = kind or self.base_kind
        now: set[int] = set()
        if kind == self.base_kind and self.base is not None:
            now.update(self.base.in_neighbours(agent).tolist())
        for r, k, op, author in self.edits.get(agent, ()):
            if k != kind or (as_of is not None and r > as_of):
                continue
            if op == "add":
                now.add(author)
            else:
                now.discard(author)
        return tuple(sorted(now))

    # -- checkpoints -------------------------------------------------------------------------
    def state(self, agent: int) -> list[list]:
        """An agent's edits for its checkpoint: [[round, kind, op, author], …]."""
        return [list(e) for e in self.edits.get(agent, ())]

    def restore(self, agent: int, saved: object) -> None:
        self.edits.pop(agent, None)
        if saved:
            self.edits[agent] = [(int(r), str(k), str(op), int(a)) for r, k, op, a in saved]  # type: ignore[union-attr]

    def forget_after(self, round_: int) -> None:
        """Edits made after `round_` are undone (a round played again starts from its checkpoint)."""
        for agent in list(self.edits):
            kept = [e for e in self.edits[agent] if e[0] <= round_]
            if kept:
                self.edits[agent] = kept
            else:
                del self.edits[agent]


def rebuild(agents: int, base: Graph | None, edits: Iterable[tuple[int, int, int, str]],
            round_: int) -> dict[int, set[int]]:
    """The graph after round `round_` from the run's graph and its recorded edits (round,
    follower, author, op) in table order: follower -> whom it follows (agents with any edge)."""
    out: dict[int, set[int]] = {}
    if base is not None:
        for v in range(agents):
            ins = base.in_neighbours(v)
            if ins.size:
                out[v] = set(np.asarray(ins).tolist())
    for r, follower, author, op in edits:
        if r > round_:
            continue
        now = out.setdefault(follower, set())
        (now.add if op == "add" else now.discard)(author)
    return {k: v for k, v in out.items() if v}
