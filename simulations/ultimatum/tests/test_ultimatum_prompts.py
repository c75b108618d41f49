"""Prompts (pure functions of the scenario, the agent's memory and the offer): what the players
are told, the schemas, and that the dummy model's answers are valid offers and replies."""

from __future__ import annotations

import json

import pytest
from populace_ultimatum.prompts import (
    history_text,
    offer_prompt,
    offer_schema,
    respond_prompt,
    respond_schema,
    system_prompt,
)
from populace_ultimatum.rules import coins, parse

from populace.core import synth


def test_system_prompt_states_the_rules_with_the_scenario_pie():
    assert system_prompt(10) == (
        "You play the ultimatum game. Two players split 10 coins. The proposer offers the responder a whole "
        "number of coins from 0 to 10. If the responder accepts, the responder gets the offer and the proposer "
        "keeps the rest; if the responder rejects, both get nothing. Answer with JSON only.")
    assert "split 250 coins" in system_prompt(250) and "from 0 to 250" in system_prompt(250)


def test_the_proposer_is_asked_for_an_offer():
    assert offer_prompt(None, "", 10, False) == (
        'You are the proposer. How many of the 10 coins do you offer? Answer {"offer": n}.')
    assert offer_prompt("You are Ann, a baker.", "Your last rounds:\n- x\n", 10, False) == (
        "You are Ann, a baker.\nYour last rounds:\n- x\n"
        'You are the proposer. How many of the 10 coins do you offer? Answer {"offer": n}.')


def test_the_responder_sees_the_offer_and_what_the_proposer_keeps():
    assert respond_prompt(None, "", 10, 3, False) == (
        "You are the responder. The proposer offers you 3 of 10 coins (keeping 7). Do you accept? "
        'Answer {"accept": true} or {"accept": false}.')
    assert respond_prompt("You are Bo.", "", 10, 10, False).startswith(
        "You are Bo.\nYou are the responder. The proposer offers you 10 of 10 coins (keeping 0).")


def test_chain_of_thought_asks_for_reasoning_first_in_prompt_and_schema():
    assert offer_prompt(None, "", 10, True).endswith(
        'Think step by step, then answer {"reasoning": "...", "offer": n}.')
    assert respond_prompt(None, "", 10, 3, True).endswith(
        'Think step by step, then answer {"reasoning": "...", "accept": true|false}.')
    assert list(offer_schema(10, True)["properties"]) == ["reasoning", "offer"]
    assert offer_schema(10, True)["required"] == ["reasoning", "offer"]
    assert list(respond_schema(True)["properties"]) == ["reasoning", "accept"]


def test_the_schemas_bound_every_field():
    assert offer_schema(10, False) == {"type": "object",
                                       "properties": {"offer": {"type": "integer", "minimum": 0, "maximum": 10}},
                                       "required": ["offer"], "additionalProperties": False}
    assert respond_schema(False) == {"type": "object", "properties": {"accept": {"type": "boolean"}},
                                     "required": ["accept"], "additionalProperties": False}


def test_history_recalls_each_past_round():
    memory = ((1, "proposer", 4, True, 6), (2, "responder", 2, False, 0), (3, "proposer", None, None, 0),
              (4, "responder", 5, None, 0))
    assert history_text(memory) == (
        "Your last rounds:\n"
        "- round 1: you were the proposer; offer 4, accepted; you got 6.\n"
        "- round 2: you were the responder; offer 2, rejected; you got 0.\n"
        "- round 3: you were the proposer; no valid offer; you got 0.\n"
        "- round 4: you were the responder; offer 5, no valid reply; you got 0.\n")
    assert history_text(()) == ""
    assert history_text([[1, "proposer", 4, True, 6]]) == history_text(memory[:1])  # restored from JSON


@pytest.mark.parametrize("cot", [False, True])
def test_every_dummy_model_answer_is_a_valid_offer_or_reply(cot):
    offers = [coins(parse(synth.answer(offer_schema(10, cot), synth.call_seed(1, seq), 1, key), "offer", int), 10)
              for key in range(200) for seq in range(2)]
    assert None not in offers and set(offers) == set(range(11))
    replies = [parse(synth.answer(respond_schema(cot), synth.call_seed(1, seq), 1, key), "accept", bool)
               for key in range(200) for seq in range(2)]
    assert None not in replies and set(replies) == {True, False}
    assert 60 < sum(replies) < 340  # a fair coin, roughly
    big = [coins(parse(synth.answer(offer_schema(1_000_000, cot), 7, r, key), "offer", int), 1_000_000)
           for key in range(50) for r in range(1, 3)]
    assert None not in big and max(big) > 10_000  # drawn from the whole pie


def test_the_dummy_models_cot_answer_is_the_direct_one_with_reasoning():
    for key in range(20):
        for schemas in ((offer_schema(10, False), offer_schema(10, True)), (respond_schema(False), respond_schema(True))):
            direct = json.loads(synth.answer(schemas[0], 3, 1, key))
            cot = json.loads(synth.answer(schemas[1], 3, 1, key))
            assert cot == {"reasoning": "(dummy)", **direct}
