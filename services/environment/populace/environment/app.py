"""environment service wiring: round opens and host partials in (durable JetStream consumers),
round results out as triggers.

Run with `populace service environment` or `faststream run populace.environment.app:app`."""

from __future__ import annotations

from collections import OrderedDict

from faststream.middlewares import AckPolicy
from faststream.nats import JStream, PullSub
from faststream.nats.annotations import NatsMessage
from nats.js.api import DeliverPolicy

from opentelemetry.context import Context

from populace.core import bus, metrics, subjects, telemetry
from populace.core.telemetry import tracer
from populace.core.contracts import HostPartial, RoundOpen, RoundResult
from populace.core.service import Service
from populace.games.env import RatioGameEnv

svc = Service("environment")
broker, app = svc.broker, svc.app
run_stream = JStream(subjects.RUN_STREAM, declare=False)
MAX_RUNS = 1000  # root envs kept in memory; older runs' history lives in the recorder
envs: OrderedDict[str, RatioGameEnv] = OrderedDict()
round_contexts: dict[tuple[str, int], Context] = {}  # the orchestrator's round spans, by (run, round)


def env_for(run_id: str) -> RatioGameEnv:
    env = envs.get(run_id)
    if env is None:
        env = envs[run_id] = RatioGameEnv(run_id)
        env.listen("round.result", publish_result)
        while len(envs) > MAX_RUNS:
            envs.popitem(last=False)
    return env


async def publish_result(_event: str, result: RoundResult) -> None:
    with tracer.start_as_current_span(
            "environment.decide", context=round_contexts.pop((result.run_id, result.round), None),
            attributes={"populace.run_id": result.run_id, "populace.round": result.round,
                        "populace.n_valid": result.n_valid}):
        await bus.publish_js(svc.js, subjects.run_round_result(result.run_id, result.round), result,
                             msg_id=subjects.msg_id(result.run_id, result.round, "env", "result"))
    metrics.ROUNDS.labels("environment").inc()
    svc.log.info("round_closed", run_id=result.run_id, round=result.round, n=result.n,
                 valid=result.n_valid, mean=result.mean, target=result.target,
                 winner=result.winner_agent_id, winner_value=result.winner_value)


@broker.subscriber(subjects.ANY_ROUND_OPEN, stream=run_stream, durable="environment-open",
                   pull_sub=PullSub(batch_size=16), deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NACK_ON_ERROR)
async def on_round_open(msg: NatsMessage) -> None:
    opened = await svc.parse(RoundOpen, msg.raw_message)
    if opened is not None:
        round_contexts[(opened.run_id, opened.round)] = telemetry.extract(msg.headers)
        while len(round_contexts) > 10 * MAX_RUNS:  # rounds that never closed
            round_contexts.pop(next(iter(round_contexts)))
        await env_for(opened.run_id).open_round(opened.round, opened.expected, opened.game)


@broker.subscriber(subjects.ANY_PARTIAL, stream=run_stream, durable="environment-partial",
                   pull_sub=PullSub(batch_size=64), deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NACK_ON_ERROR)
async def on_partial(msg: NatsMessage) -> None:
    partial = await svc.parse(HostPartial, msg.raw_message)
    if partial is not None:
        await env_for(partial.run_id).report(partial)
