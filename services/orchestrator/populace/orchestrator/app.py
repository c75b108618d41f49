"""orchestrator service: `ctl.run.start` in; placement, round pacing and run state (KV `runs`,
compare-and-swap) out. Rounds are the backpressure gate: round n+1 opens only after round
n's result. It loads each run's simulation by name only to check its parameters, keep its
groups whole on one host and tell the recorder its tables; it plays nothing.

Run with `populace service orchestrator` or
`faststream run populace.orchestrator.app:faststream_app --factory`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import numpy as np
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import JStream
from faststream.nats.annotations import NatsMessage
from nats.js.api import DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from opentelemetry import trace
from opentelemetry.trace import Span
from pydantic import ValidationError

from populace.core import bus, checkpoints, metrics, runconfigs, subjects, telemetry
from populace.core.contracts import (
    AskedShare,
    Asking,
    ConfigRef,
    HostInfo,
    HostSpawned,
    InterviewOrder,
    InterviewPlaced,
    InterviewRequest,
    InterviewsRecorded,
    Progress,
    Restore,
    RoundOpen,
    RoundResult,
    RunCancel,
    RunDone,
    RunFault,
    RunResume,
    RunResumed,
    RunStart,
    RunStarted,
    RunState,
    SpawnBatch,
)
from populace.core.placement import PlacementError, bounded, place
from populace.core.scenario import format_validation_error
from populace.core.service import Refused, Service, control_pull
from populace.core.settings import Settings
from populace.core.telemetry import tracer
from populace.orchestrator import interviews, placing, workflow
from populace.population.living import ChangeError, Population
from populace.sdk.registry import Resolved, resolve
from populace.sdk.simulation import SimulationError

DESCRIPTION = ("Accepts runs, places agents on agent-hosts (keeping a simulation's groups whole), "
               "paces rounds and keeps each run's state.")
HOST_WAIT_S = 10.0  # how long a run start waits for a first agent-host to register


class Orchestrator:
    def __init__(self, svc: Service) -> None:
        self.svc = svc
        # Open spans: "<rid>" is the run (the trace's root), "<rid>.<n>" its rounds.
        self.spans: dict[str, Span] = {}
        # Runs this orchestrator placed (or adopted after a restart) and has not finished, with
        # their hosts: those hosts are watched.
        self.watched: dict[str, set[str]] = {}
        self.watch_task: asyncio.Task | None = None
        self.progress_at: dict[str, float] = {}  # run id -> last progress tick that counted (time.monotonic)
        self.ticks: dict[str, workflow.RoundTicks] = {}  # run id -> its round in play's ticks so far
        self.units: dict[str, int] = {}  # run id -> agents that must stay on one host (a group)
        # run id -> (round in play, time.monotonic() of its first announcement): the round's time
        self.round_opened: dict[str, tuple[int, float]] = {}
        self.stored_configs: set[tuple[str, ConfigRef]] = set()  # (run id, config) in the object store
        self.stopping: set[tuple[str, int]] = set()  # (run id, epoch) whose RunDone is being published
        # Runs with post-hoc interviews in flight (RunState.asking), with those interviews' hosts:
        # watched like a running run's, so a lost host's part is ordered from another.
        self.asking: dict[str, set[str]] = {}
        self.progress_sub = None
        metrics.RUNS_ACTIVE.set_function(lambda: len(self.watched))  # read at scrape time only

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        # Core NATS ticks (one per outcome batch): a round that makes progress is not stalled.
        self.progress_sub = await self.svc.nc.subscribe(subjects.ANY_PROGRESS, cb=self.on_progress)
        self.watch_task = asyncio.create_task(self.watch_hosts())

    async def on_progress(self, msg) -> None:
        """A tick moves the round's deadline only if it comes from a host of the run's live
        shares, for the round in play, within that host's agents (workflow.RoundTicks); a
        refused one is dead-lettered, naming its sender."""
        parts = msg.subject.split(".")
        rid = parts[1] if len(parts) == 4 else ""
        ticks = self.ticks.get(rid)
        if rid not in self.watched or ticks is None:
            return  # a run this orchestrator does not pace (finished, or not yet playing)
        try:
            tick = Progress.model_validate_json(msg.data)
        except ValidationError as err:
            return await self.svc.dead_letter(msg, err, terminate=False)
        taken = ticks.take(msg.subject, tick)
        if taken is True:
            self.progress_at[rid] = time.monotonic()
        elif taken is not False:
            await self.svc.dead_letter(msg, f"progress refused from {parts[3]}: {taken}", terminate=False)

    async def stop(self) -> None:
        if self.watch_task:
            self.watch_task.cancel()
        if self.progress_sub is not None:
            await self.progress_sub.unsubscribe()

    async def adopt_unfinished_runs(self) -> None:
        """After a restart: watch the runs KV says are still spawning or running, and publish the
        stops decided but not said (the orchestrator before died between the two)."""
        for state in await bus.registry_entries(self.svc.js, subjects.RUNS_BUCKET, RunState):
            if workflow.unannounced_stop(state) is not None:
                try:
                    await self.announce_stop(state)
                except Exception as err:  # said again by its next event or the next start; the others are adopted
                    self.svc.log.warning("stop_announce_failed", run_id=state.run_id, error=str(err))
            if state.status in ("spawning", "running"):
                self.watched[state.run_id] = set(state.placement)
            if state.status == "running":
                self.ticks[state.run_id] = workflow.RoundTicks.of(state)
            if state.asking:
                self.asking[state.run_id] = {sh.host_id for a in state.asking for sh in a.shares}
        if self.watched or self.asking:
            self.svc.log.info("runs_adopted", runs=sorted(self.watched), interviews=sorted(self.asking))

    async def watch_hosts(self) -> None:
        """Every heartbeat, for each watched run: place again the shares of hosts that stopped
        heartbeating (or restarted), and announce again — then pause — a round without
        progress past its deadline. A host counts as stopped only when a complete registry
        read says so on two beats in a row: a failed read (a NATS leader election) proves
        nothing and is skipped."""
        settings = self.svc.settings
        silent_s = settings.host_lost_s
        try:
            await self.adopt_unfinished_runs()
        except Exception as err:
            self.svc.log.warning("runs_adopt_failed", error=str(err))
        missing: dict[str, int] = {}  # host id -> consecutive beats it was seen stale or absent
        while True:
            await asyncio.sleep(settings.heartbeat_s)
            if not self.watched and not self.asking:
                missing.clear()
                continue
            try:
                fresh, _ = bounded(await bus.registry_entries(self.svc.js, subjects.HOSTS_BUCKET, HostInfo,
                                                              fresh_within_s=silent_s, strict=True),
                                   settings.host_capacity_max)
            except Exception as err:
                self.svc.log.warning("host_watch_read_failed", error=str(err))
                continue
            up = {h.host_id for h in fresh}
            placed = set().union(*self.watched.values(), *self.asking.values())
            missing = {h: missing.get(h, 0) + 1 for h in placed if h not in up}
            live = up | {h for h, beats in missing.items() if beats < 2}
            for rid in list(self.watched):
                try:
                    await self.advance(rid, lambda s, fresh=fresh, live=live: self.check(s, fresh, live))
                except Refused:  # its state is gone: nothing left to watch
                    self.watched.pop(rid, None)
                except Exception as err:
                    self.svc.log.warning("host_watch_failed", run_id=rid, error=str(err))
            for rid in list(self.asking):
                try:
                    await self.watch_interviews(rid, fresh, live)
                except Refused:
                    self.asking.pop(rid, None)
                except Exception as err:
                    self.svc.log.warning("interview_watch_failed", run_id=rid, error=str(err))

    async def watch_interviews(self, rid: str, fresh: list[HostInfo], live: set[str]) -> None:
        """One beat over a run's post-hoc interviews in flight: those recorded are watched no
        more, a lost host's part is ordered from a living host (interviews.on_beat)."""
        state = await bus.run_state(self.svc.js, rid)
        if state is None or not state.asking:
            self.asking.pop(rid, None)
            return
        recorded = {a.request for a in state.asking
                    if await bus.last_on(self.svc.js, subjects.RUN_STREAM, subjects.run_interviewed(rid, a.request),
                                         InterviewsRecorded) is not None}
        decided: list[RunState] = []

        def decide(s: RunState) -> tuple[RunState, list]:
            new, actions = interviews.on_beat(s, fresh, live, recorded, self.svc.settings.host_lost_s)
            decided[:] = [new]
            return new, actions

        await self.advance(rid, decide)
        hosts = {sh.host_id for a in decided[0].asking for sh in a.shares} if decided else set()
        if decided and not decided[0].asking:
            self.asking.pop(rid, None)
        elif hosts:
            self.asking[rid] = hosts

    def check(self, state: RunState, hosts: list[HostInfo], live: set[str]) -> tuple[RunState, list]:
        """One watch beat for one run: lost shares first, then the round's deadline."""
        s = self.svc.settings
        new, actions = workflow.on_hosts_lost(state, hosts, live, s.host_lost_s, self.unit_of(state),
                                              s.placement_policy)
        if new is not state:
            return new, actions
        since = max(time.monotonic() - (time.time() - state.phase_at), self.progress_at.get(state.run_id, 0.0))
        deadline = workflow.stall_deadline(state.config, s.infer_timeout_s, s.infer_attempts, s.round_stall_s)
        stalled = time.monotonic() - since
        placed = {sh.host_id for sh in state.shares}
        busy = {h.host_id: h.loop_busy_s for h in hosts if h.host_id in placed and h.loop_busy_s >= deadline / 2}
        return workflow.on_stalled(state, stalled, deadline, busy)

    def unit_of(self, state: RunState) -> int:
        """A simulation's group size (its groups stay whole on one host); 1 without groups."""
        rid = state.run_id
        if rid not in self.units:
            try:
                resolved = resolve(state.config)
                self.units[rid] = resolved.instance(rid).placement_unit()
            except (SimulationError, ValidationError):
                self.units[rid] = 1
        return self.units[rid]

    async def runs_kv(self):
        return await self.svc.js.key_value(subjects.RUNS_BUCKET)

    async def fresh_hosts(self) -> list[HostInfo]:
        """The hosts to place on, each capacity claim capped at POPULACE_HOST_CAPACITY_MAX."""
        s = self.svc.settings
        hosts, over = bounded(await bus.registry_entries(self.svc.js, subjects.HOSTS_BUCKET, HostInfo,
                                                         fresh_within_s=s.registry_ttl_s), s.host_capacity_max)
        for h in over:
            self.svc.log.warning("host_capacity_bounded", host_id=h.host_id, claimed=h.capacity,
                                 bound=s.host_capacity_max)
        return hosts

    def place(self, agents: int, hosts: list[HostInfo], unit: int) -> dict[str, list[tuple[int, int]]]:
        return place(agents, hosts, unit=unit, policy=self.svc.settings.placement_policy)

    async def place_when_possible(self, agents: int,
                                  unit: int) -> tuple[list[HostInfo], dict[str, list[tuple[int, int]]]]:
        """A new or resumed run's hosts and placement, waiting up to HOST_WAIT_S for a first host
        and two heartbeats for room a run that just ended frees (placing.py)."""
        return await placing.place_when_possible(
            self.fresh_hosts, lambda hosts: self.place(agents, hosts, unit),
            hosts_wait_s=HOST_WAIT_S, room_wait_s=2 * self.svc.settings.heartbeat_s)

    # -- handlers -----------------------------------------------------------------------
    async def on_run_start(self, start: RunStart, msg: NatsMessage) -> None:
        """A client asks for a run: check its simulation, place its agents, spawn them. A start
        of a run that exists is one delivered again (its handler died before the ack): nothing
        is decided again, least of all a refusal, which would say `failed` of a running run."""
        rid = start.run_id
        kv = await self.runs_kv()
        try:
            await kv.get(rid)
            self.svc.log.info("run_start_replayed", run_id=rid)
            return
        except KeyNotFoundError:
            pass
        try:
            resolved = resolve(start.config)
            unit = resolved.instance(rid).placement_unit()
        except (SimulationError, ValidationError) as err:
            detail = format_validation_error(err) if isinstance(err, ValidationError) else str(err)
            return await self.reject(rid, f"the orchestrator cannot run it: {detail}")
        cfg = resolved.config
        source = None
        if start.fork is not None:
            try:
                source = await self.fork_source(start)
            except (ValueError, checkpoints.CheckpointError) as err:
                return await self.reject(rid, f"cannot fork: {err}")
        living = source[3].population if source is not None else None
        try:
            # a fork of a population that changed: every id its parent had given by then
            hosts, placement = await self.place_when_possible(living.size if living is not None else cfg.agents, unit)
        except PlacementError as err:
            return await self.reject(rid, str(err))
        self.units[rid] = unit
        incarnations = {h.host_id: h.started_at for h in hosts}
        if source is None:
            state = workflow.new_run(rid, cfg, placement, incarnations)
        else:
            parent, k, digests, env = source
            # the parent's state stays in its checkpoint object: the fork's environment reads it there
            env_state = workflow.state_ref(parent.run_id, k, digests[subjects.checkpoint_env(parent.run_id, k)])
            state = workflow.fork_run(rid, start.config, placement, parent, k, env_state, env.observation,
                                      incarnations, digests, selection=env.selection, world=env.world,
                                      population=env.population, prototypes=env.prototypes)
        try:
            await kv.create(rid, bus.encode(state))
        except Exception:  # created meanwhile by the same start, handled twice at once
            self.svc.log.info("run_start_replayed", run_id=rid)
            return
        runconfigs.CACHE.put(rid, state.config_ref.digest, state.config)  # type: ignore[union-attr]  # validated
        run_span = self.spans[rid] = tracer.start_span(
            "orchestrator.run", context=telemetry.extract(msg.headers),
            attributes={"populace.run_id": rid, "populace.agents": cfg.agents, "populace.rounds": cfg.rounds,
                        "populace.simulation": cfg.simulation})
        self.watched[rid] = set(placement)
        metrics.RUNS.labels("started").inc()
        with trace.use_span(run_span, end_on_exit=False):
            await self.announce(state, resolved, start.manifest)

    async def fork_source(self, start: RunStart) -> tuple[RunState, int, dict[str, str], checkpoints.EnvCheckpoint]:
        """Where a fork starts: its parent's state, the round, that round's checkpoint digests and
        its environment's checkpoint (state, observation, selection, world, who was alive)."""
        kv = await self.runs_kv()
        try:
            entry = await kv.get(start.fork.run_id)
        except KeyNotFoundError:
            raise ValueError(f"run {start.fork.run_id!r} is not known here") from None
        parent = RunState.model_validate_json(entry.value)
        k = start.fork.round
        if k > workflow.completed(parent):
            raise ValueError(f"run {parent.run_id} has completed {workflow.completed(parent)} rounds, "
                             f"not {k}")
        if parent.config.agents != start.config.agents:
            raise ValueError(f"agents: a fork keeps its parent's {parent.config.agents} agents")
        result = None
        if k != workflow.completed(parent) or not parent.checkpoints:
            # an older round's digests are in its result, which only the environment publishes
            result = await bus.last_on(self.svc.js, subjects.RUN_STREAM, subjects.run_round_result(parent.run_id, k),
                                       RoundResult)
        digests = workflow.fork_digests(parent, k, result)
        env = await checkpoints.load_env(self.svc.js, parent.run_id, k, digests)
        return parent, k, digests, env

    async def reject(self, rid: str, reason: str) -> None:
        self.svc.log.warning("run_rejected", run_id=rid, reason=reason)
        await self.finish(rid, workflow.FinishRun("failed", 0, reason))

    async def announce(self, state: RunState, resolved: Resolved, manifest: dict | None = None) -> None:
        rid, cfg = state.run_id, resolved.config
        await bus.publish_js(self.svc.js, subjects.run_started(rid),
                             RunStarted(run_id=rid, config=cfg, started_at=time.time(), hosts=sorted(state.placement),
                                        tables=resolved.tables(), manifest=manifest),
                             msg_id=subjects.msg_id(rid, 0, "orch", "started"))
        await self.spawn(state)
        self.svc.log.info("run_placed", run_id=rid, simulation=cfg.simulation, agents=cfg.agents, rounds=cfg.rounds,
                          hosts={h: sum(c for _, c in r) for h, r in state.placement.items()},
                          fork=state.restore.model_dump() if state.restore else None)

    async def spawn(self, state: RunState, keys: tuple[str, ...] | None = None) -> None:
        """Publish the spawn of the shares named (all of them by default), restored from the
        run's last completed round (a fork: its parent's). A config that cannot be stored (the
        object store is full) pauses the run, naming the store: a resume stores it then."""
        try:
            await self.store_config(state)
        except checkpoints.CheckpointError as err:
            reason = (f"the orchestrator cannot store the run's config: {err}; `populace resume {state.run_id}` "
                      "continues")
            self.svc.log.error("config_not_stored", run_id=state.run_id, error=reason)
            await self.advance(state.run_id, lambda s: workflow.on_pause(s, reason))
            return
        restore = workflow.restore_point(state)
        live = [sh.key for sh in state.shares]
        for sh in state.shares:
            if keys is not None and sh.key not in keys:
                continue
            await bus.publish_js(self.svc.js, subjects.run_spawn(state.run_id, sh.host_id),
                                 SpawnBatch(run_id=state.run_id, host_id=sh.host_id, ranges=sh.ranges,
                                            config_ref=state.config_ref, epoch=sh.epoch, restore=restore,
                                            from_round=sh.from_round, live=live),
                                 msg_id=subjects.msg_id(state.run_id, state.nudged, sh.host_id, "spawn", sh.epoch))

    async def store_config(self, state: RunState) -> None:
        """The run's config where its round opens name it (once per config: its digest is in the
        name), before anything that plays the run is told of it."""
        ref = state.config_ref
        if (state.run_id, ref) not in self.stored_configs:  # type: ignore[comparison-overlap]
            await runconfigs.store(self.svc.js, state.run_id, ref, state.config)  # type: ignore[arg-type]
            self.stored_configs.add((state.run_id, ref))  # type: ignore[arg-type]

    async def on_spawned(self, spawned: HostSpawned) -> None:
        """A host created its agents; the last one opens the first round to play."""
        await self.advance(spawned.run_id, lambda s: workflow.on_spawned(s, spawned.host_id, spawned.epoch))

    async def on_result(self, result: RoundResult) -> None:
        """The environment decided a round: open the next, or finish. Each share's checkpoint
        digests are kept for its own ranges only (checkpoints.recorded)."""
        state = await bus.run_state(self.svc.js, result.run_id)
        if state is not None and state.status == "running" and state.round == result.round:
            _, dropped = checkpoints.recorded(result.run_id, result.round, result.checkpoints,
                                              result.env_checkpoint, {sh.key: sh.ranges for sh in state.shares})
            for why in dropped:
                self.svc.log.warning("checkpoint_digest_refused", run_id=result.run_id, round=result.round, reason=why)
        if round_span := self.spans.pop(f"{result.run_id}.{result.round}", None):
            round_span.set_attributes({"populace.n_valid": result.n_valid})
            round_span.end()
        opened = self.round_opened.get(result.run_id)
        if opened is not None and opened[0] == result.round:
            del self.round_opened[result.run_id]
            metrics.ROUND_SECONDS.labels("orchestrator").observe(time.monotonic() - opened[1])
        await self.advance(result.run_id, lambda s: workflow.on_result(s, result))

    async def on_fault(self, fault: RunFault, msg: NatsMessage) -> None:
        """A service or a placed share cannot go on with a run: fail (or pause) it now, with its
        reason. From anyone else, or claiming another sender: dead-lettered, naming the sender."""
        subject = msg.raw_message.subject
        if fault.request is not None:
            return await self.on_interview_fault(fault, subject)
        why = workflow.fault_refusal(await bus.run_state(self.svc.js, fault.run_id), fault, subject)
        if why is not None:
            raise Refused(f"fault refused from {subject.rsplit('.', 1)[-1]}: {why}")
        self.svc.log.warning("run_fault", run_id=fault.run_id, source=fault.source, reason=fault.reason,
                             pause=fault.pause)
        stop = workflow.on_pause if fault.pause else workflow.on_failure
        await self.advance(fault.run_id, lambda s: stop(s, fault.reason))

    async def on_interview_fault(self, fault: RunFault, subject: str) -> None:
        """A host cannot answer its part of a post-hoc interview: the interview fails (not the
        run), saying why. From a host not ordered to answer it: dead-lettered."""
        sender = subject.rsplit(".", 1)[-1]
        state = await bus.run_state(self.svc.js, fault.run_id)
        why = interviews.fault_refusal(state, fault, subject)
        if why is not None:
            raise Refused(f"fault refused from {sender}: {why}")
        asking = next((a for a in state.asking if a.request == fault.request), None)  # type: ignore[union-attr]
        if asking is None:  # recorded, or failed already (another host's fault)
            self.svc.log.info("interview_fault_late", run_id=fault.run_id, request=fault.request, source=sender,
                              reason=fault.reason)
            return
        await self.give_up_interview(fault.run_id, asking,
                                     f"agent-host {sender} cannot answer interview {asking.request}: {fault.reason}",
                                     host_id=sender)

    async def on_cancel(self, cancel: RunCancel, msg: NatsMessage) -> None:
        """Stop a run at once (its hosts drop the round in play); it can be resumed."""
        request = ctl_request(msg)
        await self.advance(cancel.run_id, lambda s: workflow.on_cancel(s, cancel.reason, request))

    async def on_resume(self, resume: RunResume, msg: NatsMessage) -> None:
        """Continue a failed, cancelled or paused run after its last completed round, on the
        hosts up now."""
        rid, request = resume.run_id, ctl_request(msg)
        kv = await self.runs_kv()
        try:
            state = runconfigs.CACHE.state((await kv.get(rid)).value)
        except KeyNotFoundError:
            raise Refused(f"run {rid} is not known: nothing to resume") from None
        if request is not None and workflow.stale(state, request):  # its asker was answered the first time
            self.svc.log.info("resume_stale", run_id=rid, request_seq=request.seq, applied_seq=state.request_seq)
            return
        why = workflow.resume_refusal(state, resume.budget)
        if why is None:
            try:
                # every agent id given so far (newcomers too, the departed's ranges kept: ids are never reused)
                ids = state.population.size if state.population is not None else state.config.agents
                hosts, placement = await self.place_when_possible(ids, self.unit_of(state))
            except PlacementError as err:
                why = str(err)
        if why is not None:
            return await self.refuse_resume(state, why)
        incarnations = {h.host_id: h.started_at for h in hosts}
        await self.advance(rid, lambda s: workflow.on_resume(s, placement, incarnations, resume.budget, request))

    async def played(self, state: RunState, round_: int, digests: dict[str, str]) -> tuple[np.ndarray, int] | None:
        """In a run whose population changed, the mask of the agents that played round
        `round_` (they answer after it: the living before its changes) and how many ids were
        given by then, from who was alive after it (its environment checkpoint names that);
        None: the run's first agents, all."""
        if state.population is None:
            return None
        env = await checkpoints.load_env(self.svc.js, state.run_id, round_, digests)
        if env.population is None:
            return None
        try:
            population = Population.from_bytes(await checkpoints.load_population(self.svc.js, env.population))
        except ChangeError as err:
            raise checkpoints.CheckpointError(str(err)) from None
        return population.played(round_), env.population.size_in(round_)

    async def on_interview(self, req: InterviewRequest) -> None:
        """A post-hoc interview: checked against the run's state and its round's checkpoint
        (every object there, with the digest recorded when the round closed), then each
        checkpoint range ordered from one agent-host up. Placed or refused, it is said on
        `run.<rid>.asked.<request>`; nothing is asked of a refused one."""
        rid = req.run_id
        state = await bus.run_state(self.svc.js, rid)
        if state is not None and any(a.request == req.request for a in state.asking):
            return  # delivered again once placed: its orders and placement were said before it was watched
        why = interviews.refusal(state, req)
        hosts: dict[str, list[tuple[int, int]]] = {}
        restore = None
        up: list[HostInfo] = []
        played: np.ndarray | None = None
        if why is None:
            k = req.after_round
            try:
                result = None
                if k != workflow.completed(state) or not state.checkpoints:
                    result = await bus.last_on(self.svc.js, subjects.RUN_STREAM, subjects.run_round_result(rid, k),
                                               RoundResult)
                digests = workflow.fork_digests(state, k, result)
                who = await self.played(state, k, digests)
                played = who[0] if who is not None else None
                ranges = workflow.layout_for(state, k, who[1] if who is not None else None)
                writers = workflow.writers_for(state, k)
                await checkpoints.present(self.svc.js, [subjects.checkpoint_agents(rid, k, f) for f, _ in ranges],
                                          writers)
                restore = Restore(run_id=rid, round=k, ranges=ranges, digests=digests, writers=writers)
                why = interviews.absent(req, played)
            except checkpoints.CheckpointError as err:
                why = f"after_round: round {k}'s checkpoint cannot be used: {err}"
        if why is None:
            try:  # where the order names it (a recorded run's may be pruned)
                await self.store_config(state)
            except checkpoints.CheckpointError as err:
                why = f"the run's config cannot be stored: {err}"
        if why is None:
            up = await self.fresh_hosts()
            hosts = interviews.split(restore.ranges, up)
            if not hosts:
                why = "no agent-host is up to answer it"
        placed = InterviewPlaced(run_id=rid, request=req.request, after_round=req.after_round, survey=req.survey,
                                 hosts=hosts, error=why, placed_at=time.time(),
                                 expected=interviews.expected(req, state.config.agents, state.config.seed, played)
                                 if why is None else 0)
        order_seq = 0
        if why is None:
            for host, ranges in hosts.items():
                ack = await bus.publish_js(self.svc.js, subjects.run_ask(rid, host),
                                           InterviewOrder(run_id=rid, host_id=host, request=req.request,
                                                          after_round=req.after_round, survey=req.survey,
                                                          sample=req.sample, agents=req.agents, ranges=ranges,
                                                          restore=restore, config_ref=state.config_ref),
                                           msg_id=f"{rid}.ask.{req.request}.{host}")
                order_seq = order_seq or ack.seq
        await bus.publish_js(self.svc.js, subjects.run_asked(rid, req.request), placed,
                             msg_id=f"{rid}.asked.{req.request}")
        if why is None:  # watched from now on (said first: a redelivery then finds it placed)
            started = {h.host_id: h.started_at for h in up}
            asking = Asking(request=req.request, after_round=req.after_round, expected=placed.expected,
                            order_seq=order_seq, placed_at=placed.placed_at,
                            shares=[AskedShare(host_id=h, ranges=r, incarnation=started.get(h))
                                    for h, r in hosts.items()])
            await self.advance(rid, lambda s: interviews.asked(s, asking))
            self.asking.setdefault(rid, set()).update(hosts)
        self.svc.log.info("interview_placed" if why is None else "interview_refused", run_id=rid,
                          request=req.request, after_round=req.after_round, survey=req.survey.id,
                          hosts={h: sum(c for _, c in r) for h, r in hosts.items()}, expected=placed.expected,
                          reason=why)

    async def order_again(self, state: RunState, action: interviews.OrderAgain) -> None:
        """A lost host's part of a post-hoc interview, ordered from the hosts `action` names: each
        order asks what the interview's first order asks (read back from RUN), of its own ranges."""
        rid = state.run_id
        asking = next(a for a in state.asking if a.request == action.request)
        try:
            first = await bus.until_ready(lambda: self.svc.js.get_msg(subjects.RUN_STREAM, seq=asking.order_seq),
                                          f"interview {action.request}'s order")
            order = InterviewOrder.model_validate_json(first.data or b"")
            if order.run_id != rid or order.request != action.request:
                raise ValueError(f"RUN message {asking.order_seq} is another's")
            for host, ranges in action.hosts.items():
                await bus.publish_js(self.svc.js, subjects.run_ask(rid, host),
                                     order.model_copy(update={"host_id": host, "ranges": ranges,
                                                              "placement": action.placement}),
                                     msg_id=f"{rid}.ask.{action.request}.{host}.p{action.placement}")
        except Exception as err:  # not ordered again: watching it on would wait for nobody
            await self.give_up_interview(rid, asking, f"{action.lost}, and its part could not be ordered again "
                                                     f"({type(err).__name__}: {err})")
            return
        await bus.publish_js(self.svc.js, subjects.run_asked(rid, action.request),
                             InterviewPlaced(run_id=rid, request=action.request, after_round=order.after_round,
                                             survey=order.survey, hosts=asking.hosts, expected=asking.expected,
                                             placed_at=time.time(), placement=action.placement, reason=action.reason),
                             msg_id=f"{rid}.asked.{action.request}.p{action.placement}")
        self.svc.log.warning("interview_placed_again", run_id=rid, request=action.request, reason=action.reason,
                             placement=action.placement,
                             hosts={h: sum(c for _, c in r) for h, r in action.hosts.items()})

    async def give_up_interview(self, rid: str, asking: Asking, reason: str, host_id: str | None = None) -> None:
        """Watch `request` no more and say why it fails (a host's own fault, or an order that
        could not go out)."""
        removed: list[bool] = []

        def decide(s: RunState) -> tuple[RunState, list]:
            new, _ = interviews.failed(s, asking.request, host_id)
            removed[:] = [new is not s]
            return new, []

        await self.advance(rid, decide)
        if removed and removed[0]:
            await self.interview_lost(rid, interviews.InterviewLost(asking.request, asking.after_round, asking.expected,
                                                                    reason))

    async def interview_lost(self, rid: str, action: interviews.InterviewLost) -> None:
        """Say that a post-hoc interview cannot be answered whole (whoever asked stops waiting)."""
        await bus.publish_js(self.svc.js, subjects.run_asked(rid, action.request),
                             InterviewPlaced(run_id=rid, request=action.request, after_round=action.after_round,
                                             expected=action.expected, error=action.reason, placed_at=time.time()),
                             msg_id=f"{rid}.asked.{action.request}.failed")
        self.svc.log.error("interview_failed", run_id=rid, request=action.request, reason=action.reason)

    async def refuse_resume(self, state: RunState, why: str) -> None:
        """Say so on the run's done subject (its state stays as it was): whoever asked stops
        waiting, with the reason."""
        reason = f"resume refused: {why}"
        self.svc.log.warning("resume_refused", run_id=state.run_id, reason=reason)
        if state.status in workflow.ACTIVE:
            return  # running already: nothing stopped, the asker follows the run
        await bus.publish_js(self.svc.js, subjects.run_done(state.run_id),
                             RunDone(run_id=state.run_id,
                                     status=state.status if state.status != "done" else "completed",
                                     rounds=state.round, finished_at=time.time(), reason=reason, epoch=state.epoch),
                             msg_id=f"{state.run_id}.refused.{time.time_ns()}")

    # -- deciding and doing -------------------------------------------------------------
    async def advance(self, rid: str, decide: Callable[[RunState], tuple[RunState, list[workflow.Action]]]) -> None:
        """Compare-and-swap the run state, then perform the actions the decision asked for."""
        kv = await bus.until_ready(self.runs_kv, "KV runs")
        for _ in range(50):
            try:
                entry = await bus.until_ready(lambda: kv.get(rid), f"run state {rid}")
            except KeyNotFoundError:  # not a run this stack knows: a dead letter, never a retry loop
                raise Refused(f"run {rid} is not known") from None
            state = runconfigs.CACHE.state(entry.value)  # its config validated once per run
            new, actions = decide(state)
            if new is state:
                if workflow.unannounced_stop(state) is not None:  # an event again after a failed publish
                    await self.announce_stop(state)
                return
            try:
                await kv.update(rid, bus.encode(new), last=entry.revision)
            except KeyWrongLastSequenceError:
                continue  # someone advanced it first: decide again on the fresh state
            except bus.TRANSIENT:
                # No answer (e.g. a leader election): the write may have landed. If it did, the
                # actions are still ours to do (they are idempotent publishes); if not, decide again.
                now = runconfigs.CACHE.state(
                    (await bus.until_ready(lambda: kv.get(rid), f"run state {rid}")).value)
                if not same_state(now, new):
                    continue
            for action in actions:
                if isinstance(action, workflow.OpenRound):
                    await self.open_round(new, action)
                elif isinstance(action, workflow.SpawnShares):
                    await self.place_again(new, action)
                elif isinstance(action, interviews.OrderAgain):
                    await self.order_again(new, action)
                elif isinstance(action, interviews.InterviewLost):
                    await self.interview_lost(rid, action)
                else:
                    await self.say_stop(rid, action, new.epoch)
            return
        raise RuntimeError(f"run {rid}: could not update state (contention)")

    async def announce_stop(self, state: RunState) -> None:
        """Publish the RunDone of a stop decided but not said (workflow.unannounced_stop), once
        per epoch by its message id, and mark it said."""
        action = workflow.unannounced_stop(state)
        if action is None or (state.run_id, state.epoch) in self.stopping:  # being said here already
            return
        self.svc.log.info("stop_announced_late", run_id=state.run_id, status=action.status, epoch=state.epoch)
        await self.say_stop(state.run_id, action, state.epoch)

    async def say_stop(self, rid: str, action: workflow.FinishRun, epoch: int) -> None:
        self.stopping.add((rid, epoch))
        try:
            await self.finish(rid, action, epoch)
            await self.advance(rid, lambda s: workflow.on_stop_announced(s, epoch))
        finally:
            self.stopping.discard((rid, epoch))
            runconfigs.CACHE.forget(rid)  # after the mark: its read takes the config from the cache

    async def place_again(self, state: RunState, action: workflow.SpawnShares) -> None:
        """A resume (every share), a lost host's shares, or a spawn past its deadline."""
        rid = state.run_id
        self.watched[rid] = set(state.placement)
        if action.resumed:
            self.spans[rid] = tracer.start_span("orchestrator.run", attributes={
                "populace.run_id": rid, "populace.epoch": state.epoch, "populace.agents": state.config.agents})
            await bus.publish_js(self.svc.js, subjects.run_resumed(rid),
                                 RunResumed(run_id=rid, epoch=state.epoch, after_round=state.round,
                                            hosts=sorted(state.placement), resumed_at=time.time()),
                                 msg_id=subjects.msg_id(rid, 0, "orch", "resumed", state.epoch))
            self.svc.log.info("run_resumed", run_id=rid, epoch=state.epoch, after_round=state.round,
                              hosts={h: sum(c for _, c in r) for h, r in state.placement.items()})
            metrics.RUNS.labels("resumed").inc()
        elif state.status == "running" or state.nudged == 0:
            self.svc.log.warning("shares_replaced", run_id=rid, epoch=state.epoch, reason=state.reason,
                                 shares=list(action.keys))
        else:
            self.svc.log.warning("spawn_announced_again", run_id=rid, shares=list(action.keys))
        run_span = self.spans.get(rid)
        with trace.use_span(run_span, end_on_exit=False) if run_span else contextlib.nullcontext():
            await self.spawn(state, action.keys)

    async def open_round(self, state: RunState, action: workflow.OpenRound) -> None:
        rid = state.run_id
        self.progress_at.pop(rid, None)
        ticks = self.ticks.get(rid)
        if ticks is None or (ticks.round, ticks.epoch) != (state.round, state.epoch):
            self.ticks[rid] = workflow.RoundTicks.of(state)  # a new round, or new shares play it
        run_span = self.spans.get(rid)
        key = f"{rid}.{action.round}"
        round_span = self.spans.get(key) if action.again else None
        if round_span is None:
            round_span = self.spans[key] = tracer.start_span(
                "orchestrator.round", context=telemetry.context_of(run_span) if run_span else None,
                attributes={"populace.run_id": rid, "populace.round": action.round})
        with trace.use_span(round_span, end_on_exit=False):
            await bus.publish_js(
                self.svc.js, subjects.run_round_open(rid, action.round),
                workflow.round_open(state, action, time.time()),
                msg_id=subjects.msg_id(rid, action.round, f"orch{state.nudged}", "open", state.epoch),
            )
        if not action.again:
            metrics.ROUNDS.labels("orchestrator").inc()
            self.round_opened[rid] = (action.round, time.monotonic())
        self.svc.log.info("round_opened", run_id=rid, round=action.round, expected=action.expected,
                          again=action.again, epoch=state.epoch)

    async def finish(self, rid: str, action: workflow.FinishRun, epoch: int = 0) -> None:
        self.watched.pop(rid, None)
        self.stored_configs = {k for k in self.stored_configs if k[0] != rid}
        self.units.pop(rid, None)
        self.progress_at.pop(rid, None)
        self.ticks.pop(rid, None)
        self.round_opened.pop(rid, None)
        run_span = self.spans.pop(rid, None)
        if run_span is None:  # a run rejected before it started: no trace to continue
            await self.publish_done(rid, action, epoch)
            return
        if action.status != "completed":
            run_span.set_status(trace.StatusCode.ERROR, action.reason or action.status)
        with trace.use_span(run_span, end_on_exit=True):
            await self.publish_done(rid, action, epoch)

    async def publish_done(self, rid: str, action: workflow.FinishRun, epoch: int = 0) -> None:
        await bus.publish_js(self.svc.js, subjects.run_done(rid),
                             RunDone(run_id=rid, status=action.status, rounds=action.rounds,
                                     finished_at=time.time(), reason=action.reason, epoch=epoch),
                             msg_id=subjects.msg_id(rid, 0, "orch", "done", epoch))
        metrics.RUNS.labels(action.status).inc()  # counted once said: a publish that failed is said again
        self.svc.log.info("run_finished", run_id=rid, status=action.status, rounds=action.rounds,
                          reason=action.reason)


