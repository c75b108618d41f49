"""Turning a model's text into an answer: all six fields valid, or nothing (never a guess)."""

from __future__ import annotations

import json

import pytest
from populace_feed.parsing import Answer, parse_answer, whole


def answer(**fields) -> str:
    return json.dumps({"stance": 1, "post": "Hello.", "like": 2, "repost": 0, "follow": 3, "unfollow": 0, **fields})


def test_a_valid_answer():
    assert parse_answer(answer(), 3, 280, 5) == Answer(1, "Hello.", 2, 0, 3, 0)
    assert parse_answer(answer(post=""), 3, 280, 5).post is None  # no post
    assert parse_answer(answer(post="  two\n lines "), 3, 280, 5).post == "two lines"
    assert parse_answer(answer(stance=-3, like=5, repost=5), 3, 280, 5) == Answer(-3, "Hello.", 5, 5, 3, 0)
    assert parse_answer(answer(stance="2", like=2.0, reasoning="..."), 3, 280, 5) == Answer(2, "Hello.", 2, 0, 3, 0)
    assert parse_answer(answer(like=0, follow=0), 3, 280, 0) == Answer(1, "Hello.", 0, 0, 0, 0)  # an empty feed


@pytest.mark.parametrize("text", [
    answer(stance=4), answer(stance=-4), answer(stance=1.5), answer(stance=True), answer(stance=None),
    answer(post=None), answer(post=3), answer(post="x" * 281),
    answer(like=6), answer(repost=-1), answer(follow=True), answer(unfollow="one"),
    json.dumps({"stance": 1, "post": "", "like": 0, "repost": 0, "follow": 0}),  # unfollow missing
    "[1, 2]", "stance: 1", "", '{"stance": 1', "null",
])
def test_an_answer_that_breaks_a_rule_is_invalid(text):
    assert parse_answer(text, 3, 280, 5) is None


def test_whole_numbers():
    assert [whole(v) for v in (3, 3.0, "3", " -2 ", "-0")] == [3, 3, 3, -2, 0]
    assert [whole(v) for v in (True, 3.5, float("inf"), "3.0", "1" * 19, None, [3])] == [None] * 7
