"""An answer counts only when it fits the answer schema; nothing is guessed."""

from __future__ import annotations

import pytest
from populace_opinion import Answer, parse_answer
from populace_opinion.params import POST_MAX_CHARS
from populace_opinion.scale import MICRO, to_micro


@pytest.mark.parametrize(("raw", "expected"), [
    ('{"stance": 0.4, "post": "Cars choke the centre."}', Answer(0.4, "Cars choke the centre.")),
    ('{"stance": -1, "post": "No."}', Answer(-1.0, "No.")),
    ('{"stance": 1, "post": "Yes."}', Answer(1.0, "Yes.")),
    ('{"stance": 0, "post": "Not sure."}', Answer(0.0, "Not sure.")),
    ('  {"reasoning": "I drive.", "stance": -0.75, "post": "I need my car."} ', Answer(-0.75, "I need my car.")),
    # a post is one line: whitespace collapsed
    ('{"stance": 0.2, "post": "  Fine\\nby   me. "}', Answer(0.2, "Fine by me.")),
    # kept to six decimals: what the environment sums is exactly what is recorded
    ('{"stance": 0.12345678, "post": "Hm."}', Answer(0.123457, "Hm.")),
    ('{"stance": 0.3, "post": "' + "x" * POST_MAX_CHARS + '"}', Answer(0.3, "x" * POST_MAX_CHARS)),
])
def test_a_valid_answer(raw, expected):
    assert parse_answer(raw) == expected


@pytest.mark.parametrize("raw", [
    '{"stance": 1.5, "post": "Too far."}',          # out of range
    '{"stance": -1.0001, "post": "Too far."}',
    '{"stance": "0.5", "post": "A string."}',        # not a number
    '{"stance": true, "post": "A boolean."}',
    '{"stance": NaN, "post": "Not a number."}',
    '{"stance": 1e400, "post": "Infinite."}',
    '{"stance": 0.5}',                               # no post
    '{"stance": 0.5, "post": "   "}',
    '{"stance": 0.5, "post": 7}',
    '{"stance": 0.5, "post": "' + "x" * (POST_MAX_CHARS + 1) + '"}',
    '{"post": "No stance."}',
    '{"stance": 0.5, "post": "Cut off',
    "0.5",                                           # a bare answer has no post
    "I strongly agree.",
    "[0.5]",
    "",
])
def test_anything_else_is_invalid(raw):
    assert parse_answer(raw) is None


def test_the_scale_round_trips_exactly():
    for micro in (-MICRO, -1, 0, 1, 123_457, 350_000, MICRO):
        assert to_micro(micro / MICRO) == micro
    assert to_micro(0.35) == 350_000 and to_micro(True) is None and to_micro(None) is None
