"""Whole runs in one process (`run_local`): the same rounds on one host, three, or one
process per agent; on a graph, every agent hears its in-neighbours' posts of the round before
and the round's assortativity is the correlation over the graph's edges; the shipped example
validates with its graph and broadcast."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from populace.core import synth
from populace.core.contracts import RunConfig
from populace.sdk import InferError, ModelUnavailable, ScriptedLLM
from populace.sdk.local import local_graph, run_local

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def config(**extra) -> RunConfig:
    return RunConfig.model_validate({"simulation": "opinion", "agents": 40, "rounds": 3, "seed": 3,
                                     "model": {"backend": "dummy", "seed": 5}, **extra})


def mostly_valid(run, round_: int) -> ScriptedLLM:
    """The dummy model's seeded answers, except every 7th agent (shifting with the round)."""
    schema, seed = run.sim.answer_schema(), run.resolved.config.model.seed

    def answer(key: int, prompt: str) -> str:
        return "no comment" if (key + round_) % 7 == 0 else synth.answer(schema, seed, round_, key)

    return ScriptedLLM(answer)


def without(columns: dict, *names: str) -> dict:
    return {k: v for k, v in columns.items() if k not in names}


async def test_one_host_and_three_hosts_play_identical_rounds():
    one = await run_local(config(), hosts=1, llm=mostly_valid)
    three = await run_local(config(), hosts=3, llm=mostly_valid)
    assert without(one.rounds, "closed_at") == without(three.rounds, "closed_at")
    assert without(one.outcomes, "latency_ms") == without(three.outcomes, "latency_ms")
    rows = one.outcomes
    assert set(rows["heard"]) == {0} and set(rows["heard_mean"]) == {None}  # no graph: nothing heard
    assert one.rounds["assortativity"] == [None, None, None]
    invalid = [j for j, v in enumerate(rows["valid"]) if not v]
    assert invalid and all(rows["stance"][j] is None and rows["raw"][j] == "no comment" for j in invalid)


async def test_the_summary_follows_from_the_recorded_stances():
    res = await run_local(config(), hosts=2)
    rows = res.outcomes
    for i, r in enumerate(res.rounds["round"]):
        stances = [s for s, rr, v in zip(rows["stance"], rows["round"], rows["valid"]) if rr == r and v]
        assert res.rounds["n_valid"][i] == len(stances) == 40  # the dummy model always fits the schema
        assert res.rounds["mean_stance"][i] == sum(stances) / len(stances)
        assert res.rounds["extreme_share"][i] == sum(abs(s) >= 0.8 for s in stances) / len(stances)


async def test_one_agent_per_process_plays_the_same_rounds():
    c = config(agents=4, rounds=2)
    forked = await run_local(c, one_per_process=True)
    assert without(forked.rounds, "closed_at") == without((await run_local(c)).rounds, "closed_at")


async def test_no_model_stops_the_round_instead_of_becoming_answers():
    def down(run, round_: int) -> ScriptedLLM:
        return ScriptedLLM({0: InferError("no replica")}, default='{"stance": 0, "post": "Hm."}')

    with pytest.raises(ModelUnavailable):
        await run_local(config(agents=3, rounds=1), llm=down)


def test_the_shipped_example_validates_with_its_graph_and_broadcast():
    from populace.client.prepare import prepare_file

    prepared = prepare_file(EXAMPLES / "opinion.yaml")
    c = prepared.config
    assert c.simulation == "opinion" and c.agents == 200 and c.rounds == 4 and c.population is not None
    assert c.graph is not None and c.graph.spec["generator"] == "homophily"
    assert [(b.round, b.to, b.count, b.fields) for b in c.broadcasts] == [(3, "top-degree", 20, {"stance": 1.0})]
    assert prepared.resolved.params.prompt.max_posts == 10


# --- with a graph (run_local builds it from the section) -----------------------------------------

def drifting(run, round_: int) -> ScriptedLLM:
    """Each agent moves halfway towards the mean stance it read; every 9th answers garbage."""
    def answer(key: int, prompt: str) -> str:
        if key % 9 == 4:
            return "no comment"
        heard = [float(p.split("(stance ")[1].rstrip(")")) for p in prompt.split("\n") if "(stance " in p]
        start = (key % 7) / 3 - 1
        stance = round(start if not heard else 0.5 * start + 0.5 * sum(heard) / len(heard), 4)
        return json.dumps({"stance": stance, "post": f"Agent {key} says {stance}."})

    return ScriptedLLM(answer)


def graph_config() -> RunConfig:
    return config(agents=36, graph={"generator": "small-world", "degree": 4, "rewire": 0.2},
                  broadcasts=[{"round": 2, "text": "Ban cars now!", "fields": {"stance": 1.0}, "to": "agents",
                               "agents": [0, 5]}])


async def test_a_run_on_a_graph_hears_its_in_neighbours_and_measures_over_its_edges():
    c = graph_config()
    one = await run_local(c, hosts=1, llm=drifting)
    three = await run_local(c, hosts=3, llm=drifting)
    assert without(one.rounds, "closed_at") == without(three.rounds, "closed_at")
    assert without(one.outcomes, "latency_ms") == without(three.outcomes, "latency_ms")
    g = local_graph(c, None)
    rows = one.outcomes
    stance = {(r, a): s for r, a, s in zip(rows["round"], rows["agent_id"], rows["stance"])}
    for i, r in enumerate(one.rounds["round"]):
        pairs = []
        for a in range(c.agents):
            j = rows["agent_id"].index(a, (r - 1) * c.agents)
            posted = [stance[r - 1, u] for u in g.in_neighbours(a).tolist() if stance.get((r - 1, u)) is not None]
            assert rows["heard"][j] == len(posted) + (r == 2 and a in (0, 5))  # the broadcast is heard
            assert rows["heard_mean"][j] == (pytest.approx(np.mean(posted), abs=1e-12) if posted else None)
            if stance[r, a] is not None:
                pairs += [(stance[r, a], y) for y in posted]
        if r == 1:
            assert one.rounds["assortativity"][i] is None
        else:
            xs, ys = zip(*pairs, strict=True)
            assert one.rounds["assortativity"][i] == pytest.approx(np.corrcoef(xs, ys)[0, 1], abs=1e-12)
    # what the platform recorded as posted: the valid answers' posts, with their stances
    posts = one.posts
    assert [f["stance"] for f in posts["fields"] if f is not None] == [s for s in rows["stance"] if s is not None]
