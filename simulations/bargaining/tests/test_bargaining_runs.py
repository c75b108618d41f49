"""Whole runs in process (`run_local`, the same code the fleet plays): identical tables
(outcomes, acts, transcripts, rounds) on one host, three hosts and one agent per process; with
a scripted model whose deals fall at known messages, every recorded row is exactly what the
rules give; the dummy model makes a mix of deals and no deals; the example scenario plays."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from populace.core.contracts import RunConfig
from populace.core.scenario import load_scenario
from populace.sdk import ScriptedLLM, resolve
from populace.sdk.local import run_local

PIE, TURNS = 10, 6
TURN = re.compile(r"This is message (\d+) of")


def config(agents: int = 15, rounds: int = 3, **game) -> RunConfig:
    # blocks of 4: 15 agents hold 7 pairs per round and leave one agent unmatched
    return RunConfig.model_validate({"simulation": "bargaining", "agents": agents, "rounds": rounds, "seed": 3,
                                     "model": {"seed": 5},
                                     "game": {"pie": PIE, "turns": TURNS, "block": 4, **game}})


def known(key: int, turn: int, round_: int) -> str:
    """The scripted answer of agent `key` at message `turn` of its conversation in `round_`: some
    are not messages; an agent accepts from message 2 + (key + round) % 6 on (7: never)."""
    if (key + turn + round_) % 9 == 0:
        return f"Let me think ({key})."
    return json.dumps({"say": f"agent {key}, message {turn}", "propose": (3 * key + turn + round_) % (PIE + 1),
                       "accept": turn >= 2 + (key + round_) % 6})


def known_turns(run, round_):
    return ScriptedLLM(lambda key, prompt: known(key, int(TURN.search(prompt).group(1)), round_))


def remembering(run, round_):
    """Answers that depend on the whole prompt — the conversation so far and the agent's memory
    of past rounds — so a message or a memory lost on the way changes the rows."""
    def answer(key: int, prompt: str) -> str:
        h = sum(prompt.encode()) + 31 * key
        if h % 11 == 0:
            return "No."
        return json.dumps({"say": f"h{h % 97}", "propose": h % (PIE + 1), "accept": h % 3 == 0})
    return ScriptedLLM(answer)


def without(columns: dict, *names: str) -> dict:
    return {k: v for k, v in columns.items() if k not in names}


def rows(columns: dict) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


LLMS = {"dummy": {}, "known turns": {"llm": known_turns}, "remembering": {"llm": remembering}}


@pytest.mark.parametrize("llm", list(LLMS))
async def test_a_run_is_identical_on_one_host_three_hosts_and_one_agent_per_process(llm):
    kw = LLMS[llm]
    one = await run_local(config(), **kw)
    assert len(one.outcomes["agent_id"]) == 45 and one.rounds["round"] == [1, 2, 3]
    assert one.rounds["pairs"] == [7, 7, 7] and one.rounds["unmatched"] == [1, 1, 1]
    assert len(one.acts["seq"]) == sum(one.outcomes["turns"]) // 2  # every message, once
    for other in (await run_local(config(), hosts=3, **kw), await run_local(config(), one_per_process=True, **kw)):
        assert without(other.rounds, "closed_at") == without(one.rounds, "closed_at")
        assert without(other.outcomes, "latency_ms") == without(one.outcomes, "latency_ms")
        assert without(other.acts, "latency_ms") == without(one.acts, "latency_ms")
        assert other.transcripts == one.transcripts


def expected_rows(c: RunConfig) -> tuple[list[dict], list[dict], list[dict]]:
    """(acts, transcripts, outcomes) of a run on `known` answers, written out from the rules:
    the pairs as the run's layout draws them, then each conversation message by message."""
    layout = resolve(c).instance().group_layout()
    acts, lines, outcomes = [], [], []
    for r in range(1, c.rounds + 1):
        for g in layout.groups(r, np.arange(c.agents, dtype=np.int64)):
            base = {"run_id": "local", "round": r, "group_id": g.id}
            if len(g.members) == 1:
                outcomes.append({"run_id": "local", "round": r, "agent_id": g.members[0], "group_id": g.id,
                                 "role": "unmatched", "partner": None, "deal": None, "share": 0, "turns": 0,
                                 "valid": True, "raw": "", "error": None})
                continue
            first, second = g.members
            proposals: dict[int, int] = {}  # each speaker's latest valid proposal
            got, last_raw, valid = {first: 0, second: 0}, {}, {first: True, second: True}
            seq, deal = 0, False
            for turn in range(1, TURNS + 1):
                me, other = (first, second) if turn % 2 else (second, first)
                raw = known(me, turn, r)
                last_raw[me] = raw
                m = json.loads(raw) if raw.startswith("{") else None
                valid[me] &= m is not None
                acts.append({**base, "seq": seq, "agent_id": me, "phase": "message",
                             "say": m and m["say"], "propose": m and m["propose"],
                             "accept": None if m is None else m["accept"], "valid": m is not None, "raw": raw,
                             "error": None})
                fields = {"accept": None, "propose": None} if m is None else {"accept": m["accept"],
                                                                               "propose": m["propose"]}
                lines.append({**base, "seq": seq + 1, "speaker": me, "text": m["say"] if m else "",
                              "fields": json.dumps(fields, separators=(",", ":"), sort_keys=True)})
                seq += 2
                if m is not None and m["accept"] and other in proposals:
                    got = {me: proposals[other], other: PIE - proposals[other]}
                    deal = True
                    break
                if m is not None:
                    proposals[me] = m["propose"]
            text = (f"deal after {turn} messages: agent {first} gets {got[first]}, agent {second} gets {got[second]}"
                    if deal else f"no deal after {turn} messages: both get nothing")
            lines.append({**base, "seq": seq, "speaker": -1, "text": text, "fields": json.dumps(
                {"deal": deal, "first": got[first], "second": got[second]}, separators=(",", ":"))})
            for me, other, role in ((first, second, "first"), (second, first, "second")):
                outcomes.append({"run_id": "local", "round": r, "agent_id": me, "group_id": g.id, "role": role,
                                 "partner": other, "deal": deal, "share": got[me], "turns": turn,
                                 "valid": valid[me], "raw": last_raw[me], "error": None})
    key = lambda row: (row["round"], row["group_id"], row["seq"])  # noqa: E731
    return sorted(acts, key=key), sorted(lines, key=key), sorted(outcomes, key=lambda o: (o["round"], o["agent_id"]))


