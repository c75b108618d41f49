"""Bad `graph:` and `broadcasts:` sections: each is refused with exit code 2 and a message
naming the field, by `populace validate` and by `populace demo` before anything starts — an
edge list naming an agent that does not exist included. In process (the `cli` fixture: typer's
runner on the real app); tests/e2e/test_cli.py runs `validate` and `demo` as real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

SIMS = Path(__file__).resolve().parents[1] / "e2e" / "sims"  # gossip_sim

HEAD = "simulation: gossip_sim:Gossip\nagents: 50\nrounds: 3\n"
POP = "population: {config: pop.yaml}\n"
POP_YAML = "name: p\ntotal: 50\nattributes:\n  region:\n    weights: {north: 0.5, south: 0.5}\n"

BAD = {
    "an unknown generator": (HEAD + "graph: {generator: lattice}\n", "graph.generator"),
    "no generator": (HEAD + "graph: {degree: 4}\n", "graph.generator"),
    "a degree as large as the run": (HEAD + "graph: {generator: small-world, degree: 50}\n", "graph.degree"),
    "a degree below 1": (HEAD + "graph: {generator: homophily, attribute: region, degree: 0}\n" + POP,
                         "graph.degree"),
    "a probability above 1": (HEAD + "graph: {generator: small-world, degree: 4, rewire: 1.5}\n", "graph.rewire"),
    "a probability below 0": (HEAD + "graph: {generator: homophily, attribute: region, strength: -0.1}\n" + POP,
                              "graph.strength"),
    "an unknown key": (HEAD + "graph: {generator: scale-free, m: 3, colour: red}\n", "graph.colour"),
    "an attribute the personas lack": (HEAD + "graph: {generator: homophily, attribute: income}\n" + POP,
                                       "graph.attribute"),
    "homophily without personas": (HEAD + "graph: {generator: homophily, attribute: region}\n", "graph.attribute"),
    "an edge list naming an agent that does not exist": (
        HEAD + "graph: {generator: edges, path: edges.csv}\n", "graph.path"),
    "an edge list with a self-loop": (HEAD + "graph: {generator: edges, path: loops.csv}\n", "graph.path"),
    "an edge list that is not there": (HEAD + "graph: {generator: edges, path: nowhere.csv}\n", "graph.path"),
    "a broadcast after the last round": (
        HEAD + "graph: {generator: small-world, degree: 4}\nbroadcasts: [{round: 9, text: hi}]\n", "broadcasts.0.round"),
    "a broadcast without a graph": (HEAD + "broadcasts: [{round: 1, text: hi}]\n", "broadcasts.0"),
    "a broadcast to more agents than the run has": (
        HEAD + "graph: {generator: small-world, degree: 4}\n"
               "broadcasts: [{round: 1, text: hi, to: top-degree, count: 500}]\n", "broadcasts.0.count"),
    "a broadcast to an agent that does not exist": (
        HEAD + "graph: {generator: small-world, degree: 4}\n"
               "broadcasts: [{round: 1, text: hi, to: agents, agents: [3, 77]}]\n", "broadcasts.0.agents"),
    "a graph with one process per agent": (
        HEAD + "graph: {generator: small-world, degree: 4}\nplacement: {agents_per_process: 1}\n", "graph"),
}


@pytest.fixture(autouse=True)
def gossip_sim(monkeypatch):
    monkeypatch.syspath_prepend(str(SIMS))  # what PYTHONPATH gave the process


def _files(tmp_path):
    (tmp_path / "pop.yaml").write_text(POP_YAML)
    (tmp_path / "edges.csv").write_text("source,target\n0,1\n1,2\n2,50\n")
    (tmp_path / "loops.csv").write_text("source,target\n0,1\n3,3\n")


@pytest.mark.parametrize("case", sorted(BAD))
def test_validate_refuses_it_naming_the_field(cli, tmp_path, case):
    text, field = BAD[case]
    _files(tmp_path)
    (tmp_path / "scenario.yaml").write_text(text)
    res = cli("validate", "scenario.yaml", cwd=tmp_path)
    assert res.returncode == 2, (case, res.stdout, res.stderr)
    assert field in res.stderr, (case, res.stderr)


def test_demo_refuses_a_bad_edge_list_before_anything_starts(cli, tmp_path):
    _files(tmp_path)
    (tmp_path / "scenario.yaml").write_text(BAD["an edge list naming an agent that does not exist"][0])
    res = cli("demo", "--scenario", "scenario.yaml", "--db", str(tmp_path / "x.duckdb"), cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "graph.path" in res.stderr and "row 3" in res.stderr and "50 is not an agent id" in res.stderr, res.stderr
    assert "starting nats-server" not in res.stdout + res.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_a_graph_with_one_agent_per_process_is_refused_alike_by_the_cli_a_config_and_run_local(cli, tmp_path):
    """Issue 37: `run_local(cfg, one_per_process=True)` accepted a run with a graph (its agents read
    the inboxes through a pickled copy of the host's mailbox) while the CLI refused it. Every path
    now refuses it with the same line: the CLI, a RunConfig built in a notebook (what the
    orchestrator validates too) and the local runner."""
    import asyncio

    from pydantic import ValidationError

    from populace.core.contracts import GRAPH_ONE_PER_PROCESS, RunConfig
    from populace.sdk.local import run_local

    (tmp_path / "scenario.yaml").write_text(BAD["a graph with one process per agent"][0])
    res = cli("validate", "scenario.yaml", cwd=tmp_path)
    assert res.returncode == 2 and GRAPH_ONE_PER_PROCESS in " ".join(res.stderr.split()), res.stderr
    data = {"simulation": "gossip_sim:Gossip", "agents": 20, "rounds": 2, "graph": {"generator": "small-world",
                                                                                  "degree": 4}}
    with pytest.raises(ValidationError, match="graph: a run with a graph cannot place one agent per process"):
        RunConfig.model_validate({**data, "placement": {"agents_per_process": 1}})
    with pytest.raises(ValueError, match="graph: a run with a graph cannot place one agent per process"):
        asyncio.run(run_local(RunConfig.model_validate(data), one_per_process=True, hosts=2))
