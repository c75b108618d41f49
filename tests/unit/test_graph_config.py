"""The `graph:` section: every refusal names its field (populace.graph.config)."""

from __future__ import annotations

import pytest

from populace.core.scenario import ScenarioError
from populace.graph import GraphError, HomophilyGraph, ScaleFreeGraph, SmallWorldGraph, parse_graph


def refusal(data: object, agents: int | None = 1000) -> str:
    with pytest.raises(GraphError) as info:
        parse_graph(data, agents=agents)
    return str(info.value)


def test_each_generator_parses_with_defaults():
    ws = parse_graph({"generator": "small-world"}, agents=1000)
    assert isinstance(ws, SmallWorldGraph) and (ws.degree, ws.rewire, ws.directed, ws.self_loops) == (10, 0.1, False, False)
    assert isinstance(parse_graph({"generator": "scale-free", "m": 3, "directed": True, "seed": 4}), ScaleFreeGraph)
    h = parse_graph({"generator": "homophily", "attribute": "education", "strength": 0.9})
    assert isinstance(h, HomophilyGraph) and h.attribute == "education"
    assert parse_graph({"generator": "edges", "path": "g.parquet"}).path == "g.parquet"


def test_graph_error_is_a_scenario_error():
    assert issubclass(GraphError, ScenarioError)  # so the CLI exits 2 on it like on any scenario error


@pytest.mark.parametrize(("data", "start"), [
    ({"generator": "lattice"}, "graph.generator: unknown generator 'lattice'"),
    ({"degree": 4}, "graph.generator: is required"),
    ({"generator": "small-world", "degree": 0}, "graph.degree: must be ≥ 1 and < agents (1000)"),
    ({"generator": "small-world", "degree": 1000}, "graph.degree: must be ≥ 1 and < agents (1000)"),
    ({"generator": "small-world", "degree": 5}, "graph.degree: must be even"),
    ({"generator": "small-world", "rewire": 1.5}, "graph.rewire:"),
    ({"generator": "small-world", "rewire": -0.1}, "graph.rewire:"),
    ({"generator": "small-world", "rewire": True}, "graph.rewire: must be a number"),
    ({"generator": "scale-free", "m": 1000}, "graph.m: must be ≥ 1 and < agents (1000)"),
    ({"generator": "scale-free", "m": 0}, "graph.m:"),
    ({"generator": "homophily", "degree": 4}, "graph.attribute: Field required"),
    ({"generator": "homophily", "attribute": "region", "strength": 2}, "graph.strength:"),
    ({"generator": "homophily", "attribute": "region", "degree": 1000}, "graph.degree: must be ≥ 1 and < agents"),
    ({"generator": "edges"}, "graph.path: Field required"),
    ({"generator": "edges", "path": "g.json"}, "graph.path: must name a .csv or .parquet file"),
    ({"generator": "small-world", "weights": 3}, "graph.weights: unknown key"),
    ({"generator": "small-world", "seed": -1}, "graph.seed:"),
    ({"generator": "small-world", "directed": "sometimes"}, "graph.directed:"),
])
def test_refusals_name_the_field(data, start):
    assert refusal(data).startswith(start), refusal(data)


def test_several_problems_one_line_each():
    lines = refusal({"generator": "small-world", "degree": 0, "rewire": 3}).splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["graph.degree", "graph.rewire"]


def test_not_a_mapping():
    assert refusal([1, 2]).startswith("graph: must be a mapping")


def test_degree_bound_needs_the_agent_count():
    assert parse_graph({"generator": "small-world", "degree": 2000}, agents=None).degree == 2000
    assert "graph.degree: must be ≥ 1 and < agents (100)" in refusal({"generator": "small-world", "degree": 100}, 100)
    assert "edges" in refusal({"generator": "homophily", "attribute": "a", "degree": 50_000}, 90_000_000)
