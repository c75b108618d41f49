"""The ultimatum game in pairs, played as a scene: in each pair the proposer offers, then the
responder — seeing the offer — accepts or rejects, both inside one round. Pairs are drawn again
every round within blocks of agents (strangers), and the first of a pair proposes.

Acts (table `ultimatum_acts`): one row per act, `offer` for the proposer's, `accept` for the
responder's. Outcomes (table `ultimatum_outcomes`): one row per agent per round with its role,
partner, the pair's offer and reply, and its payoff."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from populace.sdk import LLM, Agent, Env, GroupEnv, Outcome, RunConfig, Simulation, State
from populace.sdk.scene import Scene
from populace_ultimatum import prompts, rules
from populace_ultimatum.params import COT_MAX_TOKENS, MEMORY_ROUNDS, UltimatumParams
from populace_ultimatum.rules import Counts, RoundSummary


class Move(Outcome):
    """An act: the proposer's `offer` or the responder's `accept` (None: not that act, or invalid)."""

    offer: int | None = None
    accept: bool | None = None


class Result(Outcome):
    """One agent's round. `offer` and `accepted` are the pair's (None: no valid offer or reply)."""

    role: Literal["proposer", "responder", "unmatched"] = "unmatched"
    partner: int | None = None
    offer: int | None = None
    accepted: bool | None = None
    payoff: int = 0
    measure = "offer"


class Trader(Agent):
    """Acts as its pair's scene asks (offer or respond), from its persona and last rounds."""

    __slots__ = ()
    memory_size = MEMORY_ROUNDS  # (round, role, offer, accepted, payoff)

    async def act(self, phase: str, view: dict, llm: LLM) -> Move:
        sim: Ultimatum = self.sim  # type: ignore[assignment]
        persona = self.persona.text if sim.use_persona and self.persona is not None else None
        history = prompts.history_text(self.memory) if sim.show_history else ""
        if phase == "offer":
            raw = await llm.ask(prompts.offer_prompt(persona, history, sim.pie, sim.cot), key=self.id,
                                schema=sim.offer_schema, prefix_chars=len(persona) if persona else 0)
            offer = rules.coins(rules.parse(raw, "offer", int), sim.pie)
            return Move(offer=offer, raw=raw, valid=offer is not None)
        if phase == "respond":
            raw = await llm.ask(prompts.respond_prompt(persona, history, sim.pie, view["offer"], sim.cot),
                                key=self.id, schema=sim.respond_schema, prefix_chars=len(persona) if persona else 0)
            accept = rules.parse(raw, "accept", bool)
            return Move(accept=accept, raw=raw, valid=accept is not None)
        raise ValueError(f"unknown phase {phase!r}")

    def settled(self, outcome: Result, news: object) -> None:
        if isinstance(news, int) and outcome.role != "unmatched":  # the round (None: the scene failed)
            self.remember((news, outcome.role, outcome.offer, outcome.accepted, outcome.payoff))


class Pair(GroupEnv):
    """One pair's round: the offer, then the reply, then the payoffs."""

    async def scene(self, scene: Scene) -> int:
        sim: Ultimatum = self.sim  # type: ignore[assignment]
        if len(scene.members) < 2:  # the odd one out of a block: no partner this round
            scene.outcome(scene.members[0], Result(role="unmatched"))
            return scene.round
        proposer, responder = scene.members
        move = await proposer.act("offer", {"pie": sim.pie})
        offer = offer_of(move, sim.pie)
        accepted, answer = None, ""
        if offer is not None:
            reply = await responder.act("respond", {"pie": sim.pie, "offer": offer})
            accepted, answer = reply_of(reply), reply.raw
        mine, theirs = rules.payoffs(sim.pie, offer, accepted)
        scene.outcome(proposer, Result(role="proposer", partner=responder.id, offer=offer, accepted=accepted,
                                       payoff=mine, raw=move.raw, valid=offer is not None))
        scene.outcome(responder, Result(role="responder", partner=proposer.id, offer=offer, accepted=accepted,
                                        payoff=theirs, raw=answer, valid=offer is None or accepted is not None))
        return scene.round  # what the members hear: the round, for their memory


def offer_of(move: Move, pie: int) -> int | None:
    """The offer as the game reads it: a valid act's whole number of coins within the pie, else
    None (an author's Agent subclass could return anything)."""
    return rules.coins(move.offer, pie) if move.valid else None


def reply_of(move: Move) -> bool | None:
    """The reply as the game reads it: a valid act's true or false, else None (no valid reply)."""
    return move.accept if move.valid and isinstance(move.accept, bool) else None


class UltimatumEnv(Env[State, Counts]):
    Partial = Counts

    def __init__(self, sim: Ultimatum) -> None:
        super().__init__(sim)
        self.pie = sim.pie

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Result]) -> Counts:
        c = dict.fromkeys(Counts.model_fields, 0)
        for o in outcomes:
            if o.role != "proposer":
                continue  # a pair counts once, by its proposer's row (which carries the pair's offer and reply)
            c["pairs"] += 1
            if o.offer is not None:
                c["offers"] += 1
                c["offered"] += o.offer
                if o.accepted is not None:
                    c["replies"] += 1
                    if o.accepted:
                        c["accepted"] += 1
                        c["accepted_offered"] += o.offer
        return Counts(**c)

    def merge(self, partials: Sequence[Counts]) -> Counts:
        return rules.merge(partials)

    def decide(self, state: State, round: int, total: Counts) -> tuple[State, RoundSummary]:
        return state, rules.summary(total, self.pie)


class Ultimatum(Simulation):
    name = "ultimatum"
    Params = UltimatumParams
    Agent = Trader
    Env = UltimatumEnv
    GroupEnv = Pair
    Act = Move
    Outcome = Result
    Summary = RoundSummary
    prompt_version = prompts.PROMPT_VERSION
    reference_columns = ("mean_offer",)  # on the offers' scale: drawn on their histogram
    trend_columns = ("offer_share", "acceptance_rate")

    def __init__(self, params: UltimatumParams, **kw) -> None:
        super().__init__(params, **kw)
        game = params.game
        self.pie = game.pie
        self.show_history = game.show_history
        self.cot = params.prompt.answer == "cot"
        self.use_persona = params.prompt.persona
        self.offer_schema = prompts.offer_schema(self.pie, self.cot)
        self.respond_schema = prompts.respond_schema(self.cot)

    def group_size(self) -> int:
        return 2

    def group_block(self) -> int:
        return self.params.game.block

    def system_prompt(self) -> str:
        return prompts.system_prompt(self.pie)

    def answer_schema(self) -> dict:
        return self.offer_schema

    def user_example(self) -> str:
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return prompts.offer_prompt(persona, "", self.pie, self.cot)

    @classmethod
    def model_defaults(cls, params: UltimatumParams) -> dict:
        return {"max_tokens": COT_MAX_TOKENS} if params.prompt.answer == "cot" else {}

    @classmethod
    def check_run(cls, params: UltimatumParams, config: RunConfig) -> None:
        if config.agents < 2:
            raise ValueError("agents: the ultimatum game needs at least 2 agents (a pair)")

    @classmethod
    def measure_range(cls, params: UltimatumParams) -> tuple[float, float]:
        return 0.0, float(params.game.pie)

    @classmethod
    def describe(cls, params: UltimatumParams) -> str:
        return f"ultimatum game over {params.game.pie} coins, pairs drawn again within blocks of {params.game.block}"
