"""The public-goods game with punishment (Fehr & Gächter 2000), played as a scene: in each group
every member contributes (stage 1, all members at once), then every member, seeing the others'
contributions, assigns punishment points to each of them (stage 2, all at once), both inside one
round. Groups are drawn again every round within blocks of agents (strangers).

A scene's stages are ordered and the acts within a stage simultaneous: the scene awaits the
members' acts of a stage together, so a round waits on two model latencies, not one per act.

Acts (table `punishment_acts`): one row per act, `contribute` (its `contribution`) or `punish`
(`targets` and the `points` given to each). Outcomes (table `punishment_outcomes`): one row per
agent per round: its contribution, its group's total and size, the points it gave (and how many
of them went to members who contributed as much as it or more) and received, and its payoff."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from populace.sdk import LLM, Agent, Env, GroupEnv, Outcome, RunConfig, Simulation, State
from populace.sdk.scene import Scene
from populace_punishment import parsing, prompts, rules
from populace_punishment.params import (
    COT_MAX_TOKENS,
    DIRECT_MAX_TOKENS,
    LABELS,
    MEMORY_ROUNDS,
    TOKENS_PER_POINT_FIELD,
    PunishmentParams,
)
from populace_punishment.rules import Counts, Punish, RoundSummary, Terms


class Move(Outcome):
    """An act: a `contribution` (stage 1), or `points` to each of `targets` (stage 2). None: not
    that act, or an invalid answer."""

    contribution: int | None = None
    targets: list[int] | None = None  # agent ids, in the order of `points` (the letters A, B, … of the prompt)
    points: list[int] | None = None


class Result(Outcome):
    """One agent's round. `valid` and `raw` are its contribution's; `punish_valid` says whether
    its punishment answer counted (None: it had nobody to punish, or the game has no stage 2)."""

    contribution: int | None = None  # None: an invalid answer, counted as 0
    group_total: int = 0  # the group's pot before multiplying
    group_size: int = 0
    points_given: int = 0
    points_antisocial: int = 0  # of points_given, to members who contributed as much as it or more
    points_received: int = 0
    payoff: float | None = None
    punish_valid: bool | None = None
    measure = "contribution"


class Player(Agent):
    """Contributes, then punishes, as its group's scene asks, from its persona and last rounds.
    Its only state is the platform's: id, persona (shared), the run (shared) and a memory of at
    most MEMORY_ROUNDS tuples of six small integers (the payoff follows from them)."""

    __slots__ = ()
    memory_size = MEMORY_ROUNDS  # (round, contribution or None, group total, group size, given, received)

    async def act(self, phase: str, view: Any, llm: LLM) -> Move:
        # what the prompt needs is not kept in locals: they would live through the model's wait
        sim: Punishment = self.sim  # type: ignore[assignment]
        persona = self.persona.text if sim.use_persona and self.persona is not None else None
        if phase == "contribute":
            raw = await llm.ask(sim.texts.contribute(persona, sim.texts.history(self.memory) if sim.show_history and
                                                     self.memory else "", view),
                                key=self.id, schema=sim.contribute_schema, prefix_chars=len(persona) if persona else 0)
            value = parsing.parse_contribution(raw, sim.terms.endowment)
            return Move(contribution=value, raw=raw, valid=value is not None)
        if phase == "punish":
            others = len(view.members) - 1
            raw = await llm.ask(_punish_prompt(sim, persona, self.memory, view), key=self.id,
                                schema=sim.punish_schemas[others], prefix_chars=len(persona) if persona else 0)
            points = parsing.parse_points(raw, sim.labels[others], sim.max_points)
            return Move(targets=view.targets, points=points, raw=raw, valid=points is not None)
        raise ValueError(f"unknown phase {phase!r}")

    def settled(self, outcome: Result, news: object) -> None:
        if isinstance(news, int):  # the round (None: the scene failed, nothing to remember)
            self.remember((news, outcome.contribution, outcome.group_total, outcome.group_size,
                           outcome.points_given, outcome.points_received))

    def context(self) -> str:
        return self.sim.texts.history(self.memory).rstrip("\n")  # type: ignore[attr-defined]


_view = tuple.__new__  # a NamedTuple made without its Python __new__: four per group, a million members


def _punish_prompt(sim: Punishment, persona: str | None, memory: tuple, view: Punish) -> str:
    contributions, seat = view.contributions, view.seat
    history = sim.texts.history(memory) if sim.show_history and memory else ""
    others = tuple(map(contributions.__getitem__, rules.other_seats(len(view.members))[seat]))
    return sim.texts.punish(persona, history, contributions[seat], others)


def contribution_of(move: Move, endowment: int) -> int | None:
    """The contribution as the game reads it: a valid act's whole number from 0 to the
    endowment, else None (an author's Agent subclass could return anything)."""
    if not move.valid:
        return None
    c = move.contribution
    if c.__class__ is int and 0 <= c <= endowment:  # the common case, without a call
        return c
    return parsing.whole(c, endowment)


def points_of(move: Move, targets: Sequence[int], max_points: int) -> list[int] | None:
    """The points as the game reads them: a valid act for exactly these targets, a whole number
    from 0 to max_points for each, else None (it punished nobody)."""
    if not move.valid or move.targets != list(targets) or not isinstance(move.points, list) \
            or len(move.points) != len(targets):
        return None
    points = move.points
    if all(p.__class__ is int and 0 <= p <= max_points for p in points):  # the common case
        return list(points)
    checked = [parsing.whole(p, max_points) for p in points]
    return None if None in checked else checked  # type: ignore[return-value]


class Group(GroupEnv):
    """One group's round: every member contributes, then every member punishes, then payoffs."""

    async def scene(self, scene: Scene) -> int:
        # loops, not comprehensions: a comprehension's closure costs objects per group, and a round
        # plays a group for every 4 agents
        sim: Punishment = self.sim  # type: ignore[assignment]
        members = scene.members
        k = len(members)
        endowment = sim.terms.endowment
        moves = await scene.all("contribute", (k,) * k)  # every member at once, seeing its group's size
        given: list[int | None] = []
        for move in moves:
            given.append(contribution_of(move, endowment))
        contributions = tuple(given)
        points: list[list[int] | None] = [None] * k
        asked = sim.punishing and k > 1
        if asked:
            ids = tuple([m.agent.id for m in members])
            views = []
            for i in range(k):
                views.append(_view(Punish, (i, ids, contributions)))  # Punish(i, ids, contributions)
            acts = await scene.all("punish", views)
            seats = rules.other_seats(k)
            for i in range(k):
                points[i] = points_of(acts[i], list(map(ids.__getitem__, seats[i])), sim.max_points)
        s = rules.settle_group(sim.terms, contributions, points)
        for i in range(k):
            c = contributions[i]
            scene.outcome(members[i], Result(contribution=c, group_total=s.total, group_size=k,
                                             points_given=s.given[i], points_antisocial=s.antisocial[i],
                                             points_received=s.received[i], payoff=s.payoffs[i],
                                             punish_valid=points[i] is not None if asked else None,
                                             raw=moves[i].raw, valid=c is not None))
        return scene.round  # what the members hear: the round, for their memory


class PunishmentEnv(Env[State, Counts]):
    """The root env: integer partials only (see rules), so one host or many give the same round."""

    Partial = Counts

    def __init__(self, sim: Punishment) -> None:
        super().__init__(sim)
        self.terms = sim.terms

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Result]) -> Counts:
        n = n_valid = total = free = answers = punishers = points = antisocial = 0
        for o in outcomes:
            n += 1
            if o.valid and o.contribution is not None:
                n_valid += 1
                total += o.contribution
                free += o.contribution == 0
            if o.punish_valid:
                answers += 1
                punishers += o.points_given > 0
            points += o.points_given
            antisocial += o.points_antisocial
        return Counts.model_construct(n=n, n_valid=n_valid, total=total, free_riders=free, punish_answers=answers,
                                      punishers=punishers, points=points, antisocial=antisocial)

    def merge(self, partials: Sequence[Counts]) -> Counts:
        return rules.merge(partials)

    def decide(self, state: State, round: int, total: Counts) -> tuple[State, RoundSummary]:
        return state, rules.summary(total, self.terms)


