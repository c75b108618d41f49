"""The dictator game as a Populace simulation: the class that ties the parts together.

Every round each agent is given `game.endowment` coins and decides how many to give to an
anonymous stranger, in one structured call. From round 2 on it may hear last round's
average gift, and it remembers its own last gifts. A self-interested dictator gives nothing;
people typically give a fifth to a third, and many split equally.

The class declares its name, params, agent and environment; the rest is read from them
(what a turn returns is the outcome, what it is shown the observation, what `decide` returns
the round's summary). An instance is one run (its validated params, agent count, seed and
population), shared by reference by every agent of the run on a process (`agent.sim`).
"""

from __future__ import annotations

from typing import Any

from dictator_game.agent import PROMPT_VERSION, Dictator, answer_schema, system_prompt, user_prompt
from dictator_game.env import DictatorEnv
from dictator_game.params import DictatorParams
from populace.sdk import Simulation


class DictatorGame(Simulation):
    name = "dictator"  # = the entry point's name in pyproject.toml; tables: dictator_outcomes, dictator_rounds
    Params = DictatorParams
    Agent = Dictator
    Env = DictatorEnv
    prompt_version = PROMPT_VERSION

    def __init__(self, params: DictatorParams, **kw: Any) -> None:
        super().__init__(params, **kw)
        # read by every agent's turn: kept here once rather than looked up through params each time
        self.endowment = params.game.endowment
        self.use_persona = params.prompt.persona

    def system_prompt(self) -> str:
        return system_prompt(self.endowment)

    def answer_schema(self) -> dict:
        return answer_schema(self.endowment)

    def user_example(self) -> str:
        """Agent 0's prompt in round 1, recorded in the run's manifest."""
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return user_prompt(0, persona, None, ())

    @classmethod
    def equilibrium(cls, params: DictatorParams) -> float:
        return 0.0  # the selfish prediction, drawn as a line in reports

    @classmethod
    def measure_range(cls, params: DictatorParams) -> tuple[float, float]:
        return 0.0, float(params.game.endowment)
