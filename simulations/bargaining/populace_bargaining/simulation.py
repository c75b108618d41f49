"""Bargaining by conversation, played as a scene: in each pair the two agents take turns
sending messages — something said, a proposed split, and whether they accept the other's
proposal on the table — for at most `game.turns` messages, all inside one round. The deal is
read from the transcript: the first accept of the other's latest valid proposal ends the
conversation with that split; no deal by the last message leaves both with nothing. Pairs are
drawn again every round within blocks of agents (strangers); the first of a pair speaks first.

Acts (table `bargaining_acts`): one row per message (`say`, `propose`, `accept`). Transcripts
(table `transcripts`): one line per message (its text, with `propose` and `accept` as fields),
then the scene's own closing line (speaker -1) with the result. Outcomes (table
`bargaining_outcomes`): one row per agent per round with its role, partner, whether the pair
made a deal, the coins it got and the messages used."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from populace.sdk import LLM, Agent, Env, GroupEnv, Outcome, RunConfig, Simulation, State
from populace.sdk.scene import Member, Scene
from populace_bargaining import parsing, prompts, rules
from populace_bargaining.params import (
    ANSWER_TOKENS,
    CHARS_PER_TOKEN,
    COT_MAX_TOKENS,
    MEMORY_ROUNDS,
    BargainingParams,
)
from populace_bargaining.rules import Counts, Line, RoundSummary, View


class Speech(Outcome):
    """An act: one message. All None when the answer was not a valid message."""

    say: str | None = None
    propose: int | None = None  # coins the speaker would give the other
    accept: bool | None = None  # accepts the other's proposal on the table


class Result(Outcome):
    """One agent's round. `valid`: every message it sent was a valid answer."""

    role: Literal["first", "second", "unmatched"] = "unmatched"
    partner: int | None = None
    deal: bool | None = None  # None: unmatched (no conversation)
    share: int = 0  # coins it got
    turns: int = 0  # messages the pair sent (the accepting one included)
    measure = "share"


class Negotiator(Agent):
    """Sends the message its pair's scene asks for, from its persona, its last rounds and the
    conversation so far."""

    __slots__ = ()
    memory_size = MEMORY_ROUNDS  # (round, role, deal, coins got, messages used)

    async def act(self, phase: str, view: View, llm: LLM) -> Speech:
        if phase != "message":
            raise ValueError(f"unknown phase {phase!r}")
        sim: Bargaining = self.sim  # type: ignore[assignment]
        persona = self.persona.text if sim.use_persona and self.persona is not None else None
        history = prompts.history_text(self.memory, sim.pie) if sim.show_history else ""
        prompt = prompts.message_prompt(persona, history, view.lines, self.id, view.turn, sim.turns, sim.pie,
                                        sim.cot)
        raw = await llm.ask(prompt, key=self.id, schema=sim.schema, prefix_chars=len(persona) if persona else 0)
        parsed = parsing.parse_message(raw, sim.pie, sim.say_chars)
        if parsed is None:
            return Speech(raw=raw, valid=False)
        return Speech(say=parsed.say, propose=parsed.propose, accept=parsed.accept, raw=raw)

    def settled(self, outcome: Result, news: object) -> None:
        if isinstance(news, int) and outcome.role != "unmatched":  # the round (None: the scene failed)
            self.remember((news, outcome.role, outcome.deal, outcome.share, outcome.turns))


class Conversation(GroupEnv):
    """One pair's round: messages in turn until an accept or the last message, then the split."""

    async def scene(self, scene: Scene) -> int:
        sim: Bargaining = self.sim  # type: ignore[assignment]
        if len(scene.members) < 2:  # the odd one out of a block: no partner this round
            scene.outcome(scene.members[0], Result(role="unmatched"))
            return scene.round
        first, second = scene.members
        lines: list[Line] = []
        raws = {first.id: "", second.id: ""}
        all_valid = {first.id: True, second.id: True}
        deal = None
        for k in range(sim.turns):
            speaker = first if k % 2 == 0 else second
            speech = await speaker.act("message", View(k + 1, tuple(lines)))
            line = _line(speaker, speech, sim.pie)
            lines.append(line)
            raws[speaker.id] = speech.raw
            all_valid[speaker.id] &= line.valid
            scene.say(speaker, line.say or "", propose=line.propose, accept=line.accept)
            deal = rules.agreement(lines)
            if deal is not None:
                break
        used = len(lines)
        got = {m.id: rules.shares(sim.pie, deal, m.id) for m in (first, second)}
        if deal is None:
            scene.say(None, f"no deal after {used} messages: both get nothing", deal=False,
                      first=0, second=0)
        else:
            scene.say(None, f"deal after {used} messages: agent {first.id} gets {got[first.id]}, "
                            f"agent {second.id} gets {got[second.id]}", deal=True,
                      first=got[first.id], second=got[second.id])
        for me, other, role in ((first, second, "first"), (second, first, "second")):
            scene.outcome(me, Result(role=role, partner=other.id, deal=deal is not None, share=got[me.id],
                                     turns=used, raw=raws[me.id], valid=all_valid[me.id]))
        return scene.round  # what the members hear: the round, for their memory


