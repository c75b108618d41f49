"""Turning a model's text into a contribution or punishment points. Never guesses: an answer
counts only when it is a JSON object with the asked fields, each a whole number in its range
(`4.0` counts; `4.5`, `"4"`, `true`, a negative or an out-of-range number do not). Anything else
is the act's invalid answer: the caller keeps the raw text and the game counts it as 0."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

# The answers a model gives most (the dummy model's always): exactly a JSON object of whole numbers
# from 0, in the asked order. Read without a JSON decoder; anything else (other spacing, order,
# keys, signs, decimals) is read by json.loads as before: the same result either way.
_WS = r"[ \t\n\r]*"  # JSON's whitespace (not \s: Unicode spaces are not JSON's)
_WHOLE = r"(0|[1-9][0-9]{0,17})"


def _plain(labels: Sequence[str]) -> re.Pattern | None:
    """The fast pattern for these fields, or None when a label is not plain ASCII letters and digits
    (a label JSON would escape)."""
    if not all(label.isascii() and label.isalnum() for label in labels):
        return None
    fields = f"{_WS},{_WS}".join(f'"{label}"{_WS}:{_WS}{_WHOLE}' for label in labels)
    return re.compile(f"{_WS}\\{{{_WS}{fields}{_WS}\\}}{_WS}")


_CONTRIBUTION = _plain(("contribution",))
_POINTS: dict[tuple[str, ...], re.Pattern | None] = {}


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


# What the same answer reads as, remembered (a bounded cache: a model's structured answers repeat, a
# million members answer twice a round). Keyed by the text and what the reading depends on.
_READ: dict[tuple, object] = {}
READ_CACHE = 1 << 16


def _remember(key: tuple, value: object) -> None:
    if len(_READ) >= READ_CACHE:
        _READ.clear()
    _READ[key] = value


def parse_contribution(text: str, endowment: int) -> int | None:
    """`{"contribution": 7}` (with any other keys, e.g. "reasoning") as 7, or None."""
    if text.__class__ is not str:
        return _contribution(text, endowment)
    key = ("c", text, endowment)
    value = _READ.get(key, _READ)
    if value is _READ:
        value = _contribution(text, endowment)
        _remember(key, value)
    return value  # type: ignore[return-value]


def _contribution(text: str, endowment: int) -> int | None:
    plain = _CONTRIBUTION.fullmatch(text) if text.__class__ is str else None  # type: ignore[union-attr]
    if plain is not None:
        value = int(plain[1])
        return value if value <= endowment else None
    obj = answer_object(text)
    return whole(obj.get("contribution"), endowment) if obj is not None else None


def parse_points(text: str, labels: Sequence[str], max_points: int) -> list[int] | None:
    """`{"A": 0, "B": 3, "C": 0}` as [0, 3, 0] (in the order of `labels`), or None: every label
    must carry a whole number from 0 to `max_points`, else the whole answer is invalid (one bad
    field is not read as 0: nothing is invented)."""
    if text.__class__ is not str:
        return _points(text, labels, max_points)
    names = labels if labels.__class__ is str else tuple(labels)
    key = ("p", text, names, max_points)
    read = _READ.get(key, _READ)
    if read is _READ:
        points = _points(text, names, max_points)
        read = None if points is None else tuple(points)
        _remember(key, read)
    return None if read is None else list(read)  # type: ignore[arg-type]  # a list of its own each time


def _points(text: str, labels: Sequence[str], max_points: int) -> list[int] | None:
    if text.__class__ is str:
        key = tuple(labels)
        pattern = _POINTS.get(key, False)
        if pattern is False:
            pattern = _POINTS[key] = _plain(key) if len(_POINTS) < 1024 else None
        plain = pattern.fullmatch(text) if pattern is not None else None
        if plain is not None:
            out = list(map(int, plain.groups()))
            return out if max(out, default=0) <= max_points else None
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
