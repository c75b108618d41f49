"""Graph-aware placement, pure: which host holds which agents so that most edges stay on one
host — compared with today's contiguous ranges (populace.core.placement.place).

Output shape — a permutation, so placement stays ranges. Everything downstream of placement
(shares keyed by (run, round, range, epoch), checkpoints per range, `place_ranges` after a
host is lost, the recorder's expected rows) speaks in contiguous id ranges. A partition is not
contiguous in agent ids, so :func:`place_graph` returns, besides the host of each agent, an
``order``: slot → agent id, where each host's agents occupy one contiguous run of slots.
The run then places *slots* with ranges exactly as today, and a host maps its slots to
agents through ``order`` (stored by digest next to the graph, like personas). Agent ids —
what the user's edge list, personas and results speak — never change; only which host holds
them does. (Relabelling the agents themselves at prepare time would be the other way; it
would make results, forks and edge lists speak new ids, and placement happens at run start
when the hosts are known, after the ids are fixed.)

Partitioner: METIS k-way (pymetis, a binary wheel; networkx is far too slow at 1M agents) with
target weights proportional to each host's share, then an exact pass that moves the fewest
best-connected agents so every host is within `imbalance` of its share and never above its
free capacity. If today's contiguous ranges cut fewer edges (a small-world ring lattice is
already in id order), they are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from populace.core.contracts import HostInfo
from populace.core.placement import PlacementError, place
from populace.graph.csr import Graph

__all__ = ["GraphPlacement", "contiguous_parts", "cross_host_posts", "edge_cut", "place_graph", "ranges_of"]


@dataclass(frozen=True, eq=False)
class GraphPlacement:
    hosts: list[str]  # host index → host id
    part: np.ndarray  # int32: host index of each agent id
    order: np.ndarray  # int32: slot → agent id; host i holds slots ranges[hosts[i]]
    ranges: dict[str, list[tuple[int, int]]]  # slot ranges, one contiguous range per host
    method: str  # "metis", or "contiguous" when today's ranges already cut fewer edges

    def agents_of(self, host: str) -> np.ndarray:
        return np.concatenate([self.order[first:first + count] for first, count in self.ranges[host]])


def _hosts(capacities: dict[str, int]) -> list[HostInfo]:
    return [HostInfo(host_id=h, capacity=c, pid=0, started_at=0.0, heartbeat_at=0.0)
            for h, c in capacities.items()]


def contiguous_parts(n: int, capacities: dict[str, int]) -> tuple[list[str], np.ndarray]:
    """Today's placement as a host index per agent: `place`'s contiguous ranges."""
    ranges = place(n, _hosts(capacities), policy="capacity")
    hosts = sorted(ranges)
    part = np.empty(n, dtype=np.int32)
    for i, h in enumerate(hosts):
        for first, count in ranges[h]:
            part[first:first + count] = i
    return hosts, part


def edge_cut(graph: Graph, part: np.ndarray) -> float:
    """Cross-host edges / all edges (stored entries: an undirected edge counts both ways,
    which leaves the fraction unchanged)."""
    if graph.entries == 0:
        return 0.0
    return float(np.count_nonzero(part[graph.sources] != part[graph.targets()]) / graph.entries)


def cross_host_posts(graph: Graph, part: np.ndarray) -> int:
    """Post copies that cross hosts in a round where every agent posts once and posts travel
    batched per host pair: an author's post goes once to each other host that holds at least
    one of its hearers (not once per edge). Cross-host bytes ≈ this × the mean post size."""
    t = graph.targets()
    s = graph.sources.astype(np.int64)
    k = int(part.max()) + 1 if part.size else 1
    cross = part[s] != part[t]
    return int(np.unique(s[cross] * k + part[t[cross]]).size)


def ranges_of(hosts: list[str], part: np.ndarray) -> tuple[np.ndarray, dict[str, list[tuple[int, int]]]]:
    """(order, slot ranges): agents grouped by host, by id within a host."""
    order = np.argsort(part, kind="stable").astype(np.int32)
    sizes = np.bincount(part, minlength=len(hosts))
    firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return order, {h: [(int(firsts[i]), int(sizes[i]))] for i, h in enumerate(hosts) if sizes[i]}


def _symmetric(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(xadj, adjncy) for METIS: symmetric, no self-loops, int32 where it fits."""
    from populace.graph.csr import from_edges

    if graph.directed or np.count_nonzero(graph.sources == graph.targets()):
        sym = from_edges(graph.n, graph.sources, graph.targets(), directed=False)
    else:
        sym = graph
    idx = np.int32 if sym.entries < 2**31 else np.int64
    return sym.offsets.astype(idx), sym.sources.astype(idx, copy=False)


