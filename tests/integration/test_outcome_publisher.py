"""An agent-host's outcome publisher on a real nats-server: across a restart (file store), batches
whose PubAcks were lost with the connection are sent again as soon as the client has reconnected
(not after the 10 s bound on a PubAck), and stored once (their message ids); past the server's
max_payload, a batch is cut between groups, and a group that alone does not fit pauses its round."""

from __future__ import annotations

import asyncio
import signal

import pytest

from populace.agent_host import publisher as publishing
from populace.agent_host.batch_fit import BatchTooLarge
from populace.agent_host.publisher import OutcomePublisher
from populace.core import bus, subjects
from populace.core.contracts import OutcomeBatch
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


def scene_rows(seq: int, groups: list[int], text: int) -> OutcomeRows:
    """Agents 0.. in `groups` (a group's rows together, as the sink adds them), an act and a line each."""
    n = len(groups)
    ids = list(range(n))
    return OutcomeRows(seq=seq, agent_ids=ids, columns={"value": [float(a) for a in ids]}, valid=[True] * n,
                       raws=["r" * text] * n, latency_ms=[1.0] * n, errors=[None] * n, group_ids=groups,
                       acts={"group_id": groups, "seq": [0] * n, "agent_id": ids, "phase": ["say"] * n, "n": [1] * n,
                             "valid": [True] * n, "raw": ["a" * text] * n, "latency_ms": [1.0] * n, "error": [None] * n},
                       lines={"group_id": groups, "seq": [1] * n, "speaker": ids, "text": ["t" * text] * n,
                              "fields": [None] * n})


async def test_a_batch_past_the_servers_max_payload_is_cut_between_groups_and_a_group_too_large_pauses(tmp_path):
    """A server whose max_payload is 64 KiB: a 40-agent batch of ~250 KB goes as several messages,
    each under it, each group whole in one; a group that alone does not fit raises BatchTooLarge
    (a RoundPaused: the host pauses the run naming it) instead of a publish the server refuses."""
    conf = tmp_path / "nats.conf"
    conf.write_text("max_payload: 65536\n")
    server = EmbeddedNats(store_dir=str(tmp_path / "store"), extra_args=["-c", str(conf)]).start()
    nc = None
    try:
        nc = await bus.connect(server.url, "publisher-test")
        assert nc.max_payload == 65536
        js = nc.jetstream()
        await bus.provision(js, storage="memory")
        groups = [g for g in range(10) for _ in range(4)]
        out = OutcomePublisher(nc, js, run_id="r2", round_=1, host_id="h1")
        out.emit(scene_rows(0, groups, text=2_000))
        await asyncio.wait_for(out.close(RoundShare(n=40, n_valid=40, partial=None)), 30)
        sub = await js.subscribe(subjects.run_outcomes("r2", 1, "h1"), ordered_consumer=True)
        pieces = []
        while len(pieces) < 64:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except TimeoutError:
                break
            assert len(msg.data) <= 65536
            pieces.append(OutcomeBatch.model_validate_json(msg.data))
        assert len(pieces) > 3
        assert sorted(a for p in pieces for a in p.agent_ids) == list(range(40))
        for p in pieces:  # whole groups, each with its acts and lines
            assert all(p.group_ids.count(g) == 4 for g in set(p.group_ids))
            assert p.acts.agent_id == p.agent_ids and p.lines.speaker == p.agent_ids
        too_large = OutcomePublisher(nc, js, run_id="r3", round_=2, host_id="h1")
        too_large.emit(scene_rows(0, [0, 0, 1, 1, 1, 1], text=8_000))
        with pytest.raises(BatchTooLarge, match=r"round 2: group 1 of h1 takes [\d,]+ bytes as a message"):
            await asyncio.wait_for(too_large.close(RoundShare(n=6, n_valid=6, partial=None)), 30)
    finally:
        if nc is not None:
            await nc.close()
        server.stop()


async def test_a_large_partial_travels_by_reference_with_its_size_and_one_past_the_limit_pauses(js, nc):
    """Issue 41: the partial names its object's size (the environment reads no more); a partial
    larger than a share of its agents may send is never stored: the round pauses naming it."""
    from pydantic import BaseModel

    from populace.agent_host.publisher import PartialTooLarge
    from populace.core import checkpoints
    from populace.core.contracts import PartialRef, RoundPartial, partial_object_limit

    class Movers(BaseModel):
        movers: list[int]

    out = OutcomePublisher(nc, js, run_id="r7", round_=1, host_id="h1")
    big = Movers(movers=list(range(100_000)))  # ~590 KB of JSON: over the inline limit, under 100 agents' limit
    await out.close(RoundShare(n=100, n_valid=100, partial=big))
    stored = await js.get_last_msg(subjects.RUN_STREAM, subjects.run_partial("r7", 1, "h1", 0))
    ref = PartialRef.model_validate(RoundPartial.model_validate_json(stored.data).payload)
    data = big.model_dump_json().encode()
    assert ref.ref == subjects.checkpoint_partial("r7", 1, "h1@0") and ref.size == len(data) > 256 * 1024
    assert await checkpoints.get_bytes(js, ref.ref, ref.sha256, max_bytes=ref.size) == data
    out = OutcomePublisher(nc, js, run_id="r7", round_=2, host_id="h1")
    bigger = Movers(movers=list(range(200_000)))  # ~1.3 MB: more than one agent's share may send
    size = len(bigger.model_dump_json())
    with pytest.raises(PartialTooLarge, match=rf"round 2: the partial of h1's 1 agents takes {size:,} bytes, more "
                                              rf"than the environment takes \({partial_object_limit(1):,}"):
        await out.close(RoundShare(n=1, n_valid=1, partial=bigger))
    info = await js.stream_info(subjects.RUN_STREAM, subjects_filter="run.r7.>")
    assert info.state.subjects == {subjects.run_partial("r7", 1, "h1", 0): 1}
