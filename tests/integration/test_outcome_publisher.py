"""An agent-host's outcome publisher across a nats-server restart, on a real nats-server with a file
store: batches whose PubAcks were lost with the connection are sent again as soon as the client has
reconnected (not after the 10 s bound on a PubAck), and stored once (their message ids)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from populace.agent_host import publisher as publishing
from populace.agent_host.publisher import OutcomePublisher
from populace.core import bus, subjects
from populace.core.natsserver import EmbeddedNats
from populace.sdk.play import OutcomeRows, RoundShare

pytestmark = pytest.mark.integration


def rows(seq: int, first: int, n: int) -> OutcomeRows:
    ids = list(range(first, first + n))
    return OutcomeRows(seq=seq, agent_ids=ids, columns={"value": [float(a) for a in ids]}, valid=[True] * n,
                       raws=[str(a) for a in ids], latency_ms=[1.0] * n, errors=[None] * n, group_ids=None)


async def test_batches_whose_puback_was_lost_in_a_restart_are_sent_again_once_reconnected(tmp_path, monkeypatch):
    # only the reconnect can end the wait for the lost PubAcks within this test's bound
    monkeypatch.setattr(publishing, "PUBACK_WAIT_S", 600.0)
    server = EmbeddedNats(store_dir=str(tmp_path / "store")).start()
    nc = None
    try:
        nc = await bus.connect(server.url, "publisher-test")
        js = nc.jetstream()
        await bus.provision(js, storage="file")
        out = OutcomePublisher(nc, js, run_id="r1", round_=1, host_id="h1")
        server.proc.send_signal(signal.SIGSTOP)  # frozen: what is sent now is never acknowledged
        out.emit(rows(0, 0, 3))
        out.emit(rows(1, 3, 2))
        await asyncio.sleep(0.3)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        server.start()
        await asyncio.wait_for(out.close(RoundShare(n=5, n_valid=5, partial=None)), 60)
        assert nc.stats["reconnects"] >= 1
        info = await js.stream_info(subjects.RUN_STREAM, subjects_filter="run.r1.>")
        assert info.state.subjects == {subjects.run_outcomes("r1", 1, "h1"): 2,
                                       subjects.run_partial("r1", 1, "h1", 0): 1}
    finally:
        if nc is not None:
            await nc.close()
        server.stop()
