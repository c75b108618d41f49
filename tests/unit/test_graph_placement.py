"""Graph-aware placement: balanced, within capacity, expressible as slot ranges, and cutting
far fewer edges than contiguous ranges on a homophily graph."""

from __future__ import annotations

import numpy as np
import pytest

from populace.core.placement import PlacementError
from populace.graph import (
    contiguous_parts,
    cross_host_posts,
    edge_cut,
    homophily,
    place_graph,
    scale_free,
    small_world,
)

N = 20_000


@pytest.fixture(scope="module")
def alike():
    codes = np.random.default_rng(1).integers(0, 16, N)  # e.g. 16 regions, shuffled over the ids
    return homophily(N, 10, 0.95, codes, seed=3)


def check(placed, n, capacities, bound=0.03):
    assert sorted(placed.order.tolist()) == list(range(n))  # a permutation of the agents
    first = 0
    for i, h in enumerate(placed.hosts):
        ((start, count),) = placed.ranges[h]
        assert start == first  # one contiguous run of slots per host, in host order
        first += count
        agents = placed.agents_of(h)
        assert (placed.part[agents] == i).all() and agents.size == count
        share = n * capacities[h] / sum(capacities.values())
        assert abs(count - share) <= bound * share + 1 and count <= capacities[h]
    assert first == n


@pytest.mark.parametrize("k", [2, 8])
def test_homophily_graph_cuts_far_fewer_edges(alike, k):
    caps = {f"h{i}": N // k + 100 for i in range(k)}
    _, contiguous = contiguous_parts(N, caps)
    placed = place_graph(alike, caps, seed=0)
    check(placed, N, caps)
    assert placed.method == "metis"
    before, after = edge_cut(alike, contiguous), edge_cut(alike, placed.part)
    assert before == pytest.approx(1 - 1 / k, abs=0.02)  # ids carry no structure: a random cut
    assert after < before / 3
    assert cross_host_posts(alike, placed.part) < cross_host_posts(alike, contiguous)


def test_unequal_capacities_are_respected(alike):
    caps = {"big": 15_000, "mid": 6_000, "small": 2_000}  # room for 23,000: shares 65%, 26%, 9%
    placed = place_graph(alike, caps, seed=0)
    check(placed, N, caps)


def test_deterministic_for_a_seed(alike):
    caps = {"a": N, "b": N}
    one, two = place_graph(alike, caps, seed=5), place_graph(alike, caps, seed=5)
    assert np.array_equal(one.part, two.part) and np.array_equal(one.order, two.order)


def test_keeps_contiguous_ranges_when_they_cut_less():
    ring = small_world(N, 10, 0.0, seed=0)  # a lattice in id order: contiguous is near optimal
    caps = {"a": N, "b": N}
    placed = place_graph(ring, caps)
    assert placed.method == "contiguous" and np.array_equal(placed.order, np.arange(N))
    assert placed.ranges == {"a": [(0, N // 2)], "b": [(N // 2, N // 2)]}


def test_directed_and_one_host():
    g = scale_free(5000, 3, seed=1, directed=True)
    placed = place_graph(g, {"a": 2500, "b": 2500, "c": 2500}, seed=0)
    check(placed, 5000, {"a": 2500, "b": 2500, "c": 2500})
    solo = place_graph(g, {"only": 5000})
    assert solo.ranges == {"only": [(0, 5000)]} and edge_cut(g, solo.part) == 0.0


def test_no_room_is_refused(alike):
    with pytest.raises(PlacementError):
        place_graph(alike, {"a": 1000, "b": 1000})


def test_cut_measures():
    g = small_world(8, 2, 0.0, seed=0)  # a ring 0-1-...-7-0
    part = np.array([0, 0, 0, 0, 1, 1, 1, 1], dtype=np.int32)
    assert edge_cut(g, part) == pytest.approx(2 / 8)  # 3-4 and 7-0, each stored both ways
    assert cross_host_posts(g, part) == 4  # 3→host 1, 4→host 0, 7→host 0, 0→host 1
