"""The host's agents and their turns. Every agent runs its own turn as its own asyncio task,
bounded by a per-host in-flight limit; batching happens only in the transports
(InferSession towards the gateway, GuessCollector towards the recorder and environment)."""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.js import JetStreamContext

from populace.agent_host.collector import GuessCollector
from populace.agent_host.process_mode import ProcessAgent
import structlog
from opentelemetry.context import Context

from populace.core import logs, metrics
from populace.core.telemetry import tracer
from populace.core.contracts import RoundOpen, RunConfig, SpawnBatch
from populace.core.settings import Settings
from populace.games.cast import Cast
from populace.games.player import GuessPlayer, Turn
from populace.games.prompts import answer_schema, history_text, system_prompt
from populace.sdk.agent import Agent
from populace.sdk.llm import InferSession

log = logs.get("populace.agent_host")

# Yield to the event loop every this many task launches so batches leave while agents start.
LAUNCH_SLICE = 2000


@dataclass
class HostedRun:
    run_id: str
    config: RunConfig
    agents: list[Agent]
    system: str
    schema: dict
    rounds_played: set[int] = field(default_factory=set)


class HostRuntime:
    def __init__(self, nc: Client, js: JetStreamContext, settings: Settings) -> None:
        self.nc, self.js, self.settings = nc, js, settings
        self.host_id = settings.host_id
        self.runs: dict[str, HostedRun] = {}
        self._rounds: set[asyncio.Task] = set()

    @property
    def agent_count(self) -> int:
        return sum(len(r.agents) for r in self.runs.values())

    def spawn(self, batch: SpawnBatch, cast: Cast | None = None) -> HostedRun:
        """Create this host's agents for a run (idempotent: a replayed spawn is a no-op).
        With a cast, agent i speaks from persona i (a reference to a shared string)."""
        if batch.run_id in self.runs:
            return self.runs[batch.run_id]
        cfg = batch.config
        one_per_process = cfg.placement.agents_per_process == 1 or self.settings.one_agent_per_process
        make = ProcessAgent if one_per_process else GuessPlayer
        if cast is not None and cast.texts and batch.ranges:
            last = max(first + count for first, count in batch.ranges)
            if last > len(cast):
                raise ValueError(f"run {batch.run_id}: {len(cast)} personas for agent ids up to {last - 1}")
        texts = cast.texts if cast is not None and cfg.prompt.persona else None
        agents: list[Agent] = [make(aid, texts[aid] if texts else None) for first, count in batch.ranges
                               for aid in range(first, first + count)]
        game = cfg.game
        note = cast.note if cast is not None else ""
        run = HostedRun(batch.run_id, cfg, agents, system_prompt(game, cfg.prompt, note),
                        answer_schema(game, cfg.prompt.answer))
        self.runs[batch.run_id] = run
        # Agents live for the whole run: move them out of the cyclic GC's generations so
        # each collection during a round does not walk a million long-lived objects.
        gc.collect()
        gc.freeze()
        metrics.AGENTS.set(self.agent_count)
        return run

    def forget(self, run_id: str) -> None:
        run = self.runs.pop(run_id, None)
        gc.unfreeze()  # let the finished run's agents be collected
        metrics.AGENTS.set(self.agent_count)
        if run:
            for a in run.agents:
                if isinstance(a, ProcessAgent):
                    a.stop()

    def start_round(self, opened: RoundOpen, trace_context: Context | None = None) -> None:
        run = self.runs.get(opened.run_id)
        if run is None or opened.round in run.rounds_played:
            return  # not ours, or a replay of a round already played
        run.rounds_played.add(opened.round)
        task = asyncio.get_running_loop().create_task(self.play_round(run, opened, trace_context))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def play_round(self, run: HostedRun, opened: RoundOpen, trace_context: Context | None = None) -> None:
        # One span for this host's share of the round; the batches below are its children.
        # This task's own context: the bound ids appear on every log line of the round.
        structlog.contextvars.bind_contextvars(run_id=run.run_id, round=opened.round, host_id=self.host_id)
        with tracer.start_as_current_span(
                "agent-host.round", context=trace_context,
                attributes={"populace.run_id": run.run_id, "populace.round": opened.round,
                            "populace.host_id": self.host_id, "populace.agents": len(run.agents)}):
            await self._play_round(run, opened)

    async def _play_round(self, run: HostedRun, opened: RoundOpen) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        game = run.config.game
        t0 = time.perf_counter()
        session = InferSession(
            self.nc, run_id=run.run_id, round_=opened.round, model=run.config.model,
            max_value=game.max_value, system=run.system, response_schema=run.schema,
            batch_size=s.infer_batch_size,
            flush_s=s.infer_flush_ms / 1000, timeout_s=max(s.infer_timeout_s, run.config.model.latency_s * 4 + 10),
            attempts=s.infer_attempts, host_id=self.host_id,
        )
        turn = Turn(round=opened.round, history_text=history_text(opened.history, game.history_window),
                    max_value=game.max_value, llm=session, answer=run.config.prompt.answer)
        collector = GuessCollector(self.nc, self.js, run_id=run.run_id, round_=opened.round,
                                   host_id=self.host_id, batch_size=s.guess_batch_size)
        await self._run_turns(run.agents, turn, collector, loop)
        batches = await collector.close()
        metrics.ROUNDS.labels("agent-host").inc()
        p = collector.partial
        log.info("round_played", run_id=run.run_id, round=opened.round, agents=p.n,
                 valid=p.n_valid, infer_batches=session.batches_sent, guess_batches=batches,
                 seconds=round(time.perf_counter() - t0, 3))

    async def _run_turns(self, agents: list[Agent], turn: Turn, collector: GuessCollector,
                         loop: asyncio.AbstractEventLoop) -> None:
        total = len(agents)
        if total == 0:
            return
        limit = min(self.settings.max_in_flight, total)
        finished = loop.create_future()
        state = {"next": 0, "left": total}
        now = loop.time

        async def play(agent: Agent) -> None:
            started = now()
            try:
                value, raw = await agent.reply(turn)
            except Exception as err:  # noqa: BLE001 - a user agent's bug is that agent's invalid answer
                value, raw = None, f"<agent error: {type(err).__name__}: {err}>"
            collector.add(agent.agent_id, value, raw, (now() - started) * 1000.0)

        def launch() -> None:
            i = state["next"]
            if i < total:
                state["next"] = i + 1
                loop.create_task(play(agents[i])).add_done_callback(on_done)

        def on_done(_task: asyncio.Task) -> None:
            state["left"] -= 1
            if state["left"] == 0:
                finished.set_result(None)
            else:
                launch()

        for k in range(limit):
            launch()
            if k % LAUNCH_SLICE == LAUNCH_SLICE - 1:
                await asyncio.sleep(0)
        turn.llm.flush()  # send what is queued now rather than after the flush timer
        await finished
