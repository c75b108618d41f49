"""agent-host service: spawn and round-open events in, turns played by HostRuntime.

Run with `populace service agent-host` or
`faststream run populace.agent_host.app:faststream_app --factory`."""

from __future__ import annotations

import asyncio
import os
import time

from faststream import FastStream
from faststream.nats.annotations import NatsMessage
from pydantic import ValidationError

from populace.agent_host import collector
from populace.agent_host.runtime import HostRuntime
from populace.core import bus, checkpoints, objects, runconfigs, subjects, telemetry
from populace.core.contracts import (
    HostInfo,
    HostSpawned,
    InferBatch,
    InterviewBatch,
    InterviewOrder,
    MailBatch,
    OutcomeBatch,
    Progress,
    RoundOpen,
    RoundPartial,
    RunConfig,
    RunDone,
    RunFault,
    SpawnBatch,
)
from populace.core.scenario import format_validation_error
from populace.core.service import Refused, Service
from populace.core.settings import Settings
from populace.graph.config import GraphError
from populace.graph.csr import Graph
from populace.graph.store import get_graph
from populace.population.by_digest import ByDigest
from populace.population.cast import Cast, cast_from_jsonl
from populace.population.errors import PopulationError
from populace.sdk.registry import resolve
from populace.sdk.simulation import SimulationError

DESCRIPTION = ("Hosts many agents per process (or one agent per OS process) for any simulation and "
               "plays their turns; publishes outcome batches, one partial per round, and faults.")


