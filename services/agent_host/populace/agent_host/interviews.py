"""Interviews on an agent-host: its agents answer the surveys a run plans after a round, from
their state at the round's end (frozen before the host's partial goes out, so before the next
round can start), each on a copy; the answers leave in batches (`run.<rid>.interviews.<n>.<host>`)
for the recorder. They run beside the next round: nothing of the run waits on them. Nor do
they compete with it: while one of the host's rounds is in play they start no new answers
(the round has the CPU; the calls already out go on), and between two rounds of a run they
keep few out (`BETWEEN_ROUNDS`: what is out when the next round opens competes with it); once
the run has played its last round they go at full speed. Unless the round-end states they
wait to answer from pass `interview_backlog_mb`: a long run's panel then answers as it goes.

A share restored from a round's checkpoint (a lost host's agents placed again, a resume) asks
that round's planned interviews again of its agents: the answers of a host lost before it sent
them would otherwise be missing. The recorder keeps the first answer of each (agent, question)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext

from populace.core import bus, checkpoints, logs, runconfigs, subjects
from populace.core.contracts import InterviewBatch, InterviewOrder, PlannedInterview, RunConfig, Survey, Usage
from populace.core.settings import Settings
from populace.population.cast import Cast
from populace.sdk import interview
from populace.sdk.hosting import HostedRun
from populace.sdk.llm import ModelUnavailable
from populace.sdk.nats_llm import InferSession
from populace.sdk.play import RoundPlayer
from populace.sdk.registry import resolve

log = logs.get("populace.agent_host")

# Planned answers a host keeps out between two rounds of their run (a round's first batches)
BETWEEN_ROUNDS = 2000
# Answer batches (of `outcome_batch_size` rows) a survey keeps waiting to be stored; past it, no
# new answers start until some are.
PUBLISHING = 32

States = Sequence[tuple[int, dict[str, Any]]]
# a share's agents' state at a round's end: frozen_states' JSON (answered later), or restored pairs
Frozen = bytes | States
# (run id, round or None, reason, epoch, pause)
FaultReporter = Callable[[str, int | None, str, int, bool], Awaitable[None]]
# (run id, round, request, reason): a post-hoc interview's order this host cannot answer
InterviewFaultReporter = Callable[[str, int, str, str], Awaitable[None]]


class AnswerPublisher:
    """One survey's answers from this host, in batches, each JetStream-stored once (its message
    id names run, round, host, survey, request, the request's placement and batch: a host
    ordered again, for a lost host's ranges, sends new messages)."""

    def __init__(self, js: JetStreamContext, *, run_id: str, round_: int, host_id: str, epoch: int,
                 survey: Survey, request: str | None = None, placement: int = 0) -> None:
        self._js = js
        self.run_id, self.round, self.host_id, self.epoch = run_id, round_, host_id, epoch
        self.survey, self.request, self.placement = survey, request, placement
        self._seq = 0
        self._reported = Usage()
        self._publishing: set[asyncio.Task] = set()  # batches not stored yet
        self._failed: BaseException | None = None  # the first batch that could not be stored
        self._room = asyncio.Event()  # set while fewer than PUBLISHING batches are out
        self._room.set()
        self.rows = self.valid = 0

    def emit(self, columns: dict[str, list], usage: Usage) -> None:
        """A full batch of rows (synchronously, from interview.Rows), with the session's usage so far."""
        delta = usage - self._reported
        self._reported = usage
        batch = InterviewBatch.model_construct(
            v=1, run_id=self.run_id, after_round=self.round, host_id=self.host_id, epoch=self.epoch, seq=self._seq,
            survey=self.survey, request=self.request, agent_ids=columns["agent_id"], questions=columns["question"],
            answers=columns["answer"], values=columns["value"], raws=columns["raw"], valid=columns["valid"],
            errors=columns["error"], latency_ms=columns["latency_ms"], usage=delta)
        self._seq += 1
        self.rows += len(columns["agent_id"])
        self.valid += sum(columns["valid"])
        placed = f"-p{self.placement}" if self.placement else ""
        shard = f"{self.host_id}-{self.survey.id}-{self.request or 'planned'}{placed}-{batch.seq}"
        task = asyncio.get_running_loop().create_task(bus.publish_js(
            self._js, subjects.run_interviews(self.run_id, self.round, self.host_id), batch,
            msg_id=subjects.msg_id(self.run_id, self.round, shard, "interviews", self.epoch)))
        self._publishing.add(task)
        task.add_done_callback(self._stored)
        if len(self._publishing) >= PUBLISHING:
            self._room.clear()

    def _stored(self, task: asyncio.Task) -> None:
        self._publishing.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failed is None:
            self._failed = task.exception()
        if len(self._publishing) < PUBLISHING:
            self._room.set()

    async def room(self) -> None:
        """Until fewer than PUBLISHING batches wait to be stored: answers start no faster than
        JetStream stores them (a slow server would otherwise see every answer of the share
        waiting in this host's memory)."""
        while len(self._publishing) >= PUBLISHING and self._failed is None:
            self._room.clear()
            await self._room.wait()

    async def close(self, usage: Usage) -> None:
        """Every batch stored; the usage not yet reported rides in a last, empty batch."""
        if usage != self._reported or self._seq == 0:
            self.emit({k: [] for k in interview.ROW_KEYS}, usage)
        await asyncio.gather(*self._publishing, return_exceptions=True)
        if self._failed is not None:
            raise self._failed


