"""A vote (a referendum, a product choice, a poll): every agent answers one question with one
of several options, speaking from its persona when the run has a population; optionally over
rounds in which it hears last round's distribution. One structured call per decision:
`{"choice": <option>}` (or `{"reasoning", "choice"}` with chain of thought), the choice
constrained to the options by the schema's `enum`."""

from __future__ import annotations

from functools import cached_property

from populace.sdk import LLM, Agent, Env, Observation, Outcome, RunConfig, Simulation, State, select
from populace_vote import prompts, tally
from populace_vote.params import COT_MAX_TOKENS, DEFAULT_MAX_TOKENS, VoteParams, extra_answer_tokens
from populace_vote.parsing import lookup_of, parse_choice
from populace_vote.tally import VoteCounts, VoteSummary


class Choice(Outcome):
    """Table `votes`: `choice` is the option as the scenario wrote it, or None when the answer
    was not one of the options (then `valid` is false and `raw` keeps the model's text)."""

    measure = "choice"
    choice: str | None = None


class Heard(Observation):
    """What every agent sees: last round's valid answers per option, in ballot order (empty in
    round 1, and always when the ballot does not show the distribution)."""

    distribution: dict[str, int] = {}

    @cached_property
    def distribution_text(self) -> str:  # formatted once per round per host, not per agent
        return prompts.distribution_text(self.distribution)


class LastRound(State):
    counts: dict[str, int] = {}  # last round's valid answers per option (small: one int per option)


class Voter(Agent):
    """Builds its prompt, awaits its own answer, parses it, remembers its choice."""

    __slots__ = ()

    async def turn(self, obs: Heard, llm: LLM) -> Choice:
        sim: Vote = self.sim  # type: ignore[assignment]
        persona = self.persona.text if sim.use_persona and self.persona is not None else None
        prompt = prompts.user_prompt(persona, obs.distribution_text, prompts.own_answers_text(self.memory),
                                     sim.answer)
        # the persona leads the prompt and is the same every round: the gateway keeps the agent on
        # one replica, whose prefix cache already holds it
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(persona) if persona else 0)
        choice = parse_choice(raw, sim.lookup)
        self.remember((obs.round, choice))
        return Choice(choice=choice, raw=raw, valid=choice is not None)


class VoteEnv(Env[LastRound, VoteCounts]):
    State = LastRound
    Partial = VoteCounts

    def __init__(self, sim: Vote) -> None:
        super().__init__(sim)
        self.options = sim.params.ballot.options
        self.index = {o: i for i, o in enumerate(self.options)}  # reduce: one dict lookup per vote

    def observe(self, state: LastRound, round: int) -> Heard:
        if not self.params.ballot.show_distribution:
            return Heard(round=round)
        return Heard(round=round, distribution=state.counts)

    def select(self, state: LastRound, round: int):
        turnout = self.params.ballot.turnout
        return select.rate(turnout) if turnout < 1 else None  # None: everyone votes

    def reduce(self, agent_ids, outcomes) -> VoteCounts:
        return tally.count((o.choice if o.valid else None for o in outcomes), self.index)

    def merge(self, partials) -> VoteCounts:
        return tally.merge(partials, len(self.options))

    def decide(self, state: LastRound, round: int, total: VoteCounts) -> tuple[LastRound, VoteSummary]:
        summary = tally.summarize(self.options, total)
        return LastRound(counts=summary.counts), summary


class Vote(Simulation):
    name = "vote"
    Params = VoteParams
    Agent = Voter
    Env = VoteEnv
    Outcome = Choice
    Observation = Heard
    Summary = VoteSummary
    outcome_table = "votes"
    summary_table = "vote_rounds"
    prompt_version = prompts.PROMPT_VERSION

    def __init__(self, params: VoteParams, **kw) -> None:
        super().__init__(params, **kw)
        # read by every agent's turn: kept here once, not looked up through params each time
        self.lookup = lookup_of(params.ballot.options)
        self.answer = params.prompt.answer
        self.use_persona = params.prompt.persona and self.cast is not None

    @cached_property
    def _system(self) -> str:  # the population note reads every profile: once per run, not per round
        note = self.cast.note("participants") if self.cast is not None else ""
        return prompts.system_prompt(self.params.ballot, self.params.prompt, note, persona=self.use_persona,
                                     rounds=self.rounds)

    def system_prompt(self) -> str:
        return self._system

    def answer_schema(self) -> dict:
        return prompts.answer_schema(self.params.ballot.options, self.answer)

    def user_example(self) -> str:
        persona = self.cast.personas[0].text if self.use_persona and len(self.cast) else None
        return prompts.user_prompt(persona, "", "", self.answer)

    @classmethod
    def measure_options(cls, params: VoteParams) -> tuple[str, ...]:
        return params.ballot.options  # results and reports list them in the ballot's order

    @classmethod
    def model_defaults(cls, params: VoteParams) -> dict:
        extra = extra_answer_tokens(params.ballot.options)  # long options need room in the JSON
        if params.prompt.answer == "cot":
            return {"max_tokens": COT_MAX_TOKENS + extra}
        return {"max_tokens": DEFAULT_MAX_TOKENS + extra} if extra else {}

    @classmethod
    def check_run(cls, params: VoteParams, config: RunConfig) -> None:
        if params.prompt.population_note and not config.has_personas:
            raise ValueError("prompt.population_note: needs a `population` to describe")
