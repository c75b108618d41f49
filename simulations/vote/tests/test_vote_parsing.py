"""An answer becomes an option only when it is one: nothing is guessed."""

from __future__ import annotations

import pytest
from populace_vote.parsing import lookup_of, parse_choice

OPTIONS = ("Yes", "No", "Not sure")
LOOKUP = lookup_of(OPTIONS)


@pytest.mark.parametrize(("text", "expected"), [
    ('{"choice": "Yes"}', "Yes"),
    ('  {"choice": "No"}\n', "No"),
    ('{"reasoning": "I think so.", "choice": "Not sure"}', "Not sure"),  # chain of thought
    # case and spacing are not part of an option (options are distinct without them):
    # the scenario's spelling is what is recorded
    ('{"choice": "yes"}', "Yes"),
    ('{"choice": "  NOT   SURE "}', "Not sure"),
    ("yes", "Yes"),  # a bare option, from a backend that ignored the schema
    (" No \n", "No"),
])
def test_an_option_is_recognised_and_recorded_as_the_scenario_spells_it(text, expected):
    assert parse_choice(text, LOOKUP) == expected


@pytest.mark.parametrize("text", [
    "", "   ",
    '{"choice": "maybe"}',            # not an option
    '{"choice": "Yes."}',             # nothing looser than case and spacing
    '{"choice": "Ye"}',
    '{"choice": ["Yes"]}',            # not a string
    '{"choice": null}',
    '{"choice": 1}',                  # not an index into the options
    '{"answer": "Yes"}',              # wrong key
    '{"reasoning": "Yes is right"}',  # no choice at all, though an option is mentioned
    '{"choice": "Yes"',               # truncated JSON (e.g. max_tokens reached)
    '["Yes"]',
    '"Yes"',                          # a JSON string is not the bare option
    "I vote yes",
    "Yes, definitely",
    "Yes\nNo",
])
def test_anything_else_is_invalid(text):
    assert parse_choice(text, LOOKUP) is None


def test_an_option_that_looks_like_json_is_still_an_option():
    lookup = lookup_of(("{a}", "b"))
    assert parse_choice("{a}", lookup) == "{a}"
    assert parse_choice('{"choice": "{a}"}', lookup) == "{a}"


def test_unicode_spellings_of_one_option_match():
    lookup = lookup_of(("café", "tea"))  # composed é
    assert parse_choice('{"choice": "cafe\u0301"}', lookup) == "café"  # e + combining accent
    assert parse_choice('{"choice": "CAFÉ"}', lookup) == "café"
