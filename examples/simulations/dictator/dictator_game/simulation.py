"""The dictator game as a Populace simulation: the class that ties the parts together.

Every round each agent is given `game.endowment` coins and decides how many to give to an
anonymous stranger, in one structured call. From round 2 on it may hear last round's
average gift, and it remembers its own last gifts. A self-interested dictator gives nothing;
people typically give a fifth to a third, and many split equally.

The class declares; an instance is one run (its validated params, agent count, seed and
population), shared by reference by every agent of the run on a process (`agent.sim`).
"""

from __future__ import annotations

from typing import Any

from dictator_game.agent import PROMPT_VERSION, Dictator, Gift, Heard, answer_schema, system_prompt, user_prompt
from dictator_game.env import DictatorEnv, RoundSummary
from dictator_game.params import DictatorParams
from populace.sdk import Simulation

REASONING_MAX_TOKENS = 256  # room to think when the scenario sets no model.max_tokens


class DictatorGame(Simulation):
    name = "dictator"  # = the entry point's name in pyproject.toml; tables: dictator_outcomes, dictator_rounds
    Params = DictatorParams
    Agent = Dictator
    Env = DictatorEnv
    Outcome = Gift
    Observation = Heard
    Summary = RoundSummary
    # GroupEnv = ...  (none here: see the public-goods simulation for groups settled on their host)
    prompt_version = PROMPT_VERSION

    def __init__(self, params: DictatorParams, **kw: Any) -> None:
        super().__init__(params, **kw)
        # read by every agent's turn: kept here once rather than looked up through params each time
        self.endowment = params.game.endowment
        self.use_persona = params.prompt.persona

    def system_prompt(self) -> str:
        return system_prompt(self.endowment, self.params.prompt.reasoning)

    def answer_schema(self) -> dict:
        return answer_schema(self.endowment, self.params.prompt.reasoning)

    def user_example(self) -> str:
        """Agent 0's prompt in round 1, recorded in the run's manifest."""
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return user_prompt(0, persona, None, ())

    @classmethod
    def model_defaults(cls, params: DictatorParams) -> dict:
        return {"max_tokens": REASONING_MAX_TOKENS} if params.prompt.reasoning else {}

    @classmethod
    def equilibrium(cls, params: DictatorParams) -> float:
        return 0.0  # the selfish prediction, drawn as a line in reports

    @classmethod
    def measure_range(cls, params: DictatorParams) -> tuple[float, float]:
        return 0.0, float(params.game.endowment)
