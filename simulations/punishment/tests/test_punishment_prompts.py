"""What the players read and the shapes they answer in: the rules (with and without the
punishment stage), each stage's question, the remembered rounds, and answer schemas that every
backend's structured output — and the dummy model — answers validly."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from populace_punishment import prompts
from populace_punishment.params import LABELS, GameConfig
from populace_punishment.parsing import parse_contribution, parse_points
from populace_punishment.rules import Terms

from populace.core import synth

TERMS = Terms(20, Fraction(8, 5), 1, 3)


def test_the_rules_say_both_stages_and_every_price():
    assert prompts.system_prompt(GameConfig()) == (
        "You play a public-goods game with punishment in groups of 4 players drawn again every round (you rarely "
        "meet the same players twice), over several rounds. Each round has two stages. Stage 1: every player "
        "receives 20 tokens and contributes a whole number of them, from 0 to 20, to the group's pot, keeping the "
        "rest. The pot is multiplied by 1.6 and shared equally among the group's players, whatever each "
        "contributed. Stage 2: every player sees what the others contributed and may assign each of them from 0 "
        "to 10 punishment points. Each point costs the player who assigns it 1 token and the player who receives "
        "it 3 tokens. A player's payoff for the round is the tokens kept, plus the share of the pot, minus the cost "
        "of the points assigned, minus 3 tokens per point received. Answer with JSON only.")


def test_without_punishment_and_with_fixed_groups_the_rules_say_so():
    text = prompts.system_prompt(GameConfig(max_points=0, block=4, multiplier=2.0))
    assert text == (
        "You play a public-goods game in a fixed group of 4 players (the same players every round), over several "
        "rounds. Every round, every player receives 20 tokens and contributes a whole number of them, from 0 to 20, "
        "to the group's pot, keeping the rest. The pot is multiplied by 2 and shared equally among the group's "
        "players, whatever each contributed. A player's payoff for the round is the tokens kept plus the share of "
        "the pot. Answer with JSON only.")


def test_the_contribution_question_with_persona_history_and_a_smaller_group():
    texts = prompts.Texts(TERMS, group_size=4, max_points=10, cot=False)
    history = texts.history(((1, 10, 42, 4, 3, 6),))
    assert texts.contribute("You are Ann.", history, 3) == (
        "You are Ann.\nYour last rounds:\n"
        "- round 1: you contributed 10, your group of 4 put in 42 in all; you assigned 3 points and received 6; "
        "your payoff was 5.8.\n"
        "Your group has only 3 players this round, so its pot is shared among 3. "
        'Stage 1: how many of your 20 tokens do you contribute to the pot? Answer {"contribution": n}.')
    assert texts.contribute(None, "", 4) == (
        'Stage 1: how many of your 20 tokens do you contribute to the pot? Answer {"contribution": n}.')
    assert texts.contribute(None, "", 1).startswith(
        "You are alone in your group this round: the whole multiplied pot is yours, and there is nobody to punish. ")
    alone = prompts.Texts(TERMS, group_size=4, max_points=0, cot=False).contribute(None, "", 1)
    assert alone.startswith("You are alone in your group this round: the whole multiplied pot is yours. Stage 1")
    assert prompts.Texts(TERMS, group_size=4, max_points=10, cot=True).contribute(None, "", 4) == (
        'Stage 1: how many of your 20 tokens do you contribute to the pot? Think step by step, then answer '
        '{"reasoning": "...", "contribution": n}.')


def test_the_punishment_question_shows_the_others_contributions_by_letter_and_what_the_member_holds():
    assert prompts.Texts(TERMS, 4, 10, False).punish(None, "", 10, [20, 0, None]) == (
        "Stage 1 is over: you contributed 10; the others contributed: A 20, B 0, C no valid answer (counted as 0). "
        "The pot of 30 tokens, multiplied by 1.6, gives each player 12, so you hold 22.\n"
        "Stage 2: how many punishment points (0 to 10) do you assign to each of A, B and C? Each point costs you "
        '1 token and its receiver 3 tokens. Answer {"A": n, "B": n, "C": n}.')
    assert prompts.Texts(TERMS, 4, 5, True).punish("You are Bo.", "", None, [7]) == (
        "You are Bo.\nStage 1 is over: you gave no valid answer (counted as 0); the others contributed: A 7. "
        "The pot of 7 tokens, multiplied by 1.6, gives each player 5.6, so you hold 25.6.\n"
        "Stage 2: how many punishment points (0 to 5) do you assign to A? Each point costs you 1 token and its "
        'receiver 3 tokens. Think step by step, then answer {"reasoning": "...", "A": n}.')
    # a third of a token: the share is the correctly rounded exact value, written as a person would
    odd = prompts.Texts(Terms(20, Fraction(1), 1, 3), 3, 10, False).punish(None, "", 1, [0, 0])
    assert "The pot of 1 token, multiplied by 1, gives each player 0.33, so you hold 19.33." in odd


def test_remembered_rounds_say_the_payoff_the_rules_gave():
    memory = ((1, 10, 42, 4, 1, 6), (2, None, 30, 3, 0, 0), (3, 5, 5, 1, 0, 0))
    assert prompts.history_text(memory, TERMS, True) == (
        "Your last rounds:\n"
        "- round 1: you contributed 10, your group of 4 put in 42 in all; you assigned 1 point and received 6; "
        "your payoff was 7.8.\n"  # 20 − 10 + 16.8 − 1 − 18
        "- round 2: you gave no valid answer (counted as 0), your group of 3 put in 30 in all; you assigned 0 points "
        "and received 0; your payoff was 36.\n"
        "- round 3: you contributed 5, you were alone; your payoff was 23.\n")
    # without a punishment stage nobody assigns points: none are mentioned
    assert prompts.history_text(((1, 10, 42, 4, 0, 0),), TERMS, False) == (
        "Your last rounds:\n- round 1: you contributed 10, your group of 4 put in 42 in all; your payoff was 26.8.\n")
    assert prompts.history_text((), TERMS, True) == ""


@pytest.mark.parametrize("cot", [False, True])
def test_the_schemas_are_objects_of_whole_numbers_in_range_reasoning_first(cot):
    c = prompts.contribute_schema(20, cot)
    assert list(c["properties"]) == (["reasoning"] if cot else []) + ["contribution"]
    assert c["properties"]["contribution"] == {"type": "integer", "minimum": 0, "maximum": 20}
    assert c["required"] == list(c["properties"]) and c["additionalProperties"] is False
    p = prompts.punish_schema(3, 10, cot)
    assert list(p["properties"]) == (["reasoning"] if cot else []) + ["A", "B", "C"]
    assert all(p["properties"][x] == {"type": "integer", "minimum": 0, "maximum": 10} for x in "ABC")
    assert p["required"] == list(p["properties"]) and p["additionalProperties"] is False


@pytest.mark.parametrize("cot", [False, True])
@pytest.mark.parametrize("others", [1, 3, 26])
def test_the_dummy_model_answers_both_schemas_validly_and_spreads_its_answers(cot, others):
    contribute, punish = prompts.contribute_schema(20, cot), prompts.punish_schema(others, 10, cot)
    contributions, points = set(), set()
    for key in range(300):
        c = parse_contribution(synth.answer(contribute, 7, 1, key), 20)
        p = parse_points(synth.answer(punish, 7, 1, key), LABELS[:others], 10)
        assert c is not None and p is not None and len(p) == others
        contributions.add(c)
        points.update(p)
        assert set(json.loads(synth.answer(punish, 7, 1, key))) == set(punish["properties"])
    assert contributions == set(range(21)) and points == set(range(11))
