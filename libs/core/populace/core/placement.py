"""Placement policy, pure: which agent ids go to which host.

A host's capacity is what it says of itself (its own entry in KV `hosts`), so by default it
only bounds what the host gets: runs are spread evenly over the hosts with room (`spread`).
`capacity` splits in proportion to free capacity instead (for a fleet of unequal machines
whose entries are trusted), and `bounded` caps any claim at what the operator allows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from populace.core.contracts import HostInfo

Policy = Literal["spread", "capacity"]


class PlacementError(ValueError):
    pass


def bounded(hosts: list[HostInfo], most: int | None) -> tuple[list[HostInfo], list[HostInfo]]:
    """The hosts with each capacity claim capped at `most` (None or 0: no cap), and the hosts
    whose claim was above it (as they claimed it)."""
    if not most:
        return list(hosts), []
    over = [h for h in hosts if h.capacity > most]
    return [h.model_copy(update={"capacity": most}) if h.capacity > most else h for h in hosts], over


def _spread(units: int, room: dict[str, int]) -> dict[str, float]:
    """Equal quotas over the hosts, each capped at its room (water-filling): the hosts with the
    least room are filled first and what they cannot take goes evenly to the others."""
    quotas: dict[str, float] = {}
    left, hosts = float(units), sorted(room, key=lambda h: (room[h], h))
    for i, h in enumerate(hosts):
        level = left / (len(hosts) - i)
        if room[h] <= level:
            quotas[h] = float(room[h])
            left -= room[h]
        else:
            quotas.update(dict.fromkeys(hosts[i:], level))
            break
    return quotas


def place(agents: int, hosts: list[HostInfo], unit: int = 1,
          policy: Policy = "spread") -> dict[str, list[tuple[int, int]]]:
    """Split agent ids 0..agents-1 into contiguous ranges over the hosts with free capacity:
    evenly, never above a host's free capacity (`spread`), or proportional to free capacity
    (`capacity`). Largest remainder, so counts sum exactly to `agents`; no agent is dropped.
    On hosts of equal free capacity both policies give the same ranges.

    `unit`: agents that must stay on one host (a simulation's groups of consecutive ids; the
    last group may be smaller). Ranges then start and end on group boundaries."""
    if agents < 1:
        raise PlacementError("agents must be >= 1")
    if unit < 1:
        raise PlacementError("unit must be >= 1")
    if policy not in ("spread", "capacity"):
        raise PlacementError(f"policy: {policy!r} is not 'spread' or 'capacity'")
    free = {h.host_id: max(0, h.capacity - h.agents) for h in sorted(hosts, key=lambda h: h.host_id)}
    free = {k: v for k, v in free.items() if v > 0}
    if not free:
        raise PlacementError("no agent-host with free capacity is registered")
    total_free = sum(free.values())
    if total_free < agents:
        raise PlacementError(f"{agents} agents requested but registered hosts have room for {total_free}")
    units = -(-agents // unit)
    # Whole groups only; the last group may be smaller, and it goes to the last host in id
    # order that gets any (ranges are handed out in that order): only that one may count it
    # in what is left of its room.
    room = {h: f // unit for h, f in free.items()}
    last_host = next(reversed(free))
    if free[last_host] % unit >= agents - (units - 1) * unit:
        room[last_host] += 1
    if sum(room.values()) < units:
        raise PlacementError(f"{agents} agents in groups of {unit} do not fit the registered hosts "
                             "(a group must stay on one host)")
    if policy == "spread":
        spread = _spread(units, room)
        quotas = {h: spread[h] for h in free}  # in host id order, as ranges are handed out
    else:
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
                 unit: int = 1, policy: Policy = "spread") -> dict[str, list[tuple[int, int]]]:
    """Split the agents of `ranges` (a lost share's, or a whole run's) over `hosts`, the way
    `place` splits 0..n-1 under `policy`, groups of `unit` kept whole (each range starts on a
    group boundary, as `place` made it)."""
    ordered = sorted(r for r in ranges if r[1] > 0)
    total = sum(c for _, c in ordered)
    virtual = place(total, hosts, unit, policy)
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


def birth_block(agents: int) -> int:
    """How many newcomers' ids one share takes before another takes its turn (a run of
    `agents` first agents): a share grows by one range per block, and shares differ by at most
    a block of newcomers."""
    return max(256, -(-agents // 32))


def place_births(placement: Mapping[str, Sequence[tuple[int, int]]], first: int, count: int, *, base: int,
                 block: int) -> dict[str, list[tuple[int, int]]]:
    """The shares' ranges (share key -> ranges) with newcomers' ids first..first+count-1 placed:
    the ids from `base` (the run's first newcomer's) are cut into blocks of `block`; a block begun
    goes on with the share that holds its ids so far, a new one goes to the share holding the
    fewest ids (ties: the first key). Pure: the orchestrator places by it, and a local run the
    same way. A share's ranges stay sorted, and a range grows while its share takes ids after it."""
    if count < 0 or block < 1 or first < base:
        raise PlacementError(f"newcomers {first}+{count} (block {block}, from {base}): not a placement")
    out = {key: sorted((int(f), int(c)) for f, c in ranges) for key, ranges in sorted(placement.items())}
    if not out:
        raise PlacementError("no share to place newcomers on")
    held = {key: sum(c for _, c in ranges) for key, ranges in out.items()}
    at, end = first, first + count
    while at < end:
        b = (at - base) // block
        stop = min(end, base + (b + 1) * block)
        key = _holder(out, at - 1) if at > base + b * block else None
        if key is None:
            key = min(out, key=lambda k: (held[k], k))
        ranges = out[key]
        if ranges and ranges[-1][0] + ranges[-1][1] == at:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + stop - at)
        else:
            ranges.append((at, stop - at))
        held[key] += stop - at
        at = stop
    return out


def _holder(placement: Mapping[str, Sequence[tuple[int, int]]], agent_id: int) -> str | None:
    for key, ranges in placement.items():
        if any(f <= agent_id < f + c for f, c in ranges):
            return key
    return None
