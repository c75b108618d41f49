"""Opinion dynamics on a social graph: every agent holds a stance on one statement, a number
from -1 (strongly disagree) to 1 (strongly agree), and says it in a one-sentence post. In a
run with a `graph:`, each round it reads its in-neighbours' posts of the round before (and
any broadcast the scenario sends), then gives its stance and post again. One structured call
per decision: `{"stance": s, "post": "…"}` (or `{"reasoning", "stance", "post"}` with chain
of thought). Without a graph the agents hear nothing and only restate their own stance."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

from populace.sdk import LLM, Agent, Env, Observation, Outcome, Post, RunConfig, Simulation, State
from populace.sdk.post import post_fields
from populace_opinion import hearing, measures, prompts
from populace_opinion.hearing import NOTHING_HEARD, Listened
from populace_opinion.measures import OpinionSummary, StanceSums
from populace_opinion.params import COT_MAX_TOKENS, DIRECT_MAX_TOKENS, OpinionParams
from populace_opinion.parsing import parse_answer
from populace_opinion.scale import to_micro


class Say(Post):
    """An agent's post: its sentence (`text`) and the stance it took. None: a broadcast that
    carries no stance."""

    stance: float | None = None

    def __post_init__(self) -> None:
        # Derived once per post on a host, then read by each of its ~degree hearers there (the
        # mailbox hands every hearer the same object): the stance in micro-units (None: none,
        # or off the scale) and how the post reads in a prompt. Attributes, not fields: a
        # post's fields are what travels.
        self.micro = to_micro(self.stance)
        self.line = prompts.post_line(self.text, self.stance if self.micro is not None else None)


class Stance(Outcome):
    """Table `opinion_outcomes`. `stance` is None when the answer was invalid (then `raw` keeps
    the model's text and the agent posts nothing); `heard` counts every message in the agent's
    inbox (broadcasts included) and `heard_mean` is the mean stance of its in-neighbours' posts
    (broadcasts excluded; None when it heard none). Both are None after a failed turn."""

    measure = "stance"
    stance: float | None = None
    heard: int | None = None
    heard_mean: float | None = None
    # Not a column: the sums over what the agent heard, which `reduce` (on the same host) folds
    # into the round's assortativity. A failed turn's outcome keeps this default.
    listened: ClassVar[Listened] = NOTHING_HEARD


class Discussant(Agent):
    """Reads what it heard, asks once, parses the answer, posts it and remembers its stance."""

    __slots__ = ()
    memory_size = 1  # (round, stance) of its last valid answer: the stance its next prompt recalls

    async def turn(self, obs: Observation, llm: LLM) -> Stance:
        sim: Opinion = self.sim  # type: ignore[assignment]
        messages = obs.inbox(self.id)
        listened = hearing.listen(messages)
        reading = hearing.read(messages, sim.max_posts, sim.seed, obs.round, self.id)
        persona = self.persona.text if sim.use_persona and self.persona is not None else None
        prompt = prompts.user_prompt(persona, prompts.own_stance_text(self.memory), prompts.heard_text(reading),
                                     sim.answer)
        # the persona leads the prompt and is the same every round: the gateway keeps the agent on
        # one replica, whose prefix cache already holds it
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(persona) if persona else 0)
        answer = parse_answer(raw)
        if answer is None:
            out = Stance(stance=None, heard=len(messages), heard_mean=listened.mean, raw=raw, valid=False)
        else:
            self.remember((obs.round, answer.stance))
            out = Stance(stance=answer.stance, heard=len(messages), heard_mean=listened.mean, raw=raw,
                         post=Say(text=answer.post, stance=answer.stance))
        out.listened = listened  # type: ignore[misc]
        return out


class OpinionEnv(Env[State, StanceSums]):
    Partial = StanceSums

    def __init__(self, sim: Opinion) -> None:
        super().__init__(sim)
        self.extreme = to_micro(sim.params.extreme)

    def reduce(self, agent_ids, outcomes) -> StanceSums:
        return measures.fold(((to_micro(o.stance), o.listened) for o in outcomes if o.valid), self.extreme)

    def merge(self, partials) -> StanceSums:
        return measures.merge(partials)

    def decide(self, state: State, round: int, total: StanceSums) -> tuple[State, OpinionSummary]:
        return state, measures.summarize(total)


class Opinion(Simulation):
    name = "opinion"
    Params = OpinionParams
    Agent = Discussant
    Env = OpinionEnv
    Outcome = Stance
    Summary = OpinionSummary
    Post = Say
    prompt_version = prompts.PROMPT_VERSION
    # drawn over rounds beside the mean and median stance the report computes itself
    trend_columns = ("var_stance", "extreme_share", "polarization", "assortativity")

    def __init__(self, params: OpinionParams, **kw) -> None:
        super().__init__(params, **kw)
        # read by every agent's turn: kept here once, not looked up through params each time
        self.answer = params.prompt.answer
        self.max_posts = params.prompt.max_posts
        self.use_persona = params.prompt.persona and self.cast is not None

    @cached_property
    def _system(self) -> str:
        return prompts.system_prompt(self.params.statement, self.answer, persona=self.use_persona,
                                     rounds=self.rounds)

    def system_prompt(self) -> str:
        return self._system

    def answer_schema(self) -> dict:
        return prompts.answer_schema(self.answer)

    def user_example(self) -> str:
        persona = self.cast.personas[0].text if self.use_persona and len(self.cast) else None
        return prompts.user_prompt(persona, "", "", self.answer)

    @classmethod
    def model_defaults(cls, params: OpinionParams) -> dict:
        return {"max_tokens": COT_MAX_TOKENS if params.prompt.answer == "cot" else DIRECT_MAX_TOKENS}

    @classmethod
    def check_run(cls, params: OpinionParams, config: RunConfig) -> None:
        # a broadcast is read as a Say: a field it does not have would be dropped without a word
        names = post_fields(Say)
        for i, b in enumerate(config.broadcasts):
            for key, value in b.fields.items():
                where = f"broadcasts.{i}.fields.{key}"
                if key not in names:
                    raise ValueError(f"{where}: not a field of this simulation's post (its fields: "
                                     f"{', '.join(names)})")
                if key == "stance" and value is not None and to_micro(value) is None:
                    raise ValueError(f"{where}: must be a number from -1 to 1 (got {value!r})")

    @classmethod
    def describe(cls, params: OpinionParams) -> str:
        return (f"Stance on {prompts.quoted(params.statement)} from -1 (strongly disagree) to 1 (strongly "
                f"agree); |stance| ≥ {params.extreme:g} counts as extreme.")

    @classmethod
    def measure_range(cls, params: OpinionParams) -> tuple[float, float]:
        return -1.0, 1.0
