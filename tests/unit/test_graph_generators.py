"""Graph generators: seeded, deterministic, and shaped as their names promise."""

from __future__ import annotations

import numpy as np
import pytest

from populace.graph import (
    Graph,
    GraphError,
    attribute_codes,
    build_graph,
    from_edges,
    homophily,
    parse_graph,
    scale_free,
    small_world,
)

N = 20_000


def same(a: Graph, b: Graph) -> bool:
    return (a.n == b.n and a.directed == b.directed and np.array_equal(a.offsets, b.offsets)
            and np.array_equal(a.sources, b.sources))


def rows_are_sorted_and_unique(g: Graph) -> bool:
    step = np.diff(g.sources.astype(np.int64))
    inner = np.ones(g.entries - 1, dtype=bool)
    inner[g.offsets[1:-1][g.offsets[1:-1] > 0] - 1] = False
    return bool((step[inner] > 0).all())


def symmetric(g: Graph) -> bool:
    fwd = np.sort(g.targets().astype(np.int64) * g.n + g.sources)
    back = np.sort(g.sources.astype(np.int64) * g.n + g.targets())
    return bool(np.array_equal(fwd, back))


@pytest.mark.parametrize("make", [
    lambda s, d: small_world(N, 10, 0.2, seed=s, directed=d),
    lambda s, d: scale_free(N, 5, seed=s, directed=d),
    lambda s, d: homophily(N, 10, 0.8, np.arange(N) % 7, seed=s, directed=d),
])
@pytest.mark.parametrize("directed", [False, True])
def test_seeded_and_deterministic(make, directed):
    a, b, c = make(1, directed), make(1, directed), make(2, directed)
    assert same(a, b) and not same(a, c)
    assert a.offsets.dtype == np.int64 and a.sources.dtype == np.int32 and a.weights is None
    assert a.offsets[0] == 0 and a.offsets[-1] == a.entries == a.sources.size
    assert rows_are_sorted_and_unique(a)
    assert not np.any(a.sources == a.targets())  # no self-loops unless allowed
    assert symmetric(a) == (not directed)


def test_small_world_p0_is_the_ring_lattice():
    g = small_world(1000, 6, 0.0, seed=3)
    for v in (0, 1, 500, 999):
        want = sorted((v + d) % 1000 for d in (-3, -2, -1, 1, 2, 3))
        assert g.in_neighbours(v).tolist() == want
    assert (g.in_degree() == 6).all()
    d = small_world(1000, 6, 0.0, seed=3, directed=True)
    assert same(Graph(d.n, d.offsets, d.sources, None, False), g)  # directed: each hears the same 6


def test_small_world_rewiring_keeps_the_mean_degree():
    g = small_world(N, 10, 0.3, seed=5)
    assert g.mean_degree() == pytest.approx(10, rel=0.01)
    lattice = np.abs(((g.sources.astype(np.int64) - g.targets() + N // 2) % N) - N // 2) <= 5
    assert 0.6 < lattice.mean() < 0.8  # ~70% of edges are still lattice edges at p = 0.3
    d = small_world(N, 10, 0.3, seed=5, directed=True)
    assert d.in_degree().min() >= 9 and d.mean_degree() == pytest.approx(10, rel=0.01)


def test_scale_free_mean_degree_and_heavy_tail():
    g = scale_free(N, 5, seed=2)
    assert g.mean_degree() == pytest.approx(10, rel=0.01)
    deg = g.in_degree()
    assert deg.min() >= 1 and deg.max() > 30 * deg.mean()  # hubs: a power law, not a Poisson
    assert np.percentile(deg, 50) < deg.mean()  # most agents are below the mean
    ws = small_world(N, 10, 0.2, seed=2).in_degree()
    assert ws.max() < 3 * ws.mean()  # ... which a small world is not
    d = scale_free(N, 5, seed=2, directed=True)
    assert (d.in_degree()[6:] <= 5).all() and d.in_degree()[6:].mean() > 4.9  # each hears its m picks
    assert d.out_degree().max() > 100  # hubs are heard by many


def test_homophily_links_alike_agents():
    rng = np.random.default_rng(0)
    codes = rng.choice(4, size=N, p=[0.4, 0.3, 0.2, 0.1])
    baseline = float(((np.bincount(codes) / N) ** 2).sum())  # same-attribute share of random edges: 0.30
    for strength in (0.5, 0.9):
        g = homophily(N, 10, strength, codes, seed=1)
        share = float((codes[g.sources] == codes[g.targets()]).mean())
        assert share == pytest.approx(strength + (1 - strength) * baseline, abs=0.02)
        assert share > baseline + 0.3
        assert g.mean_degree() == pytest.approx(10, rel=0.01)
    zero = homophily(N, 10, 0.0, codes, seed=1)
    assert float((codes[zero.sources] == codes[zero.targets()]).mean()) == pytest.approx(baseline, abs=0.02)
    d = homophily(N, 8, 0.9, codes, seed=1, directed=True)
    assert d.in_degree().min() >= 6 and d.mean_degree() == pytest.approx(8, rel=0.01)
    with pytest.raises(ValueError, match="codes"):
        homophily(N, 10, 0.5, codes[:10], seed=1)


def test_from_edges_drops_repeats_and_self_loops_unless_allowed():
    g = from_edges(4, [0, 0, 1, 2, 2], [1, 1, 0, 2, 3], directed=True)
    assert g.entries == 3 and g.in_neighbours(1).tolist() == [0] and g.in_neighbours(0).tolist() == [1]
    loops = from_edges(4, [2, 0], [2, 1], directed=False, self_loops=True)
    assert loops.in_neighbours(2).tolist() == [2] and loops.entries == 3 and loops.edges == 2
    w = from_edges(3, [0, 0], [1, 2], directed=True, weights=[0.5, 2.0])
    assert w.weights.dtype == np.float32 and w.weights.tolist() == [0.5, 2.0]


def test_build_graph_from_config_and_personas():
    records = [{"profile": {"education": ["high school", "Ph.D."][i % 2]}} for i in range(1000)]
    codes, values = attribute_codes(records, "education")
    assert values == ["high school", "Ph.D."] and codes[:4].tolist() == [0, 1, 0, 1]
    cfg = parse_graph({"generator": "homophily", "attribute": "education", "degree": 6}, agents=1000)
    g = build_graph(cfg, 1000, seed=9, codes=codes)
    assert same(g, homophily(1000, 6, 0.8, codes, seed=9))
    pinned = parse_graph({"generator": "small-world", "degree": 4, "seed": 3}, agents=1000)
    assert same(build_graph(pinned, 1000, seed=0), build_graph(pinned, 1000, seed=1))  # the config's seed wins
    with pytest.raises(GraphError, match=r"^graph.attribute: 'region' is not in agent 0's profile \(it has: education\)"):
        attribute_codes(records, "region")
    with pytest.raises(GraphError, match="^graph.attribute: homophily by 'education' needs the agents' personas"):
        build_graph(cfg, 1000, seed=0)
