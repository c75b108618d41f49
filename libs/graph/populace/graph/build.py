"""One entry point from a validated `graph:` section to the run's graph."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from populace.graph.config import (
    EdgeListGraph,
    GraphConfig,
    GraphError,
    HomophilyGraph,
    ScaleFreeGraph,
    SmallWorldGraph,
)
from populace.graph.csr import Graph
from populace.graph.edgelist import load_edge_list
from populace.graph.generators import homophily, scale_free, small_world

__all__ = ["attribute_codes", "build_graph"]


def attribute_codes(records: Sequence[dict], attribute: str) -> tuple[np.ndarray, list]:
    """(codes, values) of a persona attribute: agent i's value is ``values[codes[i]]``.
    `records` are the run's persona records (each with a ``profile`` mapping), one per agent.
    GraphError names `graph.attribute` when an agent's profile lacks it."""
    seen: dict = {}
    codes = np.empty(len(records), dtype=np.int32)
    for i, rec in enumerate(records):
        profile = rec.get("profile") or {}
        if attribute not in profile:
            have = ", ".join(sorted(profile)) or "none"
            raise GraphError(f"graph.attribute: {attribute!r} is not in agent {i}'s profile "
                             f"(it has: {have})")
        value = profile[attribute]
        key = value if isinstance(value, str | int | float | bool) or value is None else repr(value)
        codes[i] = seen.setdefault(key, len(seen))
    return codes, list(seen)


def build_graph(config: GraphConfig, agents: int, *, seed: int, codes: np.ndarray | None = None,
                base: Path = Path(".")) -> Graph:
    """The graph of `config` over agents 0..agents-1. `seed` is the run's seed (the config's
    own `seed` wins); `codes` are the homophily attribute's category codes, one per agent
    (see :func:`attribute_codes`); `base` is the folder an edge list's relative path is in."""
    s = config.seed if config.seed is not None else seed
    common = {"directed": config.directed, "self_loops": config.self_loops}
    if isinstance(config, SmallWorldGraph):
        return small_world(agents, config.degree, config.rewire, seed=s, **common)
    if isinstance(config, ScaleFreeGraph):
        return scale_free(agents, config.m, seed=s, **common)
    if isinstance(config, HomophilyGraph):
        if codes is None:
            raise GraphError(f"graph.attribute: homophily by {config.attribute!r} needs the agents' personas "
                             "(give the scenario a `population:`)")
        if len(codes) != agents:
            raise GraphError(f"graph.attribute: {len(codes)} values of {config.attribute!r} for {agents} agents")
        return homophily(agents, config.degree, config.strength, codes, seed=s, **common)
    if isinstance(config, EdgeListGraph):
        path = Path(config.path)
        return load_edge_list(path if path.is_absolute() else base / path, agents, **common)
    raise GraphError(f"graph.generator: {config!r} is not a graph config")
