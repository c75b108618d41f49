"""The prompt texts and the answer schema, as pure functions."""

from __future__ import annotations

import json

import pytest
from populace_vote import prompts
from populace_vote.params import BallotConfig, PromptConfig

from populace.core import synth

BALLOT = BallotConfig(question="Lower the voting age to 16?", options=("yes", "no", "undecided"))


def test_distribution_text_gives_shares_in_ballot_order_rounded_half_up():
    text = prompts.distribution_text({"yes": 1, "no": 6, "undecided": 1})
    assert text == 'In the last round, 8 people answered validly: "yes" 13%, "no" 75%, "undecided" 13%.'


@pytest.mark.parametrize(("count", "total", "expected"), [
    (1, 8, 13), (1, 200, 1), (1, 400, 0), (3, 400, 1), (2, 3, 67), (0, 5, 0), (5, 5, 100)])
def test_percent_rounds_half_up_exactly(count, total, expected):
    assert prompts.percent(count, total) == expected


def test_distribution_text_is_empty_when_nobody_answered_validly():
    assert prompts.distribution_text({}) == ""
    assert prompts.distribution_text({"yes": 0, "no": 0}) == ""


def test_distribution_text_of_one_person_and_of_many():
    assert prompts.distribution_text({"yes": 1, "no": 0}).startswith("In the last round, 1 person answered")
    assert "1,000,000 people" in prompts.distribution_text({"yes": 400_000, "no": 600_000})


def test_own_answers_show_valid_choices_with_their_rounds():
    assert prompts.own_answers_text(()) == ""
    assert prompts.own_answers_text(((1, None),)) == ""
    assert prompts.own_answers_text(((1, "yes"), (2, None), (3, "no"))) == \
        'Your answers in earlier rounds: round 1 "yes", round 3 "no".'


def test_system_prompt_states_question_and_options_exactly():
    text = prompts.system_prompt(BALLOT)
    assert "Question: Lower the voting age to 16?" in text
    assert 'Options: "yes", "no", "undecided".' in text
    assert text.endswith(prompts.ANSWER_INSTRUCTIONS["direct"])
    assert prompts.REPEATED not in text and prompts.SPEAK_AS_PERSONA not in text


def test_system_prompt_variants():
    shown = BALLOT.model_copy(update={"show_distribution": True})
    assert prompts.REPEATED in prompts.system_prompt(shown, rounds=3)
    assert prompts.REPEATED not in prompts.system_prompt(shown, rounds=1)  # nothing will be repeated
    note = "The participants are 10 people."
    assert note not in prompts.system_prompt(BALLOT, PromptConfig(), note)  # off by default
    assert note in prompts.system_prompt(BALLOT, PromptConfig(population_note=True), note)
    assert prompts.SPEAK_AS_PERSONA in prompts.system_prompt(BALLOT, persona=True)
    assert prompts.system_prompt(BALLOT, PromptConfig(answer="cot")).endswith(prompts.ANSWER_INSTRUCTIONS["cot"])


def test_user_prompt_leads_with_the_persona_and_skips_empty_parts():
    assert prompts.user_prompt(None, "", "") == "Which option do you choose?"
    text = prompts.user_prompt("You are Ana.", "In the last round, …", "Your answers …", "cot")
    assert text == "You are Ana. In the last round, … Your answers … Think step by step, then choose one option."


def test_options_are_quoted_as_json_strings():
    assert prompts.quoted('say "no"') == '"say \\"no\\""'
    assert prompts.quoted("café") == '"café"'


@pytest.mark.parametrize("answer", ["direct", "cot"])
def test_schema_constrains_the_choice_to_the_options(answer):
    schema = prompts.answer_schema(BALLOT.options, answer)
    assert schema["properties"]["choice"] == {"type": "string", "enum": ["yes", "no", "undecided"]}
    assert "choice" in schema["required"] and schema["additionalProperties"] is False
    if answer == "cot":
        assert list(schema["properties"]) == ["reasoning", "choice"]  # think first, then commit
    # the dummy model answers it with one of the options, the same one with or without reasoning
    direct = prompts.answer_schema(BALLOT.options)
    for key in range(20):
        got = json.loads(synth.answer(schema, 7, 1, key))
        assert got["choice"] == json.loads(synth.answer(direct, 7, 1, key))["choice"] in BALLOT.options
