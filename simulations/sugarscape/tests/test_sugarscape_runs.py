"""Sugarscape's whole runs in one process: one host equals three and one agent per process (the
same rows, the same births and deaths), a resume or fork after any round equals the uninterrupted
run, and every round keeps issue 37's promises — no two living agents on one cell, no departed
agent in a later round, every death in table `population` with the agent's last row starving —
by the rule and by the model (the dummy one) alike."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from populace_sugarscape import Sugarscape

from populace.core.contracts import RunConfig
from populace.sdk import resolve
from populace.sdk.local import run_local
from populace.sdk.testing import check_resume

# a small landscape where some starve within a few rounds (endowments of 1-6, metabolism up to 4)
SMALL = {"agents": 120, "rounds": 5, "seed": 5, "grid": {"width": 20, "height": 20},
         "traits": {"endowment": [1, 6]}}
DROP = ("latency_ms",)


def play(hosts: int = 1, one_per_process: bool = False, **data):
    config = resolve(RunConfig.model_validate({"simulation": "sugarscape", **SMALL, **data}))
    return asyncio.run(run_local(config, hosts=hosts, one_per_process=one_per_process))


def rows(result) -> dict:
    return {k: v for k, v in result.outcomes.items() if k not in DROP}


def assert_the_rules_held(result) -> None:
    out, pop = result.outcomes, result.population
    # no two living agents share a cell in any round (each row is a living agent's round)
    cells = Counter(zip(out["round"], out["cell"]))
    assert max(cells.values()) == 1
    # no departed agent appears in a later round
    gone = {a: r for r, a, e in zip(pop["round"], pop["agent_id"], pop["event"]) if e in ("died", "left")}
    assert not [(r, a) for r, a in zip(out["round"], out["agent_id"]) if a in gone and r > gone[a]]
    # every death is in `population`, after the round whose row shows the agent starving
    last = {(r, a): s for r, a, s in zip(out["round"], out["agent_id"], out["sugar"])}
    assert gone and all(last[(r, a)] <= 0 for a, r in gone.items())
    assert set(pop["reason"]) <= {"starved", "replaces an agent that starved"}
    assert Counter(pop["event"])["died"] == sum(result.rounds["died"])
    # every living agent has a row each round: those of the round before, less the dead, with the newcomers
    per_round = Counter(out["round"])
    assert [per_round[r] for r in result.rounds["round"][1:]] == result.rounds["living"][:-1]


@pytest.mark.parametrize("rule", [{}, {"replacement": True}], ids=["deaths", "replacement"])
def test_one_host_equals_three(rule):
    one = play(rule=rule)
    assert_the_rules_held(one)
    three = play(hosts=3, rule=rule)
    assert rows(one) == rows(three) and one.rounds["living"] == three.rounds["living"]
    assert one.population == three.population
    if rule:  # the starved replaced: newcomers take the next ids and play from the next round
        born = [a for a, e in zip(one.population["agent_id"], one.population["event"]) if e == "born"]
        assert born == list(range(120, 120 + len(born))) and set(born[:3]) <= set(one.outcomes["agent_id"])
        assert one.rounds["living"] == [120] * 5


def test_one_agent_per_process_plays_the_same_rounds():
    data = {"agents": 12, "rounds": 4, "grid": {"width": 13, "height": 13}, "rule": {"replacement": True}}
    many, alone = play(**data), play(hosts=2, one_per_process=True, **data)
    assert rows(many) == rows(alone) and many.population == alone.population
    assert sum(many.rounds["born"]) > 0  # newcomers get processes of their own
    assert_the_rules_held(many)


def test_the_model_picks_among_the_cells_in_sight_the_same_on_one_host_as_on_two():
    data = {"rounds": 4, "rule": {"decider": "llm", "replacement": True}}
    one, two = play(**data), play(hosts=2, **data)
    assert rows(one) == rows(two) and one.population == two.population
    assert_the_rules_held(one)
    assert sum(one.rounds["llm_calls"]) > 0
    # an answer outside the cells offered is the model's invalid answer: that agent stays
    assert {True, False} == set(one.outcomes["valid"])


@pytest.mark.parametrize("rule", [{}, {"replacement": True}], ids=["deaths", "replacement"])
def test_a_run_resumed_or_forked_after_any_round_is_the_uninterrupted_run(rule):
    check_resume(Sugarscape, {**SMALL, "agents": 60, "rounds": 4, "rule": rule}, hosts=2)