class Punishment(Simulation):
    name = "punishment"
    Params = PunishmentParams
    Agent = Player
    Env = PunishmentEnv
    GroupEnv = Group
    Act = Move
    Outcome = Result
    Summary = RoundSummary
    prompt_version = prompts.PROMPT_VERSION
    reference_columns = ("mean_contribution",)  # on the contributions' scale: drawn on their histogram
    trend_columns = ("share_punishing", "free_riders", "antisocial_share")

    def __init__(self, params: PunishmentParams, **kw) -> None:
        super().__init__(params, **kw)
        game = params.game
        # read by every act: kept here once, shared by every agent of the run on a process
        self.terms = Terms(game.endowment, game.multiplier_fraction, game.cost, game.fine)
        self.max_points = game.max_points
        self.punishing = game.max_points > 0
        self.show_history = game.show_history
        self.cot = params.prompt.answer == "cot"
        self.use_persona = params.prompt.persona
        self.texts = prompts.Texts(self.terms, game.group_size, game.max_points, self.cot)
        # the same schema objects call after call (ports compile each once): by number of others
        self.contribute_schema = prompts.contribute_schema(game.endowment, self.cot)
        self.punish_schemas = tuple(prompts.punish_schema(n, game.max_points, self.cot)
                                    for n in range(game.group_size))
        self.labels = tuple(LABELS[:n] for n in range(game.group_size))  # an answer's fields, by number of others

    def group_size(self) -> int:
        return self.params.game.group_size

    def group_block(self) -> int:
        return self.params.game.block

    def system_prompt(self) -> str:
        return prompts.system_prompt(self.params.game)

    def answer_schema(self) -> dict:
        return self.contribute_schema

    def user_example(self) -> str:
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return self.texts.contribute(persona, "", self.params.game.group_size)

    @classmethod
    def model_defaults(cls, params: PunishmentParams) -> dict:
        # a punishment answer has a field per other member: room for them all
        points = 8 + TOKENS_PER_POINT_FIELD * (params.game.group_size - 1)
        if params.prompt.answer == "cot":
            return {"max_tokens": COT_MAX_TOKENS + points}
        return {"max_tokens": points} if points > DIRECT_MAX_TOKENS else {}

    @classmethod
    def check_run(cls, params: PunishmentParams, config: RunConfig) -> None:
        k = params.game.group_size
        if k > config.agents:
            raise ValueError(f"game.group_size: {k} is more than the run's {config.agents} agents "
                             "(a group needs that many players)")

    @classmethod
    def equilibrium(cls, params: PunishmentParams) -> float | None:
        game = params.game
        return rules.equilibrium(game.endowment, game.multiplier_fraction, game.group_size)

    @classmethod
    def measure_range(cls, params: PunishmentParams) -> tuple[float, float]:
        return 0.0, float(params.game.endowment)

    @classmethod
    def describe(cls, params: PunishmentParams) -> str:
        g = params.game
        game = (f"public-goods game with punishment (up to {g.max_points} points to each other member, a point "
                f"costing {g.cost} to its giver and {g.fine} to its receiver)" if g.max_points
                else "public-goods game without punishment")
        return (f"{game}: groups of {g.group_size} drawn again within blocks of {g.block}, endowment {g.endowment}, "
                f"multiplier {prompts.num(g.multiplier)}")
