"""Whole runs in process (`run_local`, the same code the fleet plays): identical tables (outcomes,
acts, rounds) on one host, three hosts and one agent per process; with a scripted model whose
answers are known, every recorded row is exactly what the rules give; the round summary agrees
with the rows; the example scenario plays on the dummy model."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from populace_punishment import Player, Punishment
from populace_punishment.rules import Terms, others, settle_group

from populace.core.contracts import RunConfig
from populace.core.scenario import load_scenario
from populace.sdk import ScriptedLLM, resolve
from populace.sdk.local import run_local
from populace.sdk.registry import Resolved

TERMS = Terms(20, Fraction(8, 5), 1, 3)
CRASH = "(an answer the agent's code cannot handle)"
LETTERS = re.compile(r'"([A-Z])": n')


class Fragile(Player):
    """An author's agent with a bug: its own code raises on one answer of the model."""

    __slots__ = ()

    async def act(self, phase, view, llm):
        move = await super().act(phase, view, llm)
        if move.raw == CRASH:
            raise ValueError(f"bug in agent {self.id}")
        return move


class FragilePunishment(Punishment):
    Agent = Fragile


def config(agents: int = 18, rounds: int = 3, sim: type[Punishment] = FragilePunishment, **game) -> Resolved:
    # blocks of 8: 18 agents play two groups of 4 in each full block and a pair in the last
    c = resolve(RunConfig.model_validate({"simulation": "punishment", "agents": agents, "rounds": rounds, "seed": 3,
                                          "model": {"seed": 5}, "game": {"block": 8, **game}}))
    return Resolved(c.config, sim, c.params)


def known_contribution(key: int, round_: int) -> str:
    """Agent `key`'s stage-1 answer: mostly a contribution, sometimes not one, once in a while an
    answer its own code crashes on (an agent bug, in its own process too)."""
    h = (key * 7 + round_ * 3) % 17
    if h == 0:
        return CRASH
    if h == 1:
        return "I give half."
    if h == 2:
        return json.dumps({"contribution": 21})  # more than the endowment
    return json.dumps({"contribution": (key * 3 + round_) % 21})


def known_points(key: int, round_: int, others_: int) -> str:
    h = (key + round_) % 11
    if h == 0:
        return CRASH
    if h == 1:
        return "Nobody."
    if h == 2:
        return json.dumps({"A": 11, **{chr(66 + i): 0 for i in range(others_ - 1)}})  # over the maximum
    return json.dumps({chr(65 + i): (key + i + round_) % 4 * (h % 2) for i in range(others_)})


def known(run, round_):
    def answer(key: int, prompt: str):
        if "Stage 2:" not in prompt:
            return known_contribution(key, round_)
        return known_points(key, round_, len(LETTERS.findall(prompt)))
    return ScriptedLLM(answer)


def remembering(run, round_):
    """Answers that depend on the whole prompt (what the agent sees and remembers), so a view or
    a memory lost on the way changes the rows."""
    def answer(key: int, prompt: str) -> str:
        h = sum(prompt.encode()) + 31 * key
        if h % 13 == 0:
            return "No."
        if "Stage 2:" not in prompt:
            return json.dumps({"contribution": h % 21})
        return json.dumps({x: (h >> i) % 3 for i, x in enumerate(LETTERS.findall(prompt))})
    return ScriptedLLM(answer)


def without(columns: dict, *names: str) -> dict:
    return {k: v for k, v in columns.items() if k not in names}


def rows(columns: dict) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


LLMS = {"dummy": ({}, Punishment), "known": ({"llm": known}, FragilePunishment),
        "remembering": ({"llm": remembering}, Punishment)}


@pytest.mark.parametrize("llm", list(LLMS))
async def test_a_run_is_identical_on_one_host_three_hosts_and_one_agent_per_process(llm):
    kw, sim = LLMS[llm]
    one = await run_local(config(sim=sim), **kw)
    assert len(one.outcomes["agent_id"]) == 54 and one.rounds["round"] == [1, 2, 3]
    assert one.rounds["n"] == [18, 18, 18]
    assert len(one.acts["seq"]) == 2 * 54  # a contribution and a punishment per member: nobody is alone
    assert one.transcripts["seq"] == []
    assert any(one.outcomes["error"]) == (llm == "known")  # an agent's bug, in its own process too
    for other in (await run_local(config(sim=sim), hosts=3, **kw),
                  await run_local(config(sim=sim), one_per_process=True, **kw)):
        assert without(other.rounds, "closed_at") == without(one.rounds, "closed_at")
        assert without(other.outcomes, "latency_ms") == without(one.outcomes, "latency_ms")
        assert without(other.acts, "latency_ms") == without(one.acts, "latency_ms")


def read(raw: str, bug: bool, field_names: list[str], top: int):
    """What the rules read from a known answer: a list of values, or None (invalid)."""
    if bug or not raw.startswith("{"):
        return None
    obj = json.loads(raw)
    values = [obj.get(f) for f in field_names]
    return values if all(isinstance(v, int) and 0 <= v <= top for v in values) else None


