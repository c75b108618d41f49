"""Scenario sections are validated by the vote's params; every error names its field as the
scenario wrote it."""

from __future__ import annotations

import pytest
from populace_vote.params import MAX_OPTIONS
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.scenario import ScenarioError, format_validation_error
from populace.sdk import resolve


def resolved(**sections):
    return resolve(RunConfig.model_validate({"simulation": "vote", **sections}))


def error_of(**sections) -> str:
    with pytest.raises(ValidationError) as info:
        resolved(**sections)
    return format_validation_error(info.value)


def test_defaults_play_a_yes_no_question():
    r = resolved()
    assert r.params.ballot.options == ("yes", "no") and r.params.ballot.question
    assert r.params.ballot.show_distribution is False
    assert r.config.model.max_tokens == 48  # the platform's default: a short direct answer


def test_options_are_trimmed_and_keep_their_order():
    r = resolved(ballot={"question": " Which? ", "options": [" B ", "a", "c"]})
    assert r.params.ballot.options == ("B", "a", "c") and r.params.ballot.question == "Which?"
    assert r.config.params["ballot"]["options"] == ["B", "a", "c"]  # the run's config holds the checked values


@pytest.mark.parametrize(("ballot", "expected"), [
    ({"question": "  "}, "ballot.question: must not be empty"),
    ({"question": 3}, "ballot.question: must be text"),
    ({"question": "q" * 4001}, "ballot.question: must be at most 4000 characters"),
    ({"options": ["yes"]}, "ballot.options: needs 2 to"),
    ({"options": []}, "ballot.options: needs 2 to"),
    ({"options": [str(i) for i in range(MAX_OPTIONS + 1)]}, f"ballot.options: needs 2 to {MAX_OPTIONS} options"),
    ({"options": "yes, no"}, "ballot.options: must be a list of options"),
    ({"options": ["a", "  "]}, "ballot.options.1: must not be empty"),
    ({"options": ["a", "b\nc"]}, "ballot.options.1: must be on one line"),
    ({"options": ["a", "x" * 201]}, "ballot.options.1: must be at most 200 characters"),
    ({"options": ["a", 2]}, "ballot.options.1: must be text"),
    # YAML reads a bare yes/no as a boolean: the message says how to write it
    ({"options": [True, False]}, 'ballot.options.0: must be text; YAML reads unquoted yes/no'),
    ({"options": ["Yes", " yes"]}, "ballot.options: option 1 ('yes') repeats option 0 ('Yes')"),
    ({"options": ["a", "Not sure", "not  SURE"]}, "ballot.options: option 2 ('not  SURE') repeats option 1"),
    ({"show_distribution": "sometimes"}, "ballot.show_distribution:"),
    ({"show_distributions": True}, "ballot.show_distributions: unknown key"),
])
def test_bad_ballot_names_the_field(ballot, expected):
    assert error_of(ballot=ballot).startswith(expected)


def test_one_bad_option_is_one_error():
    assert error_of(ballot={"options": ["a", "b", ""]}).count("\n") == 0


@pytest.mark.parametrize(("sections", "expected"), [
    ({"prompt": {"answer": "think"}}, "prompt.answer:"),
    ({"prompt": {"persona": "maybe"}}, "prompt.persona:"),
    ({"prompt": {"population_note": True}}, "prompt.population_note: needs a `population`"),
    ({"ballots": {}}, "ballots: unknown key"),
])
def test_bad_prompt_or_section_names_the_field(sections, expected):
    assert error_of(**sections).startswith(expected)


def test_chain_of_thought_gets_room_to_think_unless_the_scenario_says_otherwise():
    assert resolved(prompt={"answer": "cot"}).config.model.max_tokens == 256
    assert resolved(prompt={"answer": "cot"}, model={"max_tokens": 100}).config.model.max_tokens == 100


def test_long_options_get_room_for_the_whole_answer():
    long = "x" * 200
    assert resolved(ballot={"options": ["a", long]}).config.model.max_tokens == 16 + 200
    assert resolved(ballot={"options": ["a", "é" * 100]}).config.model.max_tokens == 16 + 200  # UTF-8 bytes
    assert resolved(ballot={"options": ["a", long]}, prompt={"answer": "cot"}).config.model.max_tokens == \
        256 + 16 + 200 - 48


def test_a_scenario_file_error_names_the_field(tmp_path):
    from populace.client.prepare import prepare_file

    path = tmp_path / "bad.yaml"
    path.write_text("simulation: vote\nagents: 4\nballot:\n  options: [yes, no]\n")
    with pytest.raises(ScenarioError, match=r"ballot\.options\.0: must be text; YAML reads unquoted"):
        prepare_file(path)