@pytest.mark.parametrize("hosts", [1, 3])
async def test_every_row_is_what_the_rules_give_for_deals_at_known_messages(hosts):
    c = config()
    result = await run_local(c, hosts=hosts, llm=known_turns)
    acts, lines, outcomes = expected_rows(c)
    assert rows(without(result.acts, "latency_ms")) == acts
    assert rows(result.transcripts) == lines
    assert rows(without(result.outcomes, "latency_ms")) == outcomes
    # the script reaches every ending: deals at several messages, no deals, invalid messages
    ended = Counter(o["turns"] if o["deal"] else "none" for o in outcomes if o["role"] == "first")
    assert ended["none"] > 0 and len(set(ended) - {"none"}) >= 3
    assert any(not a["valid"] for a in acts)


async def test_the_round_summary_agrees_with_the_recorded_rows():
    result = await run_local(config(agents=23), hosts=2, llm=known_turns)
    o, r = rows(result.outcomes), result.rounds
    for i, n in enumerate(r["round"]):
        firsts = [x for x in o if x["round"] == n and x["role"] == "first"]
        deals = [x for x in firsts if x["deal"]]
        assert (r["n"][i], r["pairs"][i], r["deals"][i], r["unmatched"][i]) == (23, len(firsts), len(deals), 1)
        assert r["n_valid"][i] == sum(x["valid"] for x in o if x["round"] == n)
        assert r["deal_rate"][i] == len(deals) / len(firsts)
        assert r["mean_turns"][i] == sum(x["turns"] for x in firsts) / len(firsts)
        assert r["mean_turns_to_deal"][i] == sum(x["turns"] for x in deals) / len(deals)
        assert r["mean_first_share"][i] == sum(x["share"] for x in deals) / len(deals)
        assert r["first_share_of_pie"][i] == sum(x["share"] for x in deals) / (len(deals) * PIE)
        for x in deals:  # a deal splits the whole pie between the pair
            partner = next(y for y in o if y["round"] == n and y["agent_id"] == x["partner"])
            assert x["share"] + partner["share"] == PIE


async def test_the_example_scenario_plays_with_a_mix_of_deals_and_no_deals_on_the_dummy_model():
    path = Path(__file__).resolve().parents[3] / "examples" / "bargaining.yaml"
    result = await run_local(load_scenario(path))
    r = result.rounds
    assert r["round"] == [1, 2, 3] and r["pairs"] == [100, 100, 100] and r["n_valid"] == [200, 200, 200]
    # each accept is a fair coin on the dummy model: a deal ends at message 2..6, or none does
    firsts = [x for x in rows(result.outcomes) if x["role"] == "first"]
    ended = Counter(x["turns"] if x["deal"] else "none" for x in firsts)
    assert set(ended) == {2, 3, 4, 5, 6, "none"}
    assert ended[2] > ended[3] > ended[4] > ended["none"] > 0
    assert {x["share"] for x in firsts if x["deal"]} == set(range(PIE + 1))
    assert len(result.transcripts["seq"]) == len(result.acts["seq"]) + 300  # every message, and each pair's close
