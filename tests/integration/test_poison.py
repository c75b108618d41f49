"""Poison-proof consumers on a real nats-server: a JetStream message whose handler keeps
failing comes again after a growing delay, then is dead-lettered once with its error; it
never loops."""

from __future__ import annotations

import asyncio

import pytest
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, PullSub
from nats.js.api import DeliverPolicy

from populace.core import subjects
from populace.core.contracts import RunCancel
from populace.core.service import RETRY_DELAYS_S, Service, retry_delay
from populace.core.settings import Settings

pytestmark = pytest.mark.integration


def test_the_retry_delays_grow_and_stop_growing():
    assert [retry_delay(n) for n in (0, 1, 2, 3)] == [0.5, 0.5, 1.0, 2.0]
    assert retry_delay(100) == RETRY_DELAYS_S[-1] == 30.0


async def test_a_message_whose_handler_keeps_failing_is_dead_lettered_once_after_its_deliveries(nats_server, js):
    svc = Service("poison-test", Settings(nats_url=nats_server.url, storage="memory"))
    svc.max_deliveries, svc.retry_delays_s = 3, (0.05, 0.1)
    calls: list[int] = []

    @svc.handle(subjects.RUN_CANCEL, RunCancel, stream=JStream(subjects.CTL_STREAM, declare=False),
                durable="poison-test", pull_sub=PullSub(batch_size=4), deliver_policy=DeliverPolicy.NEW,
                ack_policy=AckPolicy.NACK_ON_ERROR)
    async def always_fails(cancel: RunCancel, msg) -> None:
        calls.append(msg.raw_message.metadata.num_delivered)
        raise RuntimeError("the database is on fire")

    dead = await js.pull_subscribe(subjects.dlq("poison-test"), durable="poison-dlq", stream=subjects.DLQ_STREAM)
    await svc._connect_and_provision()
    await svc.broker.start()
    try:
        await js.publish(subjects.RUN_CANCEL, RunCancel(run_id="r1").model_dump_json().encode(),
                         stream=subjects.CTL_STREAM)
        for _ in range(100):
            if len(calls) >= 3:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a fourth delivery would come within this
        assert calls == [1, 2, 3]
        letters = await dead.fetch(10, timeout=2)
        assert len(letters) == 1
        assert letters[0].headers["Populace-Error"] == ("handler failed 3 times, last: RuntimeError: "
                                                        "the database is on fire")
        assert letters[0].headers["Populace-Instance"].startswith("poison-test.")
        # the server's own bound, past ours: a message that kills the process still stops coming
        assert (await js.consumer_info(subjects.CTL_STREAM, "poison-test")).config.max_deliver == 5
    finally:
        await svc.broker.stop()