class AgentHost:
    """The service's state: one per process, built by `create`."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.host_id = svc.settings.host_id
        self.runtime: HostRuntime | None = None
        self.heartbeat: bus.ThreadHeartbeat | None = None
        # by personas digest: one population kept in memory, fetched and parsed once however
        # many spawns and interviews ask for it (at once too)
        self.casts: ByDigest[Cast] = ByDigest(limit=1)
        self.graphs: dict[str, Graph] = {}  # by graph digest: one graph kept in memory

    async def start(self) -> None:
        collector.fit_to(0)  # sized to the agents held on every spawn and drop (collector.py)
        svc = self.svc
        runtime = self.runtime = HostRuntime(svc.nc, svc.js, svc.settings, report_fault=self.report_fault,
                                             report_interview_fault=self.report_interview_fault)
        started = time.time()
        # From a thread of its own (its own loop and connection): the simulation's code can hold
        # this process's loop for as long as it likes, the host stays registered, and its entry
        # says how long the loop has been held (a host is lost only when it is).
        self.heartbeat = bus.ThreadHeartbeat(
            svc.settings.nats_url, subjects.HOSTS_BUCKET, self.host_id,
            lambda busy_s: HostInfo(host_id=self.host_id, capacity=svc.settings.host_capacity,
                                    agents=runtime.held, pid=os.getpid(), started_at=started,
                                    heartbeat_at=time.time(), loop_busy_s=busy_s),
            svc.settings.heartbeat_s, name=f"populace-agent-host-{self.host_id}-heartbeat",
            connect_kw=bus.credentials(svc.settings),
        )
        await self.heartbeat.start()

    async def stop(self) -> None:
        if self.heartbeat:
            await self.heartbeat.stop()
        if self.runtime:
            self.runtime.interviews.cancel_all()
            for rid in list(self.runtime.runs):
                self.runtime.forget(rid)

    async def report_fault(self, run_id: str, round_: int | None, reason: str, epoch: int = 0,
                           pause: bool = False) -> None:
        await bus.publish_js(self.svc.js, subjects.run_fault(run_id, self.host_id),
                             RunFault(run_id=run_id, source=self.host_id, round=round_, reason=reason, pause=pause,
                                      epoch=epoch),
                             msg_id=subjects.msg_id(run_id, round_ or 0, self.host_id, "fault", epoch))

    async def report_interview_fault(self, run_id: str, round_: int, request: str, reason: str) -> None:
        """This host cannot answer its order of post-hoc interview `request`: the interview fails
        (the orchestrator says so to whoever asked), not the run."""
        await bus.publish_js(self.svc.js, subjects.run_fault(run_id, self.host_id),
                             RunFault(run_id=run_id, source=self.host_id, round=round_, reason=reason,
                                      request=request),
                             msg_id=subjects.msg_id(run_id, round_, f"{self.host_id}-{request}", "fault"))

    async def load_cast(self, config: RunConfig) -> Cast | None:
        """The run's personas, read once per file from the object store (cached by digest: a
        sweep reuses one population across many runs)."""
        pop = config.population
        if pop is None or pop.digest is None:
            return None
        digest = pop.digest

        async def parsed() -> Cast:
            data = await objects.get_personas(self.svc.js, digest)
            return await asyncio.to_thread(cast_from_jsonl, data, f"personas {digest[:12]}")

        return await self.casts.get(digest, parsed)

    async def load_graph(self, config: RunConfig) -> Graph | None:
        """The run's graph, read once per digest from the object store (checked against it)."""
        ref = config.graph
        if ref is None:
            return None
        if ref.digest is None:
            raise ValueError("the run has a graph: but it was never built and uploaded (no digest): "
                             "submit it with populace run / the client, which build it")
        if ref.digest not in self.graphs:
            self.graphs.clear()
            self.graphs[ref.digest] = await get_graph(self.svc.js, ref.digest)
        return self.graphs[ref.digest]

    async def on_spawn(self, batch: SpawnBatch) -> None:
        """This host's agents of a run, as id ranges (personas and config by reference: the
        config read by its digest once per run, and kept for the round opens that name it)."""
        t0 = time.perf_counter()
        try:
            config = await runconfigs.fetch(self.svc.js, batch.run_id, batch.config_ref)
            cast = await self.load_cast(config)
            graph = await self.load_graph(config)
            run = self.runtime.spawn(batch, config, cast, graph)  # type: ignore[union-attr]
            await self.runtime.restore(run, batch)  # type: ignore[union-attr]
        except (objects.BlobError, PopulationError, SimulationError, ValueError, checkpoints.CheckpointError,
                GraphError, runconfigs.ConfigUnavailable) as err:
            detail = format_validation_error(err) if isinstance(err, ValidationError) else str(err)
            reason = f"agent-host {self.host_id} cannot host run {batch.run_id}: {detail}"
            self.svc.log.error("spawn_failed", run_id=batch.run_id, error=reason)
            self.runtime.drop(batch.run_id, batch.epoch)  # type: ignore[union-attr]
            # A checkpoint or config that cannot be read is not the run's fault: it pauses, naming it.
            await self.report_fault(batch.run_id, None, reason, batch.epoch,
                                    pause=isinstance(err, (checkpoints.CheckpointError, runconfigs.ConfigUnavailable)))
            return
        seconds = time.perf_counter() - t0
        self.svc.log.info("agents_spawned", run_id=batch.run_id, agents=len(run.agents),
                          simulation=config.simulation, seconds=round(seconds, 3),
                          one_per_process=config.placement.agents_per_process == 1)
        await bus.publish_js(
            self.svc.js, subjects.run_spawned(batch.run_id, self.host_id),
            HostSpawned(run_id=batch.run_id, host_id=self.host_id, agents=len(run.agents), seconds=seconds,
                        epoch=batch.epoch),
            msg_id=subjects.msg_id(batch.run_id, 0, self.host_id, "spawned", batch.epoch),
        )

    async def on_round_open(self, opened: RoundOpen, msg: NatsMessage) -> None:
        """A round opens: this host plays its agents' turns (in a task of its own), once the
        announcement is checked against the run's state (a forged one is dead-lettered)."""
        if not self.runtime.hosts(opened):  # type: ignore[union-attr]
            return  # a run this host plays no agent of: nothing to check
        why = await bus.open_refusal(self.svc.js, opened)
        if why is not None:
            raise Refused(why)  # dead-lettered once by the service
        if not await self.configure(opened):
            return
        self.runtime.start_round(opened, telemetry.extract(msg.headers))  # type: ignore[union-attr]

    async def configure(self, opened: RoundOpen) -> bool:
        """The run's config as the announced round names it: the spawn's, or (a config changed
        from this round on) read by its digest and resolved once. One that cannot be read pauses
        the run, like a world that cannot: an infrastructure fault, never the agents' answer."""
        rid = opened.run_id
        try:
            config = await runconfigs.announced(self.svc.js, opened)
            if config is None:
                return True  # an older announcement: its rounds are played, or not this host's to play
            for run in self.runtime.runs.get(rid, {}).values():  # type: ignore[union-attr]
                if run.resolved.config is not config and run.resolved.config != config:
                    run.resolved = resolve(config)
        except (runconfigs.ConfigUnavailable, SimulationError, ValidationError) as err:
            detail = format_validation_error(err) if isinstance(err, ValidationError) else str(err)
            reason = f"agent-host {self.host_id} cannot play round {opened.round} of run {rid}: {detail}"
            self.svc.log.error("config_unavailable", run_id=rid, round=opened.round, error=reason)
            await self.report_fault(rid, opened.round, reason, opened.epoch, pause=True)
            return False
        return True

    async def on_mail(self, batch: MailBatch, msg: NatsMessage) -> None:
        """Another share's posts for one of this host's shares (a forged sender: dead-lettered)."""
        why = self.runtime.receive_mail(batch, msg.raw_message.subject)  # type: ignore[union-attr]
        if why is not None:
            raise Refused(why)

    async def on_ask(self, order: InterviewOrder) -> None:
        """A post-hoc interview's order (placed by the orchestrator): this host's ranges answer
        it from the round's checkpoint, in a task of its own (spawns and rounds go on)."""
        self.runtime.interviews.order(order, self.load_cast)  # type: ignore[union-attr]

    async def on_done(self, done: RunDone) -> None:
        """A run stopped (completed, failed, cancelled, paused): its round in play stops, its
        agents go (not those of a resume that already placed them again), and the registry hears
        of the room they leave at once: a run started as this one ends is placed on it."""
        held = self.runtime.agent_count  # type: ignore[union-attr]
        self.runtime.forget(done.run_id, up_to_epoch=done.epoch)  # type: ignore[union-attr]
        if self.heartbeat and self.runtime.agent_count != held:  # type: ignore[union-attr]
            await self.heartbeat.beat_now()
        if not self.runtime.runs.get(done.run_id):  # type: ignore[union-attr]
            runconfigs.CACHE.forget(done.run_id)
        if done.status != "completed":  # a completed run's interviews go on: the recorder waits for them
            self.runtime.interviews.cancel(done.run_id)  # type: ignore[union-attr]
        else:  # no more rounds: they go at full speed
            self.runtime.interviews.ended(done.run_id)  # type: ignore[union-attr]


