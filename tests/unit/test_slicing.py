"""The rule that keeps a simulation's code from holding an agent-host's event loop
(populace.sdk.slicing): after a slice of it, the loop turns (polls I/O, fires timers) before
more runs; cheap code is never held. Pure: a fake clock that the units of "author code" advance,
on a plain asyncio loop, no broker."""

from __future__ import annotations

import asyncio

import pytest

from populace.sdk.slicing import MOST_UNCHECKED, Slicer, let_through, unchecked


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_clock_reads_grow_rarer_as_the_code_gets_cheaper():
    assert unchecked(0.05, 0.0) == 1  # nothing measured yet: read the clock at the next entry
    assert unchecked(0.05, 0.010) == 2  # half of the 5 entries the slice still holds
    assert unchecked(0.05, 0.100) == 1  # one entry takes longer than the slice: read every time
    assert unchecked(0.05, 0.000_005) == MOST_UNCHECKED  # a cheap turn: one read per 64
    assert unchecked(-0.01, 0.001) == 1


def test_a_turn_of_the_loop_lets_a_slices_worth_through():
    assert let_through(0.05, 0.010, 100) == 5
    assert let_through(0.05, 0.200, 100) == 1  # one that alone takes longer than a slice still runs
    assert let_through(0.05, 0.010, 3) == 3  # no more than wait
    assert let_through(0.05, 0.0, 1000) == MOST_UNCHECKED  # cost unknown: a few, then measured
    assert let_through(0.05, 0.010, 0) == 0


async def _play(units: int, cost: float, slice_s: float = 0.05):
    """`units` tasks, each passing the gate then "running" `cost` seconds of author code (the fake
    clock advances), all ready at once. Returns (the order they ran in, the author seconds run
    between two turns of the loop, the slicer)."""
    loop = asyncio.get_running_loop()
    clock = FakeClock()
    slicer = Slicer(loop, slice_s, clock=clock)
    ran: list[int] = []
    turns: list[float] = [0.0]  # author seconds since the loop last turned, one entry per turn
    stop = False

    def turned() -> None:  # queued each turn: runs once per iteration of the loop
        turns.append(0.0)
        if not stop:
            loop.call_soon(turned)

    async def unit(i: int) -> None:
        wait = slicer.enter()
        if wait is not None:
            await wait
        clock.t += cost
        turns[-1] += cost
        ran.append(i)

    loop.call_soon(turned)
    await asyncio.gather(*(unit(i) for i in range(units)))
    stop = True
    return ran, turns, slicer


async def test_slow_code_gives_the_loop_back_after_each_slice_in_order():
    ran, turns, slicer = await _play(40, 0.020)
    assert ran == list(range(40))  # first come, first run
    # never more than a slice of author code (and the one entry that crossed it) between two turns
    assert max(turns) <= 0.050 + 0.020 + 1e-9
    assert sum(turns) == pytest.approx(40 * 0.020)
    assert slicer.held >= 30


async def test_one_call_longer_than_a_slice_runs_alone():
    ran, turns, _ = await _play(5, 0.300)
    assert ran == list(range(5))
    assert max(turns) == pytest.approx(0.300)  # one at a time: the loop turns between them


async def test_cheap_code_is_never_held():
    ran, _, slicer = await _play(2000, 0.000_005)
    assert slicer.held == 0
    assert len(ran) == 2000
    # and the launcher may start as many as it asks for
    assert slicer.room(2000) == 2000


async def test_the_launcher_starts_a_slices_worth_of_slow_turns():
    _, _, slicer = await _play(40, 0.020)
    assert slicer.room(2000) == 2  # 50 ms at 20 ms each


async def test_an_entry_cancelled_while_it_waits_is_skipped():
    loop = asyncio.get_running_loop()
    clock = FakeClock()
    slicer = Slicer(loop, 0.05, clock=clock)
    ran: list[int] = []

    async def unit(i: int) -> None:
        wait = slicer.enter()
        if wait is not None:
            await wait
        clock.t += 0.04
        ran.append(i)

    tasks = [loop.create_task(unit(i)) for i in range(6)]
    await asyncio.sleep(0)  # all entered: the first two ran, the rest wait
    tasks[3].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert ran == [0, 1, 2, 4, 5]


def test_a_slice_is_a_positive_number_of_seconds():
    with pytest.raises(ValueError, match="slice_s"):
        Slicer(asyncio.new_event_loop(), 0)
