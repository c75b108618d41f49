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

Members whose acts are simultaneous (a stage: every member contributes at once) act together
with `scene.all`, which starts their acts in order and awaits them together, so a stage waits on
one model latency, not one per member:

    contributions = await scene.all("contribute", [view] * len(scene.members))

A scene must give every member its round's outcome (`scene.outcome`), act for its own members
only, and never await one member's act while another act of that member is running. A group of
k members acts at most MAX_ACTS_PER_MEMBER × k times and says at most MAX_LINES_PER_MEMBER × k
lines in a round (the recorder refuses more: a host writes a bounded transcript)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from contextvars import Context, ContextVar, copy_context
from typing import TYPE_CHECKING, Any

import populace.sdk.llm as ports
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


# A scene's records are plain tuples (a million members act twice a round), appended as they
# happen and sent columnar (populace.sdk.play.OutcomeSink):
# an act: (group, seq, agent id, phase, the act, latency in ms, error or None)
ActRecord = tuple[int, int, int, str, Any, float, "str | None"]
# a line: (group, seq, speaker, text, fields as compact JSON or None)
LineRecord = tuple[int, int, int, str, "str | None"]


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

    def act(self, phase: str, view: Any = None) -> Coroutine[Any, Any, Any]:
        """This member acts (`Agent.act(phase, view, llm)` in its own agent) and the act is
        recorded; await it. Its bug is its act's invalid outcome (the scene goes on); no model
        answering stops the round, as in a turn. (The scene's own coroutine, not one around it:
        a million members act twice a round.)"""
        scene = self._scene
        if scene is None:
            return _ended(self)
        return scene._act(self, phase, view)

    def __repr__(self) -> str:
        return f"Member({self.agent.id})"


async def _ended(member: Member) -> Any:
    """A member of a scene that has ended (kept by a scene of another group) was asked to act."""
    playing = PLAYING.get()
    if playing is not None:
        raise playing._break(f"agent {member.id} is not a member of group {playing.group}")
    raise SceneError(f"agent {member.id} was asked to act after its scene ended")


class Scene:
    """One group's round (see the module's docstring). One per group per round, so a small
    object: the platform's bookkeeping lives in slots, created empty."""

    __slots__ = ("_act_cls", "_acts_begun", "_clock", "_ctx", "_failed_act", "_gate", "_llm", "_seq", "acts",
                 "broken", "group", "in_flight", "last_active", "members", "outcomes", "round", "sim", "transcript")

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
        self._ctx: Context | None = None  # where its stages' acts run (Scene.all), made on its first stage

    def end(self) -> None:
        """The scene is over: its members can no longer act (and hold it no more: a scene and
        its members would otherwise wait for the cyclic collector, a million members a round)."""
        for m in self.members:
            m._scene = None
        self._ctx = None  # it names the scene (PLAYING)

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
        self.transcript.append((self.group, self._next(), who, text[:MAX_LINE_CHARS], body))

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

    def all(self, phase: str, views: Sequence[Any] | None = None, *,
            members: Sequence[Member] | None = None) -> asyncio.Future[list[Any]]:
        """A stage whose acts are simultaneous: `members` (default: the group's, in order) act at
        once, member i seeing `views[i]` (None: every member sees None), and their acts come back
        in that order; each is recorded as `member.act` records it, its `seq` in that order. The
        stage waits on one model latency, not one per member.

        The acts run without a task each (a million members act twice a round): the platform
        drives each act's coroutine itself, in a context of its own, as a task would, but
        `asyncio.current_task()` is None inside them. Code in an act that needs a task of its
        own (`asyncio.timeout`, a TaskGroup, a library that looks for its task) runs in one
        (`await asyncio.create_task(...)`), or the scene awaits such acts with `member.act`.
        The first act to fail (no model answered, a rule broken) stops the stage: the others
        are cancelled, and its failure is raised; the scene cancelled while it waits cancels them
        too. (Await what it returns: a future, not a coroutine, one object fewer per stage.)"""
        who = self.members if members is None else tuple(members)
        n = len(who)
        if views is None:
            views = (None,) * n
        else:
            views = tuple(views)
            if len(views) != n:
                raise self._break(f"all({phase!r}) got {len(views)} views for {n} members (one per member, "
                                  "in the members' order)")
        if phase.__class__ is not str and not isinstance(phase, str):
            raise self._break(f"an act's phase is a string, not {type(phase).__name__}")
        if self._acts_begun + n > MAX_ACTS_PER_MEMBER * len(self.members):
            raise self._break(f"more than {MAX_ACTS_PER_MEMBER} acts per member ({len(self.members)}) in a round")
        playing = PLAYING.get()
        for i, member in enumerate(who):
            why = None
            if member._scene is not self or (playing is not None and playing is not self):
                where = playing if playing is not None else self
                why = where._break(f"agent {member.id} is not a member of group {where.group}")
            elif member._busy:  # acting now, or listed twice
                why = self._break(f"agent {member.id} was asked to act while its previous act was still running "
                                  "(await each act before the next of the same member)")
            if why is not None:
                for m in who[:i]:
                    m._busy = False
                raise why
            member._busy = True
        self._acts_begun += n
        if n == 0:
            done = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        return _Stage(self, phase, who, views).done

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
        if phase.__class__ is not str and not isinstance(phase, str):
            raise self._break(f"an act's phase is a string, not {type(phase).__name__}")
        if self._acts_begun >= MAX_ACTS_PER_MEMBER * len(self.members):
            raise self._break(f"more than {MAX_ACTS_PER_MEMBER} acts per member ({len(self.members)}) in a round")
        self._acts_begun += 1
        seq = self._seq
        self._seq = seq + 1
        agent = member.agent
        member._busy = True
        self.in_flight += 1  # waiting for the loop to turn is not a stuck scene
        gate = self._gate
        if gate is not None:
            wait = gate()
            if wait is not None:
                await wait
        clock = self._clock
        started = clock()
        error = None
        caller = CALLER.set(agent.id)  # the act's calls are the member's own
        try:
            act = await agent.act(phase, view, self._llm)
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
            self.last_active = ended = clock()
        self.acts.append((self.group, seq, agent.id, phase, act, (ended - started) * 1000.0, error))
        return act


