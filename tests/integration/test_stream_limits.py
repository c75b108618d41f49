"""RUN and DLQ are bounded by age and bytes when a service creates them (issue 26, item 7: RUN
had no byte limit, DLQ none either, and 150 MB of junk became 314 MB stored)."""

from __future__ import annotations

import nats
import pytest
from nats.js.api import DiscardPolicy

from populace.core import bus, subjects
from populace.core.natsserver import EmbeddedNats

pytestmark = pytest.mark.integration


async def test_run_and_dlq_are_created_bounded_by_age_and_bytes():
    with EmbeddedNats() as ns:
        nc = await nats.connect(ns.url)
        try:
            js = nc.jetstream()
            await bus.provision(js, storage="memory")
            run = (await js.stream_info(subjects.RUN_STREAM)).config
            dlq = (await js.stream_info(subjects.DLQ_STREAM)).config
        finally:
            await nc.close()
    assert (run.max_bytes, run.max_age, DiscardPolicy(run.discard)) == (
        bus.RUN_MAX_BYTES["memory"], bus.RUN_MAX_AGE_S, DiscardPolicy.NEW)  # full: new events refused, loudly
    assert (dlq.max_bytes, dlq.max_age, DiscardPolicy(dlq.discard)) == (
        bus.DLQ_MAX_BYTES, bus.DLQ_MAX_AGE_S, DiscardPolicy.OLD)


async def test_a_default_limit_the_server_cannot_reserve_is_lowered_a_set_one_is_an_error(tmp_path):
    conf = tmp_path / "small.conf"
    conf.write_text("jetstream { max_memory_store: 469762048 }\n")  # 448 MiB of memory storage
    with EmbeddedNats(extra_args=["-c", str(conf)]) as ns:
        nc = await nats.connect(ns.url)
        try:
            js = nc.jetstream()
            with pytest.raises(bus.StreamLimitError, match="POPULACE_RUN_MAX_BYTES"):
                await bus.provision(js, storage="memory", run_max_bytes=2**30)  # set by the operator: kept
            await bus.provision(js, storage="memory")  # the defaults: lowered until they fit
            run = (await js.stream_info(subjects.RUN_STREAM)).config
            dlq = (await js.stream_info(subjects.DLQ_STREAM)).config
        finally:
            await nc.close()
    assert dlq.max_bytes == bus.DLQ_MAX_BYTES  # reserved first: it fits as it is
    assert run.max_bytes == bus.RUN_MAX_BYTES["memory"] // 16  # 2 GiB → 128 MiB, beside the DLQ's 256 MiB
