"""Scenes: ordered acts inside one round. A group environment's `async def scene(self, scene)`
awaits its members' acts in order, on the host that holds the group, one task per group:

    class Pair(GroupEnv):
        async def scene(self, scene: Scene) -> None:
            proposer, responder = scene.members
            offer = await proposer.act("offer", {"pie": 10})
            reply = await responder.act("respond", {"pie": 10, "offer": offer.amount})
            scene.say(responder, "deal" if reply.accept else "no deal")
            scene.outcome(proposer, Result(role="proposer", payoff=...))
            scene.outcome(responder, Result(role="responder", payoff=...))

Each act runs in its member's own agent (`Agent.act(phase, view, llm)`: its memory, persona and
LLM key), also when that agent lives in its own OS process; acts of different groups run
concurrently and their model calls are batched as turns are. Every act is recorded (the
simulation's acts table: one row per act, its `Act` columns), every line said too
(`transcripts`), and a scene finishes inside its round, so a checkpoint, a re-placement, a
resume and a fork replay whole scenes.

A scene must give every member its round's outcome (`scene.outcome`), act for its own members
only, and never await one member's act while another act of that member is running. A group of
k members acts at most MAX_ACTS_PER_MEMBER × k times and says at most MAX_LINES_PER_MEMBER × k
lines in a round (the recorder refuses more: a host writes a bounded transcript)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from populace.core.contracts import MAX_ACTS_PER_MEMBER, MAX_LINES_PER_MEMBER
from populace.sdk.llm import CALLER, InferError
from populace.sdk.rng import seeded

if TYPE_CHECKING:
    import random

    from populace.population.cast import Persona
    from populace.sdk.agent import Agent
    from populace.sdk.llm import LLM
    from populace.sdk.outcome import Outcome

MAX_LINE_CHARS = 10_000  # one line of a transcript (a runaway answer cannot overflow a batch)
# the scene whose task is running: a member of another group's scene cannot act in it
PLAYING: ContextVar[Scene | None] = ContextVar("populace_scene", default=None)


class SceneError(RuntimeError):
    """The simulation's scene broke a rule or raised: the round cannot close."""


@dataclass(slots=True)
class ActRecord:
    seq: int
    agent_id: int
    phase: str
    act: Outcome
    latency_ms: float
    error: str | None


@dataclass(slots=True)
class LineRecord:
    seq: int
    speaker: int
    text: str
    fields: str | None  # compact JSON


class Member:
    """A member of a scene's group, as the scene sees it: who it is, and its `act`."""

    __slots__ = ("_busy", "_scene", "agent")

    def __init__(self, agent: Agent, scene: Scene) -> None:
        self.agent = agent
        self._scene = scene
        self._busy = False

    @property
    def id(self) -> int:
        return self.agent.id

    @property
    def persona(self) -> Persona | None:
        return self.agent.persona

    async def act(self, phase: str, view: Any = None) -> Any:
        """This member acts (`Agent.act(phase, view, llm)` in its own agent) and the act is
        recorded. Its bug is its act's invalid outcome (the scene goes on); no model answering
        stops the round, as in a turn."""
        return await self._scene._act(self, phase, view)

    def __repr__(self) -> str:
        return f"Member({self.agent.id})"


