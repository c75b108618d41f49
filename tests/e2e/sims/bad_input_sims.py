"""A small simulation with a world, a view, edge edits, claims and an invariant, and one bug it can
be switched to, for the bad-input tests (issues 23 and 37): a world column of the wrong type or
length, a view that raises, an edit naming an agent that does not exist or an edge kind not
declared, a claim on a cell that does not exist, an invariant that breaks or that raises, a view
that shows an item the world does not have or one item twice. Each bug strikes in round 2.

A subclass sets `bug`; the end-to-end test leaves it None and names the bug in the file that
`BAD_INPUT_BUG_FILE` points to (read at each call, by every service): deleting the file is the
"fix", after which `populace resume` must give exactly the rows of an undisturbed run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field

from populace.sdk import Agent, Claims, Env, Outcome, Partial, Simulation, State, Summary, invariant
from populace.sdk.edges import follow
from populace.sdk.env import Ints
from populace.sdk.world import World, column

BUG_ROUND = 2
BUGGY_AGENT = 7


class Board(World):
    score = column("int32", "agents")
    # a size of its own (the memory estimate counts it); its values are what a view shows an agent
    # (who saw what: table `shown`)
    cells = column("int64", "cells")


@dataclass(frozen=True, slots=True)
class Seen:
    round: int
    score: int
    follows: int  # whom it follows now: read in the view, where its host keeps its edges


class Mark(Outcome):
    score: int = 0
    follows: int = 0  # whom it followed before this round (its in-edges, restored on resume)
    cell: int | None = None  # the cell it claims
    measure = "score"


class Gains(Partial):
    n: int = 0
    gainers: Ints = np.zeros(0, dtype=np.int64)
    claims: Claims = Field(default_factory=Claims)


class Total(Summary):
    total: int = 0
    gainers: int = 0
    granted: int = 0  # cells claimed that went to one claimant each


class Player(Agent):
    __slots__ = ()

    async def turn(self, obs: Seen, llm) -> Mark:
        sim: Ledger = self.sim  # type: ignore[assignment]
        n = sim.agents
        author = (self.id + obs.round) % n
        edits = [follow(author)] if author != self.id else []
        if obs.round == BUG_ROUND and self.id == BUGGY_AGENT:
            if sim.bug() == "edge_kind":
                edits = [follow(author, kind="like")]
            elif sim.bug() == "edge_agent":
                edits = [follow(n + 3)]
        cell = (self.id * 3 + obs.round) % sim.params.cells
        if obs.round == BUG_ROUND and self.id == BUGGY_AGENT and sim.bug() == "claim":
            cell = sim.params.cells + 5
        return Mark(score=obs.score, follows=obs.follows, cell=cell, raw=str(obs.score), edits=edits or None)


class BoardEnv(Env[State, Gains]):
    Partial = Gains
    World = Board
    shown_items = "cells"

    def start_world(self, state: State) -> Board:
        n = self.sim.agents
        cells = self.sim.params.cells
        return Board({"agents": n, "cells": cells}, score=np.arange(n, dtype=np.int32) % 5,
                     cells=100 + np.arange(cells, dtype=np.int64))

    def view(self, world: Board, round: int, agent_id: int) -> Seen:
        bug = self.sim.bug() if round == BUG_ROUND and agent_id == BUGGY_AGENT else None
        if bug == "view":
            raise KeyError(f"no such post for agent {agent_id}")
        cells = world.cells.size
        shown = [int(world.cells[(agent_id + round) % cells]), int(world.cells[(agent_id + 2 * round + 1) % cells])]
        if bug == "shown_item":
            shown[1] = 9999
        elif bug == "shown_twice":
            shown[1] = shown[0]
        self.show(agent_id, shown, ranks=[2, 1])
        return Seen(round, int(world.score[agent_id]), len(self.sim.following(agent_id)))

    @invariant("no score below zero")
    def scores(self, state: State, world: Board):
        if self.sim.bug() == "invariant_raises" and getattr(self, "decided", 0) == BUG_ROUND:
            raise ZeroDivisionError("division by zero")
        return np.flatnonzero(world.score < 0)

    def reduce(self, ids, outs) -> Gains:
        return Gains(n=len(ids), gainers=np.asarray([a for a, o in zip(ids, outs) if (o.score + a + o.follows) % 3 == 0],
                                                    dtype=np.int64),
                     claims=Claims.of(ids, [o.cell for o in outs]))

    def merge(self, parts) -> Gains:
        return Gains(n=sum(p.n for p in parts),
                     gainers=np.concatenate([p.gainers for p in parts]) if parts else np.zeros(0, dtype=np.int64),
                     claims=Claims.merge(p.claims for p in parts))

    def decide(self, state: State, round: int, total: Gains, world: Board):
        self.decided = round  # the invariant's bug strikes after this round
        gainers = np.sort(total.gainers)
        score = world.score.copy()
        score[gainers] += round
        won = total.claims.grant(world.sizes["cells"], seed=self.sim.seed, round=round, what="cell")
        score[won.agent] += 1
        if round == BUG_ROUND and self.sim.bug() == "invariant":
            score[[BUGGY_AGENT, 11]] = -1
        if round == BUG_ROUND and self.sim.bug() == "world_type":
            return state, Total(total=int(score.sum())), world.replace(score=score + 0.5)
        if round == BUG_ROUND and self.sim.bug() == "world_length":
            return state, Total(total=int(score.sum())), world.replace(score=score[:-1])
        return (state, Total(total=int(score.sum()), gainers=int(gainers.size), granted=len(won)),
                world.replace(score=score))


class LedgerParams(Simulation.Params):
    cells: int = 16


class Ledger(Simulation):
    name = "ledger"
    Params = LedgerParams
    Agent = Player
    Env = BoardEnv
    Outcome = Mark
    Summary = Total
    edge_kinds = ("follow",)
    bug_name: ClassVar[str | None] = None  # a subclass's bug; None: the one named in $BAD_INPUT_BUG_FILE, if any

    def world_sizes(self) -> dict[str, int]:
        return {"agents": self.agents, "cells": self.params.cells}

    def bug(self) -> str | None:
        if self.bug_name is not None:
            return self.bug_name
        path = os.environ.get("BAD_INPUT_BUG_FILE")
        return Path(path).read_text().strip() if path and Path(path).exists() else None


class ViewBug(Ledger):
    """The view raises for agent 7 in round 2 (a local run by import path)."""

    bug_name = "view"
