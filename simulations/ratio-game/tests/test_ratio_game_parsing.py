"""Turning model text into a guess (never inventing a number), and the game's prompts."""

from __future__ import annotations

import math

import pytest
from populace_ratio_game.params import GameConfig
from populace_ratio_game.parsing import parse_guess
from populace_ratio_game.prompts import history_text, system_prompt, user_prompt


@pytest.mark.parametrize("text,expected", [
    ('{"guess": 42}', 42.0),
    ('{"guess":42}', 42.0),
    ('  {"guess": 42.5}\n', 42.5),
    ('{"guess": "42"}', 42.0),
    ('{"guess": " 7 "}', 7.0),
    ('{"guess": 0}', 0.0),
    ('{"guess": 100}', 100.0),
    ('{"guess": 1e2}', 100.0),
    ('{"guess": 33, "why": "two thirds of fifty"}', 33.0),
    ("42", 42.0),
    (" 42.5 ", 42.5),
    ("\t0\n", 0.0),
    ("100", 100.0),
    ("100.0", 100.0),
    ("0.25", 0.25),
])
def test_valid_answers(text, expected):
    value = parse_guess(text, 100)
    assert value == expected
    assert isinstance(value, float)


@pytest.mark.parametrize("text", [
    # out of range / negative
    "101", "100.5", '{"guess": 1000}', "-1", "-0.5", '{"guess": -3}',
    # non-finite
    "nan", "NaN", "inf", "-inf", "Infinity", '{"guess": NaN}', '{"guess": Infinity}',
    '{"guess": "nan"}', '{"guess": "inf"}',
    # prose and partial numbers
    "I guess 42", "42 is my guess", "forty-two", "42, 43", "4 2", "1e2", "42.", ".5", "0x2A",
    # empty
    "", "   ", "\n",
    # JSON of the wrong shape
    '{"guess": true}', '{"guess": false}', '{"guess": null}', '{"guess": [42]}',
    '{"guess": {"value": 42}}', '{"answer": 42}', "{}", "[42]", '[{"guess": 42}]',
    '{"guess": 42', '{"guess": 42} and more', '{"guess": "about 42"}', '"42"',
])
def test_invalid_answers(text):
    assert parse_guess(text, 100) is None


def test_max_value_is_respected():
    assert parse_guess("50", 50) == 50.0
    assert parse_guess("50.01", 50) is None
    assert parse_guess('{"guess": 1000}', 1000) == 1000.0


def test_small_json_floats_are_accepted():
    """A JSON number such as 0.00001 is a valid, in-range guess."""
    assert parse_guess('{"guess": 0.001}', 100) == 0.001
    assert parse_guess('{"guess": 0.0001}', 100) == 0.0001


def test_tiny_json_float_is_accepted():
    assert parse_guess('{"guess": 0.00001}', 100) == 0.00001


def test_result_is_always_finite_and_in_range():
    for text in ["0", "99.999", '{"guess": 12.75}', '{"guess": "64"}']:
        v = parse_guess(text, 100)
        assert v is not None and math.isfinite(v) and 0 <= v <= 100


# --- prompts ----------------------------------------------------------------------------------
def test_system_prompt_default_game():
    s = system_prompt(GameConfig())
    assert "2/3 of the average of all numbers" in s
    assert "between 0 and 100." in s  # 100.0 rendered as an integer
    assert "plus" not in s
    assert '{"guess": <number>}' in s


def test_system_prompt_with_offset_and_other_ratio():
    s = system_prompt(GameConfig(ratio="1/2", offset=5, max_value=50))
    assert "closest to 5 plus 1/2 of the average of all numbers" in s
    assert "between 0 and 50." in s
    s = system_prompt(GameConfig(ratio="51/100", offset=2.5))
    assert "2.5 plus 51/100 of the average" in s


def test_system_prompt_is_shared_not_per_agent():
    assert system_prompt(GameConfig()) == system_prompt(GameConfig())
    assert system_prompt(GameConfig(ratio="1/2")) != system_prompt(GameConfig())


def test_user_prompt_first_round():
    assert user_prompt(7, "", ()) == "You are player 7. Report your number."


def test_user_prompt_with_history_and_own_numbers():
    p = user_prompt(12, "33, 22.5", ((1, 40.0), (2, None), (3, 12.5)))
    assert p == ("You are player 12. Winning numbers of previous rounds: 33, 22.5. "
                 "Your previous numbers: 40, 12.5. Report your number.")


def test_user_prompt_all_own_invalid_omits_section():
    p = user_prompt(3, "10", ((1, None), (2, None)))
    assert "Your previous numbers" not in p
    assert "Winning numbers of previous rounds: 10." in p


@pytest.mark.parametrize("history,window,expected", [
    ([1.0, 2.5, 3.0, 4.0], 2, "3, 4"),
    ([1.0, 2.5, 3.0, 4.0], 3, "2.5, 3, 4"),
    ([1.0, 2.5], 10, "1, 2.5"),
    ([1.0, 2.5], 0, ""),
    ([], 5, ""),
    ([33.333333333], 1, "33.3333"),
])
def test_history_text(history, window, expected):
    assert history_text(history, window) == expected


def test_non_ascii_digits_are_not_numbers():
    assert parse_guess("٤٢", 100) is None


def test_negative_zero_is_zero():
    value = parse_guess("-0", 100)
    assert value == 0.0 and str(value) == "0.0"
