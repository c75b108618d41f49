"""A scenario's graph is built and numbered before the run: the renumbered graph is the same
graph (every edge maps through the order), the personas follow their agents, contiguous ranges
cut fewer edges than the generator's ids, and what the scenario did not set stays unset."""

from __future__ import annotations

import json

import numpy as np

from populace.client.prepare import prepare_file
from populace.graph import build_graph, loads, parse_graph
from populace.graph.prepare import bisection_parts, prepare_graph, relabel


def test_relabel_keeps_every_edge():
    g = build_graph(parse_graph({"generator": "scale-free", "m": 3, "directed": True}, 300), 300, seed=2)
    order = np.random.default_rng(1).permutation(300).astype(np.int32)
    r = relabel(g, order)
    rank = np.empty(300, dtype=np.int64)
    rank[order] = np.arange(300)
    before = {(int(rank[s]), int(rank[t])) for s, t in zip(g.sources, g.targets(), strict=True)}
    after = set(zip(r.sources.tolist(), r.targets().tolist(), strict=True))
    assert before == after and r.directed


def test_partition_order_cuts_fewer_edges_than_the_ids():
    rng = np.random.default_rng(0)
    records = [{"profile": {"region": str(rng.integers(0, 4))}} for _ in range(4000)]
    spec = {"generator": "homophily", "attribute": "region", "degree": 8, "strength": 0.9}
    p = prepare_graph(spec, 4000, seed=1, records=records)
    assert p.order is not None and p.stats["method"].startswith("metis")
    for k in ("2", "4"):
        assert p.stats["edge_cut"][k] < p.stats["edge_cut_ids"][k] / 2, p.stats
    ids = prepare_graph(spec, 4000, seed=1, records=records, placement="ids")
    assert ids.order is None and ids.graph.entries == p.graph.entries
    assert bisection_parts(10) == 1 and bisection_parts(4000) == 64


def test_a_prepared_scenario_renumbers_personas_with_the_graph(tmp_path):
    (tmp_path / "pop.yaml").write_text("name: p\ntotal: 400\nattributes:\n"
                                       "  region:\n    weights: {north: 0.25, south: 0.25, east: 0.25, west: 0.25}\n")
    (tmp_path / "s.yaml").write_text("simulation: opinion\nrounds: 2\npopulation: {config: pop.yaml}\n"
                                     "graph: {generator: homophily, attribute: region, degree: 6, strength: 0.9}\n")
    p = prepare_file(tmp_path / "s.yaml")
    assert p.config.graph.digest == p.manifest["graph"]["digest"] and p.graph is not None
    assert p.config.model.max_tokens == 96, "the simulation's model default must survive the population"
    order = np.frombuffer(p.graph_order, dtype="<i4")
    records = [json.loads(line) for line in p.personas.decode().splitlines()]
    g = loads(p.graph, expect_digest=p.config.graph.digest)
    same = np.array([records[s]["profile"]["region"] == records[t]["profile"]["region"]
                     for s, t in zip(g.sources.tolist(), g.targets().tolist(), strict=True)])
    assert same.mean() > 0.85, "homophily must hold between the renumbered agents' personas"
    assert sorted(order.tolist()) == list(range(400))


def test_a_rerun_builds_the_same_graph_and_names_an_edge_list_that_changed(tmp_path):
    import pytest

    from populace.client.prepare import prepare_rerun
    from populace.core.scenario import ScenarioError

    (tmp_path / "edges.csv").write_text("source,target\n" + "".join(f"{i},{(i * 7 + 3) % 60}\n" for i in range(60)))
    (tmp_path / "s.yaml").write_text("simulation: opinion\nagents: 60\nrounds: 2\n"
                                     "graph: {generator: edges, path: edges.csv, directed: true}\n")
    first = prepare_file(tmp_path / "s.yaml")
    again = prepare_rerun(first.manifest)
    assert again.config.graph.digest == first.config.graph.digest and again.graph == first.graph
    (tmp_path / "edges.csv").write_text("source,target\n0,1\n1,2\n")
    with pytest.raises(ScenarioError, match="graph: edges.csv changed since the run"):
        prepare_rerun(first.manifest)


def test_a_fork_keeps_its_parents_graph_and_may_add_a_broadcast(tmp_path):
    import pytest

    from populace.client.prepare import prepare_fork
    from populace.core.scenario import ScenarioError

    (tmp_path / "s.yaml").write_text("simulation: opinion\nagents: 80\nrounds: 4\n"
                                     "graph: {generator: small-world, degree: 4}\n")
    parent = prepare_file(tmp_path / "s.yaml")
    with pytest.raises(ScenarioError, match="graph: a fork keeps its parent's graph"):
        prepare_fork(parent.config, 2, {"graph": {"generator": "scale-free", "m": 2}}, parent.manifest)
    fork = prepare_fork(parent.config, 2, {"broadcasts": [{"round": 3, "text": "vote yes", "fields": {"stance": 1.0}}]},
                        parent.manifest)
    assert fork.config.graph.digest == parent.config.graph.digest and fork.config.broadcasts[0].round == 3
    assert fork.manifest["graph"] == parent.manifest["graph"]
