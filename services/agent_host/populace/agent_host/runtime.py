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

from populace.agent_host import collector
from populace.agent_host.interviews import Interviewer, InterviewFaultReporter
from populace.agent_host.mail import MailCarrier, MailMissing
from populace.agent_host.publisher import OutcomePublisher
from populace.core import checkpoints, logs, metrics
from populace.core.contracts import LivingRef, MailBatch, RoundOpen, RunConfig, SpawnBatch, WorldRef, share_key
from populace.core.settings import Settings
from populace.core.telemetry import tracer
from populace.graph.csr import Graph
from populace.population.cast import Cast
from populace.sdk.hosting import HostedRun, host_run
from populace.sdk.llm import ModelUnavailable
from populace.sdk.nats_llm import InferSession
from populace.sdk.play import RoundPaused
from populace.sdk.population import GONE, Population
from populace.sdk.registry import resolve
from populace.sdk.statejson import StateTypeError
from populace.sdk.world import World

log = logs.get("populace.agent_host")

# An agent's post in its checkpoint (beside its declared state; no state field starts with "__"):
# its text, and its fields as compact sorted JSON (populace.sdk.post.fields_json)
POST_TEXT, POST_FIELDS = "__post_text__", "__post_fields__"

# (run id, round or None, reason, epoch, pause): tell the orchestrator this run cannot go on
# here (pause: not the run's fault, e.g. no model answers; it can resume as it is).
FaultReporter = Callable[[str, int | None, str, int, bool], Awaitable[None]]


