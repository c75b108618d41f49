"""Placement policy, pure: which agent ids go to which host."""

from __future__ import annotations

from populace.core.contracts import HostInfo


class PlacementError(ValueError):
    pass


def place(agents: int, hosts: list[HostInfo]) -> dict[str, list[tuple[int, int]]]:
    """Split agent ids 0..agents-1 into contiguous ranges, proportional to each host's free
    capacity (largest-remainder, so counts sum exactly to `agents`; no agent is dropped)."""
    if agents < 1:
        raise PlacementError("agents must be >= 1")
    free = {h.host_id: max(0, h.capacity - h.agents) for h in sorted(hosts, key=lambda h: h.host_id)}
    free = {k: v for k, v in free.items() if v > 0}
    if not free:
        raise PlacementError("no agent-host with free capacity is registered")
    total_free = sum(free.values())
    if total_free < agents:
        raise PlacementError(f"{agents} agents requested but registered hosts have room for {total_free}")
    quotas = {h: agents * f / total_free for h, f in free.items()}
    counts = {h: int(q) for h, q in quotas.items()}
    short = agents - sum(counts.values())
    for h in sorted(quotas, key=lambda h: (counts[h] - quotas[h], h))[:short]:
        counts[h] += 1
    out: dict[str, list[tuple[int, int]]] = {}
    first = 0
    for h, n in counts.items():
        if n:
            out[h] = [(first, n)]
            first += n
    return out
