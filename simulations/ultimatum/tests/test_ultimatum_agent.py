"""The agent and its pair's scene, played by the platform's own round player with a scripted
model: the offer, then the reply to it, in order; what is recorded (acts, outcomes — invalid
answers and agent bugs too); who is paired with whom each round; what each agent remembers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from populace_ultimatum import Move, Trader, Ultimatum
from populace_ultimatum.prompts import offer_prompt, respond_prompt
from populace_ultimatum.rules import Counts, summary
from populace_ultimatum.simulation import offer_of, reply_of

from populace.core.contracts import RunConfig
from populace.sdk import Cast, InferError, ModelUnavailable, Persona, ScriptedLLM, resolve
from populace.sdk.hosting import host_run
from populace.sdk.play import OutcomeSink
from populace.sdk.registry import Resolved

OFFERED = re.compile(r"The proposer offers you (\d+) of")
Answer = str | BaseException


def config(agents: int, **game) -> RunConfig:
    return RunConfig.model_validate({"simulation": "ultimatum", "agents": agents, "seed": 4,
                                     "game": {"block": 2, **game}})


def share(agents: int = 2, cast: Cast | None = None, ranges: list[tuple[int, int]] | None = None,
          resolved: Resolved | None = None, **game):
    return host_run(resolved or resolve(config(agents, **game)), "r", ranges or [(0, agents)], cast, freeze=False)


def script(offer: Answer | Callable[[int], Answer], reply: Answer | Callable[[int, int], Answer]) -> ScriptedLLM:
    """Answers a proposer with `offer` (or `offer(key)`), a responder with `reply` (or
    `reply(key, the offer it sees)`, read from its prompt)."""
    def answer(key: int, prompt: str) -> Answer:
        seen = OFFERED.search(prompt)
        if seen is None:
            return offer(key) if callable(offer) else offer
        return reply(key, int(seen.group(1))) if callable(reply) else reply
    return ScriptedLLM(answer)


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


def pairs(run, round_: int = 1) -> list[tuple[int, ...]]:
    """The round's groups as (proposer, responder), or (unmatched,)."""
    return [g.members for g in run.player.groups(round_, None)]


def act(group: int, seq: int, agent: int, phase: str, raw: str, offer=None, accept=None, valid=True, error=None):
    return {"group_id": group, "seq": seq, "agent_id": agent, "phase": phase, "offer": offer, "accept": accept,
            "valid": valid, "raw": raw, "error": error}


async def test_the_proposer_offers_then_the_responder_sees_the_offer_and_accepts():
    run = share()
    ((proposer, responder),) = pairs(run)
    llm = script('{"offer": 4}', '{"accept": true}')
    result, outcomes, acts, lines = await play(run, llm)
    assert [a.key for a in llm.asked] == [proposer, responder]  # the offer first, then the reply to it
    assert llm.asked[0].prompt == 'You are the proposer. How many of the 10 coins do you offer? Answer {"offer": n}.'
    assert llm.asked[1].prompt == ("You are the responder. The proposer offers you 4 of 10 coins (keeping 6). "
                                   'Do you accept? Answer {"accept": true} or {"accept": false}.')
    assert llm.asked[0].schema is run.sim.offer_schema and llm.asked[1].schema is run.sim.respond_schema
    assert all(a.system is None and a.prefix_chars == 0 for a in llm.asked)
    assert acts == [act(0, 0, proposer, "offer", '{"offer": 4}', offer=4),
                    act(0, 1, responder, "respond", '{"accept": true}', accept=True)]
    assert lines == []  # the ultimatum game says nothing besides its acts
    assert outcomes[proposer] == {"group": 0, "valid": True, "raw": '{"offer": 4}', "error": None,
                                  "role": "proposer", "partner": responder, "offer": 4, "accepted": True, "payoff": 6}
    assert outcomes[responder] == {"group": 0, "valid": True, "raw": '{"accept": true}', "error": None,
                                   "role": "responder", "partner": proposer, "offer": 4, "accepted": True,
                                   "payoff": 4}
    assert result.partial == Counts(pairs=1, offers=1, offered=4, replies=1, accepted=1, accepted_offered=4)
    assert (result.n, result.n_valid) == (2, 2)


async def test_a_rejected_offer_leaves_both_with_nothing():
    run = share()
    ((proposer, responder),) = pairs(run)
    result, outcomes, acts, _ = await play(run, script('{"offer": 1}', '{"accept": false}'))
    assert [a["accept"] for a in acts] == [None, False]
    for aid in (proposer, responder):
        assert (outcomes[aid]["offer"], outcomes[aid]["accepted"], outcomes[aid]["payoff"]) == (1, False, 0)
        assert outcomes[aid]["valid"] is True
    assert result.partial == Counts(pairs=1, offers=1, offered=1, replies=1, accepted=0, accepted_offered=0)


