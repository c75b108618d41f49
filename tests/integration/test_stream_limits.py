"""Every stream, KV bucket and object store is bounded by bytes when a service creates it (issue
26, item 7: RUN had no byte limit, DLQ none either, and 150 MB of junk became 314 MB stored; issue
41: the checkpoints store had none, one host filled the server's storage with it and then
`ctl.run.start` could not be published)."""

from __future__ import annotations

import nats
import pytest
from nats.js.api import DiscardPolicy

from populace.core import bus, owned_objects, subjects
from populace.core.natsserver import EmbeddedNats

pytestmark = pytest.mark.integration

MiB = 2**20


async def test_every_stream_and_bucket_is_created_bounded_by_bytes():
    with EmbeddedNats() as ns:
        nc = await nats.connect(ns.url)
        try:
            js = nc.jetstream()
            await bus.provision(js, storage="memory")
            await bus.provision_snapshots(js, storage="memory")
            await bus.provision_nodes(js, storage="memory")
            await bus.provision_pacing(js, storage="memory")
            configs = {info.config.name: info.config for info in await js.streams_info()}
        finally:
            await nc.close()
    run, dlq, ctl = configs["RUN"], configs["DLQ"], configs["CTL"]
    assert (run.max_bytes, run.max_age, DiscardPolicy(run.discard)) == (
        bus.RUN_MAX_BYTES["memory"], bus.RUN_MAX_AGE_S, DiscardPolicy.NEW)  # full: new events refused, loudly
    assert (dlq.max_bytes, dlq.max_age, DiscardPolicy(dlq.discard)) == (
        bus.DLQ_MAX_BYTES, bus.DLQ_MAX_AGE_S, DiscardPolicy.OLD)
    assert (ctl.max_bytes, DiscardPolicy(ctl.discard)) == (32 * MiB, DiscardPolicy.OLD)  # its room is its own
    assert sorted(configs) == sorted(["CTL", "RUN", "DLQ", "KV_runs", "KV_hosts", "KV_services", "KV_replicas",
                                      "KV_nodes", "KV_pacing", "OBJ_personas", "OBJ_graphs", "OBJ_checkpoints",
                                      "OBJ_snapshots"])
    assert all(cfg.max_bytes and cfg.max_bytes > 0 for cfg in configs.values()), {
        n: c.max_bytes for n, c in configs.items()}
    ckpt = configs[subjects.CHECKPOINTS_STREAM]
    assert ckpt.max_bytes == 2**30 and not ckpt.allow_rollup_hdrs and ckpt.discard_new_per_subject
    # a quarter per writer and run, counted in messages, never fewer than a 10,000-round run writes
    assert ckpt.max_msgs_per_subject == max(bus.MIN_WRITER_RUN_MESSAGES, 2**30 // 4 // owned_objects.CHUNK_BYTES)
    assert ckpt.max_msg_size == owned_objects.MAX_MESSAGE_BYTES


async def test_a_default_limit_the_server_cannot_reserve_is_lowered_a_set_one_is_an_error(tmp_path):
    conf = tmp_path / "small.conf"
    conf.write_text("jetstream { max_memory_store: 1073741824 }\n")  # 1 GiB of memory storage
    with EmbeddedNats(extra_args=["-c", str(conf)]) as ns:
        nc = await nats.connect(ns.url)
        try:
            js = nc.jetstream()
            with pytest.raises(bus.StreamLimitError, match="POPULACE_RUN_MAX_BYTES"):
                await bus.provision(js, storage="memory", run_max_bytes=2**30)  # set by the operator: kept
            await bus.provision(js, storage="memory")  # the defaults: lowered until they fit
            limits = {info.config.name: info.config for info in await js.streams_info()}
        finally:
            await nc.close()
    assert limits["DLQ"].max_bytes == bus.DLQ_MAX_BYTES  # reserved first: it fits as it is
    assert limits["CTL"].max_bytes == 32 * MiB
    # RUN fits itself in what the small ones left (1 GiB - 332 MiB), the stores in what RUN left
    assert limits["RUN"].max_bytes == bus.RUN_MAX_BYTES["memory"] // 4
    ckpt = limits[subjects.CHECKPOINTS_STREAM]
    assert ckpt.max_bytes == 128 * MiB
    assert ckpt.max_msgs_per_subject == bus.MIN_WRITER_RUN_MESSAGES
    assert (limits["OBJ_personas"].max_bytes, limits["OBJ_graphs"].max_bytes) == (32 * MiB, 16 * MiB)
