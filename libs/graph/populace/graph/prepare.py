"""A run's graph from its scenario, ready to store: built, and (with `placement: partition`)
its agents numbered so that contiguous id ranges — what the orchestrator places on hosts —
are parts of the graph.

Why renumber instead of placing arbitrary id sets: everything downstream of placement (shares
keyed by (run, round, range, epoch), checkpoints per range, re-placement of a lost host's
range, the recorder's expected rows) speaks contiguous ranges. Ordering the agents by a
recursive bisection (METIS, 2^k parts whose numbering is hierarchical) makes *any* split into
contiguous ranges follow the graph: halves are a bisection, quarters a 4-way partition, and a
split into 3 cuts through one part only. So the order is fixed once, before the hosts are known,
and a lost host's range re-placed later still holds neighbours together. The personas follow
their agents (agent i gets node order[i]'s persona), and `order` is stored with the run so a
result can be read back in the generator's or the edge list's own node ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from populace.graph.build import attribute_codes, build_graph
from populace.graph.config import GraphConfig, HomophilyGraph, parse_graph
from populace.graph.csr import Graph, from_edges
from populace.graph.serial import digest, dumps

__all__ = ["PreparedGraph", "bisection_parts", "partition_order", "prepare_graph", "relabel"]

MAX_PARTS = 64  # finest level of the bisection: more than any run's host count here
HOSTS_REPORTED = range(1, 9)  # the manifest's edge cuts: an even split over this many hosts


@dataclass(frozen=True, eq=False)
class PreparedGraph:
    graph: Graph  # over agent ids (renumbered when `order` is set)
    data: bytes  # canonical bytes (populace.graph.serial), to store by `digest`
    digest: str
    order: np.ndarray | None  # int32: agent id -> node id of the config's numbering (None: the same)
    order_digest: str | None
    stats: dict = field(default_factory=dict)  # for the run's manifest


def bisection_parts(n: int) -> int:
    """Parts of the bisection for n agents: a power of two, at most 64, about 32+ agents each."""
    parts = 1
    while parts * 2 <= MAX_PARTS and n // (parts * 2) >= 32:
        parts *= 2
    return parts


def partition_order(graph: Graph, parts: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """(order, method): node ids sorted by their part of a recursive bisection into `parts`
    (by id within a part). Without pymetis (no wheel for this platform) or with one part, the
    identity, method naming why."""
    n = graph.n
    if parts < 2 or graph.entries == 0:
        return np.arange(n, dtype=np.int32), "ids (graph too small to partition)"
    try:
        import pymetis
    except ImportError:
        return np.arange(n, dtype=np.int32), "ids (pymetis is not installed)"
    from populace.graph.placement import _symmetric

    xadj, adjncy = _symmetric(graph)
    opts = pymetis.Options(seed=int(seed) % 2**31)
    _, membership = pymetis.part_graph(parts, pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
                                       recursive=True, options=opts)
    part = np.asarray(membership, dtype=np.int32)
    return np.argsort(part, kind="stable").astype(np.int32), f"metis recursive bisection, {parts} parts"


def relabel(graph: Graph, order: np.ndarray) -> Graph:
    """The graph over new ids: new id i is old node order[i]."""
    rank = np.empty(graph.n, dtype=np.int64)
    rank[order] = np.arange(graph.n, dtype=np.int64)
    src = rank[graph.sources]
    dst = rank[graph.targets()]
    # directed=True: both directions are already stored for an undirected graph
    g = from_edges(graph.n, src, dst, directed=True, weights=graph.weights, self_loops=True)
    return Graph(n=g.n, offsets=g.offsets, sources=g.sources, weights=g.weights, directed=graph.directed)


def _contiguous_cut(graph: Graph, hosts: int) -> float:
    if graph.entries == 0 or hosts < 2:
        return 0.0
    size = -(-graph.n // hosts)
    part = np.arange(graph.n) // size
    return float(np.count_nonzero(part[graph.sources] != part[graph.targets()]) / graph.entries)


def prepare_graph(spec: dict, agents: int, *, seed: int, placement: str = "partition",
                  records: Sequence[dict] | None = None, base: Path = Path(".")) -> PreparedGraph:
    """Validate (GraphError naming the field), build, and renumber a run's graph. `records`: the
    run's persona records in agent order (homophily needs them)."""
    config: GraphConfig = parse_graph(spec, agents)
    codes = None
    if isinstance(config, HomophilyGraph) and records is not None:
        codes, _ = attribute_codes(records, config.attribute)
    graph = build_graph(config, agents, seed=seed, codes=codes, base=base)
    stats: dict = {"generator": config.kind, "edges": graph.edges, "entries": graph.entries,
                   "mean_degree": round(graph.mean_degree(), 3), "directed": graph.directed,
                   "placement": placement}
    order = None
    if placement == "partition":
        order, method = partition_order(graph, bisection_parts(agents), seed=seed)
        identity = bool((order == np.arange(agents)).all())
        stats["method"] = method
        stats["edge_cut_ids"] = {str(k): round(_contiguous_cut(graph, k), 4) for k in HOSTS_REPORTED}
        if identity:
            order = None
        else:
            graph = relabel(graph, order)
        stats["edge_cut"] = {str(k): round(_contiguous_cut(graph, k), 4) for k in HOSTS_REPORTED}
    data = dumps(graph)
    order_digest = None
    if order is not None:
        import hashlib

        order_digest = hashlib.sha256(np.ascontiguousarray(order, dtype="<i4").tobytes()).hexdigest()
    return PreparedGraph(graph=graph, data=data, digest=digest(data), order=order, order_digest=order_digest,
                         stats=stats)