@pytest.mark.parametrize("raw", ["I offer 4.", '{"offer": 11}', '{"offer": -1}', '{"offer": 4.5}',
                                 '{"offer": true}', '{"offer": 1e999}', '{"amount": 4}'])
async def test_an_invalid_offer_asks_no_reply_makes_no_deal_and_pays_nothing(raw):
    run = share()
    ((proposer, responder),) = pairs(run)
    llm = script(raw, '{"accept": true}')
    result, outcomes, acts, _ = await play(run, llm)
    assert [a.key for a in llm.asked] == [proposer]  # the responder is never asked
    assert acts == [act(0, 0, proposer, "offer", raw, valid=False)]
    assert outcomes[proposer] == {"group": 0, "valid": False, "raw": raw, "error": None,  # the model's, not a bug
                                  "role": "proposer", "partner": responder, "offer": None, "accepted": None,
                                  "payoff": 0}
    assert outcomes[responder] == {"group": 0, "valid": True, "raw": "", "error": None, "role": "responder",
                                   "partner": proposer, "offer": None, "accepted": None, "payoff": 0}
    assert result.partial == Counts(pairs=1)
    assert (result.n, result.n_valid) == (2, 1)


@pytest.mark.parametrize("raw", ["Yes, gladly.", '{"accept": "yes"}', '{"accept": 1}', '{"reply": true}'])
async def test_an_invalid_reply_counts_as_no_deal(raw):
    run = share()
    ((proposer, responder),) = pairs(run)
    result, outcomes, acts, _ = await play(run, script('{"offer": 5}', raw))
    assert acts[1] == act(0, 1, responder, "respond", raw, valid=False)
    assert outcomes[responder] == {"group": 0, "valid": False, "raw": raw, "error": None, "role": "responder",
                                   "partner": proposer, "offer": 5, "accepted": None, "payoff": 0}
    assert (outcomes[proposer]["valid"], outcomes[proposer]["accepted"], outcomes[proposer]["payoff"]) == (
        True, None, 0)
    assert result.partial == Counts(pairs=1, offers=1, offered=5)  # an offer, no valid reply, no deal
    s = summary(result.partial, 10)
    assert (s.mean_offer, s.acceptance_rate, s.mean_accepted_offer) == (5.0, None, None)


async def test_an_agent_bug_is_its_acts_error_and_every_scene_goes_on():
    run = share(6, block=6)  # three pairs in one round
    (p1, r1), (p2, r2), (p3, r3) = pairs(run)
    llm = script(lambda key: ValueError(f"bug {key}") if key == p1 else '{"offer": 3}',
                 lambda key, offer: ValueError(f"bug {key}") if key == r2 else '{"accept": true}')
    result, outcomes, acts, _ = await play(run, llm)
    by_group = {g: [a for a in acts if a["group_id"] == g] for g in (0, 1, 2)}
    # the proposer's bug: its offer act is an agent error, no reply is asked, nobody is paid
    assert by_group[0] == [act(0, 0, p1, "offer", f"<agent error: ValueError: bug {p1}>", valid=False,
                               error=f"agent: ValueError: bug {p1}")]
    assert r1 not in {a.key for a in llm.asked}
    assert (outcomes[p1]["error"], outcomes[p1]["valid"], outcomes[p1]["payoff"]) == (
        f"agent: ValueError: bug {p1}", False, 0)
    assert (outcomes[r1]["error"], outcomes[r1]["valid"], outcomes[r1]["payoff"]) == (None, True, 0)
    # the responder's bug: counted as no valid reply, the error is the responder's alone
    assert by_group[1][1] == act(1, 1, r2, "respond", f"<agent error: ValueError: bug {r2}>", valid=False,
                                 error=f"agent: ValueError: bug {r2}")
    assert (outcomes[r2]["error"], outcomes[r2]["valid"], outcomes[r2]["accepted"]) == (
        f"agent: ValueError: bug {r2}", False, None)
    assert (outcomes[p2]["error"], outcomes[p2]["valid"], outcomes[p2]["payoff"]) == (None, True, 0)
    assert outcomes[r2]["raw"] == f"<agent error: ValueError: bug {r2}>"
    # the third pair plays as if nothing happened
    assert (outcomes[p3]["payoff"], outcomes[r3]["payoff"], outcomes[r3]["error"]) == (7, 3, None)
    assert result.partial == Counts(pairs=3, offers=2, offered=6, replies=1, accepted=1, accepted_offered=3)


@pytest.mark.parametrize("at", ["offer", "respond"])
async def test_an_outage_is_never_recorded_as_an_answer_the_round_stops(at):
    run = share(4, block=4)
    down = InferError("gateway down")
    llm = script(down, '{"accept": true}') if at == "offer" else script('{"offer": 5}', down)
    with pytest.raises(ModelUnavailable, match="gateway down"):
        await play(run, llm)