class HostRuntime:
    def __init__(self, nc: Client, js: JetStreamContext, settings: Settings,
                 report_fault: FaultReporter | None = None,
                 report_interview_fault: InterviewFaultReporter | None = None) -> None:
        self.nc, self.js, self.settings = nc, js, settings
        self.host_id = settings.host_id
        # run id -> share epoch -> its agents: a host can hold two shares of one run (its own,
        # and a lost host's agents placed on it in a later epoch)
        self.runs: dict[str, dict[int, HostedRun]] = {}
        self.held = 0  # agent_count as of the last spawn or drop: what the heartbeat's thread reads
        self._rounds: dict[tuple[str, int], set[asyncio.Task]] = {}  # by share: cancelled with it
        self._report_fault = report_fault
        self.mail = MailCarrier(nc, js, settings)
        self.interviews = Interviewer(nc, js, settings, self.host_id, report_fault, report_interview_fault)
        self._worlds: dict[str, tuple[WorldRef, World]] = {}  # run id -> the world its last round read
        self._populations: dict[str, tuple[LivingRef, Population]] = {}  # run id -> who is alive, as last read
        # (run id, epoch) -> first agent id of a range -> its checkpoints since its last full one
        self._chains: dict[tuple[str, int], dict[int, checkpoints.Chain]] = {}

    @property
    def agent_count(self) -> int:
        return sum(r.count for shares in self.runs.values() for r in shares.values())

    @property
    def turn_agents(self) -> int:
        """Agents of the runs whose rounds are single turns (no groups): what sizes the collector."""
        return sum(r.count for shares in self.runs.values() for r in shares.values() if r.player.layout is None)

    def key(self, epoch: int) -> str:
        return share_key(self.host_id, epoch)

    def spawn(self, batch: SpawnBatch, config: RunConfig, cast: Cast | None = None,
              graph: Graph | None = None) -> HostedRun:
        """Create this host's share of a run (idempotent: a replayed spawn is a no-op) with the
        run's `config` (the one `batch.config_ref` names). The
        host's shares of the run that the new placement no longer lists (a resume replaced
        them) go first. Raises SimulationError / ValidationError / ValueError when the run
        cannot be hosted."""
        shares = self.runs.get(batch.run_id, {})
        if batch.epoch in shares:
            return shares[batch.epoch]
        for epoch in [e for e in shares if batch.live and self.key(e) not in batch.live]:
            self.drop(batch.run_id, epoch)
        resolved = resolve(config)
        one_per_process = resolved.config.placement.agents_per_process == 1 or self.settings.one_agent_per_process
        run = host_run(resolved, batch.run_id, batch.ranges, cast, one_per_process=one_per_process,
                       max_in_flight=self.settings.max_in_flight, epoch=batch.epoch, graph=graph,
                       scene_idle_s=self.settings.scene_idle_s, slice_s=self.settings.loop_slice_ms / 1000,
                       view_budget_bytes=self.settings.view_budget_bytes)
        self.runs.setdefault(batch.run_id, {})[batch.epoch] = run
        self.held = self.agent_count
        metrics.AGENTS.set(self.held)
        collector.fit_to(self.turn_agents)
        return run

    async def restore(self, run: HostedRun, batch: SpawnBatch) -> None:
        """Set the agents' declared state from the checkpoint the spawn names (resume, fork,
        a lost host's agents), each object checked against the digest its writer reported
        (the spawn carries them from KV `runs`): CheckpointUnverified if one does not match."""
        if batch.restore is None:
            return
        r = batch.restore
        states = await checkpoints.load_agents(self.js, r.run_id, r.round, r.ranges, run.ranges, r.digests, r.writers)
        population = await self.population(run.run_id, r.population) if r.population is not None else None
        run.restore(states, population, r.round)
        plans = self.interviews.planned(run, r.round) if r.run_id == run.run_id else []
        if plans:  # their answers may have been lost with the host that played the round: asked again
            # those who played the round answer (not those departed before it)
            self.interviews.start(run, r.round, sorted((a, st) for a, st in states.items() if st.get(GONE) is not True),
                                  plans)
        if run.mailroom is not None:
            # what the agents read next: every agent's post of that round (the checkpoint of
            # every range holds its agents' posts), not only this share's
            everyone = await checkpoints.load_agents(self.js, r.run_id, r.round, r.ranges, r.ranges, r.digests,
                                                     r.writers)
            box = run.mailroom.box(r.round)
            for aid, state in everyone.items():
                text = state.get(POST_TEXT)
                if text is not None:
                    box.put_json(aid, None, text, state.get(POST_FIELDS) or "{}")  # type: ignore[arg-type]
            run.mailroom.restored.add(r.round)

    def drop(self, run_id: str, epoch: int) -> None:
        """One share goes: its round in play stops at once, its agents are freed."""
        for task in self._rounds.pop((run_id, epoch), set()):
            task.cancel()
        shares = self.runs.get(run_id, {})
        run = shares.pop(epoch, None)
        self._chains.pop((run_id, epoch), None)
        self.mail.forget(run_id, epoch)
        if not shares:
            self.runs.pop(run_id, None)
            self._worlds.pop(run_id, None)
            self._populations.pop(run_id, None)
        gc.unfreeze()  # let the share's agents be collected
        self.held = self.agent_count
        metrics.AGENTS.set(self.held)
        collector.fit_to(self.turn_agents)
        if run:
            run.stop()
            del run
            # The share's agents and what its rounds left are held in reference cycles, which
            # only a full collection frees; at this host's thresholds (app.py) that may come much
            # later, so whatever the host does next (a post-hoc interview, the next run) would
            # grow it on top of a run it no longer holds. Measured on 200,000 agents: 419 MB
            # resident after the share went, 137 MB after this collection.
            gc.collect()

    def forget(self, run_id: str, up_to_epoch: int | None = None) -> None:
        """A run stopped: every share of it (up to `up_to_epoch`: a newer one is a resume's)."""
        for epoch in list(self.runs.get(run_id, {})):
            if up_to_epoch is None or epoch <= up_to_epoch:
                self.drop(run_id, epoch)

    def hosts(self, opened: RoundOpen) -> bool:
        """Whether this host plays agents of the announced run."""
        return bool(self.runs.get(opened.run_id))

    def start_round(self, opened: RoundOpen, trace_context: Context | None = None) -> None:
        """Play the round with each share the open lists (once per share); a share an open of a
        newer placement no longer lists was replaced: it goes."""
        for epoch, run in list(self.runs.get(opened.run_id, {}).items()):
            if self.key(epoch) not in opened.shares:
                if epoch < opened.epoch:
                    self.drop(opened.run_id, epoch)
                continue
            if run.mailroom is not None and opened.ranges:
                known = run.placements.get(opened.round)
                if known is None or known[0] <= opened.epoch:
                    run.placements[opened.round] = (opened.epoch, {k: list(v) for k, v in opened.ranges.items()})
                if opened.round in run.mailroom.played:
                    # announced again after a re-placement: the new shares need this round's posts
                    self._spawn_task(run, self.mail.send(run, opened.round))
            if opened.round in run.rounds_played:
                continue  # a replay, or the round announced again for other shares
            run.rounds_played.add(opened.round)
            task = asyncio.get_running_loop().create_task(self.play_round(run, opened, trace_context))
            tasks = self._rounds.setdefault((opened.run_id, epoch), set())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def _spawn_task(self, run: HostedRun, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks = self._rounds.setdefault((run.run_id, run.epoch), set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def receive_mail(self, batch: MailBatch, subject: str) -> str | None:
        """A share's posts for one of this host's shares (why it is refused, or None)."""
        return self.mail.receive(self.runs, batch, subject)

    async def play_round(self, run: HostedRun, opened: RoundOpen, trace_context: Context | None = None) -> None:
        # One span for this host's share of the round; the batches below are its children.
        # This task's own context: the bound ids appear on every log line of the round.
        structlog.contextvars.bind_contextvars(run_id=run.run_id, round=opened.round, host_id=self.host_id)
        with tracer.start_as_current_span(
                "agent-host.round", context=trace_context,
                attributes={"populace.run_id": run.run_id, "populace.round": opened.round,
                            "populace.host_id": self.host_id, "populace.agents": run.count}):
            try:
                await self._play_round(run, opened)
            except asyncio.CancelledError:
                log.info("round_cancelled", run_id=run.run_id, round=opened.round)
                raise
            except MailMissing as err:  # the bus lost posts: pause; a resume rebuilds inboxes from checkpoints
                reason = f"round {opened.round}: {err}; `populace resume {run.run_id}` continues"
                log.error("mail_missing", error=reason)
                if self._report_fault is not None:
                    await self._report_fault(run.run_id, opened.round, reason, run.epoch, True)
            except RoundPaused as err:  # the simulation broke a rule (a scene, an edit): pause, resumable once fixed
                reason = f"{err}; fix the simulation, then `populace resume {run.run_id}`"
                log.error("scene_failed", error=reason)
                if self._report_fault is not None:
                    await self._report_fault(run.run_id, opened.round, reason, run.epoch, True)
            except checkpoints.CheckpointError as err:  # a checkpoint, world or partial object the store
                # refused (full) or that cannot be read: the store's fault, never the simulation's
                reason = f"round {opened.round}: {err}; `populace resume {run.run_id}` continues"
                log.error("checkpoint_unusable", error=reason)
                if self._report_fault is not None:
                    await self._report_fault(run.run_id, opened.round, reason, run.epoch, True)
            except ModelUnavailable as err:  # the model path is down: pause, record nothing as answers
                reason = f"round {opened.round}: {err}; `populace resume {run.run_id}` continues once a model answers"
                log.error("model_unavailable", error=reason)
                if self._report_fault is not None:
                    await self._report_fault(run.run_id, opened.round, reason, run.epoch, True)
            except Exception as err:
                reason = (f"simulation {run.resolved.config.simulation!r} failed on {self.host_id} in round "
                          f"{opened.round}: {err}")
                log.error("round_failed", error=reason)
                if self._report_fault is not None:
                    await self._report_fault(run.run_id, opened.round, reason, run.epoch, False)

    async def _play_round(self, run: HostedRun, opened: RoundOpen) -> None:
        s = self.settings
        model = run.resolved.config.model
        t0 = time.perf_counter()
        publisher = OutcomePublisher(self.nc, self.js, run_id=run.run_id, round_=opened.round, host_id=self.host_id,
                                     epoch=run.epoch)
        session = InferSession(
            self.nc, run_id=run.run_id, round_=opened.round, model=model, system=run.sim.request_system_prompt(),
            response_schema=run.sim.request_schema(), batch_size=s.infer_batch_size,
            flush_s=s.infer_flush_ms / 1000, timeout_s=max(s.infer_timeout_s, model.latency_s * 4 + 10),
            attempts=s.infer_attempts, host_id=self.host_id, silence_s=s.infer_silence_s, down_s=s.infer_down_s,
            on_worked_on=publisher.worked_on, models=run.resolved.config.models, model_of=run.models,
            # a scene's stage asks every member the same question after what each saw: that end
            # travels once per batch, as an interview's question does. Single turns keep their prompts
            # whole: finding and cutting the end cost the hosts 0.3-0.4 s of CPU each in a 1M-agent
            # round of single turns and saved the gateway and nats-server nothing measurable.
            shared_suffix=run.player.scenes,
        )
        room = run.mailroom
        with self.interviews.round_in_play():  # no interview answer starts until the partial is out
            if room is not None:
                await self.mail.ready(run, opened.round)
            if opened.population is not None:  # the departed go, the newcomers placed here come
                run.apply(await self.population(run.run_id, opened.population),
                          opened.ranges.get(self.key(run.epoch), run.ranges))
            share = await run.engine.play(opened.round, opened.observation, opened.selection, session,
                                          emit=publisher.emit, batch_size=s.outcome_batch_size,
                                          world=await self.world_of(run, opened), prototypes=opened.prototypes)
            mails = (0, 0, 0)
            if room is not None:
                room.played.add(opened.round)
                mails = await self.mail.send(run, opened.round)
            played = time.perf_counter()
            saved = await self.checkpoint(run, opened.round) if s.checkpoints else []
            # interviews planned after the round answer from its end state, frozen before the
            # partial lets the next round start
            plans = self.interviews.planned(run, opened.round)
            frozen = await self.interviews.freeze(run) if plans else ()
            # The partial goes out last: a round that closes is a round whose checkpoints exist
            # (their digests ride in it, so a restore can tell them from a rewrite).
            await publisher.close(share, session.usage(), checkpoints={c.name: c.digest for c in saved},
                                  interviews=self.interviews.take(run))
        if plans:
            self.interviews.start(run, opened.round, frozen, plans)
        if room is not None:
            room.forget_before(opened.round)
        metrics.ROUNDS.labels("agent-host").inc()
        metrics.ROUND_SECONDS.labels("agent-host").observe(time.perf_counter() - t0)
        metrics.RETRIES.labels("agent-host").inc(session.infra_retries)
        log.info("round_played", run_id=run.run_id, round=opened.round, agents=share.n, valid=share.n_valid,
                 infer_batches=session.batches_sent, infra_retries=session.infra_retries, llm_calls=session.llm_calls,
                 tokens=session.prompt_tokens + session.completion_tokens, outcome_batches=share.batches,
                 mail_messages=mails[0], mail_posts=mails[1], mail_bytes=mails[2],
                 checkpoint_bytes=sum(c.size for c in saved),
                 checkpoint_seconds=round(time.perf_counter() - played, 3),
                 seconds=round(time.perf_counter() - t0, 3))

    async def world_of(self, run: HostedRun, opened: RoundOpen) -> World | None:
        """The world the announced round plays in: read once per world by the reference the
        announcement carries (checked against its digest), kept while the next rounds name it."""
        ref, cls = opened.world, run.env.World
        if ref is None or cls is None:
            return None  # no world, or the first round's (every share starts it itself)
        kept = self._worlds.get(run.run_id)
        if kept is not None and kept[0] == ref:
            return kept[1]
        world = cls.from_bytes(await checkpoints.load_world(self.js, ref))
        self._worlds[run.run_id] = (ref, world)  # one per run: the previous round's goes
        return world

    async def population(self, run_id: str, ref: LivingRef) -> Population:
        """Who is alive, by the reference a round's announcement (or a restore) carries: read
        once per reference, checked against its digest."""
        kept = self._populations.get(run_id)
        if kept is not None and kept[0] == ref:
            return kept[1]
        population = Population.from_bytes(await checkpoints.load_population(self.js, ref))
        self._populations[run_id] = (ref, population)
        return population

    async def checkpoint(self, run: HostedRun, round_: int) -> list[checkpoints.Stored]:
        """The agents' declared state after `round_`, one object per range: only the agents that
        acted since the range's previous checkpoint (a delta on it), or every agent when a full
        one is due (checkpoints.Chain.full_due). Returns each object's name, size and digest."""
        s = self.settings
        chains = self._chains.setdefault((run.run_id, run.epoch), {})
        changed = run.take_changed()
        box = run.mailroom.box(round_) if run.mailroom is not None else None
        round_fields = (POST_TEXT, POST_FIELDS) if box is not None else ()
        # each range's chain on its own: one whose deltas outgrew its base (or with no base yet: a
        # range of newcomers) is written whole, the others as deltas
        due = {first for first, _ in run.ranges if chains.setdefault(first, checkpoints.Chain()).full_due(
            s.checkpoint_full_every, s.checkpoint_delta_ratio)}
        full = changed is None or len(due) == len(run.ranges)
        try:
            return await self._save(run, round_, chains, None if full else changed, box, round_fields,
                                    full_ranges=due)
        except StateTypeError as err:  # the simulation's agents hold what no checkpoint keeps: resumable once fixed
            run.changed = None
            raise RoundPaused(f"simulation {run.resolved.config.simulation!r}: round {round_}: its agents' state "
                              f"cannot be checkpointed: {err}") from err
        except BaseException:
            run.changed = None  # what this round changed may not be stored: the next checkpoint is full
            raise

    async def _save(self, run: HostedRun, round_: int, chains: dict[int, checkpoints.Chain],
                    changed: set[int] | None, box, round_fields: tuple[str, ...],
                    full_ranges: set[int] = frozenset()) -> list[checkpoints.Stored]:  # type: ignore[assignment]
        stored = []
        if changed is None:  # every range at once (after a restore, or every chain due)
            parts = await run.snapshot()
        else:
            parts = await run.snapshot_of(changed, full=full_ranges)
        for first, count, full, rows, columns, marks in parts:
            if box is not None:  # their posts: what a replacement or a resume gives the next round to read
                if rows is None:
                    columns[POST_TEXT] = box.texts[first:first + count]
                    columns[POST_FIELDS] = box.bodies[first:first + count]
                else:
                    columns[POST_TEXT] = [box.texts[first + o] for o in rows]
                    columns[POST_FIELDS] = [box.bodies[first + o] for o in rows]
            chain = chains.setdefault(first, checkpoints.Chain())
            saved = await checkpoints.save_agents(self.js, run.run_id, round_, first, count, columns,
                                                  writer=self.host_id, changed=None if full else rows, chain=chain,
                                                  round_fields=round_fields, held=rows if full else None,
                                                  marks=marks)
            chain.add(saved, full=full)
            stored.append(saved)
        return stored
