"""Turning an LLM's text into a guess. Never invents a number: unparseable → None (invalid),
and the caller keeps the raw text."""

from __future__ import annotations

import json
import re

from populace.games.rules import finite_in_range

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_guess(text: str, max_value: float) -> float | None:
    """Accepts the structured answer `{"guess": 42}` or a bare number ("42", " 42.5 ").
    Anything else — prose, out-of-range, NaN — is invalid."""
    s = text.strip()
    if not s:
        return None
    if s[0] == "{":
        try:
            obj = json.loads(s)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        raw = obj.get("guess")
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            return None
        s = str(raw).strip()
    if not _NUMBER.fullmatch(s):
        return None
    value = float(s)
    return value if finite_in_range(value, max_value) else None
