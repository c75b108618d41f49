"""The agent and its pair's scene, played by the platform's own round player with a scripted
model: what each agent is asked (the conversation so far), when the conversation stops, what
is recorded (acts, transcript lines, outcomes — invalid messages and agent bugs too), and what
each agent remembers."""

from __future__ import annotations

import json
import re

import pytest
from populace_bargaining import Negotiator, Speech
from populace_bargaining.rules import Line
from populace_bargaining.simulation import _line

from populace.core.contracts import RunConfig
from populace.sdk import Cast, InferError, ModelUnavailable, Persona, ScriptedLLM, resolve
from populace.sdk.hosting import host_run
from populace.sdk.play import OutcomeSink

TURN = re.compile(r"This is message (\d+) of")


def share(agents: int = 2, cast: Cast | None = None, **game):
    config = RunConfig.model_validate({"simulation": "bargaining", "agents": agents,
                                       "game": {"block": 2, **game}})
    return host_run(resolve(config), "r", [(0, agents)], cast, freeze=False)


def msg(say: str, propose: int, accept: bool = False) -> str:
    return json.dumps({"say": say, "propose": propose, "accept": accept})


def by_turn(plan: dict[int, object]) -> ScriptedLLM:
    """Answers by the message's number in its conversation (read from the prompt)."""
    return ScriptedLLM(lambda key, prompt: plan[int(TURN.search(prompt).group(1))])


def rows_of(columns: dict[str, list] | None) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else []


async def play(run, llm, round_: int = 1, batch_size: int = 1000):
    """One round: (the share's result, outcome rows by agent id, act rows, transcript rows)."""
    batches = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=batch_size, emit=batches.append, grouped=True)
    await run.player.play(run.observation(round_, None), llm, sink)
    result = sink.close()
    outcomes, acts, lines = {}, [], []
    for b in batches:
        for i, aid in enumerate(b.agent_ids):
            outcomes[aid] = {"group": b.group_ids[i], "valid": b.valid[i], "raw": b.raws[i], "error": b.errors[i],
                             **{name: col[i] for name, col in b.columns.items()}}
        acts += [{k: v for k, v in r.items() if k != "latency_ms"} for r in rows_of(b.acts)]
        lines += rows_of(b.lines)
    return result, outcomes, acts, lines


def pair(run, round_: int = 1) -> tuple[int, int]:
    """(first speaker, second speaker) of the run's first pair in `round_`."""
    return run.player.groups(round_, None)[0].members


async def test_each_message_is_one_call_that_sees_the_conversation_so_far_and_an_accept_ends_it():
    run = share()
    first, second = pair(run)
    llm = by_turn({1: msg("Half?", 5), 2: msg("Give me 7.", 3), 3: msg("Deal.", 0, accept=True)})
    result, outcomes, acts, lines = await play(run, llm)
    assert [a.key for a in llm.asked] == [first, second, first]  # the 4th..6th messages are never asked
    for a in llm.asked:
        assert a.system is None and a.schema == run.sim.answer_schema() and a.prefix_chars == 0
    assert llm.asked[1].prompt == (
        "The conversation so far:\n"
        '- They: "Half?" (they propose to give you 5, keeping 5)\n'
        "On the table: they give you 5 of 10 coins and keep 5. Accepting ends the conversation with that split.\n"
        'This is message 2 of 6. Answer {"say": "...", "propose": n, "accept": true|false}.')
    assert llm.asked[2].prompt.startswith(
        "The conversation so far:\n"
        '- You: "Half?" (you proposed to give them 5, keeping 5)\n'
        '- They: "Give me 7." (they propose to give you 3, keeping 7)\n'
        "On the table: they give you 3 of 10 coins and keep 7.")
    assert acts == [
        {"group_id": 0, "seq": 0, "agent_id": first, "phase": "message", "say": "Half?", "propose": 5,
         "accept": False, "valid": True, "raw": msg("Half?", 5), "error": None},
        {"group_id": 0, "seq": 2, "agent_id": second, "phase": "message", "say": "Give me 7.", "propose": 3,
         "accept": False, "valid": True, "raw": msg("Give me 7.", 3), "error": None},
        {"group_id": 0, "seq": 4, "agent_id": first, "phase": "message", "say": "Deal.", "propose": 0,
         "accept": True, "valid": True, "raw": msg("Deal.", 0, True), "error": None}]
    assert lines == [
        {"group_id": 0, "seq": 1, "speaker": first, "text": "Half?", "fields": '{"accept":false,"propose":5}'},
        {"group_id": 0, "seq": 3, "speaker": second, "text": "Give me 7.", "fields": '{"accept":false,"propose":3}'},
        {"group_id": 0, "seq": 5, "speaker": first, "text": "Deal.", "fields": '{"accept":true,"propose":0}'},
        {"group_id": 0, "seq": 6, "speaker": -1, "text": f"deal after 3 messages: agent {first} gets 3, agent "
         f"{second} gets 7", "fields": '{"deal":true,"first":3,"second":7}'}]
    assert outcomes[first] == {"group": 0, "valid": True, "raw": msg("Deal.", 0, True), "error": None,
                               "role": "first", "partner": second, "deal": True, "share": 3, "turns": 3}
    assert outcomes[second] == {"group": 0, "valid": True, "raw": msg("Give me 7.", 3), "error": None,
                                "role": "second", "partner": first, "deal": True, "share": 7, "turns": 3}
    p = result.partial
    assert (p.pairs, p.deals, p.messages, p.deal_messages, p.first_coins, p.unmatched) == (1, 1, 3, 3, 3, 0)