async def test_each_agent_remembers_its_round_and_sees_it_in_the_next_rounds_prompt():
    run = share()
    ((proposer, responder),) = pairs(run)
    await play(run, script('{"offer": 4}', '{"accept": true}'))
    assert run.agents[proposer].memory == ((1, "proposer", 4, True, 6),)
    assert run.agents[responder].memory == ((1, "responder", 4, True, 4),)
    llm = script('{"offer": 2}', '{"accept": false}')
    await play(run, llm, round_=2)
    shown = {a.key: a.prompt for a in llm.asked}
    assert shown[proposer].startswith("Your last rounds:\n"
                                      "- round 1: you were the proposer; offer 4, accepted; you got 6.\n"
                                      "You are the ")
    assert shown[responder].startswith("Your last rounds:\n"
                                       "- round 1: you were the responder; offer 4, accepted; you got 4.\n")
    ((second_proposer, _),) = pairs(run, 2)
    assert run.agents[second_proposer].memory[-1] == (2, "proposer", 2, False, 0)


async def test_memory_keeps_the_last_five_rounds():
    run = share()
    for r in range(1, 8):
        llm = script(json.dumps({"offer": r}), '{"accept": true}')
        await play(run, llm, round_=r)
    assert [m[0] for m in run.agents[0].memory] == [3, 4, 5, 6, 7]
    history = llm.asked[0].prompt.split("You are the")[0]
    assert history.count("\n- round ") == 5 and "- round 2:" in history and "- round 1:" not in history


async def test_without_history_the_prompt_recalls_nothing():
    run = share(show_history=False)
    await play(run, script('{"offer": 4}', '{"accept": true}'))
    llm = script('{"offer": 4}', '{"accept": true}')
    await play(run, llm, round_=2)
    assert [a.prompt.startswith("You are the") for a in llm.asked] == [True, True]
    assert run.agents[0].memory and run.agents[1].memory  # remembered, only not shown


async def test_the_persona_leads_the_prompt_and_is_its_cacheable_prefix():
    cast = Cast([Persona(i, f"You are Person {i}, a trader.", {"occupation": "trader"}) for i in range(2)])
    run = share(cast=cast)
    llm = script('{"offer": 4}', '{"accept": true}')
    await play(run, llm)
    for a in llm.asked:
        persona = f"You are Person {a.key}, a trader."
        assert a.prompt.startswith(persona + "\n") and a.prefix_chars == len(persona)
    assert run.sim.user_example() == offer_prompt("You are Person 0, a trader.", "", 10, False)
    plain = resolve(RunConfig.model_validate({"simulation": "ultimatum", "agents": 2, "prompt": {"persona": False}}))
    run = share(cast=cast, resolved=plain)
    llm = script('{"offer": 4}', '{"accept": true}')
    await play(run, llm)
    assert all(a.prompt.startswith("You are the") and a.prefix_chars == 0 for a in llm.asked)
    assert run.sim.user_example() == offer_prompt(None, "", 10, False)


async def test_chain_of_thought_asks_with_the_reasoning_schemas():
    cot = resolve(RunConfig.model_validate({"simulation": "ultimatum", "agents": 2, "game": {"block": 2, "pie": 100},
                                            "prompt": {"answer": "cot"}}))
    llm = script('{"reasoning": "fair", "offer": 40}', '{"reasoning": "ok", "accept": true}')
    _, outcomes, _, _ = await play(share(resolved=cot), llm)
    assert llm.asked[0].prompt == offer_prompt(None, "", 100, True)
    assert llm.asked[1].prompt == respond_prompt(None, "", 100, 40, True)
    assert [list(a.schema["properties"]) for a in llm.asked] == [["reasoning", "offer"], ["reasoning", "accept"]]
    assert sorted(o["payoff"] for o in outcomes.values()) == [40, 60]


async def test_the_odd_agent_of_a_block_has_no_partner_and_asks_nothing():
    run = share(3, block=4)  # one block of 3: a pair and one left over
    llm = script('{"offer": 4}', '{"accept": true}')
    result, outcomes, acts, _ = await play(run, llm)
    (alone,) = [aid for aid, o in outcomes.items() if o["role"] == "unmatched"]
    assert outcomes[alone] == {"group": 1, "valid": True, "raw": "", "error": None, "role": "unmatched",
                               "partner": None, "offer": None, "accepted": None, "payoff": 0}
    assert alone not in {a.key for a in llm.asked} and alone not in {a["agent_id"] for a in acts}
    assert run.agents[alone].memory == ()  # nothing happened to it: nothing to recall
    assert (result.partial.pairs, result.n, result.n_valid) == (1, 3, 3)