def ctl_request(msg: NatsMessage) -> workflow.Request | None:
    """The control request `msg` carries, by its place in the CTL stream (None: not from a stream,
    as in FastStream's in-memory test broker: nothing to tell a delivery again by)."""
    if not bus.is_jetstream(msg.raw_message):
        return None
    meta = msg.raw_message.metadata
    return workflow.Request(meta.sequence.stream, meta.timestamp.timestamp())


def same_state(a: RunState, b: RunState) -> bool:
    return a.model_dump(exclude={"updated_at"}) == b.model_dump(exclude={"updated_at"})


def create(settings: Settings | None = None) -> Service:
    svc = Service("orchestrator", settings, DESCRIPTION)
    orch = Orchestrator(svc)
    svc.on_ready(orch.start)
    svc.on_stop(orch.stop)
    # Subscribers NACK on error: a handler that failed on a transient JetStream error (e.g. during
    # a leader election) gets the message again instead of losing it (which stalled the run).
    ctl_stream = JStream(subjects.CTL_STREAM, declare=False)
    run_stream = JStream(subjects.RUN_STREAM, declare=False)
    durable = {"deliver_policy": DeliverPolicy.NEW, "ack_policy": AckPolicy.NACK_ON_ERROR}
    svc.handle(subjects.RUN_START, RunStart, stream=ctl_stream, durable="orchestrator-ctl",
               pull_sub=control_pull(), **durable)(orch.on_run_start)
    svc.handle(subjects.ANY_SPAWNED, HostSpawned, stream=run_stream, durable="orchestrator-spawned",
               pull_sub=control_pull(), **durable)(orch.on_spawned)
    svc.handle(subjects.ANY_ROUND_RESULT, RoundResult, stream=run_stream, durable="orchestrator-result",
               pull_sub=control_pull(), **durable)(orch.on_result)
    svc.handle(subjects.ANY_FAULT, RunFault, stream=run_stream, durable="orchestrator-fault",
               pull_sub=control_pull(), **durable)(orch.on_fault)
    svc.handle(subjects.RUN_CANCEL, RunCancel, stream=ctl_stream, durable="orchestrator-cancel",
               pull_sub=control_pull(), **durable)(orch.on_cancel)
    svc.handle(subjects.RUN_RESUME, RunResume, stream=ctl_stream, durable="orchestrator-resume",
               pull_sub=control_pull(), **durable)(orch.on_resume)
    svc.handle(subjects.RUN_INTERVIEW, InterviewRequest, stream=ctl_stream, durable="orchestrator-interview",
               pull_sub=control_pull(), **durable)(orch.on_interview)
    svc.publishes(subjects.ANY_ASK, InterviewOrder, "a post-hoc interview's order to one host: its ranges")
    svc.publishes(subjects.ANY_ASKED, InterviewPlaced, "a post-hoc interview placed (or refused, with why)")
    svc.publishes(subjects.ANY_STARTED, RunStarted, "a run was placed; carries its simulation's tables")
    svc.publishes(subjects.ANY_SPAWN, SpawnBatch, "one host's agents, as id ranges")
    svc.publishes(subjects.ANY_ROUND_OPEN, RoundOpen, "once per round, with the environment's state")
    svc.publishes(subjects.ANY_RUN_DONE, RunDone, "the run stopped: completed, failed or cancelled (with a reason)")
    svc.publishes(subjects.ANY_RESUMED, RunResumed, "a run continues in a new epoch after its last completed round")
    return svc


def faststream_app() -> FastStream:
    """For FastStream's own CLI: `faststream run|docs gen <this module>:faststream_app --factory`."""
    return create().app