async def test_no_accept_by_the_last_message_leaves_both_with_nothing():
    run = share(turns=4)
    first, second = pair(run)
    llm = by_turn({1: msg("a", 1, accept=True), 2: msg("b", 2), 3: msg("c", 3), 4: msg("d", 4)})
    result, outcomes, acts, lines = await play(run, llm)
    assert [a["agent_id"] for a in acts] == [first, second, first, second]
    assert "This is message 4 of 4, the last: if you do not accept now, both of you get nothing." in \
        llm.asked[3].prompt
    assert lines[-1] == {"group_id": 0, "seq": 8, "speaker": -1, "text": "no deal after 4 messages: both get nothing",
                         "fields": '{"deal":false,"first":0,"second":0}'}
    for aid in (first, second):
        assert (outcomes[aid]["deal"], outcomes[aid]["share"], outcomes[aid]["turns"]) == (False, 0, 4)
    assert (result.partial.deals, result.partial.messages) == (0, 4)


async def test_an_invalid_message_is_recorded_with_its_text_proposes_nothing_and_marks_its_sender():
    run = share()
    first, second = pair(run)
    llm = by_turn({1: msg("I give you 3", 3), 2: msg("Four?", 4), 3: "I accept, I think.",
                   4: msg("Fine, 3 it is.", 9, accept=True)})
    _, outcomes, acts, lines = await play(run, llm)
    assert acts[2] == {"group_id": 0, "seq": 4, "agent_id": first, "phase": "message", "say": None, "propose": None,
                       "accept": None, "valid": False, "raw": "I accept, I think.", "error": None}
    assert lines[2] == {"group_id": 0, "seq": 5, "speaker": first, "text": "", "fields": '{"accept":null,"propose":null}'}
    assert "- They: (no valid message)" in llm.asked[3].prompt
    # the accept takes the first speaker's latest valid proposal: 3 coins, from message 1
    assert "On the table: they give you 3 of 10 coins and keep 7." in llm.asked[3].prompt
    assert (outcomes[second]["share"], outcomes[first]["share"], outcomes[first]["turns"]) == (3, 7, 4)
    assert (outcomes[first]["valid"], outcomes[second]["valid"]) == (False, True)
    assert outcomes[first]["error"] is None  # the model's answer, not a failure


async def test_an_agent_bug_is_recorded_as_such_and_the_conversation_goes_on():
    run = share()
    first, second = pair(run)
    llm = by_turn({1: msg("x", 5), 2: ValueError("bug"), 3: msg("y", 4), 4: msg("z", 1, accept=True)})
    _, outcomes, acts, _ = await play(run, llm)
    assert acts[1]["error"] == "agent: ValueError: bug" and acts[1]["valid"] is False
    assert acts[1]["raw"] == "<agent error: ValueError: bug>"
    assert outcomes[second]["error"] == "agent: ValueError: bug" and outcomes[second]["valid"] is False
    assert (outcomes[second]["deal"], outcomes[second]["share"], outcomes[first]["share"]) == (True, 4, 6)


async def test_an_outage_is_never_recorded_as_an_answer_the_round_stops():
    run = share()
    with pytest.raises(ModelUnavailable, match="gateway down"):
        await play(run, by_turn({1: msg("x", 5), 2: InferError("gateway down")}))


