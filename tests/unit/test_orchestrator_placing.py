"""Placing a run as hosts register and free their room (populace.orchestrator.placing): the
registry is a list of reads, the waits real and short, no broker."""

from __future__ import annotations

import asyncio
import time

import pytest

from populace.core.contracts import HostInfo
from populace.core.placement import PlacementError, place
from populace.orchestrator.placing import place_when_possible


def host(host_id: str, capacity: int, agents: int = 0) -> HostInfo:
    return HostInfo(host_id=host_id, capacity=capacity, agents=agents, pid=1, started_at=0.0, heartbeat_at=0.0)


def registry(*reads: list[HostInfo]):
    """Each call returns the next read; the last one from then on. Counts the calls."""
    seen = []

    async def read() -> list[HostInfo]:
        seen.append(1)
        return reads[min(len(seen), len(reads)) - 1]

    return read, seen


def placing(agents: int, hosts_wait_s: float = 5.0, room_wait_s: float = 5.0, *reads: list[HostInfo]):
    read, seen = registry(*reads)
    out = asyncio.run(place_when_possible(read, lambda hosts: place(agents, hosts), hosts_wait_s=hosts_wait_s,
                                          room_wait_s=room_wait_s, poll_s=0.01))
    return out, len(seen)


def test_hosts_with_room_place_at_the_first_read():
    (hosts, placement), reads = placing(200, 5, 5, [host("h0", 400, 0)])
    assert reads == 1 and placement == {"h0": [(0, 200)]} and [h.host_id for h in hosts] == ["h0"]


def test_the_room_a_run_that_just_ended_frees_is_waited_for():
    full, freed = [host("h0", 400, 400), host("h1", 400, 400)], [host("h0", 400, 0), host("h1", 400, 400)]
    (_, placement), reads = placing(200, 5, 5, full, full, freed)
    assert reads == 3 and placement == {"h0": [(0, 200)]}


def test_a_first_host_is_waited_for_then_its_room():
    (_, placement), reads = placing(100, 5, 5, [], [], [host("h0", 50, 50)], [host("h0", 200, 50)])
    assert reads == 4 and placement == {"h0": [(0, 100)]}


@pytest.mark.parametrize("reads, wait_s, reason", [
    ([[host("h0", 400, 400)]], 0.2, "no agent-host with free capacity is registered"),
    ([[host("h0", 400, 0)]], 0.2, "800 agents requested but registered hosts have room for 400"),
    ([[]], 0.3, "no agent-host with free capacity is registered"),
])
def test_a_run_that_never_fits_is_refused_with_the_placement_reason_after_its_wait(reads, wait_s, reason):
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match=reason):
        placing(800, 0.3, 0.2, *reads)
    assert time.monotonic() - t0 >= wait_s  # waited, bounded by the test's timeout


def test_the_room_wait_counts_from_the_first_host_read_not_from_the_start():
    # no host for longer than the room wait, then one without room, then room: still placed
    # (60 empty reads take at least 0.6 s, more than the room wait)
    reads = [[]] * 60 + [[host("h0", 10, 10)]] * 5 + [[host("h0", 10, 0)]]
    (_, placement), n = placing(10, 30, 0.5, *reads)
    assert n == 66 and placement == {"h0": [(0, 10)]}
