"""Turning an LLM's text into a guess. Never invents a number: unparseable → None (invalid),
and the caller keeps the raw text."""

from __future__ import annotations

import re

from populace.sdk.answers import answer_field
from populace_ratio_game.rules import finite_in_range

_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")  # ASCII digits only


def parse_guess(text: str, max_value: float) -> float | None:
    """Accepts the structured answer `{"guess": 42}` or a bare number ("42", " 42.5 ").
    Anything else — prose, out-of-range, NaN — is invalid."""
    raw = answer_field(text, "guess")
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        return None
    if not isinstance(raw, str):  # a JSON number: take it as is (1e-05 is a number)
        return _in_range(float(raw), max_value)
    s = raw.strip()
    if not _NUMBER.fullmatch(s):
        return None
    return _in_range(float(s), max_value)


def _in_range(value: float, max_value: float) -> float | None:
    return value + 0.0 if finite_in_range(value, max_value) else None  # + 0.0 turns -0.0 into 0.0