def expected_rows(resolved: Resolved) -> tuple[list[dict], list[dict]]:
    """(acts, outcomes) of a run on `known` answers, written out from the rules: the groups as the
    run's layout draws them, then each member's contribution, then each member's points."""
    c = resolved.config
    layout = resolved.instance().group_layout()
    acts, outcomes = [], []
    for r in range(1, c.rounds + 1):
        for g in layout.groups(r, np.arange(c.agents, dtype=np.int64)):
            k, base = len(g.members), {"run_id": "local", "round": r, "group_id": g.id}
            said = [known_contribution(m, r) for m in g.members]
            bugs = [f"ValueError: bug in agent {m}" if s == CRASH else None for m, s in zip(g.members, said)]
            contributions = [(v or [None])[0] for v in (read(s, b is not None, ["contribution"], 20)
                                                         for s, b in zip(said, bugs))]
            raws = [f"<agent error: {b}>" if b else s for s, b in zip(said, bugs)]
            for i, m in enumerate(g.members):
                acts.append({**base, "seq": i, "agent_id": m, "phase": "contribute", "contribution": contributions[i],
                             "targets": None, "points": None, "valid": contributions[i] is not None, "raw": raws[i],
                             "error": bugs[i] and f"agent: {bugs[i]}"})
            points, errors = [], list(bugs)
            for i, m in enumerate(g.members):
                answer = known_points(m, r, k - 1)
                bug = f"ValueError: bug in agent {m}" if answer == CRASH else None
                errors[i] = errors[i] or bug
                row = read(answer, bug is not None, [chr(65 + j) for j in range(k - 1)], 10)
                points.append(row)
                acts.append({**base, "seq": k + i, "agent_id": m, "phase": "punish", "contribution": None,
                             # an act whose code raised records the platform's invalid act: no targets
                             "targets": None if bug else [g.members[j] for j in others(i, k)], "points": row, "valid": row is not None,
                             "raw": f"<agent error: {bug}>" if bug else answer, "error": bug and f"agent: {bug}"})
            s = settle_group(TERMS, contributions, points)
            for i, m in enumerate(g.members):
                outcomes.append({"run_id": "local", "round": r, "agent_id": m, "group_id": g.id,
                                 "contribution": contributions[i], "group_total": s.total, "group_size": k,
                                 "points_given": s.given[i], "points_antisocial": s.antisocial[i],
                                 "points_received": s.received[i], "payoff": s.payoffs[i],
                                 "punish_valid": points[i] is not None, "valid": contributions[i] is not None,
                                 "raw": raws[i], "error": errors[i] and f"agent: {errors[i]}"})
    return (sorted(acts, key=lambda a: (a["round"], a["group_id"], a["seq"])),
            sorted(outcomes, key=lambda o: (o["round"], o["agent_id"])))


@pytest.mark.parametrize("hosts", [1, 3])
async def test_every_row_is_what_the_rules_give_for_known_answers(hosts):
    c = config(agents=26, rounds=4)
    result = await run_local(c, hosts=hosts, llm=known)
    acts, outcomes = expected_rows(c)
    assert rows(without(result.acts, "latency_ms")) == acts
    assert rows(without(result.outcomes, "latency_ms")) == outcomes
    # the script reaches every case: invalid and buggy answers at both stages, punishment and none
    assert {(a["phase"], a["valid"], a["error"] is not None) for a in acts} == {
        ("contribute", True, False), ("contribute", False, False), ("contribute", False, True),
        ("punish", True, False), ("punish", False, False), ("punish", False, True)}
    assert any(o["points_given"] for o in outcomes) and any(o["points_antisocial"] for o in outcomes)
    assert {o["group_size"] for o in outcomes} == {4, 2}  # the last block's 2 play as a pair


async def test_the_round_summary_agrees_with_the_recorded_rows():
    result = await run_local(config(agents=26, rounds=4), hosts=2, llm=known)
    o, r = rows(result.outcomes), result.rounds
    for i, n in enumerate(r["round"]):
        mine = [x for x in o if x["round"] == n]
        valid = [x["contribution"] for x in mine if x["valid"]]
        answered = [x for x in mine if x["punish_valid"]]
        points = sum(x["points_given"] for x in mine)
        assert (r["n"][i], r["n_valid"][i]) == (26, len(valid))
        assert r["mean_contribution"][i] == sum(valid) / len(valid)
        assert r["free_riders"][i] == valid.count(0) / len(valid)
        assert r["mean_payoff"][i] == pytest.approx(sum(x["payoff"] for x in mine) / 26, abs=1e-12)
        assert r["punish_answers"][i] == len(answered)
        assert r["share_punishing"][i] == sum(x["points_given"] > 0 for x in answered) / len(answered)
        assert r["mean_points"][i] == points / len(answered)
        assert r["antisocial_share"][i] == sum(x["points_antisocial"] for x in mine) / points
        assert points == sum(x["points_received"] for x in mine)  # every point given is received


async def test_the_example_scenario_plays_on_the_dummy_model():
    path = Path(__file__).resolve().parents[3] / "examples" / "punishment.yaml"
    result = await run_local(load_scenario(path))
    r = result.rounds
    assert r["round"] == [1, 2, 3] and r["n_valid"] == [400, 400, 400] and r["punish_answers"] == [400, 400, 400]
    assert r["llm_calls"] == [800, 800, 800]  # two acts per member: the dummy's answers are all valid
    assert len(result.acts["seq"]) == 2400 and all(result.acts["valid"])
    # the dummy model contributes uniformly on 0..20 and gives each other member 0..10 points
    assert all(9.0 < m < 11.0 for m in r["mean_contribution"]) and all(14.0 < p < 16.0 for p in r["mean_points"])
    assert set(result.outcomes["group_size"]) == {4} and set(result.outcomes["contribution"]) == set(range(21))
