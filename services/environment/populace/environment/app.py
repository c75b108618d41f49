"""environment service: round opens and host partials in (durable JetStream consumers), round
results out as triggers. Each run's simulation environment is loaded by name (from the
config its round opens carry) and decides the rounds; its state travels with the round
opens, so this service keeps nothing between rounds but the partials of open rounds.

Run with `populace service environment` or
`faststream run populace.environment.app:faststream_app --factory`."""

from __future__ import annotations

from collections import OrderedDict

from faststream.exceptions import RejectMessage
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, PullSub
from faststream.nats.annotations import NatsMessage
from nats.js.api import DeliverPolicy
from opentelemetry.context import Context
from pydantic import ValidationError

from faststream import FastStream
from populace.core import bus, checkpoints, metrics, subjects, telemetry
from populace.core.contracts import RoundOpen, RoundPartial, RoundResult, RunFault
from populace.core.scenario import format_validation_error
from populace.core.service import Service
from populace.core.settings import Settings
from populace.core.telemetry import tracer
from populace.environment.tally import BadPartial, EnvironmentFailed, RunTally
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

    async def fault(self, run_id: str, round_: int | None, reason: str, epoch: int = 0) -> None:
        self.failed[run_id] = epoch
        self.svc.log.error("run_fault", run_id=run_id, round=round_, reason=reason)
        await bus.publish_js(self.svc.js, subjects.run_fault(run_id, "environment"),
                             RunFault(run_id=run_id, source="environment", round=round_, reason=reason),
                             msg_id=subjects.msg_id(run_id, round_ or 0, "environment", "fault", epoch))

    async def tally_for(self, opened: RoundOpen) -> RunTally | None:
        tally = self.runs.get(opened.run_id)
        if tally is not None or self.failed.get(opened.run_id, -1) >= opened.epoch:
            return tally  # known, or failed in this epoch (a resume is a new chance)
        self.failed.pop(opened.run_id, None)
        try:
            resolved = resolve(opened.config)
            env = resolved.simulation.Env(resolved.instance(opened.run_id))
        except (SimulationError, ValidationError) as err:
            detail = format_validation_error(err) if isinstance(err, ValidationError) else str(err)
            await self.fault(opened.run_id, opened.round, f"the environment service cannot load the run's "
                                                          f"simulation: {detail}", opened.epoch)
            return None
        tally = self.runs[opened.run_id] = RunTally(opened.run_id, resolved, env)
        while len(self.runs) > MAX_RUNS:
            self.runs.popitem(last=False)
        return tally

    async def on_round_open(self, opened: RoundOpen, msg: NatsMessage) -> None:
        """A round opens: count its partials from now on (and those that came first)."""
        self.round_contexts[(opened.run_id, opened.round)] = telemetry.extract(msg.headers)
        while len(self.round_contexts) > 10 * MAX_RUNS:  # rounds that never closed
            self.round_contexts.pop(next(iter(self.round_contexts)))
        tally = await self.tally_for(opened)
        if tally is None:
            return
        await self.settle(tally, lambda: tally.open(opened), opened.round)
        for partial, raw in self.early.pop(opened.run_id, []):
            await self.count(tally, partial, raw)

    async def on_partial(self, partial: RoundPartial, msg: NatsMessage) -> None:
        """A host's reduced share of a round."""
        tally = self.runs.get(partial.run_id)
        if tally is None:
            if partial.run_id not in self.failed and sum(map(len, self.early.values())) < EARLY_LIMIT:
                self.early.setdefault(partial.run_id, []).append((partial, msg))
            return
        await self.count(tally, partial, msg, reject=True)

    async def count(self, tally: RunTally, partial: RoundPartial, msg: NatsMessage, reject: bool = False) -> None:
        try:
            await self.settle(tally, lambda: tally.add(partial), partial.round)
        except BadPartial as err:
            await self.svc.dead_letter(msg.raw_message, err, terminate=False)
            if reject:
                raise RejectMessage() from None

    async def settle(self, tally: RunTally, step, round_: int) -> None:
        try:
            result = step()
        except EnvironmentFailed as err:
            self.runs.pop(tally.run_id, None)
            await self.fault(tally.run_id, round_, str(err), tally.epoch)
            return
        if result is not None:
            await self.publish(result)

    async def publish(self, result: RoundResult) -> None:
        with tracer.start_as_current_span(
                "environment.decide", context=self.round_contexts.pop((result.run_id, result.round), None),
                attributes={"populace.run_id": result.run_id, "populace.round": result.round,
                            "populace.n_valid": result.n_valid}):
            # The checkpoint first: a round whose result is out is a round a run can continue from.
            await checkpoints.save_env(self.svc.js, result.run_id, result.round, result.state, result.observation)
            await bus.publish_js(self.svc.js, subjects.run_round_result(result.run_id, result.round), result,
                                 msg_id=subjects.msg_id(result.run_id, result.round, "env", "result", result.epoch))
        metrics.ROUNDS.labels("environment").inc()
        self.svc.log.info("round_closed", run_id=result.run_id, round=result.round, n=result.n,
                          valid=result.n_valid, summary=result.summary)


def create(settings: Settings | None = None) -> Service:
    svc = Service("environment", settings, DESCRIPTION)
    env = Environment(svc)
    run_stream = JStream(subjects.RUN_STREAM, declare=False)
    durable = dict(stream=run_stream, deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NACK_ON_ERROR)
    svc.handle(subjects.ANY_ROUND_OPEN, RoundOpen, durable="environment-open",
               pull_sub=PullSub(batch_size=16), **durable)(env.on_round_open)
    svc.handle(subjects.ANY_PARTIAL, RoundPartial, durable="environment-partial",
               pull_sub=PullSub(batch_size=64), **durable)(env.on_partial)
    svc.publishes(subjects.ANY_ROUND_RESULT, RoundResult, "the round's decision: summary, next observation, state")
    svc.publishes(subjects.ANY_FAULT, RunFault, "the run's simulation cannot be loaded or its environment raised")
    return svc


def faststream_app() -> FastStream:
    """For FastStream's own CLI: `faststream run|docs gen <this module>:faststream_app --factory`."""
    return create().app