def _line(speaker: Member, speech: Speech, pie: int) -> Line:
    """The message as the game reads it: only a valid act whose fields keep the rules counts (an
    author's Agent subclass could return anything)."""
    if (speech.valid and isinstance(speech.say, str) and isinstance(speech.accept, bool)
            and parsing.coins(speech.propose, pie) is not None):
        return Line(speaker.id, speech.say, speech.propose, speech.accept)
    return Line(speaker.id, None, None, None)


class BargainingEnv(Env[State, Counts]):
    Partial = Counts

    def __init__(self, sim: Bargaining) -> None:
        super().__init__(sim)
        self.pie = sim.pie

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Result]) -> Counts:
        c = dict.fromkeys(Counts.model_fields, 0)
        for o in outcomes:
            if o.role == "unmatched":
                c["unmatched"] += 1
            if o.role != "first":
                continue  # a pair counts once, by its first speaker
            c["pairs"] += 1
            c["messages"] += o.turns
            if o.deal:
                c["deals"] += 1
                c["deal_messages"] += o.turns
                c["first_coins"] += o.share
        return Counts(**c)

    def merge(self, partials: Sequence[Counts]) -> Counts:
        return rules.merge(partials)

    def decide(self, state: State, round: int, total: Counts) -> tuple[State, RoundSummary]:
        return state, rules.summary(total, self.pie)


class Bargaining(Simulation):
    name = "bargaining"
    Params = BargainingParams
    Agent = Negotiator
    Env = BargainingEnv
    GroupEnv = Conversation
    Act = Speech
    Outcome = Result
    Summary = RoundSummary
    prompt_version = prompts.PROMPT_VERSION
    reference_columns = ("mean_first_share",)
    trend_columns = ("deal_rate", "mean_turns")

    def __init__(self, params: BargainingParams, **kw) -> None:
        super().__init__(params, **kw)
        game = params.game
        self.pie = game.pie
        self.turns = game.turns
        self.say_chars = game.say_chars
        self.show_history = game.show_history
        self.cot = params.prompt.answer == "cot"
        self.use_persona = params.prompt.persona
        self.schema = prompts.answer_schema(self.pie, self.say_chars, self.cot)

    def group_size(self) -> int:
        return 2

    def group_block(self) -> int:
        return self.params.game.block

    def system_prompt(self) -> str:
        return prompts.system_prompt(self.pie, self.turns, self.say_chars)

    def answer_schema(self) -> dict:
        return self.schema

    def user_example(self) -> str:
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return prompts.message_prompt(persona, "", (), 0, 1, self.turns, self.pie, self.cot)

    @classmethod
    def model_defaults(cls, params: BargainingParams) -> dict:
        tokens = ANSWER_TOKENS + -(-params.game.say_chars // CHARS_PER_TOKEN)
        return {"max_tokens": tokens + (COT_MAX_TOKENS if params.prompt.answer == "cot" else 0)}

    @classmethod
    def check_run(cls, params: BargainingParams, config: RunConfig) -> None:
        if config.agents < 2:
            raise ValueError("agents: bargaining needs at least 2 agents (a pair)")

    @classmethod
    def measure_range(cls, params: BargainingParams) -> tuple[float, float]:
        return 0.0, float(params.game.pie)

    @classmethod
    def describe(cls, params: BargainingParams) -> str:
        g = params.game
        return (f"bargaining over {g.pie} coins in at most {g.turns} messages, pairs drawn again within blocks "
                f"of {g.block}")