class _Stage:
    """The acts of one `Scene.all`, each driven as an asyncio Task drives its coroutine (a step
    on each wake-up of the future it awaits, a bare yield resumed on the loop's next turn),
    without the Task: no task object, registry entry, context copy or wake-up of the scene's own
    task per act, and no object per act but its coroutine (the futures it awaits map to it in
    `waiting`; one wake-up method serves them all, the stage's start and cancellation too). The
    stage's acts share one context, a copy of the scene's; `llm.ACTING` names the member whose
    step runs (a task an act starts does not inherit it, as a turn's does not)."""

    __slots__ = ("acts", "ctx", "done", "first_seq", "gating", "left", "loop", "members", "phase", "running",
                 "scene", "started", "throws", "waiting", "wake")

    def __init__(self, scene: Scene, phase: str, members: tuple[Member, ...], views: tuple) -> None:
        self.scene, self.phase, self.members = scene, phase, members
        self.loop = loop = asyncio.get_running_loop()
        self.done: asyncio.Future = loop.create_future()
        ctx = scene._ctx
        if ctx is None:  # one per scene, a copy of its task's: its stages run one after another
            ctx = scene._ctx = copy_context()
            if ctx.get(CALLER) is not None:  # a stage started inside an act: no caller but the stepping member
                ctx.run(CALLER.set, None)
        self.ctx = ctx
        n = len(members)
        self.left = n
        self.first_seq = scene._seq
        scene._seq += n
        scene.in_flight += n
        self.started = scene._clock()
        llm = scene._llm
        # act i's coroutine while it runs (running[i]), then what it returned: the stage's result
        acts: list[Any] = []
        for i in range(n):  # a loop, not a comprehension: its closure would cost objects per stage
            acts.append(members[i].agent.act(phase, views[i], llm))
        self.acts = acts
        self.running = bytearray(b"\x01") * n  # not a container: nothing for the collector
        self.waiting: dict[asyncio.Future, int] = {}  # a future an act awaits -> that act
        self.throws: dict[int, BaseException] | None = None  # thrown into an act at its next step (a cancel …)
        self.gating: asyncio.Task | None = None  # the stage waiting at the loop's slicer
        self.wake: Callable | None = self._wake  # made once: every wake-up of the stage
        self.done.add_done_callback(self.wake, context=ctx)  # (the scene cancelled while it waits)
        loop.call_soon(self.wake, None, context=ctx)  # the start, on the loop as a task's: not inside the scene's task

    def _wake(self, future: asyncio.Future | None) -> None:
        if future is None:  # the start
            self._start()
        elif future is self.done:
            if future.cancelled():  # the scene was cancelled while it waited: its acts stop too
                self.cancel()
        else:
            i = self.waiting.pop(future, None)
            if i is not None:
                self.step(i)

    def _start(self) -> None:
        """Start the stage's acts, in order, once it passed the scene's gate (populace.sdk.slicing):
        the stage is one entry, as a scene is (its acts' code up to their first await runs in this
        one callback). When author code has held the loop a slice, the stage waits in a task (made
        only then) until the gate lets it through: an entry per act cost a hold, a task and a turn
        of the loop per act when the loop is busy, and took a stage's acts apart."""
        gate = self.scene._gate
        if gate is not None and self.gating is None:
            wait = gate()
            if wait is not None:
                self.gating = self.loop.create_task(wait, context=self.ctx)
                self.gating.add_done_callback(self._gated, context=self.ctx)
                return
        for i in range(len(self.acts)):
            self.step(i)

    def _gated(self, _held: asyncio.Task) -> None:
        """Let through (or cancelled with the stage: each act's step then throws its cancel)."""
        for i in range(len(self.acts)):
            self.step(i)
        self.gating = None

    def _woken(self, i: int, _future: asyncio.Future) -> None:
        self.step(i)

    def step(self, i: int) -> None:
        """Run act i to its next suspension (in the stage's context: a callback registered with it)."""
        if not self.running[i]:
            return
        coro = self.acts[i]
        throw = self.throws.pop(i, None) if self.throws else None
        ports.ACTING = self.members[i].agent.id  # the act's calls are the member's own
        try:
            out = coro.send(None) if throw is None else coro.throw(throw)
        except StopIteration as stop:
            ports.ACTING = None
            self.running[i] = 0
            self.finished(i, stop.value, None)
            return
        except BaseException as err:  # an Exception is the act's bug; anything else stops the stage
            ports.ACTING = None
            self.running[i] = 0
            self.finished(i, None, err)
            return
        ports.ACTING = None
        if getattr(out, "_asyncio_future_blocking", None):  # awaiting a future (an LLM answer …)
            out._asyncio_future_blocking = False
            if out in self.waiting:  # two acts await one future: this one wakes apart
                out.add_done_callback(functools.partial(self._woken, i), context=self.ctx)
            else:
                self.waiting[out] = i
                out.add_done_callback(self.wake, context=self.ctx)
            if self.throws and isinstance(self.throws.get(i), asyncio.CancelledError) and out.cancel():
                del self.throws[i]  # cancelled during its step: the future it now awaits is
            return
        if out is not None:  # what a Task refuses too: thrown into the act, whose bug it is
            self._throw(i, RuntimeError(f"an act awaited {out!r}, which is not an asyncio future"))
        self.loop.call_soon(self.step, i, context=self.ctx)  # a bare yield (asyncio.sleep(0)): the next turn

    def _throw(self, i: int, exc: BaseException) -> None:
        if self.throws is None:
            self.throws = {}
        self.throws[i] = exc

    def finished(self, i: int, act: Any, failure: BaseException | None) -> None:
        scene = self.scene
        member = self.members[i]
        member._busy = False
        scene.in_flight -= 1
        scene.last_active = ended = scene._clock()
        self.acts[i] = None  # its coroutine: done with
        self.left -= 1
        if self.left == 0:
            self.wake = None  # it holds the stage: no cycle left for the collector
        error = None
        if failure is None:
            cls = scene._act_cls
            if act.__class__ is not cls and not isinstance(act, cls):
                act, error = scene._failed_act(TypeError(f"act returned {type(act).__name__}, not {cls.__name__}"))
        elif isinstance(failure, InferError) or not isinstance(failure, Exception):
            # no model answered, or the act was cancelled: the stage stops here
            if not self.done.done():
                self.done.set_exception(failure)
                self.cancel()
            return
        else:
            act, error = scene._failed_act(failure)
        scene.acts.append((scene.group, self.first_seq + i, member.agent.id, self.phase, act,
                           (ended - self.started) * 1000.0, error))
        self.acts[i] = act
        if self.left == 0 and not self.done.done():
            self.done.set_result(self.acts)

    def cancel(self) -> None:
        """As Task.cancel, for each act still running: the future it awaits is cancelled (its
        wake-up throws CancelledError into it), or else its next step throws it."""
        waiting = dict(self.waiting)
        for future, i in waiting.items():
            if not future.cancel():  # done already, its wake-up on its way: that step throws instead
                self._throw(i, asyncio.CancelledError())
        awaiting = set(waiting.values())
        for i in range(len(self.acts)):
            if self.running[i] and i not in awaiting:
                self._throw(i, asyncio.CancelledError())
        if self.gating is not None:  # not started yet, waiting at the gate: its acts start, to be cancelled
            self.gating.cancel()
