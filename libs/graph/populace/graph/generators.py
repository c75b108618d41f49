"""Seeded, vectorised graph generators (numpy only: networkx takes minutes at 1M agents).

Each returns a :class:`Graph` (in-neighbours, CSR). The same (config, agents, seed, codes)
always gives the same arrays, on any machine: numpy's PCG64 stream is stable across releases
for the calls used here (``random``, ``integers``).

Repeated picks (two rewirings onto the same agent, a new agent picking one agent twice)
collapse into one edge rather than being redrawn one by one in Python, so the mean degree is
a hair under the nominal one (under 0.1% at 1M agents; see the tests and bench).
"""

from __future__ import annotations

import numpy as np

from populace.graph.csr import Graph, from_edges

__all__ = ["homophily", "scale_free", "small_world"]

_REDRAWS = 8  # rounds of redrawing self-loops before the rest are dropped


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def small_world(n: int, degree: int, rewire: float, *, seed: int, directed: bool = False,
                self_loops: bool = False) -> Graph:
    """Watts–Strogatz. Undirected: the ring lattice's edges (i, i+j), j = 1..degree/2, each
    with its far end moved to a uniform random agent with probability `rewire` (p = 0 is the
    ring lattice itself). Directed: each agent hears its `degree` lattice neighbours, each of
    those sources replaced by a uniform random agent with probability `rewire`."""
    rng = _rng(seed)
    half = degree // 2
    ids = np.arange(n, dtype=np.int64)
    offs = np.arange(1, half + 1, dtype=np.int64)
    if directed:  # target hears source = target ± j
        dst = np.repeat(ids, 2 * half)
        src = (dst + np.tile(np.concatenate([offs, -offs]), n)) % n
        moved = rng.random(src.size) < rewire
        src[moved] = rng.integers(0, n, int(moved.sum()))
        if not self_loops:
            _redraw_loops(rng, n, src, dst, moved)
        return from_edges(n, src, dst, directed=True, self_loops=self_loops)
    a = np.repeat(ids, half)
    b = (a + np.tile(offs, n)) % n
    moved = rng.random(b.size) < rewire
    b[moved] = rng.integers(0, n, int(moved.sum()))
    if not self_loops:
        _redraw_loops(rng, n, b, a, moved)
    return from_edges(n, a, b, directed=False, self_loops=self_loops)


def _redraw_loops(rng: np.random.Generator, n: int, drawn: np.ndarray, fixed: np.ndarray,
                  mask: np.ndarray | None = None) -> None:
    """Draw again the entries of `drawn` (where `mask`) that equal `fixed`; a few rounds, then
    whatever is left is dropped by from_edges."""
    for _ in range(_REDRAWS):
        bad = drawn == fixed
        if mask is not None:
            bad &= mask
        k = int(bad.sum())
        if not k:
            return
        drawn[bad] = rng.integers(0, n, k)


def scale_free(n: int, m: int, *, seed: int, directed: bool = False, self_loops: bool = False) -> Graph:
    """Barabási–Albert by Batagelj & Brandes' edge-copy form, vectorised.

    Agent m starts linked to agents 0..m-1; each later agent t links to m agents picked in
    proportion to their degree, i.e. to a uniform random endpoint of the edges so far. An
    endpoint is either an edge's new agent (known at once) or an edge's pick (the same as an
    earlier pick); the picks are resolved together by pointer jumping, O(log) numpy passes.
    Directed: agent t hears its picks (edges pick → t), so popular agents are heard by many and
    every agent hears m. No self-loops arise (a pick is always an earlier agent)."""
    rng = _rng(seed)
    edges = m + (n - m - 1) * m  # the star of agent m, then m per later agent
    e = np.arange(edges, dtype=np.int64)
    new = np.empty(edges, dtype=np.int64)  # the arriving agent of each edge
    new[:m] = m
    new[m:] = m + 1 + (e[m:] - m) // m
    # edges of agents before t: the star's m plus m per agent m+1..t-1
    before = m + (new[m:] - m - 1) * m
    r = (rng.random(edges - m) * (2 * before)).astype(np.int64)  # an endpoint among those edges
    r = np.minimum(r, 2 * before - 1)
    pick = np.empty(edges, dtype=np.int64)
    pick[:m] = np.arange(m)
    ref = np.full(edges, -1, dtype=np.int64)  # the earlier edge whose pick this one copies
    even = (r % 2) == 0
    tail = pick[m:]
    tail[even] = new[r[even] // 2]
    ref_tail = ref[m:]
    ref_tail[~even] = r[~even] // 2
    # pointer jumping: an unresolved edge copies its referent's pick once that is resolved,
    # else jumps to its referent's referent
    todo = np.flatnonzero(ref >= 0)
    while todo.size:
        tgt = ref[todo]
        further = ref[tgt]  # read before this pass writes: a referent resolved at the start
        done = further < 0
        pick[todo[done]] = pick[tgt[done]]
        ref[todo[done]] = -1
        todo = todo[~done]
        ref[todo] = further[~done]
    if directed:
        return from_edges(n, pick, new, directed=True, self_loops=self_loops)
    return from_edges(n, new, pick, directed=False, self_loops=self_loops)


def homophily(n: int, degree: int, strength: float, codes: np.ndarray, *, seed: int,
              directed: bool = False, self_loops: bool = False) -> Graph:
    """Random edges biased to shared attributes. `codes[i]` is agent i's category (any
    integers; agents with equal codes share the attribute). Each edge starts at an agent
    (round robin, so every agent starts about the same number); its other end is, with
    probability `strength`, a uniform random agent of the same category, else a uniform
    random agent. Undirected: n·degree/2 edges (mean degree `degree`). Directed: each agent
    hears `degree` agents drawn that way."""
    codes = np.asarray(codes)
    if codes.shape != (n,):
        raise ValueError(f"codes: need one category per agent ({n}), got shape {codes.shape}")
    rng = _rng(seed)
    _, group = np.unique(codes, return_inverse=True)
    group = group.astype(np.int64).reshape(-1)
    order = np.argsort(group, kind="stable")  # agents grouped by category
    size = np.bincount(group)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    count = n * degree if directed else (n * degree) // 2
    a = np.arange(count, dtype=np.int64) % n  # the starting (hearing, when directed) agent

    def draw(at: np.ndarray) -> np.ndarray:
        same = rng.random(at.size) < strength
        out = rng.integers(0, n, at.size)
        g = group[at[same]]
        out[same] = order[start[g] + (rng.random(g.size) * size[g]).astype(np.int64)]
        return out

    b = draw(a)
    if not self_loops:
        for _ in range(_REDRAWS):
            bad = np.flatnonzero(b == a)
            if not bad.size:
                break
            b[bad] = draw(a[bad])
    if directed:
        return from_edges(n, b, a, directed=True, self_loops=self_loops)
    return from_edges(n, a, b, directed=False, self_loops=self_loops)
