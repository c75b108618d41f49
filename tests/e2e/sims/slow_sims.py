"""A simulation whose environment's `view` is slow or large on purpose, for the tests of slow
author code (issue 36): a host held by its simulation's code is not lost, the round profile says
where the time went, and a view over its budget is said once. Given to the services by import
path (`slow_sims:SlowView`) with this folder on their PYTHONPATH.

The ratio game, with a world (one score per agent) and a view per agent that burns
`slow.view_ms` of CPU (a recommender ranking a pool in plain Python), `slow.first_ms` more for
agent `slow.first_agent` in round 1 (one call longer than a host's heartbeat timeout), and
carries `slow.pad_bytes` of padding (a view that holds the whole pool)."""

from __future__ import annotations

import time

import numpy as np
from populace_ratio_game import RatioEnv, RatioGame, RatioParams, Seen
from pydantic import BaseModel, ConfigDict, Field

from populace.sdk.world import World, column


def burn(seconds: float) -> None:
    """Hold the CPU (and so the event loop) for `seconds`, as ranking a pool in Python does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SlowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    view_ms: float = Field(0.0, ge=0)
    first_ms: float = Field(0.0, ge=0)
    first_agent: int = Field(0, ge=0)
    pad_bytes: int = Field(0, ge=0)


class SlowParams(RatioParams):
    slow: SlowConfig = SlowConfig()


class Scores(World):
    score = column("float64", "agents")


class Ranked(Seen):
    """The shared observation's history, and what this agent's feed would hold."""

    pad: str = ""


class SlowEnv(RatioEnv):
    World = Scores

    def start_world(self, state) -> Scores:
        n = self.sim.agents
        return Scores({"agents": n}, score=np.arange(n, dtype=np.float64))

    def decide(self, state, round, total, world):
        state, summary = super().decide(state, round, total)
        return state, summary, world

    def view(self, world: Scores, round: int, agent_id: int) -> Ranked:
        slow = self.params.slow
        burn(slow.view_ms / 1000)
        if round == 1 and agent_id == slow.first_agent:
            burn(slow.first_ms / 1000)
        return Ranked(round=round, pad="x" * slow.pad_bytes)


class SlowView(RatioGame):
    """The ratio game with a slow (or large) view per agent."""

    name = "slow-view"
    Params = SlowParams
    Env = SlowEnv
    outcome_table = "slow_guesses"
    summary_table = "slow_rounds"
