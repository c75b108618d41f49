"""Prompts (pure functions of the scenario and the agent's memory) and parsing (never invents
a number): what the agents are told, and what of their answers counts."""

from __future__ import annotations

import json

import pytest
from populace_public_goods.params import GameConfig, PromptConfig
from populace_public_goods.parsing import parse_contribution
from populace_public_goods.prompts import answer_schema, intro, num, system_prompt, user_prompt

from populace.core import synth

GAME = GameConfig(group_size=4, endowment=10, multiplier=1.6)


def test_system_prompt_states_the_rules_with_the_scenario_numbers():
    text = system_prompt(GAME)
    assert "groups of 4 players" in text
    assert "receives 10 tokens" in text and "from 0 to 10" in text
    assert "multiplied by 1.6 and shared equally" in text
    assert text.endswith('{"contribution": <whole number from 0 to 10>}.')


def test_chain_of_thought_asks_for_reasoning_first_in_prompt_and_schema():
    text = system_prompt(GAME, PromptConfig(answer="cot"))
    assert "step by step" in text and '{"reasoning":' in text
    schema = answer_schema(GAME, "cot")
    assert schema["required"] == ["reasoning", "contribution"]
    assert list(schema["properties"]) == ["reasoning", "contribution"]
    assert "step by step" not in system_prompt(GAME)
    assert user_prompt("You are player 1.", (), 5, "cot").endswith(
        "Think step by step, then decide how many tokens you contribute this round.")


def test_answer_schema_is_an_integer_within_the_endowment():
    assert answer_schema(GAME) == {
        "type": "object",
        "properties": {"contribution": {"type": "integer", "minimum": 0, "maximum": 10}},
        "required": ["contribution"],
    }


def test_population_note_only_when_asked():
    note = "The players are 3 people."
    assert note not in system_prompt(GAME, PromptConfig(), note)
    assert note in system_prompt(GAME, PromptConfig(population_note=True), note)


def test_user_prompt_has_persona_or_number_and_the_request():
    assert user_prompt(intro(7), (), 5) == "You are player 7. How many tokens do you contribute this round?"
    persona = "You are Ana, 34 years old. Occupation: nurse."
    assert user_prompt(intro(7, persona), (), 5).startswith(persona + " How many")


def test_user_prompt_shows_own_past_rounds_and_the_group_average():
    memory = ((1, 4, 13.5, 3.25), (2, None, 20.0, 0.0), (3, 10, 8 + 16 / 3, 10 / 3))
    text = user_prompt(intro(0), memory, 5)
    assert ("Your previous rounds: round 1: you contributed 4, your payoff was 13.5, your group's average "
            "contribution was 3.25; round 2: you gave no valid answer (counted as 0), your payoff was 20, "
            "your group's average contribution was 0; round 3: you contributed 10, your payoff was 13.33, "
            "your group's average contribution was 3.33.") in text


def test_history_window_shows_only_the_latest_rounds():
    memory = tuple((r, r, 10.0, 1.0) for r in range(1, 8))
    text = user_prompt(intro(0), memory, 2)
    assert "round 6:" in text and "round 7:" in text and "round 5:" not in text
    assert "previous rounds" not in user_prompt(intro(0), memory, 0)


def test_a_restored_memory_of_lists_reads_the_same():
    # a checkpoint stores memory items as JSON lists
    assert user_prompt(intro(0), [[1, 4, 13.5, 3.25]], 5) == user_prompt(intro(0), ((1, 4, 13.5, 3.25),), 5)


def test_a_smaller_last_group_is_told_its_size():
    assert intro(9, None, 2) == "You are player 9. Your group has only 2 players, so its pot is shared among 2."
    assert "alone in your group" in intro(9, None, 1)


@pytest.mark.parametrize(("x", "text"), [(2, "2"), (2.0, "2"), (1.6, "1.6"), (80 / 3, "26.67"), (0.5, "0.5")])
def test_numbers_read_as_a_person_would_write_them(x, text):
    assert num(x) == text


@pytest.mark.parametrize(("text", "value"), [
    ('{"contribution": 7}', 7),
    ('  {"contribution": 0} ', 0),
    ('{"contribution": 10}', 10),
    ('{"reasoning": "others give 5", "contribution": 5}', 5),
    ('{"contribution": 7.0}', 7),
    ('{"contribution": " 7 "}', 7),
    ("7", 7),
    ('{"contribution": 11}', None),  # more than the endowment
    ('{"contribution": -1}', None),
    ('{"contribution": 7.5}', None),  # never rounded into a whole number
    ('{"contribution": true}', None),
    ('{"contribution": null}', None),
    ('{"contribution": "seven"}', None),
    ('{"contribution": 1e999}', None),  # inf
    ('{"guess": 7}', None),
    ('[7]', None),
    ('{"contribution": 7', None),
    ("I give 7 tokens", None),
    ("-3", None),
    ("7.5", None),
    ("", None),
    ("99999999999999999999999", None),
])
def test_parse_contribution(text, value):
    assert parse_contribution(text, 10) == value


@pytest.mark.parametrize("answer", ["direct", "cot"])
def test_every_dummy_model_answer_is_a_valid_contribution(answer):
    schema = answer_schema(GAME, answer)
    values = {parse_contribution(synth.answer(schema, 0, r, key), 10) for r in (1, 2) for key in range(200)}
    assert None not in values and values == set(range(11))  # uniform over 0..E: both ends reached


def test_the_dummy_models_cot_answer_parses_to_the_same_contribution_as_direct():
    for key in range(20):
        direct = json.loads(synth.answer(answer_schema(GAME), 3, 1, key))["contribution"]
        cot = parse_contribution(synth.answer(answer_schema(GAME, "cot"), 3, 1, key), 10)
        assert cot == direct
