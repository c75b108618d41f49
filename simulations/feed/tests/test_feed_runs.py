"""Whole runs in process (`run_local`, the same code the fleet plays): identical tables
(outcomes, edges, rounds) on one host, three hosts and one agent per process (not with a graph:
refused, as everywhere), with and without a follow graph and a population; only the agents their activity selects act; every follow and
unfollow is one the rules allow and the round summary agrees with the recorded rows; the dummy
model makes a mix of posts, likes, reposts, follows and unfollows; the example scenario plays."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from populace.core.contracts import RunConfig
from populace.core.scenario import load_scenario
from populace.sdk import Cast, Persona, ScriptedLLM, select
from populace.sdk.edges import rebuild
from populace.sdk.local import local_graph, run_local

LEVELS = ("high", "medium", "low")


def config(agents: int = 60, rounds: int = 4, graph: bool = False, **params) -> RunConfig:
    data = {"simulation": "feed", "agents": agents, "rounds": rounds, "seed": 3, "model": {"seed": 5},
            "activity": {"rates": {"high": 0.9, "medium": 0.4, "low": 0.1}, "default": 0.5},
            "pool": {"seed_posts": 30, "size": 50}, "recommender": {"k": 5}, **params}
    if graph:
        data["graph"] = {"generator": "small-world", "degree": 4, "rewire": 0.2, "directed": True}
    return RunConfig.model_validate(data)


def cast(agents: int = 60) -> Cast:
    return Cast([Persona(i, f"You are Person {i}.", {"activity": LEVELS[i % 3]}) for i in range(agents)])


def remembering(run, round_):
    """Answers that depend on the whole prompt — the feed, its order, who is followed — so a feed
    ranked differently anywhere changes the rows."""
    def answer(key: int, prompt: str) -> str:
        h = sum(prompt.encode()) + 31 * key
        if h % 13 == 0:
            return "I would rather not say."
        shown = prompt.count("\n[")
        pick = (lambda salt: (h // salt) % (shown + 1)) if shown else (lambda salt: 0)
        return json.dumps({"stance": h % 7 - 3, "post": f"h{h % 101}" if h % 3 else "", "like": pick(7),
                           "repost": pick(11) if h % 2 else 0, "follow": pick(5), "unfollow": pick(3)})
    return ScriptedLLM(answer)


def without(columns: dict, *names: str) -> dict:
    return {k: v for k, v in columns.items() if k not in names}


def rows(columns: dict) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


CASES = {"dummy": ({}, False, False), "remembering": ({"llm": remembering}, False, False),
         "remembering, graph and population": ({"llm": remembering}, True, True),
         "dummy, graph": ({}, True, False),
         "remembering, interests and graph": ({"llm": remembering}, True, True, {"interest": 2.0})}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_run_is_identical_on_one_host_three_hosts_and_one_agent_per_process(case):
    kw, graph, population, *recommender = CASES[case]
    c = config(graph=graph, recommender={"k": 5, **(recommender[0] if recommender else {})})
    if population:
        kw = {**kw, "cast": cast()}
    one = await run_local(c, **kw)
    assert one.rounds["round"] == [1, 2, 3, 4] and sum(one.rounds["follows"]) > 0
    others = [await run_local(c, hosts=3, **kw)]
    if graph:  # posts are read from the host's in-process inboxes: refused, as the CLI and the fleet refuse it
        with pytest.raises(ValueError, match="graph: a run with a graph cannot place one agent per process"):
            await run_local(c, one_per_process=True, **kw)
    else:
        others.append(await run_local(c, one_per_process=True, **kw))
    for other in others:
        assert without(other.rounds, "closed_at") == without(one.rounds, "closed_at")
        assert without(other.outcomes, "latency_ms") == without(one.outcomes, "latency_ms")
        assert other.edges == one.edges
        assert other.shown == one.shown


@pytest.mark.parametrize("interest", [0.0, 1.5])
async def test_every_acting_reader_has_its_feed_recorded_and_acts_only_on_what_it_was_shown(interest):
    c = config(rounds=4, graph=True, recommender={"k": 5, "interest": interest})
    result = await run_local(c, llm=remembering, cast=cast())
    shown = {(r, a): (items, ranks) for r, a, items, ranks in
             zip(*(result.shown[k] for k in ("round", "agent_id", "items", "ranks")))}
    acted = rows(result.outcomes)
    assert sorted(shown) == [(x["round"], x["agent_id"]) for x in acted]  # one record per acting reader
    for x in acted:
        items, ranks = shown[x["round"], x["agent_id"]]
        assert len(items) == 5 and ranks == [1, 2, 3, 4, 5]
        for column in ("liked", "reposted"):
            assert x[column] is None or x[column] in items
    off = await run_local(config(rounds=2, recommender={"k": 5, "interest": interest, "record_shown": False}))
    assert off.tables.shown_items == "post_id" and off.shown["agent_id"] == []


async def test_only_the_agents_their_activity_selects_act():
    c = config(rounds=3)
    result = await run_local(c, cast=cast())
    profiles = [p.profile for p in cast().personas]
    rates = select.rate_by("activity", {"high": 0.9, "medium": 0.4, "low": 0.1}, default=0.5)
    for r in (1, 2, 3):
        picked = np.flatnonzero(rates.pick(np.arange(60), seed=3, round_=r, profiles=profiles)).tolist()
        assert [x["agent_id"] for x in rows(result.outcomes) if x["round"] == r] == picked
        assert result.rounds["n"][r - 1] == len(picked)
        assert result.rounds["active_share"][r - 1] == len(picked) / 60
    acted = Counter(LEVELS[x["agent_id"] % 3] for x in rows(result.outcomes))
    assert acted["high"] > acted["medium"] > acted["low"] > 0
    # without a population every agent acts at the default rate
    bare = await run_local(config(rounds=3))
    assert bare.rounds["n"] == [int(rates.pick(np.arange(60), seed=3, round_=r, profiles=None).sum())
                                for r in (1, 2, 3)]


async def test_follows_are_the_rules_and_the_summary_agrees_with_the_rows():
    c = config(rounds=5, graph=True)
    result = await run_local(c, llm=remembering)
    base = local_graph(c, None)
    o, r = rows(result.outcomes), result.rounds
    edits = list(zip(result.edges["round"], result.edges["follower"], result.edges["author"], result.edges["op"]))
    net = 0
    for n in range(1, 6):
        before, after = rebuild(60, base, edits, n - 1), rebuild(60, base, edits, n)
        mine = [x for x in o if x["round"] == n]
        for x in mine:  # a follow adds an author it did not follow; an unfollow removes one it did
            if x["followed"] is not None:
                assert x["followed"] not in before.get(x["agent_id"], set())
                assert x["followed"] in after[x["agent_id"]]
            if x["unfollowed"] is not None:
                assert x["unfollowed"] in before[x["agent_id"]]
                assert x["unfollowed"] not in after.get(x["agent_id"], set())
        valid = [x for x in mine if x["valid"]]
        follows = sum(x["followed"] is not None for x in mine)
        unfollows = sum(x["unfollowed"] is not None for x in mine)
        net += follows - unfollows
        i = n - 1
        assert (r["n"][i], r["n_valid"][i]) == (len(mine), len(valid))
        assert (r["posts"][i], r["likes"][i], r["reposts"][i], r["follows"][i], r["unfollows"][i],
                r["net_follows"][i]) == (sum(x["text"] is not None for x in valid),
                                         sum(x["liked"] is not None for x in valid),
                                         sum(x["reposted"] is not None for x in valid), follows, unfollows, net)
        stances = [x["stance"] / 3 for x in valid]
        assert r["mean_stance"][i] == pytest.approx(sum(stances) / len(stances))
        assert r["extreme_share"][i] == sum(abs(s) == 1 for s in stances) / len(stances)
        assert r["pool"][i] == min(50, 30 + sum(r["posts"][:n]))  # until it fills up, the pool keeps every post
    assert sum(r["unfollows"]) > 0 and any(not x["valid"] for x in o)


async def test_the_example_scenario_plays_with_a_mix_on_the_dummy_model():
    path = Path(__file__).resolve().parents[3] / "examples" / "feed.yaml"
    result = await run_local(load_scenario(path))
    r = result.rounds
    assert r["round"] == [1, 2, 3, 4, 5] and r["n"] == r["n_valid"]
    for column in ("posts", "likes", "reposts", "follows"):
        assert all(v > 0 for v in r[column]), column
    assert sum(r["unfollows"]) > 0 and r["net_follows"][-1] == sum(r["follows"]) - sum(r["unfollows"])
    assert min(r["active_share"]) > 0.05 and max(r["active_share"]) < 0.5
    assert all(0 < p < 1 for p in r["polarization"])
