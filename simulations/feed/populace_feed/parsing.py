"""Turning a model's text into an answer. Never guesses: the answer must be a JSON object with
all six fields valid — `stance` a whole number from -scale to scale, `post` text of at most
the allowed length ("" for none), and `like`, `repost`, `follow`, `unfollow` each 0 (none) or
the number of a post in the agent's feed. Anything else is an invalid answer, whose raw text
the caller keeps and which does nothing."""

from __future__ import annotations

import json
import re
from typing import NamedTuple

_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only
FIELDS = ("stance", "post", "like", "repost", "follow", "unfollow")


class Answer(NamedTuple):
    stance: int
    post: str | None  # None: no post
    like: int  # a post's number in the feed (1..), 0: none
    repost: int
    follow: int
    unfollow: int


def whole(value: object) -> int | None:
    """A whole number written as 3, 3.0 or "3" (not true, 3.5, inf or a huge string), or None."""
    if isinstance(value, bool):  # JSON true is not 1
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        s = value.strip()
        return int(s) if _INTEGER.fullmatch(s) and len(s) <= 18 else None  # bounded before int()
    return value if isinstance(value, int) else None


def parse_answer(text: str, scale: int, post_chars: int, feed_size: int) -> Answer | None:
    """The answer in `text` (any other keys, e.g. "reasoning", are ignored), or None."""
    try:
        obj = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    stance = whole(obj.get("stance"))
    if stance is None or not -scale <= stance <= scale:
        return None
    post = obj.get("post")
    if not isinstance(post, str):
        return None
    post = " ".join(post.split())  # one line: a post is shown quoted in other agents' feeds
    if len(post) > post_chars:
        return None
    picks = []
    for name in FIELDS[2:]:
        n = whole(obj.get(name))
        if n is None or not 0 <= n <= feed_size:
            return None
        picks.append(n)
    return Answer(stance, post or None, *picks)