def place_graph(graph: Graph, capacities: dict[str, int], *, imbalance: float = 0.03,
                seed: int = 0) -> GraphPlacement:
    """Assign agents to hosts so most edges are host-local. Each host's count is within
    `imbalance` of its share in `place` (proportional to free capacity) and never above
    its capacity. Deterministic for a seed. Weights are ignored (every edge counts one).
    Without pymetis (no wheel for this platform) the contiguous ranges are kept, method
    "contiguous (pymetis is not installed)"."""
    try:
        import pymetis
    except ImportError:
        pymetis = None

    n = graph.n
    shares = place(n, _hosts(capacities), policy="capacity")  # exact shares, the same as contiguous placement
    hosts = sorted(shares)
    target = np.array([sum(c for _, c in shares[h]) for h in hosts], dtype=np.int64)
    cap = np.array([capacities[h] for h in hosts], dtype=np.int64)
    lo = np.ceil(target * (1 - imbalance)).astype(np.int64)
    hi = np.minimum(cap, np.floor(target * (1 + imbalance)).astype(np.int64))
    if (hi < target).any():
        raise PlacementError("a host's capacity is below its share")
    if len(hosts) == 1:
        part = np.zeros(n, dtype=np.int32)
    elif pymetis is None:
        _, contiguous = contiguous_parts(n, capacities)
        order, ranges = ranges_of(hosts, contiguous)
        return GraphPlacement(hosts=hosts, part=contiguous, order=order, ranges=ranges,
                              method="contiguous (pymetis is not installed)")
    else:
        xadj, adjncy = _symmetric(graph)
        opts = pymetis.Options(seed=int(seed) % 2**31, ufactor=max(1, int(imbalance * 1000) - 5))
        _, membership = pymetis.part_graph(len(hosts), pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
                                           tpwgts=list(target / target.sum()), options=opts)
        part = np.asarray(membership, dtype=np.int32)
        _rebalance(graph, part, target, lo, hi)
        # A graph whose ids already follow its structure (a ring lattice, an edge list in
        # crawl order) may be cut less by today's ranges: then keep them (order = identity).
        _, contiguous = contiguous_parts(n, capacities)
        if edge_cut(graph, contiguous) <= edge_cut(graph, part):
            order, ranges = ranges_of(hosts, contiguous)
            return GraphPlacement(hosts=hosts, part=contiguous, order=order, ranges=ranges, method="contiguous")
    order, ranges = ranges_of(hosts, part)
    return GraphPlacement(hosts=hosts, part=part, order=order, ranges=ranges, method="metis")


def _rebalance(graph: Graph, part: np.ndarray, target: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
    """Move agents until every host is within [lo, hi]: from the host most over to the one
    most under, the donor's agents with the most neighbours on the receiver first."""
    k = target.size
    t, s = graph.targets(), graph.sources
    for _ in range(4 * k):
        size = np.bincount(part, minlength=k)
        excess, deficit = size - hi, lo - size
        if excess.max() > 0:
            donor = int(np.argmax(excess))
            receiver = int(np.argmin(size - target))
            amount = int(min(excess[donor], target[receiver] - size[receiver]))
        elif deficit.max() > 0:
            receiver = int(np.argmax(deficit))
            donor = int(np.argmax(size - target))
            amount = int(min(deficit[receiver], size[donor] - target[donor]))
        else:
            return
        mine = np.flatnonzero(part == donor)
        # gain of moving v: its neighbours on the receiver minus those on the donor (both ways)
        gain = np.zeros(graph.n, dtype=np.int64)
        for a, b in ((t, s), (s, t)):
            on = part[b]
            gain += np.bincount(a[on == receiver], minlength=graph.n)
            gain -= np.bincount(a[on == donor], minlength=graph.n)
        best = mine[np.argsort(-gain[mine], kind="stable")[:amount]]
        part[best] = receiver
    raise PlacementError("could not balance the hosts within the bound")
