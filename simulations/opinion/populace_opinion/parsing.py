"""Turning an LLM's text into a stance and a post. Never invents an answer: anything that does
not fit the answer schema is None (invalid), and the caller keeps the raw text.

An answer counts when it is a JSON object whose `stance` is a number in [-1, 1] and whose
`post` is text that is not empty and at most POST_MAX_CHARS long once its whitespace is
collapsed (a post is one line). Nothing looser: a bare number, a stance of 1.5, a missing or
over-long post make the whole answer invalid, and the agent posts nothing that round (its
in-neighbours hear one post fewer) rather than repeating an earlier stance it did not give.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from populace_opinion.params import POST_MAX_CHARS
from populace_opinion.scale import MICRO, to_micro


class Answer(NamedTuple):
    stance: float  # on the scale, to six decimals (see scale.py)
    post: str  # one line, trimmed


def parse_answer(text: str) -> Answer | None:
    """`{"stance": 0.4, "post": "…"}` (with or without `reasoning`) → Answer; else None."""
    s = text.strip()
    if not s.startswith("{"):
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    micro = to_micro(obj.get("stance"))
    post = obj.get("post")
    if micro is None or not isinstance(post, str):
        return None
    post = " ".join(post.split())
    if not post or len(post) > POST_MAX_CHARS:
        return None
    return Answer(micro / MICRO, post)
