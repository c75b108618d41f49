"""Whole runs in process (`run_local`, the same code the fleet plays): identical rounds on one
host, on three and one agent per process, and recorded rows that agree with the rules."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import pytest

from populace.core.contracts import RunConfig
from populace.core.scenario import load_scenario
from populace.sdk import ScriptedLLM
from populace.sdk.local import run_local

E, M, K = 20, Fraction(8, 5), 5


def config(agents: int = 23, rounds: int = 3) -> RunConfig:
    # 23 agents in groups of 5: the last group has 3 members
    return RunConfig.model_validate({"simulation": "public-goods", "agents": agents, "rounds": rounds, "seed": 3,
                                     "model": {"seed": 5},
                                     "game": {"group_size": K, "endowment": E, "multiplier": float(M)}})


def remembering(key: int, prompt: str) -> str:
    """An answer that depends on the whole prompt, so on the agent's memory of past rounds (a
    member that missed its group's news would answer differently); some answers are invalid."""
    h = sum(prompt.encode()) + 31 * key
    return "I keep everything." if h % 9 == 0 else json.dumps({"contribution": h % (E + 1)})


def scripted(run, round_):
    return ScriptedLLM(remembering)


def rounds_of(result) -> dict:
    return {k: v for k, v in result.rounds.items() if k != "closed_at"}


def outcomes_of(result) -> dict:
    return {k: v for k, v in result.outcomes.items() if k != "latency_ms"}


@pytest.mark.parametrize("llm", ["dummy", "remembering"])
async def test_a_run_is_identical_on_one_host_three_hosts_and_one_agent_per_process(llm):
    kw = {} if llm == "dummy" else {"llm": scripted}
    one = await run_local(config(), **kw)
    assert len(one.outcomes["agent_id"]) == 69 and one.rounds["round"] == [1, 2, 3]
    if llm == "remembering":
        assert 0 < sum(one.rounds["n_valid"]) < 69  # some answers were invalid
        later = {one.outcomes["raw"][i] for i in range(69) if one.outcomes["round"][i] > 1}
        assert later != {one.outcomes["raw"][i] for i in range(23)}  # memory changed the answers
    for other in (await run_local(config(), hosts=3, **kw), await run_local(config(), one_per_process=True, **kw)):
        assert rounds_of(other) == rounds_of(one)
        assert outcomes_of(other) == outcomes_of(one)


async def test_recorded_payoffs_equal_the_rules_recomputed_from_recorded_contributions():
    result = await run_local(config(agents=23, rounds=2), hosts=3, llm=scripted)
    rows = [dict(zip(result.outcomes, values)) for values in zip(*result.outcomes.values())]
    groups: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for row in rows:
        assert row["group_id"] == row["agent_id"] // K
        assert (row["contribution"] is None) == (not row["valid"])
        groups[row["round"], row["group_id"]].append(row)
    assert sorted(len(g) for g in groups.values()) == [3, 3, 5, 5, 5, 5, 5, 5, 5, 5]  # nobody dropped
    for members in groups.values():
        pot = sum(m["contribution"] or 0 for m in members)  # an invalid answer counts as 0
        for m in members:
            exact = E - (m["contribution"] or 0) + M * pot / len(members)
            assert m["payoff"] == float(exact)


async def test_the_round_summary_agrees_with_the_recorded_rows():
    result = await run_local(config(agents=23, rounds=2), llm=scripted)
    o, r = result.outcomes, result.rounds
    for i, n in enumerate(r["round"]):
        rows = [j for j in range(len(o["round"])) if o["round"][j] == n]
        valid = [o["contribution"][j] for j in rows if o["valid"][j]]
        assert (r["n"][i], r["n_valid"][i]) == (23, len(valid))
        assert r["total_contribution"][i] == sum(valid)
        assert r["mean_contribution"][i] == sum(valid) / len(valid)
        assert r["mean_payoff"][i] == pytest.approx(math.fsum(o["payoff"][j] for j in rows) / 23, abs=1e-12)
        assert r["groups"][i] == 5
        assert r["free_riders"][i] == valid.count(0) / len(valid)
        assert r["full_contributors"][i] == valid.count(E) / len(valid)


async def test_the_local_run_of_the_example_scenario_plays():
    path = Path(__file__).resolve().parents[3] / "examples" / "public-goods.yaml"
    c = load_scenario(path)
    result = await run_local(c.model_copy(update={"agents": 12, "rounds": 2}))
    assert result.rounds["groups"] == [3, 3] and result.rounds["n_valid"] == [12, 12]
