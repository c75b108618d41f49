"""Populace graphs: a run's social graph (who hears whom), built once from the scenario's
`graph:` section, stored once by digest, and used to place agents so most edges stay on
one host.

Typical use::

    from populace.graph import build_graph, dumps, digest, parse_graph, place_graph

    cfg = parse_graph({"generator": "small-world", "degree": 10, "rewire": 0.1}, agents=1_000_000)
    g = build_graph(cfg, 1_000_000, seed=0)          # CSR of in-neighbours, ~2 s
    data = dumps(g); key = digest(data)               # canonical bytes, sha256
    placed = place_graph(g, {"h1": 500_000, "h2": 500_000})
"""

from populace.graph.build import attribute_codes, build_graph
from populace.graph.config import (
    GENERATORS,
    EdgeListGraph,
    GraphConfig,
    GraphError,
    HomophilyGraph,
    ScaleFreeGraph,
    SmallWorldGraph,
    parse_graph,
)
from populace.graph.csr import Graph, from_edges
from populace.graph.edgelist import load_edge_list
from populace.graph.generators import homophily, scale_free, small_world
from populace.graph.placement import (
    GraphPlacement,
    contiguous_parts,
    cross_host_posts,
    edge_cut,
    place_graph,
    ranges_of,
)
from populace.graph.serial import digest, dumps, loads

__all__ = [
    "GENERATORS",
    "EdgeListGraph",
    "Graph",
    "GraphConfig",
    "GraphError",
    "GraphPlacement",
    "HomophilyGraph",
    "ScaleFreeGraph",
    "SmallWorldGraph",
    "attribute_codes",
    "build_graph",
    "contiguous_parts",
    "cross_host_posts",
    "digest",
    "dumps",
    "edge_cut",
    "from_edges",
    "homophily",
    "load_edge_list",
    "loads",
    "parse_graph",
    "place_graph",
    "ranges_of",
    "scale_free",
    "small_world",
]
