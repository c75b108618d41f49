"""The package a stranger wrote from the guide alone (issue 25): each agent chooses to go or to
stay, scores a point for going and a bonus for choosing as it did last round, and declares its
extra attribute the way the guide's one line reads: `state_fields = ("score",)`. Its outcome
depends on the agent's memory, so a resume that lost the memory changes the rows.

`Forgetful` is the same agent with an attribute it changes every turn and does not declare:
a resume would lose it, so local runs and `check_resume` refuse it, naming `streak`.

Given to the services by import path (`stranger_sims:Walk`) with this folder on their
PYTHONPATH."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from populace.sdk import LLM, Agent, Env, Observation, Outcome, Partial, Simulation, State, Summary, answer_field

MOVES = ("go", "stay")


class Step(Outcome):
    measure = "move"
    move: Literal["go", "stay"] | None = None
    score: int | None = None  # the agent's running score after this round


class Seen(Observation):
    last_go_pct: float | None = None


class Steps(Partial):
    go: int = 0
    stay: int = 0


class Last(State):
    go_pct: float | None = None


class WalkSummary(Summary):
    go_pct: float | None = Field(None, title="go %")


class Walker(Agent):
    __slots__ = ("score",)
    state_fields = ("score",)  # as the guide's line reads: "list your extra attribute"

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.score = 0

    def prompt(self, obs: Seen) -> str:
        history = ", ".join(f"round {r}: {m}" for r, m in self.memory) or "none"
        return f"Your score is {self.score}. Your moves so far: {history}. Last round {obs.last_go_pct}% went."

    async def turn(self, obs: Seen, llm: LLM) -> Step:
        raw = await llm.ask(self.prompt(obs), key=self.id)
        move = answer_field(raw, "move")
        if move not in MOVES:
            self.remember((obs.round, None))
            return Step(raw=raw, valid=False)
        # a bonus for keeping to last round's move: a resumed agent without its memory loses it
        self.score += (move == "go") + (bool(self.memory) and self.memory[-1][1] == move)
        self.remember((obs.round, move))
        return Step(move=move, score=self.score, raw=raw)


class WalkEnv(Env[Last, Steps]):
    State = Last
    Partial = Steps

    def observe(self, state: Last, round: int) -> Seen:
        return Seen(round=round, last_go_pct=state.go_pct)

    def reduce(self, agent_ids, outcomes) -> Steps:
        go = sum(1 for o in outcomes if o.valid and o.move == "go")
        stay = sum(1 for o in outcomes if o.valid and o.move == "stay")
        return Steps(go=go, stay=stay)

    def merge(self, partials) -> Steps:
        return Steps(go=sum(p.go for p in partials), stay=sum(p.stay for p in partials))

    def decide(self, state: Last, round: int, total: Steps) -> tuple[Last, WalkSummary]:
        n = total.go + total.stay
        pct = 100 * total.go / n if n else None
        return Last(go_pct=pct), WalkSummary(go_pct=pct)


class Walk(Simulation):
    name = "walk"
    Agent = Walker
    Env = WalkEnv
    Outcome = Step
    Observation = Seen
    Summary = WalkSummary

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"move": {"type": "string", "enum": list(MOVES)}},
                "required": ["move"]}


class ForgetfulWalker(Walker):
    __slots__ = ("streak",)  # changed by every turn, declared nowhere: a resume would lose it

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.streak = 0

    async def turn(self, obs: Seen, llm: LLM) -> Step:
        out = await super().turn(obs, llm)
        self.streak = self.streak + 1 if out.move == "go" else 0
        return out


class Forgetful(Walk):
    name = "forgetful-walk"
    Agent = ForgetfulWalker
    outcome_table = "forgetful_walk_outcomes"
    summary_table = "forgetful_walk_rounds"


class RollingWalker(Walker):
    """Saves a random.Random (unannotated, so the class check cannot see it): no checkpoint can
    rebuild one, so the fleet's first checkpoint pauses the run naming the field and agent."""

    __slots__ = ("rng",)
    state_fields = ("score", "rng")

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        import random

        self.rng = random.Random(agent_id)


class Rolling(Walk):
    name = "rolling-walk"
    Agent = RollingWalker
    outcome_table = "rolling_walk_outcomes"
    summary_table = "rolling_walk_rounds"