def create(settings: Settings | None = None) -> Service:
    svc = Service("agent-host", settings, DESCRIPTION)
    host = AgentHost(svc)
    svc.instance = f"{svc.name}.{host.host_id}"  # a host's own NATS user writes only this key
    svc.on_ready(host.start)
    svc.on_stop(host.stop)
    # no_reply: these are JetStream-published events whose reply subject is the publisher's
    # PubAck inbox; an (empty) handler reply there would race the server's real acknowledgement.
    svc.handle(subjects.any_spawn_for(host.host_id), SpawnBatch, no_reply=True)(host.on_spawn)
    svc.handle(subjects.ANY_ROUND_OPEN, RoundOpen, no_reply=True)(host.on_round_open)
    svc.handle(subjects.ANY_RUN_DONE, RunDone, no_reply=True)(host.on_done)
    svc.handle(subjects.any_mail_for(host.host_id), MailBatch, no_reply=True)(host.on_mail)
    svc.handle(subjects.any_ask_for(host.host_id), InterviewOrder, no_reply=True)(host.on_ask)
    svc.publishes(subjects.ANY_SPAWNED, HostSpawned, "this host created its agents of a run")
    svc.publishes(subjects.ANY_OUTCOMES, OutcomeBatch, "~1,000 agents' outcomes of a round, columnar")
    svc.publishes(subjects.ANY_MAIL, MailBatch, "posts of a round for another share's agents (a run with a graph)")
    svc.publishes(subjects.ANY_INTERVIEWS, InterviewBatch, "answers to interviews asked after a round, in batches")
    svc.publishes(subjects.ANY_PARTIAL, RoundPartial, "this host's reduced round, after all its outcomes are stored")
    svc.publishes(subjects.ANY_FAULT, RunFault, "this host cannot host the run or its simulation failed")
    svc.publishes(subjects.ANY_PROGRESS, Progress, "core NATS, not stored: outcomes answered so far")
    svc.publishes(subjects.ANY_LLM_INFER, InferBatch, "request/reply to the gateways' queue group, as this "
                  "host's NATS user; answered on its own reply.gateway.<user>.…")
    return svc


def faststream_app() -> FastStream:
    """For FastStream's own CLI: `faststream run|docs gen <this module>:faststream_app --factory`."""
    return create().app
