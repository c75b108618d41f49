"""Placement policy, pure: which agent ids go to which host."""

from __future__ import annotations

from populace.core.contracts import HostInfo


class PlacementError(ValueError):
    pass


def place(agents: int, hosts: list[HostInfo], unit: int = 1) -> dict[str, list[tuple[int, int]]]:
    """Split agent ids 0..agents-1 into contiguous ranges, proportional to each host's free
    capacity (largest remainder, so counts sum exactly to `agents`; no agent is dropped).

    `unit`: agents that must stay on one host (a simulation's groups of consecutive ids; the
    last group may be smaller). Ranges then start and end on group boundaries."""
    if agents < 1:
        raise PlacementError("agents must be >= 1")
    if unit < 1:
        raise PlacementError("unit must be >= 1")
    free = {h.host_id: max(0, h.capacity - h.agents) for h in sorted(hosts, key=lambda h: h.host_id)}
    free = {k: v for k, v in free.items() if v > 0}
    if not free:
        raise PlacementError("no agent-host with free capacity is registered")
    total_free = sum(free.values())
    if total_free < agents:
        raise PlacementError(f"{agents} agents requested but registered hosts have room for {total_free}")
    units = -(-agents // unit)
    room = {h: f // unit + (1 if f % unit >= agents - (units - 1) * unit else 0) for h, f in free.items()}
    if sum(room.values()) < units:
        raise PlacementError(f"{agents} agents in groups of {unit} do not fit the registered hosts "
                             "(a group must stay on one host)")
    quotas = {h: units * f / total_free for h, f in free.items()}
    counts = {h: min(int(q), room[h]) for h, q in quotas.items()}
    short = units - sum(counts.values())
    while short:
        for h in sorted(quotas, key=lambda h: (counts[h] - quotas[h], h)):
            if short and counts[h] < room[h]:
                counts[h] += 1
                short -= 1
    out: dict[str, list[tuple[int, int]]] = {}
    first = 0
    for h, n in counts.items():
        if n:
            last = min(agents, first + n * unit)
            out[h] = [(first, last - first)]
            first = last
    return out


def place_ranges(ranges: list[tuple[int, int]], hosts: list[HostInfo],
                 unit: int = 1) -> dict[str, list[tuple[int, int]]]:
    """Split the agents of `ranges` (a lost share's, or a whole run's) over `hosts`, the way
    `place` splits 0..n-1: proportional to free capacity, groups of `unit` kept whole (each
    range starts on a group boundary, as `place` made it)."""
    ordered = sorted(r for r in ranges if r[1] > 0)
    total = sum(c for _, c in ordered)
    virtual = place(total, hosts, unit)
    out: dict[str, list[tuple[int, int]]] = {}
    pieces = sorted((first, count, host) for host, rs in virtual.items() for first, count in rs)
    i, offset = 0, 0  # the range the next agent comes from, and how far into it
    for _, count, host in pieces:
        need = count
        while need:
            first, length = ordered[i]
            take = min(need, length - offset)
            mine = out.setdefault(host, [])
            if mine and mine[-1][0] + mine[-1][1] == first + offset:
                mine[-1] = (mine[-1][0], mine[-1][1] + take)  # contiguous: one range
            else:
                mine.append((first + offset, take))
            need -= take
            offset += take
            if offset == length:
                i, offset = i + 1, 0
    return out
