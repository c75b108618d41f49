"""Simulations that misbehave on purpose, for the end-to-end fault tests. Given to the
services by import path (`faulty_sims:Flaky`) with this folder on their PYTHONPATH."""

from __future__ import annotations

from populace_ratio_game import Player, RatioEnv, RatioGame


class BuggyPlayer(Player):
    __slots__ = ()

    async def turn(self, obs, llm):
        if self.id % 10 == 3:
            raise ValueError(f"agent {self.id} has a bug")
        return await super().turn(obs, llm)


class Flaky(RatioGame):
    """Every tenth agent's turn raises: recorded as that agent's invalid outcome."""

    name = "flaky"
    Agent = BuggyPlayer
    outcome_table = "flaky_guesses"
    summary_table = "flaky_rounds"


class BoomEnv(RatioEnv):
    def decide(self, state, round, total):
        if round == 2:
            raise ZeroDivisionError("the environment's own bug")
        return super().decide(state, round, total)


class EnvBoom(RatioGame):
    """The environment raises when it decides round 2: the run fails, naming it."""

    name = "env-boom"
    Env = BoomEnv
    outcome_table = "boom_guesses"
    summary_table = "boom_rounds"
