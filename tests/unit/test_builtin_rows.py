"""Every built-in simulation and the dictator template give exactly the rows they gave before the
round engine was rewritten: digests of their local runs (outcomes, rounds, posts; the feed's shown
and edges) on the dummy
model, stored in builtin_rows.json. A local run equals a fleet run (tests/e2e), so these pin the
fleet's rows too. Regenerate only for an intended change of results:
`POPULACE_WRITE_DIGESTS=1 uv run pytest tests/unit/test_builtin_rows.py`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from populace.client.prepare import prepare_file
from populace.graph.serial import loads
from populace.population.cast import cast_from_jsonl
from populace.sdk.local import run_local

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DIGESTS = Path(__file__).with_name("builtin_rows.json")
DICTATOR = EXAMPLES / "simulations" / "dictator"

# (scenario, overrides, run_local options)
CASES = {
    "ratio-game": ("guess-two-thirds.yaml", {"agents": 300}, {}),
    "ratio-game-3-hosts": ("guess-two-thirds.yaml", {"agents": 300}, {"hosts": 3}),
    "public-goods": ("public-goods.yaml", {"agents": 103, "rounds": 3}, {}),
    "public-goods-3-hosts": ("public-goods.yaml", {"agents": 103, "rounds": 3}, {"hosts": 3}),
    "public-goods-per-process": ("public-goods.yaml", {"agents": 12, "rounds": 2},
                                 {"hosts": 2, "one_per_process": True}),
    "vote": ("vote.yaml", {"agents": 150}, {}),
    "vote-3-hosts": ("vote.yaml", {"agents": 150}, {"hosts": 3}),
    "opinion": ("opinion.yaml", {"agents": 120}, {}),
    "opinion-3-hosts": ("opinion.yaml", {"agents": 120}, {"hosts": 3}),
    "ultimatum": ("ultimatum.yaml", {"agents": 90}, {}),
    "bargaining": ("bargaining.yaml", {"agents": 90}, {}),
    # blocks of 40: the last block's 10 agents play two groups of 4 and a pair
    "punishment": ("punishment.yaml", {"agents": 90, "game": {"block": 40}}, {"hosts": 2}),
    "public-goods-firms": ("public-goods.yaml", {"agents": 103, "rounds": 3, "simulation": "public-goods-firms",
                                                "firm": {"size": 20, "match": 0.5}}, {"hosts": 3}),
    # a world with views (moves anywhere), and its world rules: nearby moves by claims, only the
    # unhappy selected from the world (issue 37; a change of the claims' rule changes these)
    "schelling": ("schelling.yaml", {"rounds": 4}, {}),
    "schelling-claims-3-hosts": ("schelling.yaml", {"rounds": 4, "rule": {"threshold": 0.5, "move": "nearby",
                                                                          "ask": "unhappy"}}, {"hosts": 3}),
    # births and deaths (issue 37): the example as it ships (deaths only), and the model choosing
    # among the cells in sight with the starved replaced, on 3 hosts (their table `population` too)
    "sugarscape": ("sugarscape.yaml", {"rounds": 6}, {}),
    "sugarscape-llm-replacement-3-hosts": ("sugarscape.yaml", {"agents": 150, "rounds": 4,
                                                               "grid": {"width": 20, "height": 20},
                                                               "traits": {"endowment": [1, 8]},
                                                               "rule": {"decider": "llm", "replacement": True}},
                                           {"hosts": 3}),
    # a world, views, edge edits and who saw what (table shown); 2 hosts, its population and graph
    "feed": ("feed.yaml", {"agents": 300, "rounds": 3}, {"hosts": 2}),
    "feed-interest": ("feed.yaml", {"agents": 300, "rounds": 3, "recommender": {"interest": 1.5}}, {"hosts": 2}),
    "dictator": ("simulations/dictator/scenario.yaml",
                 {"agents": 90, "simulation": "dictator_game:DictatorGame"}, {"hosts": 2}),
}
DROPPED = ("run_id", "latency_ms", "closed_at")
# the rounds' cost columns, added after these digests were taken: always 0 on the dummy model,
# left out while they are (a value there would change the digest)
COST = ("cached_tokens", "dollars")


def digest(columns: dict[str, list]) -> str:
    kept = {k: v for k, v in sorted(columns.items()) if k not in DROPPED and not (k in COST and not any(v))}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def play(case: str) -> dict[str, str]:
    scenario, overrides, options = CASES[case]
    path = EXAMPLES / scenario
    text = path.read_text()
    import yaml

    data = {**yaml.safe_load(text), **overrides}
    scratch = path.parent / f".digest-{case}.yaml"  # beside the original: relative paths resolve the same
    scratch.write_text(yaml.safe_dump(data))
    try:
        prepared = prepare_file(scratch)
    finally:
        scratch.unlink()
    cast = cast_from_jsonl(prepared.personas) if prepared.personas is not None else None
    graph = loads(prepared.graph) if prepared.graph is not None else None
    result = asyncio.run(run_local(prepared.resolved, cast=cast, graph=graph, **options))
    got = {"outcomes": digest(result.outcomes), "rounds": digest(result.rounds), "posts": digest(result.posts)}
    if result.population:  # a population that changed: its births and deaths
        got["population"] = digest(result.population)
    if result.acts:  # scenes
        got.update(acts=digest(result.acts), transcripts=digest(result.transcripts))
    if result.shown:  # who saw what
        got.update(shown=digest(result.shown), edges=digest(result.edges))
    return got


@pytest.fixture(scope="module", autouse=True)
def dictator_importable():
    sys.path.insert(0, str(DICTATOR))
    yield
    sys.path.remove(str(DICTATOR))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_builtin_gives_exactly_the_rows_it_gave(case):
    got = play(case)
    stored = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    if os.environ.get("POPULACE_WRITE_DIGESTS"):
        stored[case] = got
        DIGESTS.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    assert got == stored[case]
