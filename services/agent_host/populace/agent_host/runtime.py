"""The host's runs: their agents (built by the SDK for the run's simulation, loaded by name)
and their rounds, played by the SDK's round player with the NATS transports — InferSession
towards the gateway, OutcomePublisher towards the recorder and the environment. Knows no
simulation: everything about one comes from the SDK."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable

import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from opentelemetry.context import Context

from populace.agent_host.publisher import OutcomePublisher
from populace.core import checkpoints, logs, metrics
from populace.core.contracts import RoundOpen, SpawnBatch
from populace.core.settings import Settings
from populace.core.telemetry import tracer
from populace.population.cast import Cast
from populace.sdk.hosting import HostedRun, host_run
from populace.sdk.nats_llm import InferSession
from populace.sdk.play import OutcomeSink
from populace.sdk.registry import resolve

log = logs.get("populace.agent_host")

# (run id, round or None, reason, epoch): tell the orchestrator this run cannot go on here.
FaultReporter = Callable[[str, int | None, str, int], Awaitable[None]]


class HostRuntime:
    def __init__(self, nc: Client, js: JetStreamContext, settings: Settings,
                 report_fault: FaultReporter | None = None) -> None:
        self.nc, self.js, self.settings = nc, js, settings
        self.host_id = settings.host_id
        self.runs: dict[str, HostedRun] = {}
        self._rounds: dict[str, set[asyncio.Task]] = {}  # by run: cancelled with their run
        self._report_fault = report_fault

    @property
    def agent_count(self) -> int:
        return sum(len(r.agents) for r in self.runs.values())

    def spawn(self, batch: SpawnBatch, cast: Cast | None = None) -> HostedRun:
        """Create this host's agents for a run (idempotent: a replayed spawn is a no-op; a spawn
        of a newer epoch — a resume — replaces the old agents). Raises SimulationError /
        ValidationError / ValueError when the run cannot be hosted."""
        current = self.runs.get(batch.run_id)
        if current is not None and current.epoch >= batch.epoch:
            return current
        if current is not None:
            self.forget(batch.run_id)
        resolved = resolve(batch.config)
        one_per_process = resolved.config.placement.agents_per_process == 1 or self.settings.one_agent_per_process
        run = host_run(resolved, batch.run_id, batch.ranges, cast, one_per_process=one_per_process,
                       max_in_flight=self.settings.max_in_flight, epoch=batch.epoch)
        self.runs[batch.run_id] = run
        metrics.AGENTS.set(self.agent_count)
        return run

    async def restore(self, run: HostedRun, batch: SpawnBatch) -> None:
        """Set the agents' declared state from the checkpoint the spawn names (resume, fork)."""
        if batch.restore is None:
            return
        r = batch.restore
        states = await checkpoints.load_agents(self.js, r.run_id, r.round, r.ranges, run.ranges)
        run.restore(states)

    def forget(self, run_id: str) -> None:
        for task in self._rounds.pop(run_id, set()):
            task.cancel()  # a cancelled (or replaced) run's round stops at once
        run = self.runs.pop(run_id, None)
        gc.unfreeze()  # let the finished run's agents be collected
        metrics.AGENTS.set(self.agent_count)
        if run:
            run.stop()

    def start_round(self, opened: RoundOpen, trace_context: Context | None = None) -> None:
        run = self.runs.get(opened.run_id)
        if run is None or opened.epoch != run.epoch or opened.round in run.rounds_played:
            return  # not ours, of another epoch, or a replay of a round already played
        run.rounds_played.add(opened.round)
        task = asyncio.get_running_loop().create_task(self.play_round(run, opened, trace_context))
        tasks = self._rounds.setdefault(opened.run_id, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def play_round(self, run: HostedRun, opened: RoundOpen, trace_context: Context | None = None) -> None:
        # One span for this host's share of the round; the batches below are its children.
        # This task's own context: the bound ids appear on every log line of the round.
        structlog.contextvars.bind_contextvars(run_id=run.run_id, round=opened.round, host_id=self.host_id)
        with tracer.start_as_current_span(
                "agent-host.round", context=trace_context,
                attributes={"populace.run_id": run.run_id, "populace.round": opened.round,
                            "populace.host_id": self.host_id, "populace.agents": len(run.agents)}):
            try:
                await self._play_round(run, opened)
            except asyncio.CancelledError:
                log.info("round_cancelled", run_id=run.run_id, round=opened.round)
                raise
            except Exception as err:  # noqa: BLE001 - the simulation's code (or the bus) failed the round
                reason = (f"simulation {run.resolved.config.simulation!r} failed on {self.host_id} in round "
                          f"{opened.round}: {err}")
                log.error("round_failed", error=reason)
                if self._report_fault is not None:
                    await self._report_fault(run.run_id, opened.round, reason, run.epoch)

    async def _play_round(self, run: HostedRun, opened: RoundOpen) -> None:
        s = self.settings
        model = run.resolved.config.model
        t0 = time.perf_counter()
        obs = run.observation(opened.round, opened.observation)
        session = InferSession(
            self.nc, run_id=run.run_id, round_=opened.round, model=model, system=run.sim.system_prompt(),
            response_schema=run.sim.answer_schema(), batch_size=s.infer_batch_size,
            flush_s=s.infer_flush_ms / 1000, timeout_s=max(s.infer_timeout_s, model.latency_s * 4 + 10),
            attempts=s.infer_attempts, host_id=self.host_id,
        )
        publisher = OutcomePublisher(self.nc, self.js, run_id=run.run_id, round_=opened.round, host_id=self.host_id,
                                     epoch=run.epoch)
        sink = OutcomeSink(type(run.sim), run.env, batch_size=s.outcome_batch_size, emit=publisher.emit,
                           grouped=run.tables.grouped)
        await run.player.play(obs, session, sink)
        share = sink.close()
        played = time.perf_counter()
        saved = await self.checkpoint(run, opened.round) if s.checkpoints else 0
        # The partial goes out last: a round that closes is a round whose checkpoints exist.
        await publisher.close(share)
        metrics.ROUNDS.labels("agent-host").inc()
        log.info("round_played", run_id=run.run_id, round=opened.round, agents=share.n, valid=share.n_valid,
                 infer_batches=session.batches_sent, outcome_batches=share.batches,
                 checkpoint_bytes=saved, checkpoint_seconds=round(time.perf_counter() - played, 3),
                 seconds=round(time.perf_counter() - t0, 3))

    async def checkpoint(self, run: HostedRun, round_: int) -> int:
        """The agents' declared state after `round_`, one object per range; returns the bytes."""
        total = 0
        for first, count, columns in await run.snapshot():
            total += await checkpoints.save_agents(self.js, run.run_id, round_, first, count, columns)
        return total
