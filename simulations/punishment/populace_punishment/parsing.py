"""Turning a model's text into a contribution or punishment points. Never guesses: an answer
counts only when it is a JSON object with the asked fields, each a whole number in its range
(`4.0` counts; `4.5`, `"4"`, `true`, a negative or an out-of-range number do not). Anything else
is the act's invalid answer: the caller keeps the raw text and the game counts it as 0."""

from __future__ import annotations

import json
from collections.abc import Sequence


def answer_object(text: str) -> dict | None:
    """The answer as a JSON object, or None. Never raises: a model's text is only data."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):  # RecursionError: "[[[[…" past the decoder's depth
        return None
    return value if isinstance(value, dict) else None


def whole(value: object, top: int) -> int | None:
    """A whole number from 0 to `top`, or None."""
    if isinstance(value, bool):  # JSON true is not 1 token
        return None
    if isinstance(value, float):
        if not value.is_integer():  # 4.5, inf and nan are not whole numbers
            return None
        value = int(value)
    if not isinstance(value, int):
        return None
    return value if 0 <= value <= top else None


def parse_contribution(text: str, endowment: int) -> int | None:
    """`{"contribution": 7}` (with any other keys, e.g. "reasoning") as 7, or None."""
    obj = answer_object(text)
    return whole(obj.get("contribution"), endowment) if obj is not None else None


def parse_points(text: str, labels: Sequence[str], max_points: int) -> list[int] | None:
    """`{"A": 0, "B": 3, "C": 0}` as [0, 3, 0] (in the order of `labels`), or None: every label
    must carry a whole number from 0 to `max_points`, else the whole answer is invalid (one bad
    field is not read as 0: nothing is invented)."""
    obj = answer_object(text)
    if obj is None:
        return None
    out = []
    for label in labels:
        p = whole(obj.get(label), max_points)
        if p is None:
            return None
        out.append(p)
    return out