async def test_each_agent_remembers_its_deal_and_sees_it_in_the_next_rounds_prompt():
    run = share()
    first, second = pair(run)
    await play(run, by_turn({1: msg("x", 4), 2: msg("ok", 0, accept=True)}))
    assert run.agents[first].memory == ((1, "first", True, 6, 2),)
    assert run.agents[second].memory == ((1, "second", True, 4, 2),)
    llm = by_turn({t: msg("no", 0) for t in range(1, 7)})
    await play(run, llm, round_=2)
    shown = {a.key: a.prompt for a in llm.asked}
    assert shown[first].startswith("Your last rounds:\n- round 1: you spoke first; deal after 2 messages: you got 6 "
                                   "of 10 coins.\n")
    assert run.agents[first].memory[-1] == (2, "first" if pair(run, 2)[0] == first else "second", False, 0, 6)


async def test_without_history_the_prompt_recalls_nothing():
    run = share(show_history=False)
    await play(run, by_turn({1: msg("x", 4), 2: msg("ok", 0, accept=True)}))
    llm = by_turn({1: msg("x", 4), 2: msg("ok", 0, accept=True)})
    await play(run, llm, round_=2)
    assert all("last rounds" not in a.prompt for a in llm.asked) and run.agents[0].memory


async def test_the_persona_leads_the_prompt_and_is_its_cacheable_prefix():
    cast = Cast([Persona(i, f"You are Person {i}, a trader.", {"occupation": "trader"}) for i in range(2)])
    run = share(cast=cast)
    llm = by_turn({1: msg("x", 4), 2: msg("ok", 0, accept=True)})
    await play(run, llm)
    for a in llm.asked:
        persona = f"You are Person {a.key}, a trader."
        assert a.prompt.startswith(persona + "\n") and a.prefix_chars == len(persona)
    assert run.sim.user_example().startswith("You are Person 0, a trader.\nNo messages yet")


async def test_the_odd_agent_of_a_block_has_no_partner_and_no_conversation():
    run = share(3, block=4)  # one block of 3: a pair and one left over
    llm = by_turn({1: msg("x", 4), 2: msg("ok", 0, accept=True)})
    result, outcomes, _, _ = await play(run, llm)
    (alone,) = [aid for aid, o in outcomes.items() if o["role"] == "unmatched"]
    assert outcomes[alone] == {"group": 1, "valid": True, "raw": "", "error": None, "role": "unmatched",
                               "partner": None, "deal": None, "share": 0, "turns": 0}
    assert alone not in {a.key for a in llm.asked} and run.agents[alone].memory == ()
    assert (result.partial.pairs, result.partial.unmatched, result.n) == (1, 1, 3)


@pytest.mark.parametrize("batch_size", [1, 3, 1000])
async def test_batches_that_cut_pairs_give_the_same_round(batch_size):
    run = share(9, block=4)  # blocks of 4, 4 and 1: four pairs, one unmatched
    llm = ScriptedLLM(lambda key, prompt: msg("x", key % 11,
                                              accept=int(TURN.search(prompt).group(1)) >= 2 + key % 5))
    result, outcomes, acts, lines = await play(run, llm, batch_size=batch_size)
    p = result.partial
    assert (p.pairs, p.unmatched, result.n) == (4, 1, 9)
    assert p.messages == len(acts) and len(lines) == len(acts) + 4
    assert p.first_coins == sum(o["share"] for o in outcomes.values() if o["role"] == "first" and o["deal"])


def test_a_speech_that_breaks_the_rules_counts_as_no_message():
    # an author's Agent subclass may return any Speech: the scene reads only what keeps the rules
    class Who:
        id = 4

    assert _line(Who(), Speech(say="x", propose=3, accept=True), 10) == Line(4, "x", 3, True)
    for bad in (Speech(say="x", propose=11, accept=True), Speech(say="x", propose=3, accept=True, valid=False),
                Speech(say=None, propose=3, accept=False), Speech(say="x", propose=3, accept=None),
                Speech(say="x", propose=True, accept=False)):
        assert _line(Who(), bad, 10) == Line(4, None, None, None)


def test_an_agent_is_a_small_object():
    assert Negotiator.__slots__ == ()
    agent = share().agents[0]
    assert isinstance(agent, Negotiator) and not hasattr(agent, "__dict__")
