"""A checkpoint write across a nats-server restart, on a real nats-server with a file store: the
chunks whose PubAcks were lost with the connection are written again as soon as the client has
reconnected, not after the request timeout, and the object reads back whole."""

from __future__ import annotations

import asyncio
import signal

import pytest

from populace.core import bus, checkpoints
from populace.core.natsserver import EmbeddedNats

pytestmark = pytest.mark.integration


async def test_a_checkpoint_write_whose_pubacks_were_lost_in_a_restart_is_written_again_once_reconnected(tmp_path):
    server = EmbeddedNats(store_dir=str(tmp_path / "store")).start()
    nc = None
    try:
        nc = await bus.connect(server.url, "checkpoint-reconnect-test")
        await bus.provision(nc.jetstream(), storage="file")
        js = nc.jetstream(timeout=600.0)  # only the reconnect can end the wait within this test's bound
        data = bytes(range(256)) * 2048  # 512 KB: several chunks
        server.proc.send_signal(signal.SIGSTOP)  # frozen: what is sent now is never acknowledged
        writing = asyncio.create_task(checkpoints.put_bytes(js, "r1.1.partial.h1-0", data, writer="h1"))
        await asyncio.sleep(0.3)
        assert not writing.done()
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        server.start()
        digest = await asyncio.wait_for(writing, 60)
        assert nc.stats["reconnects"] >= 1
        assert await checkpoints.get_bytes(nc.jetstream(), "r1.1.partial.h1-0", digest) == data
    finally:
        if nc is not None:
            await nc.close()
        server.stop()


async def test_a_wait_that_sees_no_reconnect_returns_what_it_awaited(nats_server):
    nc = await bus.connect(nats_server.url, "unless-reconnected-test")
    try:
        assert await bus.unless_reconnected(nc, asyncio.sleep(0.25, result="done")) == "done"

        async def fails() -> None:
            raise ValueError("its own error")

        with pytest.raises(ValueError, match="its own error"):
            await bus.unless_reconnected(nc, fails())
    finally:
        await nc.close()