class Interviewer:
    """The planned interviews of a host's runs: started after a round, counted for the partials."""

    def __init__(self, nc: Client, js: JetStreamContext, settings: Settings, host_id: str,
                 report_fault: FaultReporter | None = None,
                 report_interview_fault: InterviewFaultReporter | None = None) -> None:
        self.nc, self.js, self.settings, self.host_id = nc, js, settings, host_id
        self._report_fault = report_fault
        self._report_interview_fault = report_interview_fault
        self._tasks: dict[str, set[asyncio.Task]] = {}  # by run id
        self._done: dict[tuple[str, int], Usage] = {}  # (run, epoch) -> LLM work finished, not yet in a partial
        self._in_play = 0  # the host's rounds in play now
        self._idle = asyncio.Event()  # set when none is (or when the backlog must go on regardless)
        self._idle.set()
        self._waiting = 0  # bytes of frozen states whose planned interviews have not finished
        self._backlog_limit = settings.interview_backlog_mb * 1024 * 1024
        self._one_at_a_time = asyncio.Lock()  # planned interviews answer in turn: one thawed share at a time
        self._ended: dict[str, None] = {}  # runs that play no more rounds (the latest thousand)

    @staticmethod
    def planned(run: HostedRun, round_: int) -> list[PlannedInterview]:
        c = run.resolved.config
        return [plan for plan in c.interviews if round_ in plan.rounds(c.rounds)]

    @staticmethod
    async def freeze(run: HostedRun) -> bytes:
        """The share's agents' declared state now, as a checkpoint holds it (JSON: a deep copy,
        read back into columns only when they answer, off the round's path)."""
        return interview.frozen_states(await run.snapshot())

    @contextlib.contextmanager
    def round_in_play(self) -> Iterator[None]:
        """A round of this host is in play: planned interviews start no new answers meanwhile."""
        self._in_play += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_play -= 1
            if self._in_play == 0:
                self._idle.set()

    def _answered(self, size: int) -> None:
        self._waiting -= size

    def ended(self, run_id: str) -> None:
        """`run_id` plays no more rounds: its planned interviews go at full speed."""
        self._ended[run_id] = None
        if len(self._ended) > 1000:
            del self._ended[next(iter(self._ended))]

    def _held_back(self) -> bool:
        return self._in_play > 0 and self._waiting <= self._backlog_limit

    def _gate(self, run: HostedRun, round_: int) -> Callable[[], Awaitable[int]]:
        """How many of the answers after `round_` may be out now: none while a round is in play
        (waited out), few between rounds, all once the run has played its last (or past the
        backlog's bound)."""
        last = round_ >= run.resolved.config.rounds

        async def gate() -> int:
            while self._held_back():
                self._idle.clear()
                await self._idle.wait()
            if last or run.run_id in self._ended or self._waiting > self._backlog_limit:
                return 1 << 62
            return BETWEEN_ROUNDS

        return gate

    def take(self, run: HostedRun) -> Usage:
        """The interviews' LLM work finished since the share's last partial (for the next one)."""
        return self._done.pop((run.run_id, run.epoch), Usage())

    def start(self, run: HostedRun, round_: int, states: Frozen, plans: list[PlannedInterview]) -> None:
        size = len(states) if isinstance(states, (bytes, bytearray)) else 0
        self._waiting += size
        if not self._held_back():
            self._idle.set()  # past the bound: those waiting go on beside the round
        task = asyncio.get_running_loop().create_task(self._planned(run, round_, states, plans))
        task.add_done_callback(lambda _: self._answered(size))  # however it ends, even cancelled before it ran
        tasks = self._tasks.setdefault(run.run_id, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def cancel(self, run_id: str) -> None:
        """A run stopped short (cancelled, failed, paused): its interviews stop too (a completed
        run's go on: the recorder waits for them)."""
        for task in self._tasks.pop(run_id, set()):
            task.cancel()

    def cancel_all(self) -> None:
        for run_id in list(self._tasks):
            self.cancel(run_id)

    def order(self, order: InterviewOrder, load_cast: Callable[[RunConfig], Awaitable[Cast | None]]) -> None:
        """Answer a post-hoc interview's order, in a task of its own."""
        task = asyncio.get_running_loop().create_task(self._ordered(order, load_cast))
        tasks = self._tasks.setdefault(f"ask:{order.run_id}", set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _ordered(self, order: InterviewOrder, load_cast: Callable[[RunConfig], Awaitable[Cast | None]]) -> None:
        """No agent of the run is built: each chosen agent answers from a copy made from its
        state in the checkpoint (verified against the digests the order carries)."""
        r = order.restore
        try:
            config = await runconfigs.fetch(self.js, order.run_id, order.config_ref)
            resolved = resolve(config)
            sim = resolved.instance(order.run_id, await load_cast(config))
            run = HostedRun(order.run_id, resolved, sim, type(sim).Env(sim), [], RoundPlayer(sim, []),
                            ranges=list(order.ranges))
            states = interview.Respondents.from_chunks(
                [chunk async for chunk in checkpoints.agent_chunks(self.js, r.run_id, r.round, r.ranges, order.ranges,
                                                                   r.digests, r.writers)],
                wanted=order.ranges)
            chosen = states.chosen(seed=config.seed, survey_id=order.survey.id, sample=order.sample,
                                   agents=order.agents, last_use=True)
            del states
            await self.ask(run, order.after_round, chosen, order.survey, request=order.request,
                           placement=order.placement)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the asker waits for the answers: the interview fails, saying why
            error = f"{type(err).__name__}: {err}"
            log.error("interview_failed", run_id=order.run_id, request=order.request, after_round=order.after_round,
                      error=error)
            if self._report_interview_fault is not None:
                try:
                    await self._report_interview_fault(order.run_id, order.after_round, order.request, error)
                except Exception as pub_err:
                    log.error("interview_fault_unsaid", run_id=order.run_id, request=order.request,
                              error=f"{type(pub_err).__name__}: {pub_err}")

    async def _planned(self, run: HostedRun, round_: int, states: Frozen, plans: list[PlannedInterview]) -> None:
        seed = run.resolved.config.seed
        async with self._one_at_a_time:
            gate = self._gate(run, round_)
            await gate()
            people = (interview.Respondents.frozen(states) if isinstance(states, (bytes, bytearray))
                      else interview.Respondents.of(states))
            del states
            for n, plan in enumerate(plans, 1):
                chosen = people.chosen(seed=seed, survey_id=plan.id, sample=plan.sample, agents=plan.agents,
                                       last_use=n == len(plans))
                try:
                    await self.ask(run, round_, chosen, plan.survey, gate=gate)
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    reason = (f"interviews after round {round_} ({plan.id}) on {self.host_id}: "
                              f"{type(err).__name__}: {err}; `populace resume {run.run_id}` asks them again")
                    log.error("interviews_failed", run_id=run.run_id, round=round_, survey=plan.id, error=reason)
                    if self._report_fault is not None and isinstance(err, ModelUnavailable):
                        await self._report_fault(run.run_id, round_, reason, run.epoch, True)
                    return

    async def ask(self, run: HostedRun, round_: int, states: interview.Respondents | States, survey: Survey,
                  request: str | None = None, gate: Callable[[], Awaitable[int]] | None = None,
                  placement: int = 0) -> AnswerPublisher:
        """`states`' agents answer `survey` (each from a copy); their answers are published.
        `gate`: awaited before each slice of answers starts, how many may be out (`_gate`)."""
        s = self.settings
        model = run.resolved.config.model
        model = model.model_copy(update={"max_tokens": interview.max_tokens(survey, model.max_tokens)})
        session = InferSession(
            self.nc, run_id=run.run_id, round_=round_, model=model, system=interview.SYSTEM,
            batch_size=s.infer_batch_size, flush_s=s.infer_flush_ms / 1000,
            timeout_s=max(s.infer_timeout_s, model.latency_s * 4 + 10), attempts=s.infer_attempts,
            host_id=self.host_id, silence_s=s.infer_silence_s, down_s=s.infer_down_s, shared_suffix=True,
            models=run.resolved.config.models, model_of=run.models)
        out = AnswerPublisher(self.js, run_id=run.run_id, round_=round_, host_id=self.host_id, epoch=run.epoch,
                              survey=survey, request=request, placement=placement)
        rows = interview.Rows(emit=lambda columns: out.emit(columns, session.usage()), size=s.outcome_batch_size)
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def paced() -> int:
            await out.room()
            return 1 << 62 if gate is None else await gate()

        try:
            await interview.ask(run.sim, states, survey, session, rows,
                                max_in_flight=min(s.max_in_flight, s.interview_in_flight), gate=paced)
        finally:
            rows.flush()
            await session.drain()
            await out.close(session.usage())
            key = (run.run_id, run.epoch)
            self._done[key] = self._done.get(key, Usage()) + session.usage()
        log.info("interviewed", run_id=run.run_id, round=round_, survey=survey.id, request=request,
                 agents=len(states), answers=out.rows, valid=out.valid, llm_calls=session.llm_calls,
                 tokens=session.prompt_tokens + session.completion_tokens,
                 seconds=round(loop.time() - t0, 3))
        return out
