"""Placing a run on the agent-hosts registered now, waiting a little for them where it cannot be
done yet: for a first host to register (a stack still starting), and for the room a run that just
ended frees (its hosts beat at once when they drop its agents, but a run started as the last one
ends may be read before those beats land: a script's second run, a sweep's next one, a resume
right after a pause). A run that does not fit after that wait is refused with the placement's
reason."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from populace.core.contracts import HostInfo
from populace.core.placement import PlacementError

P = TypeVar("P")


async def place_when_possible(read_hosts: Callable[[], Awaitable[list[HostInfo]]],
                              place: Callable[[list[HostInfo]], P], *, hosts_wait_s: float,
                              room_wait_s: float, poll_s: float = 0.25) -> tuple[list[HostInfo], P]:
    """(the hosts read, `place(hosts)`) once it places; while it raises PlacementError, read the
    hosts again every `poll_s`, for up to `hosts_wait_s` while none is registered and up to
    `room_wait_s` from the first read that found one; then the last PlacementError is raised."""
    start = time.monotonic()
    found: float | None = None  # when a host was first read
    while True:
        hosts = await read_hosts()
        try:
            return hosts, place(hosts)
        except PlacementError:
            now = time.monotonic()
            if hosts and found is None:
                found = now
            since, wait_s = (start, hosts_wait_s) if found is None else (found, room_wait_s)
            if now - since >= wait_s:
                raise
        await asyncio.sleep(poll_s)
