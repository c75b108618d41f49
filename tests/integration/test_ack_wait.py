"""A service's durable consumers on a real nats-server: their ack wait is POPULACE_ACK_WAIT_S (not
NATS's 30 s), so what a process that died had in hand reaches its successor that soon; a handler
that takes longer than the ack wait keeps its message (it says "in progress"), so it is handled
once."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, PullSub
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from populace.core import subjects
from populace.core.contracts import RunCancel
from populace.core.service import Service
from populace.core.settings import Settings

pytestmark = pytest.mark.integration

DURABLE = "ack-wait-test"
ROOT = Path(__file__).resolve().parents[2]


def service(url: str, calls: list[int], hold: asyncio.Event | None = None, sleep_s: float = 0.0,
            on_call=None) -> Service:
    svc = Service(DURABLE, Settings(nats_url=url, storage="memory", ack_wait_s=1.0))

    @svc.handle(subjects.RUN_CANCEL, RunCancel, stream=JStream(subjects.CTL_STREAM, declare=False),
                durable=DURABLE, pull_sub=PullSub(batch_size=1), deliver_policy=DeliverPolicy.NEW,
                ack_policy=AckPolicy.NACK_ON_ERROR)
    async def on_cancel(cancel: RunCancel, msg) -> None:
        calls.append(msg.raw_message.metadata.num_delivered)
        if on_call is not None:
            on_call()
        if hold is not None:
            await hold.wait()
        await asyncio.sleep(sleep_s)

    return svc


async def until(cond, timeout: float) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)


async def test_a_handler_longer_than_the_ack_wait_keeps_its_message(nats_server, js):
    calls: list[int] = []
    svc = service(nats_server.url, calls, sleep_s=3.5)  # more than three ack waits
    await svc._connect_and_provision()
    await svc.broker.start()
    try:
        assert (await js.consumer_info(subjects.CTL_STREAM, DURABLE)).config.ack_wait == 1.0
        await js.publish(subjects.RUN_CANCEL, RunCancel(run_id="r1").model_dump_json().encode(),
                         stream=subjects.CTL_STREAM)
        await until(lambda: calls, 10)
        await asyncio.sleep(5)  # the handler ends after 3.5 s; a redelivery would have come by now
        assert calls == [1]
        assert (await js.consumer_info(subjects.CTL_STREAM, DURABLE)).num_ack_pending == 0
    finally:
        await svc.broker.stop()


# The process that dies holding the message: takes it, says so in a file, never settles it.
DYING = """
import asyncio, pathlib, sys
sys.path.insert(0, sys.argv[3])
from tests.integration.test_ack_wait import service

async def main():
    marker = pathlib.Path(sys.argv[2])
    svc = service(sys.argv[1], [], hold=asyncio.Event(), on_call=lambda: marker.write_text("held"))
    await svc._connect_and_provision()
    await svc.broker.start()
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_what_a_killed_process_held_reaches_its_successor_after_the_ack_wait(nats_server, js, tmp_path):
    marker = tmp_path / "held"
    dying = await asyncio.create_subprocess_exec(sys.executable, "-c", DYING, nats_server.url, str(marker), str(ROOT))
    successor: Service | None = None
    try:
        async def bound() -> bool:
            try:
                await js.consumer_info(subjects.CTL_STREAM, DURABLE)
                return True
            except NotFoundError:
                return False
        for _ in range(600):
            if await bound():
                break
            await asyncio.sleep(0.1)
        await js.publish(subjects.RUN_CANCEL, RunCancel(run_id="r1").model_dump_json().encode(),
                         stream=subjects.CTL_STREAM)
        await until(marker.exists, 30)
        assert marker.exists(), "the first process never took the message"
        dying.kill()  # SIGKILL: gone with the message in hand, unacknowledged
        await asyncio.wait_for(dying.wait(), 10)
        calls: list[int] = []
        successor = service(nats_server.url, calls)
        await successor._connect_and_provision()
        await successor.broker.start()
        await until(lambda: calls, 10)  # with NATS's default ack wait it would come after 30 s
        assert calls == [2]
    finally:
        if dying.returncode is None:
            dying.kill()
            await asyncio.wait_for(dying.wait(), 10)
        if successor is not None:
            await successor.broker.stop()
