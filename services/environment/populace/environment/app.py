"""environment service: round opens and host partials in (durable JetStream consumers), round
results out as triggers. Each run's simulation environment is loaded by name (from the
config its round opens name by digest, read once per run and config) and decides the rounds.
The state it decides stays here and in its checkpoint object of the round (stored before the
result); round opens name it by reference, and a restarted service (or a fork's) reads it back
from that object, checked against the digest recorded when its round closed.

Run with `populace service environment` or
`faststream run populace.environment.app:faststream_app --factory`."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import JStream
from faststream.nats.annotations import NatsMessage
from nats.js.api import DeliverPolicy
from opentelemetry.context import Context
from pydantic import ValidationError
from pydantic_core import from_json

from populace.core import bus, checkpoints, metrics, runconfigs, subjects, telemetry
from populace.core.contracts import (
    PartialRef,
    RoundOpen,
    RoundPartial,
    RoundResult,
    RunFault,
    RunHead,
    RunState,
    Share,
    StateRef,
    partial_object_limit,
    share_key,
)
from populace.core.scenario import format_validation_error
from populace.core.service import Refused, Service, control_pull
from populace.core.settings import Settings
from populace.core.telemetry import tracer
from populace.environment.run_tally import BadPartial, EnvironmentFailed, RunTally
from populace.sdk.play import RoundPaused
from populace.sdk.registry import resolve
from populace.sdk.simulation import SimulationError

DESCRIPTION = ("Folds the hosts' partials of each round with the run's simulation environment, "
               "decides the round and publishes its result (the trigger for the next round).")
MAX_RUNS = 1000  # runs kept in memory; older runs' history lives in the recorder
EARLY_LIMIT = 100_000  # partials waiting for their round's open, over all runs


class Environment:
    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.runs: OrderedDict[str, RunTally] = OrderedDict()
        self.failed: dict[str, int] = {}  # runs whose simulation failed here, with the epoch it failed in
        self.early: dict[str, list[tuple[RoundPartial, NatsMessage]]] = {}  # partials before any open
        self.round_contexts: dict[tuple[str, int], Context] = {}  # the orchestrator's round spans

    async def fault(self, run_id: str, round_: int | None, reason: str, epoch: int = 0,
                    cause: BaseException | None = None) -> None:
        """`cause`: what the simulation raised; its bug that a fix resumes from (a world its
        declaration refuses) pauses the run rather than failing it, and so does an object the
        store refused or cannot give back (it is full, a world is unreadable): not the run's fault."""
        pause = isinstance(cause, (RoundPaused, checkpoints.CheckpointError))
        if isinstance(cause, RoundPaused):
            reason = f"{reason}; fix the simulation, then `populace resume {run_id}`"
        elif pause:
            reason = f"{reason}; `populace resume {run_id}` continues"
        self.failed[run_id] = epoch
        self.svc.log.error("run_fault", run_id=run_id, round=round_, reason=reason, pause=pause)
        await bus.publish_js(self.svc.js, subjects.run_fault(run_id, "environment"),
                             RunFault(run_id=run_id, source="environment", round=round_, reason=reason, pause=pause),
                             msg_id=subjects.msg_id(run_id, round_ or 0, "environment", "fault", epoch))

    async def tally_for(self, opened: RoundOpen) -> RunTally | None:
        tally = self.runs.get(opened.run_id)
        if tally is None and self.failed.get(opened.run_id, -1) >= opened.epoch:
            return None  # failed in this epoch (a resume is a new chance)
        if tally is not None and runconfigs.CACHE.get(opened.run_id, opened.config_ref.digest) is not None:
            return tally
        try:  # the config the open names, read once by its digest (the first open, or a new config)
            config = await runconfigs.announced(self.svc.js, opened)
        except runconfigs.ConfigUnavailable as err:  # like a world that cannot be read: the run stops, naming it
            self.runs.pop(opened.run_id, None)
            await self.fault(opened.run_id, opened.round, f"the environment cannot read the run's config: {err}",
                             opened.epoch)
            return None
        if config is None:  # an older announcement naming an older config: it decides nothing
            return tally
        if tally is not None:  # its config changed from this round on (a resume with a new budget)
            try:
                tally.resolved = resolve(config)
            except (SimulationError, ValidationError) as err:
                self.runs.pop(opened.run_id, None)
                await self.fault(opened.run_id, opened.round, f"the environment cannot resolve the run's config: "
                                                              f"{err}", opened.epoch)
                return None
            return tally
        self.failed.pop(opened.run_id, None)
        try:
            resolved = resolve(config)
            env = resolved.simulation.Env(resolved.instance(opened.run_id))
        except (SimulationError, ValidationError) as err:
            detail = format_validation_error(err) if isinstance(err, ValidationError) else str(err)
            await self.fault(opened.run_id, opened.round, f"the environment service cannot load the run's "
                                                          f"simulation: {detail}", opened.epoch)
            return None
        tally = self.runs[opened.run_id] = RunTally(opened.run_id, resolved, env,
                                                    budget_bytes=self.svc.settings.view_budget_bytes)
        while len(self.runs) > MAX_RUNS:
            runconfigs.CACHE.forget(self.runs.popitem(last=False)[0])
        return tally

    async def on_round_open(self, opened: RoundOpen, msg: NatsMessage | None) -> None:
        """A round opens (or is announced again): count its partials from now on (and those
        that came first)."""
        why = await bus.open_refusal(self.svc.js, opened)
        if why is not None:  # not the orchestrator's announcement: it must not move a round
            if msg is None:
                self.svc.log.warning("bad_open_skipped", run_id=opened.run_id, error=why)
                return
            raise Refused(why)  # dead-lettered once by the service
        if msg is not None:
            self.round_contexts[(opened.run_id, opened.round)] = telemetry.extract(msg.headers)
        while len(self.round_contexts) > 10 * MAX_RUNS:  # rounds that never closed
            self.round_contexts.pop(next(iter(self.round_contexts)))
        tally = await self.tally_for(opened)
        if tally is None:
            return
        async with tally.steps:  # not while the run's last round is being decided
            if not (await self.load_state(tally, opened) and await self.load_world(tally, opened)
                    and await self.load_population(tally, opened)):
                return
            await self.settle(tally, lambda: tally.open(opened), opened.round)
        await self.drain_refused(tally)
        for partial, raw in self.early.pop(opened.run_id, []):
            await self.count(tally, partial, raw)

    async def load_state(self, tally: RunTally, opened: RoundOpen) -> bool:
        """The state the announced round starts from, when it is not the one in hand (after a
        restart, on a fork, a resume here of a run decided elsewhere): read by the reference the
        announcement carries and checked against its digest; one that cannot be read stops the
        run naming it (paused: the store is not the run's fault)."""
        ref = tally.needs_state(opened)
        if ref is None:
            return True
        try:
            tally.keep_state(ref, await checkpoints.load_state(self.svc.js, ref))
        except Exception as err:  # unreadable, changed, or not an environment's state
            self.runs.pop(tally.run_id, None)
            await self.fault(tally.run_id, opened.round, f"the environment cannot read the state round "
                                                         f"{opened.round} starts from: {err}", tally.epoch, cause=err)
            return False
        return True

    async def load_world(self, tally: RunTally, opened: RoundOpen) -> bool:
        """The world the announced round plays in, read (once) by the reference it carries and
        checked against its digest; a world that cannot be read fails the run naming it."""
        try:
            ref = tally.needs_world(opened)
            if ref is not None:
                tally.set_world(ref, await checkpoints.load_world(self.svc.js, ref))
        except RoundPaused as err:  # round 1's world, which its declaration refuses: the simulation's bug
            self.runs.pop(tally.run_id, None)
            await self.fault(tally.run_id, opened.round, str(err), tally.epoch, cause=err)
            return False
        except Exception as err:  # unreadable, changed, or not the simulation's World
            self.runs.pop(tally.run_id, None)
            await self.fault(tally.run_id, opened.round, f"the environment cannot read the round's world: {err}",
                             tally.epoch, cause=err)
            return False
        return True

    async def load_population(self, tally: RunTally, opened: RoundOpen) -> bool:
        """Who is alive in the announced round, read (once) by the reference it carries and
        checked against its digest; one that cannot be read fails the run naming it."""
        try:
            ref = tally.needs_population(opened)
            if ref is not None:
                tally.set_population(ref, await checkpoints.load_population(self.svc.js, ref))
        except Exception as err:  # unreadable, changed, or not a population's bytes
            self.runs.pop(tally.run_id, None)
            await self.fault(tally.run_id, opened.round, f"the environment cannot read who is alive in the round: "
                                                         f"{err}", tally.epoch)
            return False
        return True

    async def on_partial(self, partial: RoundPartial, msg: NatsMessage | None) -> None:
        """A share's reduced part of a round. One that travels by reference is read only once
        its sender is known to be placed (count)."""
        if msg is not None and msg.raw_message.subject != subjects.run_partial(
                partial.run_id, partial.round, partial.host_id, partial.epoch):
            # the subject is what NATS permissions check: a body must not claim another sender
            raise Refused(f"a partial of {partial.host_id}@{partial.epoch}, round {partial.round} "
                          f"of run {partial.run_id} does not belong on {msg.raw_message.subject}")
        tally = self.runs.get(partial.run_id)
        if tally is None:
            if partial.run_id in self.failed:
                return
            if msg is not None:
                head = await self.head_of(partial.run_id)
                if head is None:
                    raise Refused(f"run {partial.run_id} is not known")
                if not self.in_placement(head, partial):  # kept unread until its round's announcement
                    if partial.epoch < head.epoch:
                        return  # a replaced share's straggler
                    raise Refused(f"share {share_key(partial.host_id, partial.epoch)} was never placed in run "
                                  f"{partial.run_id}")
            # The round's announcement may have been handled while the run was looked up: its
            # early partials are taken already, so one kept now would wait for good (a round
            # that never closes).
            tally = self.runs.get(partial.run_id)
            if tally is None:
                if sum(map(len, self.early.values())) < EARLY_LIMIT:
                    self.early.setdefault(partial.run_id, []).append((partial, msg))
                return
        if msg is not None and partial.epoch > tally.epoch and await self.placed(partial) is None:
            raise Refused(f"share {share_key(partial.host_id, partial.epoch)} was never placed in run "
                          f"{partial.run_id}")
        await self.count(tally, partial, msg, reject=msg is not None)

    @staticmethod
    def in_placement(head: RunHead, partial: RoundPartial) -> Share | None:
        key = share_key(partial.host_id, partial.epoch)
        return next((sh for sh in head.shares if sh.key == key), None)

    async def read_reference(self, tally: RunTally, partial: RoundPartial) -> RoundPartial | None:
        """A partial too large for a message names an object of its own share, its digest and
        size: read it, checked, in place of the reference — only once the round's placement (or,
        for a round not announced here yet, the run's in KV) says its sender counts, and only if
        its size is what a share of its agents may send (partial_object_limit). Raises BadPartial
        when refused; None: a straggler, never read."""
        key = share_key(partial.host_id, partial.epoch)
        name = subjects.checkpoint_partial(partial.run_id, partial.round, key)
        try:
            ref = PartialRef.model_validate(partial.payload)
        except ValidationError as err:
            raise BadPartial(f"a partial of {key} names its object wrongly: {format_validation_error(err)}") from None
        if ref.ref != name:
            raise BadPartial(f"a partial of {key} names {ref.ref!r}, not its own object {name}")
        async with tally.steps:  # the round's state as decide leaves it, not mid-step
            standing = tally.screen(partial)  # BadPartial: the round's placement refuses its sender
        if standing is False:
            return None
        agents = partial.n
        if standing is None:  # its round is not announced here yet: the run's placement decides
            share = await self.placed(partial)
            if share is None:
                raise BadPartial(f"share {key} was never placed in run {partial.run_id}")
            agents = min(agents, sum(c for _, c in share.ranges))
        limit = partial_object_limit(agents)
        if ref.size > limit:
            raise BadPartial(f"the partial's object {name} has {ref.size:,} bytes; a partial of {agents:,} agents "
                             f"may have {limit:,}")
        try:
            data = await checkpoints.get_bytes(self.svc.js, name, ref.sha256, max_bytes=ref.size)
            if len(data) != ref.size:
                raise ValueError(f"it holds {len(data):,} bytes, not the {ref.size:,} its partial says")
            payload = await asyncio.to_thread(from_json, data, allow_inf_nan=False)
        except (checkpoints.CheckpointError, ValueError) as err:
            raise BadPartial(f"the partial's object {name} cannot be used: {err}") from None
        if not isinstance(payload, dict):
            raise BadPartial(f"the partial's object {name} holds {type(payload).__name__}, not a partial")
        return partial.model_copy(update={"payload": payload})

    async def head_of(self, run_id: str) -> RunHead | None:
        """The run's state in KV `runs` (None: no such run), read without its config (RunHead):
        one validated here while the announcement's read of it by digest was under way was a
        second validation of the run's config. A partial may come before its round's announcement."""
        return await bus.run_head(self.svc.js, run_id)

    async def placed(self, partial: RoundPartial) -> Share | None:
        """The partial's share in the run's placement (KV `runs`, written before the orchestrator
        spawns it), if it is there: e.g. a share of an epoch newer than the rounds announced here
        is a re-placement in flight, not an epoch made up."""
        head = await self.head_of(partial.run_id)
        return None if head is None else self.in_placement(head, partial)

    async def ever_placed(self, partial: RoundPartial) -> bool:
        """Whether the partial's share was ever placed in its run: in the placement in force or
        an earlier one (KV `runs`; True where the run's layouts do not name their shares)."""
        run = await bus.run_writers(self.svc.js, partial.run_id)
        if run is None:
            return False
        keys = run.placed()
        return keys is None or share_key(partial.host_id, partial.epoch) in keys

    async def count(self, tally: RunTally, partial: RoundPartial, msg: NatsMessage | None,
                    reject: bool = False) -> None:
        try:
            if reject:
                # A partial of a round decided already is a straggler, dropped quietly, only if
                # its share was ever placed: one from a host the run never placed is refused
                # whenever it comes (before its round closed, the round's placement refuses it).
                async with tally.steps:
                    decided = tally.screen(partial) is False
                if decided and not await self.ever_placed(partial):
                    raise BadPartial(f"share {share_key(partial.host_id, partial.epoch)} was never placed in run "
                                     f"{partial.run_id}")
            if PartialRef.of(partial.payload):  # screened under the run's lock, read without it
                read = await self.read_reference(tally, partial)
                if read is None:
                    return
                partial = read
            async with tally.steps:
                await self.settle(tally, lambda: tally.add(partial, msg), partial.round)
        except BadPartial as err:
            if msg is None:  # read again from the stream: dead-lettered when it first came
                self.svc.log.warning("bad_partial_skipped", run_id=partial.run_id, error=str(err))
            elif reject:
                raise Refused(str(err)) from None  # dead-lettered once by the service
            else:  # a partial that waited for its round: acknowledged when it came, so copied
                await self.svc.dead_letter(msg.raw_message, err, terminate=False)

    async def drain_refused(self, tally: RunTally) -> None:
        """Early partials the round's announcement refused: dead letters now (they were
        acknowledged when they came, so they are copied, not terminated)."""
        refused, tally.refused = tally.refused, []
        for r in refused:
            if r.source is None:  # read again from the stream after a restart
                self.svc.log.warning("bad_partial_skipped", run_id=r.partial.run_id, error=r.reason)
            else:
                await self.svc.dead_letter(r.source.raw_message, r.reason, terminate=False)

    async def rebuild(self) -> None:
        """After a restart: the old process acknowledged the round in play's announcement and
        the partials it had; read them again from the stream (the round's newest announcement,
        then each of its shares' partials), so the round closes as if nothing happened."""
        js = self.svc.js
        rebuilt = []
        for state in await bus.registry_entries(js, subjects.RUNS_BUCKET, RunState):
            if state.status != "running":
                continue
            rid, n = state.run_id, state.round
            opened = await bus.last_on(js, subjects.RUN_STREAM, subjects.run_round_open(rid, n), RoundOpen)
            if opened is None:
                continue
            await self.on_round_open(opened, None)
            for key in opened.shares:
                host_id, _, epoch = key.rpartition("@")
                partial = await bus.last_on(js, subjects.RUN_STREAM, subjects.run_partial(rid, n, host_id, int(epoch)),
                                            RoundPartial)
                if partial is not None:
                    await self.on_partial(partial, None)
            rebuilt.append(f"{rid}#{n}")
        if rebuilt:
            self.svc.log.info("rounds_rebuilt", rounds=rebuilt)

    async def settle(self, tally: RunTally, step, round_: int) -> None:
        """One step of a run's tally (held by `tally.steps`), in a worker thread: a decision runs the
        simulation's merge and decide, which may take seconds, while this loop goes on (the
        service's heartbeat, other runs' partials, keeping its messages in progress)."""
        try:
            result = await asyncio.to_thread(step)
        except EnvironmentFailed as err:
            self.runs.pop(tally.run_id, None)
            await self.fault(tally.run_id, round_, str(err), tally.epoch, cause=err.__cause__)
            return
        if result is not None:
            try:
                await self.publish(result, tally)
            except checkpoints.CheckpointError as err:  # its checkpoint refused (the store is full)
                self.runs.pop(tally.run_id, None)
                await self.fault(tally.run_id, round_, f"the environment cannot store round {round_}'s checkpoint: "
                                 f"{err}", tally.epoch, cause=err)

    async def publish(self, result: RoundResult, tally: RunTally) -> None:
        with tracer.start_as_current_span(
                "environment.decide", context=self.round_contexts.pop((result.run_id, result.round), None),
                attributes={"populace.run_id": result.run_id, "populace.round": result.round,
                            "populace.n_valid": result.n_valid}):
            # The checkpoint first: a round whose result is out is a round a run can continue from
            # (its world too: the next round's announcement names it, with its digest).
            out = tally.worlds_out.pop(result.round, None) if tally is not None else None
            if out is not None:
                await checkpoints.put_bytes(self.svc.js, out[0].name, out[1], writer=checkpoints.ENV_WRITER)
            living = tally.populations_out.pop(result.round, None) if tally is not None else None
            if living is not None:  # who is alive after it: the next round's announcement names it
                await checkpoints.save_population(self.svc.js, result.run_id, result.round, living[1])
            state = tally.states_out.pop(result.round)
            stored = await checkpoints.save_env(self.svc.js, result.run_id, result.round, state,
                                                result.observation, result.selection, result.world,
                                                result.population,
                                                result.prototypes.shares if result.prototypes else None)
            if result.round < tally.resolved.config.rounds:
                # the next round's open names it by this reference: it starts from the state in hand
                tally.keep_state(StateRef(name=stored.name, digest=stored.digest), state)
            else:  # the run's last round: nothing starts from it here (a fork's environment reads the object)
                tally.states.clear()
            # What each folded share says it checkpointed, and this one's own: the orchestrator
            # records them, and a restore reads only objects that still match.
            parts = tally.partials.get(result.round, {}) if tally is not None else {}
            result = result.model_copy(update={
                "env_checkpoint": stored.digest,
                "checkpoints": {k: dict(parts[k].partial.checkpoints) for k in result.shares if k in parts}})
            await bus.publish_js(self.svc.js, subjects.run_round_result(result.run_id, result.round), result,
                                 msg_id=subjects.msg_id(result.run_id, result.round, "env", "result", result.epoch))
        metrics.ROUNDS.labels("environment").inc()
        self.svc.log.info("round_closed", run_id=result.run_id, round=result.round, n=result.n,
                          valid=result.n_valid, summary=result.summary)


def create(settings: Settings | None = None) -> Service:
    svc = Service("environment", settings, DESCRIPTION)
    env = Environment(svc)
    svc.on_ready(env.rebuild)
    run_stream = JStream(subjects.RUN_STREAM, declare=False)
    durable = {"stream": run_stream, "deliver_policy": DeliverPolicy.NEW, "ack_policy": AckPolicy.NACK_ON_ERROR}
    svc.handle(subjects.ANY_ROUND_OPEN, RoundOpen, durable="environment-open",
               pull_sub=control_pull(), **durable)(env.on_round_open)
    svc.handle(subjects.ANY_PARTIAL, RoundPartial, durable="environment-partial",
               pull_sub=control_pull(), **durable)(env.on_partial)
    svc.publishes(subjects.ANY_ROUND_RESULT, RoundResult, "the round's decision: summary, next observation, state")
    svc.publishes(subjects.ANY_FAULT, RunFault, "the run's simulation cannot be loaded or its environment raised")
    return svc


def faststream_app() -> FastStream:
    """For FastStream's own CLI: `faststream run|docs gen <this module>:faststream_app --factory`."""
    return create().app
