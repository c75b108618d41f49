"""Turning a model's text into a message. Never guesses: the answer must be a JSON object with
`say` (text of at most the game's length), `propose` (a whole number of coins from 0 to the
pie) and `accept` (true or false); anything else is an invalid message, whose raw text the
caller keeps and which proposes and accepts nothing."""

from __future__ import annotations

import json
import re
from typing import NamedTuple

_INTEGER = re.compile(r"[0-9]+")  # ASCII digits only; a sign or a fraction is not a coin count


class Parsed(NamedTuple):
    say: str
    propose: int
    accept: bool


def parse_message(text: str, pie: int, say_chars: int) -> Parsed | None:
    """`{"say": "…", "propose": 4, "accept": false}` (with any other keys, e.g. "reasoning")
    as a message, or None. `propose` may be written 4.0 or "4"; `say` is stripped."""
    try:
        obj = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    say, accept = obj.get("say"), obj.get("accept")
    propose = coins(obj.get("propose"), pie)
    if not isinstance(say, str) or not isinstance(accept, bool) or propose is None:
        return None
    say = say.strip()
    if len(say) > say_chars:
        return None
    return Parsed(say, propose, accept)


def coins(value: object, pie: int) -> int | None:
    """A whole number of coins from 0 to `pie`, or None."""
    if isinstance(value, bool):  # JSON true is not 1 coin
        return None
    if isinstance(value, float):  # 4.0 is a whole number; 4.5, inf and nan are not
        if not value.is_integer():
            return None
        value = int(value)
    elif isinstance(value, str):
        s = value.strip()
        if not _INTEGER.fullmatch(s) or len(s) > 18:  # bounded before int(): no huge conversions
            return None
        value = int(s)
    if not isinstance(value, int):
        return None
    return value if 0 <= value <= pie else None