class Scene:
    """One group's round (see the module's docstring). One per group per round, so a small
    object: the platform's bookkeeping lives in slots, created empty."""

    __slots__ = ("_act_cls", "_acts_begun", "_clock", "_failed_act", "_gate", "_llm", "_seq", "acts", "broken",
                 "group",
                 "in_flight", "last_active", "members", "outcomes", "round", "sim", "transcript")

    def __init__(self, round: int, group: int, sim: Any, llm: LLM, act_cls: type,
                 failed_act: Callable[[BaseException], tuple[Outcome, str]],
                 clock: Callable[[], float] = time.perf_counter, gate: Callable[[], Any] | None = None) -> None:
        self.round = round
        self.group = group
        self.sim = sim
        self._llm = llm
        self._act_cls = act_cls
        self._failed_act = failed_act
        self._clock = clock
        # before each act (the member's code): the loop's slicer (populace.sdk.slicing), or None
        self._gate = gate
        self.members: tuple[Member, ...] = ()
        self.transcript: list[LineRecord] = []
        self.acts: list[ActRecord] = []
        self.outcomes: dict[int, Outcome] = {}
        self._seq = 0
        self._acts_begun = 0
        self.in_flight = 0  # acts and model calls running now: a scene with none for long is stuck
        self.last_active = 0.0
        self.broken: str | None = None  # the first rule it broke (the round fails even if the scene caught it)

    @property
    def _where(self) -> str:
        return f"simulation {type(self.sim).name!r}, round {self.round}, group {self.group}"

    @property
    def rng(self) -> random.Random:
        """A random.Random seeded by (run seed, round, group): the same on every process."""
        return seeded(self.sim.seed, self.round, self.group, "scene")

    def member(self, agent_id: int) -> Member:
        for m in self.members:
            if m.id == agent_id:
                return m
        raise self._break(f"agent {agent_id} is not a member of group {self.group}")

    def _break(self, why: str) -> SceneError:
        if self.broken is None:
            self.broken = f"{self._where}: {why}"
        return SceneError(f"{self._where}: {why}")

    def say(self, speaker: Member | int | None, text: str, **fields: Any) -> None:
        """A line of the group's transcript (speaker None or -1: the scene itself, e.g. a
        game master); `fields` are recorded as JSON."""
        who = -1 if speaker is None else speaker.id if isinstance(speaker, Member) else int(speaker)
        if who != -1:
            self.member(who)
        if not isinstance(text, str):
            raise self._break(f"say() takes text, not {type(text).__name__}")
        try:
            body = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False) if fields else None
        except (TypeError, ValueError) as err:
            raise self._break(f"a line's fields must be JSON: {err}") from None
        if len(self.transcript) >= MAX_LINES_PER_MEMBER * len(self.members):
            raise self._break(f"more than {MAX_LINES_PER_MEMBER} lines per member ({len(self.members)}) in a round")
        self.transcript.append(LineRecord(self._next(), who, text[:MAX_LINE_CHARS], body))

    def outcome(self, member: Member | int, outcome: Outcome) -> None:
        """A member's round outcome (its row in the simulation's outcomes table)."""
        m = member if isinstance(member, Member) else self.member(int(member))
        if m._scene is not self:
            raise self._break(f"agent {m.id} is not a member of group {self.group}")
        self.outcomes[m.id] = outcome

    async def ask(self, prompt: str, *, schema: dict | None = None, system: str | None = None) -> str:
        """The group's own model call (a game master narrating to its group), under the first
        member's key. Not an act: it is recorded as the model call it is, not in the acts table."""
        self.in_flight += 1
        try:
            return await self._llm.ask(prompt, key=self.members[0].id, system=system, schema=schema)
        finally:
            self.in_flight -= 1
            self.last_active = self._clock()

    def _next(self) -> int:
        self._seq += 1
        return self._seq - 1

    async def _act(self, member: Member, phase: str, view: Any) -> Any:
        playing = PLAYING.get()
        if member._scene is not self or (playing is not None and playing is not self):
            where = playing if playing is not None else self
            raise where._break(f"agent {member.id} is not a member of group {where.group}")
        if member._busy:
            raise self._break(f"agent {member.id} was asked to act while its previous act was still running "
                              "(await each act before the next of the same member)")
        if not isinstance(phase, str):
            raise self._break(f"an act's phase is a string, not {type(phase).__name__}")
        if self._acts_begun >= MAX_ACTS_PER_MEMBER * len(self.members):
            raise self._break(f"more than {MAX_ACTS_PER_MEMBER} acts per member ({len(self.members)}) in a round")
        self._acts_begun += 1
        seq = self._next()
        member._busy = True
        self.in_flight += 1  # waiting for the loop to turn is not a stuck scene
        wait = self._gate() if self._gate is not None else None
        if wait is not None:
            await wait
        started = self._clock()
        error = None
        caller = CALLER.set(member.id)  # the act's calls are the member's own
        try:
            act = await member.agent.act(phase, view, self._llm)
            if act.__class__ is not self._act_cls and not isinstance(act, self._act_cls):
                raise TypeError(f"act returned {type(act).__name__}, not {self._act_cls.__name__}")
        except InferError:
            raise
        except Exception as err:
            act, error = self._failed_act(err)
        finally:
            CALLER.reset(caller)
            member._busy = False
            self.in_flight -= 1
            self.last_active = self._clock()
        self.acts.append(ActRecord(seq, member.id, phase, act, (self.last_active - started) * 1000.0, error))
        return act
