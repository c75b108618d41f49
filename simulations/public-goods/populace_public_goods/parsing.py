"""Turning an LLM's text into a contribution. Never invents a number: anything that is not a
whole number of tokens from 0 to the endowment is None (invalid), and the caller keeps the
raw text. The game then counts it as 0 (see rules)."""

from __future__ import annotations

import re

from populace.sdk.answers import answer_field

_INTEGER = re.compile(r"[0-9]+")  # ASCII digits only; a sign or a fraction is not a token count


def parse_contribution(text: str, endowment: int) -> int | None:
    """Accepts the structured answer `{"contribution": 7}` (also `7.0` or `"7"` inside it) or a
    bare whole number ("7"). Prose, fractions (7.5), negatives and out-of-range are invalid."""
    raw = answer_field(text, "contribution")
    if isinstance(raw, bool):  # JSON true is not 1 token
        return None
    if isinstance(raw, int):
        return _in_range(raw, endowment)
    if isinstance(raw, float):  # 7.0 is a whole number; 7.5, inf and nan are not
        return _in_range(int(raw), endowment) if raw.is_integer() else None
    if not isinstance(raw, str):
        return None
    s = raw.strip()
    if not _INTEGER.fullmatch(s) or len(s) > 18:  # bounded before int(): no huge conversions
        return None
    return _in_range(int(s), endowment)


def _in_range(value: int, endowment: int) -> int | None:
    return value if 0 <= value <= endowment else None
