"""The paper's "guess 2/3 of the average" game as a Populace simulation.

Every agent reports a number in [0, max]; the target is ratio · mean + offset; the closest
guess wins. Agents hear the previous winning numbers (a bounded window) and remember their
own. One structured call per decision: `{"guess": n}` (or `{"reasoning", "guess"}` with
chain of thought)."""

from __future__ import annotations

from functools import cached_property

from populace.sdk import LLM, Agent, Env, Observation, Outcome, RunConfig, Simulation, State
from populace_ratio_game import prompts, rules
from populace_ratio_game.params import COT_MAX_TOKENS, RatioParams
from populace_ratio_game.parsing import parse_guess
from populace_ratio_game.rules import GuessPartial, RoundSummary


class Guess(Outcome):
    """Table `guesses`: `value` is None when the answer was invalid (`raw` keeps the text)."""

    value: float | None = None


class Seen(Observation):
    """What every agent sees: the previous rounds' winning numbers (the window the game shows)."""

    history: list[float] = []

    @cached_property
    def history_text(self) -> str:  # formatted once per round per host, not per agent
        return prompts.history_text(self.history, len(self.history))


class History(State):
    winners: list[float] = []  # every round's winning number, oldest first


class Player(Agent):
    """Builds its prompt, awaits its own answer, parses it, remembers its number."""

    __slots__ = ()

    async def turn(self, obs: Seen, llm: LLM) -> Guess:
        sim: RatioGame = self.sim  # type: ignore[assignment]
        persona = self.persona.text if self.persona is not None and sim.use_persona else None
        prompt = prompts.user_prompt(self.id, obs.history_text, self.memory, persona, sim.answer)
        # the persona leads the prompt and is the same every round: the gateway keeps it on one
        # replica, whose prefix cache already holds it
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(persona) if persona else 0)
        value = parse_guess(raw, sim.max_value)
        self.remember((obs.round, value))
        return Guess(value=value, raw=raw, valid=value is not None)


class RatioEnv(Env[History, GuessPartial]):
    State = History
    Partial = GuessPartial

    def observe(self, state: History, round: int) -> Seen:
        window = self.params.game.history_window
        return Seen(round=round, history=state.winners[-window:] if window else [])

    def reduce(self, agent_ids, outcomes) -> GuessPartial:
        return rules.partial_of((a, o.value if o.valid else None) for a, o in zip(agent_ids, outcomes))

    def reduce_drawn(self, agent_ids, outcomes, counts) -> GuessPartial:
        # a prototype run's drawn answers: one entry per answer with how many drew it
        return rules.partial_of_drawn((a, o.value if o.valid else None, c)
                                      for a, o, c in zip(agent_ids, outcomes, counts))

    def merge(self, partials) -> GuessPartial:
        return rules.merge(partials)

    def decide(self, state: History, round: int, total: GuessPartial) -> tuple[History, RoundSummary]:
        summary = rules.decide_round(total, self.params.game)
        winners = state.winners if summary.winner_value is None else [*state.winners, summary.winner_value]
        return History(winners=winners), summary


class RatioGame(Simulation):
    name = "ratio-game"
    Params = RatioParams
    Agent = Player
    Env = RatioEnv
    Outcome = Guess
    Observation = Seen
    Summary = RoundSummary
    outcome_table = "guesses"
    summary_table = "rounds"
    prompt_version = prompts.PROMPT_VERSION
    reference_columns = ("target",)
    trend_columns = ("winner_value",)
    # humans in the same game: Nagel (1995), first period, p = 1/2, 2/3, 4/3 (n, mean, median)
    references = ("references/nagel-1995.csv",)

    def __init__(self, params: RatioParams, **kw) -> None:
        super().__init__(params, **kw)
        # read by every agent's turn: kept here once, not looked up through params each time
        self.max_value = params.game.max_value
        self.answer = params.prompt.answer
        self.use_persona = params.prompt.persona

    def system_prompt(self) -> str:
        note = self.cast.note("players") if self.cast is not None else ""
        return prompts.system_prompt(self.params.game, self.params.prompt, note)

    def answer_schema(self) -> dict:
        return prompts.answer_schema(self.params.game, self.params.prompt.answer)

    def user_example(self) -> str:
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return prompts.user_prompt(0, "", (), persona, self.answer)

    @classmethod
    def model_defaults(cls, params: RatioParams) -> dict:
        return {"max_tokens": COT_MAX_TOKENS} if params.prompt.answer == "cot" else {}

    @classmethod
    def check_run(cls, params: RatioParams, config: RunConfig) -> None:
        if params.prompt.population_note and not config.has_personas:
            raise ValueError("prompt.population_note: needs a `population` to describe")

    @classmethod
    def equilibrium(cls, params: RatioParams) -> float | None:
        return rules.equilibrium(params.game)

    @classmethod
    def describe(cls, params: RatioParams) -> str:
        return rules.describe(params.game)

    @classmethod
    def measure_range(cls, params: RatioParams) -> tuple[float, float]:
        return 0.0, params.game.max_value
