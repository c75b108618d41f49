"""The public-goods game in groups as a Populace simulation.

Groups of k agents (consecutive ids; the last group may be smaller, never dropped). Every
round each agent contributes a whole number of tokens, 0 to the endowment; its group's pot is
multiplied and shared equally. The group env settles each group on the host that holds it:
it fills every member's payoff and tells the members their group's total, which each one
remembers with its own contribution and payoff. One structured call per decision:
`{"contribution": n}` (or `{"reasoning", "contribution"}` with chain of thought)."""

from __future__ import annotations

from collections.abc import Sequence

from populace.sdk import LLM, Agent, Env, GroupEnv, Observation, Outcome, RunConfig, Simulation, State
from populace_public_goods import prompts, rules
from populace_public_goods.params import COT_MAX_TOKENS, MEMORY_ROUNDS, PublicGoodsParams
from populace_public_goods.parsing import parse_contribution
from populace_public_goods.rules import GoodsPartial, GroupNews, RoundSummary


class Contribution(Outcome):
    """Table `public_goods_outcomes`, one row per agent per round (plus the platform's
    group_id, valid, raw …). `contribution` is None when the answer was invalid (`raw` keeps
    the text); the game counts it as 0, and `payoff` is recorded either way."""

    contribution: int | None = None
    payoff: float | None = None  # filled by the group env once the whole group has played
    measure = "contribution"


def counted(outcome: Contribution) -> int | None:
    """The contribution the game counts: only a valid answer's (None: counted as 0)."""
    return outcome.contribution if outcome.valid else None


class Contributor(Agent):
    """Builds its prompt from what it remembers, awaits its answer, parses it; remembers the
    round once its group has settled."""

    __slots__ = ()
    memory_size = MEMORY_ROUNDS  # (round, contribution, payoff, group average) per round

    async def turn(self, obs: Observation, llm: LLM) -> Contribution:
        sim: PublicGoods = self.sim  # type: ignore[assignment]
        persona = self.persona.text if self.persona is not None and sim.use_persona else None
        lead = prompts.intro(self.id, persona, sim.odd_group_size(self.id))
        prompt = prompts.user_prompt(lead, self.memory, sim.window, sim.answer)
        # the lead (persona) is the same every round: the gateway keeps the agent on one
        # replica, whose prefix cache already holds it
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(lead) if persona else 0)
        value = parse_contribution(raw, sim.endowment)
        return Contribution(contribution=value, raw=raw, valid=value is not None)

    def settled(self, outcome: Contribution, news: object) -> None:
        if isinstance(news, GroupNews):  # None when the group env failed: nothing to remember
            self.remember((news.round, counted(outcome), outcome.payoff, news.average))


class Group(GroupEnv):
    """Settles one group's round on its host: payoffs filled in place, news for the members."""

    def __init__(self, sim: PublicGoods) -> None:
        super().__init__(sim)
        self.endowment = sim.endowment
        self.multiplier = sim.multiplier

    def settle(self, round: int, group: int, agent_ids: Sequence[int],
               outcomes: Sequence[Contribution]) -> GroupNews:
        # k is the group's actual size: the members the platform hands over (the last group may be smaller)
        total, payoffs = rules.settle_group([counted(o) for o in outcomes], self.endowment, self.multiplier)
        for outcome, value in zip(outcomes, payoffs):
            outcome.payoff = value
        return GroupNews(round, total, len(outcomes))


class PublicGoodsEnv(Env[State, GoodsPartial]):
    """The root env: integer partials only (see rules), so one host or many give the same round."""

    Partial = GoodsPartial

    def __init__(self, sim: PublicGoods) -> None:
        super().__init__(sim)
        self.endowment = sim.endowment
        self.multiplier = sim.multiplier
        self.group_size = sim.params.game.group_size

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Contribution]) -> GoodsPartial:
        return rules.partial_of(agent_ids, map(counted, outcomes), self.endowment, self.group_size)

    def merge(self, partials: Sequence[GoodsPartial]) -> GoodsPartial:
        return rules.merge(partials)

    def decide(self, state: State, round: int, total: GoodsPartial) -> tuple[State, RoundSummary]:
        return state, rules.decide_round(total, self.endowment, self.multiplier)


class PublicGoods(Simulation):
    name = "public-goods"
    Params = PublicGoodsParams
    Agent = Contributor
    Env = PublicGoodsEnv
    GroupEnv = Group
    Outcome = Contribution
    Summary = RoundSummary
    outcome_table = "public_goods_outcomes"
    summary_table = "public_goods_rounds"
    prompt_version = prompts.PROMPT_VERSION

    def __init__(self, params: PublicGoodsParams, **kw) -> None:
        super().__init__(params, **kw)
        game = params.game
        # read by every agent's turn and every group's settle: kept here once
        self.endowment = game.endowment
        self.multiplier = game.multiplier_fraction
        self.window = game.history_window
        self.answer = params.prompt.answer
        self.use_persona = params.prompt.persona
        k = game.group_size
        self._last_first = (self.agents - 1) // k * k  # the last group's first agent id
        last_size = self.agents - self._last_first
        self._last_size = last_size if last_size != k else None

    def odd_group_size(self, agent_id: int) -> int | None:
        """The size of this agent's group when it is the smaller last group, else None."""
        return self._last_size if agent_id >= self._last_first else None

    def group_size(self) -> int:
        return self.params.game.group_size

    def system_prompt(self) -> str:
        note = self.cast.note("players") if self.cast is not None else ""
        return prompts.system_prompt(self.params.game, self.params.prompt, note)

    def answer_schema(self) -> dict:
        return prompts.answer_schema(self.params.game, self.answer)

    def user_example(self) -> str:
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return prompts.user_prompt(prompts.intro(0, persona, self.odd_group_size(0)), (), self.window,
                                   self.answer)

    @classmethod
    def model_defaults(cls, params: PublicGoodsParams) -> dict:
        return {"max_tokens": COT_MAX_TOKENS} if params.prompt.answer == "cot" else {}

    @classmethod
    def check_run(cls, params: PublicGoodsParams, config: RunConfig) -> None:
        k = params.game.group_size
        if k > config.agents:
            raise ValueError(f"game.group_size: {k} is more than the run's {config.agents} agents "
                             "(a group needs that many players)")
        if params.prompt.population_note and not config.has_personas:
            raise ValueError("prompt.population_note: needs a `population` to describe")

    @classmethod
    def equilibrium(cls, params: PublicGoodsParams) -> float | None:
        game = params.game
        return rules.equilibrium(game.endowment, game.multiplier_fraction, game.group_size)

    @classmethod
    def measure_range(cls, params: PublicGoodsParams) -> tuple[float, float]:
        return 0.0, float(params.game.endowment)
