"""Each requester's fair share of a gateway (populace.gateway.fairshare): bookkeeping only, the
batches are futures the test resolves, so no test waits on a clock."""

from __future__ import annotations

import asyncio

from populace.gateway.fairshare import FairShare


class Batches:
    """Batches that run until the test ends them, in the order they started."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ends: dict[str, asyncio.Future] = {}

    def job(self, name: str):
        async def run() -> None:
            self.started.append(name)
            self.ends[name] = asyncio.get_running_loop().create_future()
            await self.ends[name]

        return run

    async def end(self, *names: str) -> None:
        for name in names:
            self.ends[name].set_result(None)
        for _ in range(5):  # let the finished tasks settle and the next ones start
            await asyncio.sleep(0)


async def test_one_requester_holds_at_most_its_share_and_the_others_start_at_once():
    fair, b = FairShare(capacity_batches=4, capacity_prompts=100, share=0.5, waiting_bytes=10_000), Batches()
    for i in range(6):
        assert fair.submit("flood", 0, 100, b.job(f"f{i}"))
    await asyncio.sleep(0)
    assert b.started == ["f0", "f1"] and fair.waiting("flood") == 4  # half of the workers, the rest wait
    assert fair.submit("host", 0, 100, b.job("h0"))
    await asyncio.sleep(0)
    assert b.started[-1] == "h0"  # a free worker, within its share: at once
    await b.end("f0")
    assert b.started[-1] == "f2"  # the flood's next, within its share again
    fair.cancel()


async def test_waiting_batches_start_round_robin_across_requesters():
    fair, b = FairShare(capacity_batches=2, capacity_prompts=100, share=1.0, waiting_bytes=10_000), Batches()
    for i in range(2):
        fair.submit("a", 0, 1, b.job(f"a{i}"))
    for i in range(3, 6):
        fair.submit("a", 0, 1, b.job(f"a{i}"))
    for i in range(2):
        fair.submit("b", 0, 1, b.job(f"b{i}"))
    await asyncio.sleep(0)
    assert b.started == ["a0", "a1"]
    await b.end("a0", "a1")
    assert b.started[2:] == ["a3", "b0"]  # one each: b's short line is not behind a's long one
    await b.end("a3", "b0")
    assert b.started[4:] == ["a4", "b1"]
    fair.cancel()


async def test_a_full_line_is_refused_and_keeps_nothing():
    fair, b = FairShare(capacity_batches=1, capacity_prompts=100, share=1.0, waiting_bytes=250), Batches()
    assert fair.submit("a", 0, 100, b.job("run"))
    assert fair.submit("a", 0, 200, b.job("w1"))  # a first waiting batch always fits
    assert not fair.submit("a", 0, 100, b.job("w2"))  # 300 bytes waiting: over
    assert fair.submit("b", 0, 100, b.job("other"))  # another requester's line is its own
    assert fair.waiting("a") == 1 and fair.waiting("b") == 1
    fair.cancel()


async def test_replica_prompts_are_shared_too_and_the_dummy_model_costs_none():
    fair, b = FairShare(capacity_batches=10, capacity_prompts=100, share=0.5, waiting_bytes=10_000), Batches()
    assert fair.submit("flood", 40, 1, b.job("p40"))
    assert fair.submit("flood", 40, 1, b.job("p80"))  # 80 prompts: over its 50, waits
    assert fair.submit("flood", 0, 1, b.job("dummy"))  # waits behind its own line, in order
    assert fair.submit("host", 50, 1, b.job("h50"))
    await asyncio.sleep(0)
    assert b.started == ["p40", "h50"]
    await b.end("p40")
    assert b.started[2:] == ["p80", "dummy"]
    fair.cancel()
