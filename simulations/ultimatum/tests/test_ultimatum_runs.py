"""Whole runs in process (`run_local`, the same code the fleet plays): identical tables
(outcomes, acts, rounds) on one host, three hosts and one agent per process; with a scripted
model whose offers and replies are known, every recorded row is exactly what the rules give;
the round summary agrees with the rows; the example scenario plays on the dummy model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from populace_ultimatum import Trader, Ultimatum

from populace.core.contracts import RunConfig
from populace.core.scenario import load_scenario
from populace.sdk import ScriptedLLM, resolve
from populace.sdk.local import run_local
from populace.sdk.registry import Resolved

PIE = 10
OFFERED = re.compile(r"The proposer offers you (\d+) of")
CRASH = "(an answer the agent's code cannot handle)"


class Fragile(Trader):
    """An author's agent with a bug: its own code raises on one answer of the model."""

    __slots__ = ()

    async def act(self, phase, view, llm):
        move = await super().act(phase, view, llm)
        if move.raw == CRASH:
            raise ValueError(f"bug in agent {self.id}")
        return move


class FragileUltimatum(Ultimatum):
    Agent = Fragile


def config(agents: int = 15, rounds: int = 3, sim: type[Ultimatum] = FragileUltimatum, **game) -> Resolved:
    # blocks of 4: 15 agents hold 7 pairs per round and leave one agent unmatched
    c = resolve(RunConfig.model_validate({"simulation": "ultimatum", "agents": agents, "rounds": rounds, "seed": 3,
                                          "model": {"seed": 5}, "game": {"pie": PIE, "block": 4, **game}}))
    return Resolved(c.config, sim, c.params)


def known_offer(key: int, round_: int) -> str:
    """Agent `key`'s answer as proposer in `round_`: mostly an offer, sometimes not one, once in a
    while an answer its own code crashes on (an agent bug, in its own process too)."""
    h = (key * 7 + round_ * 3) % 17
    if h == 0:
        return CRASH
    if h == 1:
        return "I offer half."
    if h == 2:
        return json.dumps({"offer": PIE + 1})  # more than the pie
    return json.dumps({"offer": (key + 2 * round_) % (PIE + 1)})


def known_reply(key: int, round_: int, offer: int) -> str:
    """Agent `key`'s answer as responder to `offer`: accepts from its threshold on, sometimes no answer."""
    if (key + round_) % 9 == 0:
        return "Fine by me."
    return json.dumps({"accept": offer >= (key + round_) % 7})


def known(run, round_):
    def answer(key: int, prompt: str):
        seen = OFFERED.search(prompt)
        return known_offer(key, round_) if seen is None else known_reply(key, round_, int(seen.group(1)))
    return ScriptedLLM(answer)


def remembering(run, round_):
    """Answers that depend on the whole prompt (the offer seen, the agent's memory of past
    rounds), so an offer or a memory lost on the way changes the rows."""
    def answer(key: int, prompt: str) -> str:
        h = sum(prompt.encode()) + 31 * key
        if h % 13 == 0:
            return "No."
        if OFFERED.search(prompt) is None:
            return json.dumps({"offer": h % (PIE + 1)})
        return json.dumps({"accept": h % 3 != 0})
    return ScriptedLLM(answer)


def without(columns: dict, *names: str) -> dict:
    return {k: v for k, v in columns.items() if k not in names}


def rows(columns: dict) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


LLMS = {"dummy": ({}, Ultimatum), "known": ({"llm": known}, FragileUltimatum),
        "remembering": ({"llm": remembering}, Ultimatum)}


@pytest.mark.parametrize("llm", list(LLMS))
async def test_a_run_is_identical_on_one_host_three_hosts_and_one_agent_per_process(llm):
    kw, sim = LLMS[llm]
    one = await run_local(config(sim=sim), **kw)
    assert len(one.outcomes["agent_id"]) == 45 and one.rounds["round"] == [1, 2, 3]
    assert one.rounds["pairs"] == [7, 7, 7] and one.rounds["n"] == [15, 15, 15]
    offers = [o for o in rows(one.outcomes) if o["role"] == "proposer" and o["offer"] is not None]
    assert len(one.acts["seq"]) == 21 + len(offers)  # every offer, and a reply to each valid one
    assert one.transcripts["seq"] == []  # the ultimatum game says nothing besides its acts
    assert any(one.outcomes["error"]) == (llm == "known")  # an agent's bug, in its own process too
    for other in (await run_local(config(sim=sim), hosts=3, **kw),
                  await run_local(config(sim=sim), one_per_process=True, **kw)):
        assert without(other.rounds, "closed_at") == without(one.rounds, "closed_at")
        assert without(other.outcomes, "latency_ms") == without(one.outcomes, "latency_ms")
        assert without(other.acts, "latency_ms") == without(one.acts, "latency_ms")