async def test_roles_and_partners_are_drawn_again_each_round_within_blocks_never_across():
    run = share(40, block=10)
    seen_pairs, proposed, responded = [], set(), set()
    for r in range(1, 11):
        llm = script(lambda key: json.dumps({"offer": key % 11}), '{"accept": true}')
        _, outcomes, acts, _ = await play(run, llm, round_=r)
        drawn = pairs(run, r)
        # who acts first in each scene is the group's first member, its partner second
        by_group = {}
        for a in acts:
            by_group.setdefault(a["group_id"], []).append((a["seq"], a["agent_id"], a["phase"]))
        assert len(by_group) == len(drawn) == 20
        for gid, (p, q) in enumerate(drawn):
            assert by_group[gid] == [(0, p, "offer"), (1, q, "respond")]
            assert p // 10 == q // 10 == gid // 5  # a pair never spans blocks (5 pairs a block)
            assert (outcomes[p]["role"], outcomes[p]["partner"], outcomes[q]["partner"]) == ("proposer", q, p)
            proposed.add(p)
            responded.add(q)
        assert sorted(m for g in drawn for m in g) == list(range(40))  # everyone plays once a round
        seen_pairs.append({frozenset(g) for g in drawn})
    assert all(seen_pairs[i] != seen_pairs[i + 1] for i in range(9))  # strangers: partners change
    assert proposed == responded == set(range(40))  # roles change too


async def test_a_hosts_pairs_are_the_whole_runs_pairs_of_its_blocks():
    whole = share(40, block=10)
    part = share(40, block=10, ranges=[(10, 20)])  # blocks 1 and 2, as placement would give a host
    for r in (1, 2, 3):
        assert pairs(part, r) == [g for g in pairs(whole, r) if 10 <= g[0] < 30]
        assert [g.id for g in part.player.groups(r, None)] == list(range(5, 15))


async def test_fixed_partners_with_blocks_of_two_still_draw_who_proposes():
    run = share(2, block=2)
    firsts = {pairs(run, r)[0][0] for r in range(1, 11)}
    assert {frozenset(pairs(run, r)[0]) for r in range(1, 11)} == {frozenset((0, 1))} and firsts == {0, 1}


@pytest.mark.parametrize("batch_size", [1, 3, 1000])
async def test_batches_that_cut_pairs_give_the_same_round(batch_size):
    run = share(9, block=4)  # blocks of 4, 4 and 1: four pairs, one unmatched
    llm = script(lambda key: json.dumps({"offer": key % 11}), lambda key, offer: json.dumps({"accept": offer > 3}))
    result, outcomes, acts, _ = await play(run, llm, batch_size=batch_size)
    p = result.partial
    assert (p.pairs, result.n, len(acts)) == (4, 9, 8)
    proposers = [o for o in outcomes.values() if o["role"] == "proposer"]
    assert p.offered == sum(o["offer"] for o in proposers)
    assert p.accepted == sum(o["offer"] > 3 for o in proposers)


def test_only_a_valid_offer_of_whole_coins_within_the_pie_counts():
    # an author's Agent subclass may return any Move: the scene reads only what keeps the rules
    assert offer_of(Move(offer=4), 10) == 4 and offer_of(Move(offer=0), 10) == 0 and offer_of(Move(offer=10), 10) == 10
    for bad in (Move(offer=11), Move(offer=-1), Move(offer=4, valid=False), Move(offer=True), Move(offer=None),
                Move(offer="4"), Move(offer=4.5)):
        assert offer_of(bad, 10) is None, bad
    assert reply_of(Move(accept=True)) is True and reply_of(Move(accept=False)) is False
    for bad in (Move(accept="yes"), Move(accept=1), Move(accept=True, valid=False), Move(accept=None)):
        assert reply_of(bad) is None, bad


class Greedy(Trader):
    """An author's agent that breaks the rules: it offers more than the pie and says "yes"."""

    __slots__ = ()

    async def act(self, phase, view, llm):
        return Move(offer=view["pie"] + 5) if phase == "offer" else Move(accept="yes")


class GreedyUltimatum(Ultimatum):
    Agent = Greedy


async def test_a_move_that_breaks_the_rules_is_no_offer_and_pays_nothing():
    base = resolve(config(2))
    run = share(resolved=Resolved(base.config, GreedyUltimatum, base.params))
    result, outcomes, acts, _ = await play(run, ScriptedLLM(""))
    assert [(a["phase"], a["offer"]) for a in acts] == [("offer", 15)]  # recorded as it came; no reply asked
    assert all(o["payoff"] == 0 and o["offer"] is None for o in outcomes.values())
    assert result.partial == Counts(pairs=1)


def test_an_agent_is_a_small_object():
    assert Trader.__slots__ == ()
    agent = share().agents[0]
    assert isinstance(agent, Trader) and not hasattr(agent, "__dict__")