def expected_rows(resolved: Resolved) -> tuple[list[dict], list[dict]]:
    """(acts, outcomes) of a run on `known` answers, written out from the rules: the pairs as the
    run's layout draws them, then each pair's offer and the reply to it."""
    c = resolved.config
    layout = resolved.instance().group_layout()
    acts, outcomes = [], []
    for r in range(1, c.rounds + 1):
        for g in layout.groups(r, np.arange(c.agents, dtype=np.int64)):
            base = {"run_id": "local", "round": r, "group_id": g.id}
            if len(g.members) == 1:
                outcomes.append({"run_id": "local", "round": r, "agent_id": g.members[0], "group_id": g.id,
                                 "role": "unmatched", "partner": None, "offer": None, "accepted": None, "payoff": 0,
                                 "valid": True, "raw": "", "error": None})
                continue
            proposer, responder = g.members
            said = known_offer(proposer, r)
            bug = f"ValueError: bug in agent {proposer}" if said == CRASH else None
            raw = f"<agent error: {bug}>" if bug else said
            offer = json.loads(said)["offer"] if bug is None and said.startswith("{") else None
            offer = offer if offer is not None and 0 <= offer <= PIE else None
            acts.append({**base, "seq": 0, "agent_id": proposer, "phase": "offer", "offer": offer, "accept": None,
                         "valid": offer is not None, "raw": raw, "error": bug and f"agent: {bug}"})
            accepted, answer = None, ""
            if offer is not None:
                answer = known_reply(responder, r, offer)
                accepted = json.loads(answer)["accept"] if answer.startswith("{") else None
                acts.append({**base, "seq": 1, "agent_id": responder, "phase": "respond", "offer": None,
                             "accept": accepted, "valid": accepted is not None, "raw": answer, "error": None})
            deal = bool(accepted)
            common = {"offer": offer, "accepted": accepted}
            outcomes.append({"run_id": "local", "round": r, "agent_id": proposer, "group_id": g.id,
                             "role": "proposer", "partner": responder, **common,
                             "payoff": PIE - offer if deal else 0, "valid": offer is not None, "raw": raw,
                             "error": bug and f"agent: {bug}"})
            outcomes.append({"run_id": "local", "round": r, "agent_id": responder, "group_id": g.id,
                             "role": "responder", "partner": proposer, **common, "payoff": offer if deal else 0,
                             "valid": offer is None or accepted is not None, "raw": answer, "error": None})
    return (sorted(acts, key=lambda a: (a["round"], a["group_id"], a["seq"])),
            sorted(outcomes, key=lambda o: (o["round"], o["agent_id"])))


@pytest.mark.parametrize("hosts", [1, 3])
async def test_every_row_is_what_the_rules_give_for_known_offers_and_replies(hosts):
    c = config(agents=31, rounds=4)
    result = await run_local(c, hosts=hosts, llm=known)
    acts, outcomes = expected_rows(c)
    assert rows(without(result.acts, "latency_ms")) == acts
    assert rows(without(result.outcomes, "latency_ms")) == outcomes
    assert result.rounds["n_valid"] == [sum(o["valid"] for o in outcomes if o["round"] == r) for r in (1, 2, 3, 4)]
    # the script reaches every case: deals, rejections, invalid offers and replies, agent bugs
    proposers = [o for o in outcomes if o["role"] == "proposer"]
    assert {o["accepted"] for o in proposers if o["offer"] is not None} == {True, False, None}
    assert any(o["offer"] is None and o["error"] is None for o in proposers)
    assert any(o["error"] for o in proposers)


async def test_the_round_summary_agrees_with_the_recorded_rows():
    result = await run_local(config(agents=23, rounds=4), hosts=2, llm=known)
    o, r = rows(result.outcomes), result.rounds
    for i, n in enumerate(r["round"]):
        mine = [x for x in o if x["round"] == n]
        proposers = [x for x in mine if x["role"] == "proposer"]
        offers = [x["offer"] for x in proposers if x["offer"] is not None]
        replied = [x for x in proposers if x["accepted"] is not None]
        deals = [x["offer"] for x in replied if x["accepted"]]
        assert (r["n"][i], r["pairs"][i]) == (23, len(proposers)) and len(mine) - 2 * len(proposers) == 1
        assert r["n_valid"][i] == sum(x["valid"] for x in mine)
        assert r["mean_offer"][i] == sum(offers) / len(offers)
        assert r["offer_share"][i] == sum(offers) / len(offers) / PIE
        assert r["acceptance_rate"][i] == len(deals) / len(replied)
        assert r["mean_accepted_offer"][i] == sum(deals) / len(deals)
        for x in proposers:  # a deal splits the whole pie; anything else pays nobody
            partner = next(y for y in mine if y["agent_id"] == x["partner"])
            assert (partner["partner"], partner["offer"], partner["accepted"]) == (x["agent_id"], x["offer"],
                                                                                   x["accepted"])
            assert x["payoff"] + partner["payoff"] == (PIE if x["accepted"] else 0)


async def test_the_example_scenario_plays_on_the_dummy_model():
    path = Path(__file__).resolve().parents[3] / "examples" / "ultimatum.yaml"
    result = await run_local(load_scenario(path))
    r = result.rounds
    assert r["round"] == [1, 2, 3] and r["pairs"] == [200, 200, 200] and r["n_valid"] == [400, 400, 400]
    assert r["llm_calls"] == [400, 400, 400]  # an offer and a reply per pair: the dummy's answers are all valid
    assert len(result.acts["seq"]) == 1200 and all(result.acts["valid"])
    # the dummy model's offers are uniform on 0..10 and each reply is a fair coin
    assert all(4.0 < m < 6.0 for m in r["mean_offer"]) and all(0.4 < a < 0.6 for a in r["acceptance_rate"])
    proposers = [x for x in rows(result.outcomes) if x["role"] == "proposer"]
    assert {x["offer"] for x in proposers} == set(range(PIE + 1))
